"""Registers every sub-app on the root app. One line per command module."""

from __future__ import annotations

from orchestrator.cli import app
from orchestrator.cli import config_cmd

app.add_typer(config_cmd.app, name="config")
from orchestrator.cli import doctor_cmd, schedule_cmd  # noqa: E402

app.add_typer(schedule_cmd.app, name="schedule")
app.command("doctor")(doctor_cmd.doctor)
from orchestrator.cli import lab_cmd  # noqa: E402

app.add_typer(lab_cmd.app, name="lab")
from orchestrator.cli import build_cmd, packages_cmd  # noqa: E402

app.command("build")(build_cmd.build)
app.add_typer(packages_cmd.app, name="packages")
from orchestrator.cli import accept_cmd  # noqa: E402

app.command("accept")(accept_cmd.accept)
from orchestrator.cli import deploy_cmd, rollback_cmd, status_cmd  # noqa: E402

app.command("deploy")(deploy_cmd.deploy)
app.command("rollback")(rollback_cmd.rollback)
app.command("status")(status_cmd.status)
from orchestrator.cli import repair_cmd  # noqa: E402

app.command("repair")(repair_cmd.repair)
from orchestrator.cli import kernels_cmd  # noqa: E402

app.add_typer(kernels_cmd.app, name="kernels")
from orchestrator.cli import receipts_cmd  # noqa: E402

app.add_typer(receipts_cmd.app, name="receipts")
from orchestrator.cli import qualify_cmd  # noqa: E402

app.add_typer(qualify_cmd.app, name="qualify")
from orchestrator.cli import lease_cmd  # noqa: E402

app.add_typer(lease_cmd.app, name="lease")
from orchestrator.cli import reference_cmd  # noqa: E402

app.add_typer(reference_cmd.app, name="reference")
from orchestrator.cli import init_cmd  # noqa: E402

app.command("init")(init_cmd.init)
from orchestrator.cli import releases_cmd  # noqa: E402

app.add_typer(releases_cmd.app, name="releases")
