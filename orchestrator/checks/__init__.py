"""Acceptance checks against a live pair, one module each; `suite.run_suite` runs them in order."""
