"""Runs playbooks: plans them from host facts (pure), executes each step with a journal entry,
and rolls back on failure after activation began."""
