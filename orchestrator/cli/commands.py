"""Every pairctl command, by name: where it lives and its one-line summary.

Adding a command is one line here (its module is imported only when it runs). The target is
"module:attribute": a typer app (a group of subcommands) or a command function.
"""

from __future__ import annotations

from orchestrator.cli.lazy import Lazy, lazy

COMMANDS: dict[str, Lazy] = {
    "init": lazy("orchestrator.cli.init_cmd:init", "Scaffold an operator config repo (inventory, profile, fixtures)."),
    "build": lazy("orchestrator.cli.build_cmd:build", "Build one immutable package per target from a clean revision."),
    "packages": lazy("orchestrator.cli.packages_cmd:app", "List, show and verify built packages."),
    "deploy": lazy("orchestrator.cli.deploy_cmd:deploy", "Deploy, verify and accept a pair; roll back on failure."),
    "accept": lazy("orchestrator.cli.accept_cmd:accept", "Run the acceptance checks against a live pair."),
    "reference": lazy("orchestrator.cli.reference_cmd:app", "Show or set a route's pinned reference answers."),
    "qualify": lazy("orchestrator.cli.qualify_cmd:app", "Paired baseline/candidate qualification with declared gates."),
    "bisect": lazy(
        "orchestrator.cli.bisect_cmd:bisect", "Find the first bad revision between a good and a bad one, on a pair."
    ),
    "rollback": lazy("orchestrator.cli.rollback_cmd:rollback", "Put the previous pair back and verify it."),
    "status": lazy("orchestrator.cli.status_cmd:status", "What runs on a pair, whether it matches, leases (a read)."),
    "logs": lazy("orchestrator.cli.logs_cmd:logs", "A pair's server logs: the last lines, -f to follow (bounded)."),
    "restart": lazy(
        "orchestrator.cli.service_cmd:restart", "Restart the pair that runs now (same releases), verified."
    ),
    "stop": lazy("orchestrator.cli.service_cmd:stop", "Stop both services of a pair (links and record kept)."),
    "start": lazy("orchestrator.cli.service_cmd:start", "Start the pair current names (after stop), verified."),
    "diff": lazy("orchestrator.cli.diff_cmd:diff", "What runs against what the inventory and profile ask now."),
    "repair": lazy(
        "orchestrator.cli.repair_cmd:repair", "Rebuild a pair's route record from its links, manifests and evidence."
    ),
    "releases": lazy("orchestrator.cli.releases_cmd:app", "List and prune old releases on a pair's hosts."),
    "lease": lazy("orchestrator.cli.lease_cmd:app", "Take, show and release host leases."),
    "receipts": lazy("orchestrator.cli.receipts_cmd:app", "List, show, verify receipts; derive recovery records."),
    "kernels": lazy("orchestrator.cli.kernels_cmd:app", "Kernel patches and their CPU-reference validation cases."),
    "schedule": lazy("orchestrator.cli.schedule_cmd:app", "Run acceptance on a timer (systemd or cron)."),
    "doctor": lazy("orchestrator.cli.doctor_cmd:doctor", "Check keys, known_hosts and toolchains; say what to fix."),
    "config": lazy("orchestrator.cli.config_cmd:app", "Validate manifests, show where names resolve, JSON schemas."),
    "lab": lazy("orchestrator.cli.lab_cmd:app", "The embedded lab: loopback sshd hosts, pinned source, tiny models."),
}
