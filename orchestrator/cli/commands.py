"""Every pairctl command, by name: where it lives and its one-line summary.

Adding a command is one line here (its module is imported only when it runs). The target is
"module:attribute": a typer app (a group of subcommands) or a command function.
"""

from __future__ import annotations

from orchestrator.cli.lazy import Lazy

COMMANDS: dict[str, Lazy] = {
    "init": Lazy("orchestrator.cli.init_cmd:init", "Scaffold an operator config repo (inventory, profile, fixtures)."),
    "build": Lazy("orchestrator.cli.build_cmd:build", "Build one immutable package per target from a clean revision."),
    "packages": Lazy("orchestrator.cli.packages_cmd:app", "List, show and verify built packages."),
    "deploy": Lazy("orchestrator.cli.deploy_cmd:deploy", "Deploy, verify and accept a pair; roll back on failure."),
    "accept": Lazy("orchestrator.cli.accept_cmd:accept", "Run the acceptance checks against a live pair."),
    "reference": Lazy("orchestrator.cli.reference_cmd:app", "Show or set a route's pinned reference answers."),
    "qualify": Lazy("orchestrator.cli.qualify_cmd:app", "Paired baseline/candidate qualification with declared gates."),
    "bisect": Lazy(
        "orchestrator.cli.bisect_cmd:bisect", "Find the first bad revision between a good and a bad one, on a pair."
    ),
    "rollback": Lazy("orchestrator.cli.rollback_cmd:rollback", "Put the previous pair back and verify it."),
    "status": Lazy("orchestrator.cli.status_cmd:status", "What runs on a pair, whether it matches, leases (a read)."),
    "logs": Lazy("orchestrator.cli.logs_cmd:logs", "A pair's server logs: the last lines, -f to follow (bounded)."),
    "restart": Lazy(
        "orchestrator.cli.service_cmd:restart", "Restart the pair that runs now (same releases), verified."
    ),
    "stop": Lazy("orchestrator.cli.service_cmd:stop", "Stop both services of a pair (links and record kept)."),
    "start": Lazy("orchestrator.cli.service_cmd:start", "Start the pair current names (after stop), verified."),
    "diff": Lazy("orchestrator.cli.diff_cmd:diff", "What runs against what the inventory and profile ask now."),
    "repair": Lazy(
        "orchestrator.cli.repair_cmd:repair", "Rebuild a pair's route record from its links, manifests and evidence."
    ),
    "releases": Lazy("orchestrator.cli.releases_cmd:app", "List and prune old releases on a pair's hosts."),
    "lease": Lazy("orchestrator.cli.lease_cmd:app", "Take, show and release host leases."),
    "receipts": Lazy("orchestrator.cli.receipts_cmd:app", "List, show, verify receipts; derive recovery records."),
    "kernels": Lazy("orchestrator.cli.kernels_cmd:app", "Kernel patches and their CPU-reference validation cases."),
    "schedule": Lazy("orchestrator.cli.schedule_cmd:app", "Run acceptance on a timer (systemd or cron)."),
    "doctor": Lazy("orchestrator.cli.doctor_cmd:doctor", "Check keys, known_hosts and toolchains; say what to fix."),
    "config": Lazy("orchestrator.cli.config_cmd:app", "Validate manifests, show where names resolve, JSON schemas."),
    "lab": Lazy("orchestrator.cli.lab_cmd:app", "The embedded lab: loopback sshd hosts, pinned source, tiny models."),
}
