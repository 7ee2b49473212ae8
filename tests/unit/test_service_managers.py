"""The service-manager seam (hosts/managers): which manager a host uses is read in one place,
only the manager modules branch on it, and a third manager is one module (tests/unit/third_manager.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from mypy import api as mypy_api

from orchestrator.config.inventory import load_inventory
from orchestrator.engine.plan import Activation, pair_view, service_exec
from orchestrator.hosts import managers
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.managers.pairctl import PAIRCTL
from orchestrator.hosts.managers.systemd import SystemdManager
from orchestrator.remote.local import LocalTransport
from tests.unit import third_manager

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "orchestrator"
NAMES = {"systemd", "pairctl"}  # the managers' names as the inventory spells them
FIELDS = {"service_manager", "systemd_scope", "systemd", "scope"}  # what says which manager a host has
# where deciding by manager is the point: the managers, and the inventory's own validation of its
# systemd fields (config sits below hosts/, so it cannot ask a manager)
ALLOWED = {f"hosts/managers/{m}.py" for m in ("__init__", "pairctl", "systemd")} | {"config/inventory.py"}


def _names(node: ast.AST) -> set[str]:
    """String constants and attribute names an expression mentions."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def manager_branches(source: str) -> list[int]:
    """Lines where a test (if, ternary, while, assert, comparison) asks which manager is in use."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If | ast.IfExp | ast.While | ast.Assert):
            tested = _names(node.test)
        elif isinstance(node, ast.Compare):
            tested = _names(node)
        else:
            continue
        if tested & (NAMES | FIELDS):
            found.append(node.lineno)
    return found


def test_the_scan_finds_a_branch_on_the_manager() -> None:
    assert manager_branches("if spec.service_manager == 'systemd':\n    pass\n") == [1, 1]
    assert manager_branches("x = 30 if layout.systemd is None else 480\n") == [1, 1]
    assert manager_branches("x = layout.manager.bound_s('start')\n") == []


def test_only_the_manager_modules_branch_on_which_manager_runs() -> None:
    found = {
        rel: lines
        for path in sorted(ROOT.rglob("*.py"))
        if (rel := path.relative_to(ROOT).as_posix()) not in ALLOWED
        and (lines := manager_branches(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"ask the host's manager (hosts/managers) instead of branching on it: {found}"


def test_the_inventory_picks_the_manager_in_one_place(tmp_path: Path) -> None:
    inv = load_inventory("lab", {"PAIRCTL_HOME": str(tmp_path)})
    assert pair_view(inv, "lab").layouts["native"].manager is PAIRCTL
    spec = inv.host(inv.pair("lab").native)
    hosts = {**inv.hosts, inv.pair("lab").native: replace_spec(spec, service_manager="systemd")}
    sd = pair_view(inv.model_copy(update={"hosts": hosts}), "lab").layouts["native"].manager
    assert isinstance(sd, SystemdManager) and sd.words("llama-server")[0].startswith("systemd=user:pairctl-lab-")


def replace_spec(spec: object, **changes: object) -> object:
    return spec.model_copy(update=changes)  # type: ignore[attr-defined]


def test_a_third_manager_is_one_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered under the name the inventory gives, the test-only manager is what the plan's
    commands, their bounds, the start's staging and status's boot reading use."""
    monkeypatch.setitem(managers.MANAGERS, "pairctl", third_manager.for_host)
    view = pair_view(load_inventory("lab", {"PAIRCTL_HOME": str(tmp_path)}), "lab")
    assert all(isinstance(lay.manager, third_manager.InitScripts) for lay in view.layouts.values())
    act = Activation("pkg-n", "pkg-r", ("llama-server", "-m", "m.gguf"), ("rpc-server", "-p", "1"))
    start = service_exec(view, "start-server", "native", act)
    restart = service_exec(view, "restart-rpc", "rpc", act)
    stop = service_exec(view, "stop", "native", None)
    assert (start.bound_s, stop.bound_s) == (11, 12) and restart.bound_s == 13 + 20
    assert "initd=/etc/init.d/llama-server" in start.cmd.argv
    assert "initd=/etc/init.d/ggml-rpc-server" in restart.cmd.argv
    layout = HostLayout(str(tmp_path), third_manager.InitScripts())
    t, problems = LocalTransport("h"), []
    assert layout.manager.stage(t, layout, "llama-server", ["x"], ())[0] == "/etc/init.d/llama-server"
    assert layout.manager.boot_status(t, layout, "llama-server", "h", running=True, problems=problems) == {
        "persistence": None,
        "starts_at_boot": False,
    }
    assert problems == ["h: /etc/init.d/llama-server is not enabled; `update-rc.d llama-server enable` enables it"]


def test_the_third_manager_meets_the_protocol_under_strict_mypy() -> None:
    out, err, rc = mypy_api.run(["--strict", "--follow-imports=silent", str(Path(third_manager.__file__))])
    assert rc == 0, out + err
