"""Planning is pure: playbooks validate, the plan names every step and host, links and route
records follow the rules, with no host involved."""

from __future__ import annotations

import io
import tarfile
from datetime import UTC, datetime

import pytest

from orchestrator.config.inventory import ApiKey, load_inventory
from orchestrator.config.loader import validate
from orchestrator.config.profiles import load_profile
from orchestrator.engine.actions import ACTIONS, load_playbook
from orchestrator.engine.plan import Activation, back_out, links_after_deploy, pair_view, plan
from orchestrator.engine.playbook import Playbook
from orchestrator.errors import ConfigError, HostStateError
from orchestrator.hosts import services
from orchestrator.hosts.probes import facts_from
from orchestrator.hosts.release import pack
from orchestrator.hosts.route import RouteEntry, content_sha, next_record, parse_route


def _facts(cur, prev, releases, running=None):
    procs = {n: (pid, f"/r/releases/x/bin/{n}".encode() + b"\0") for n, pid in (running or {}).items()}
    return facts_from(
        root_exists=True,
        current_link=f"releases/{cur}" if cur else None,
        previous_link=f"releases/{prev}" if prev else None,
        release_names=list(releases),
        svc_bytes=None,
        route_bytes=None,
        procs=procs,
    )


@pytest.fixture
def inv(tmp_path):
    return load_inventory("lab", {"PAIRCTL_HOME": str(tmp_path)})


def _activation(view, profile, inv):
    pair = inv.pair("lab")
    argv = services.llama_server_argv(
        view.layouts["native"],
        "pkg-n",
        profile,
        model_paths={k: m.path for k, m in pair.models.items()},
        host=view.server_bind,
        port=view.server_port,
        rpc=[f"{view.rpc_bind}:{view.rpc_port}"],
        with_api_key=False,
    )
    rpc = services.rpc_server_argv(view.layouts["rpc"], "pkg-r", bind=view.rpc_bind, port=view.rpc_port)
    return Activation("pkg-n", "pkg-r", tuple(argv), tuple(rpc))


def test_shipped_playbooks_validate():
    for name in ("deploy", "rollback", "accept"):
        assert load_playbook(name).steps


def test_playbook_refuses_abort_after_a_change_and_unknown_actions():
    reg = {"actions": ACTIONS}
    base = {
        "name": "x",
        "steps": [
            {"name": "stop", "host": "native", "action": "stop", "on_failure": "rollback"},
            {"name": "verify", "host": "both", "action": "verify", "on_failure": "abort"},
        ],
    }
    with pytest.raises(ConfigError, match="abort after 'stop'"):
        validate(Playbook, base, source="t", context=reg)
    bad = {"name": "x", "steps": [{"name": "a", "host": "local", "action": "reboot"}]}
    with pytest.raises(ConfigError, match="unknown action"):
        validate(Playbook, bad, source="t", context=reg)
    dup = {"name": "x", "steps": [{"name": "a", "host": "both", "action": "connect"}] * 2}
    with pytest.raises(ConfigError, match="repeat"):
        validate(Playbook, dup, source="t", context=reg)
    remote = {"name": "x", "steps": [{"name": "a", "host": "native", "action": "preflight"}]}
    with pytest.raises(ConfigError, match="action preflight runs on host: local"):  # the class says local
        validate(Playbook, remote, source="t", context=reg)
    with pytest.raises(ConfigError, match="no action registry"):  # validated without one: nothing is known
        validate(Playbook, base, source="t")


def test_required_steps_fail_closed_without_the_bundled_playbooks(tmp_path):
    """The steps each command needs are read from the bundled playbooks; a folder that is missing
    or holds none refuses with the fix named, where an empty table required nothing."""
    from orchestrator.engine.playbook import required_steps

    for folder in (tmp_path / "missing", tmp_path):
        with pytest.raises(ConfigError, match="no bundled playbooks.*nothing was run") as err:
            required_steps(folder)
        assert "reinstall pairctl" in (err.value.hint or "")
    assert {"deploy", "rollback", "repair"} <= set(required_steps())


def test_deploy_plan_lists_every_step_on_its_hosts(inv):
    view = pair_view(inv, "lab")
    act = _activation(view, load_profile("lab"), inv)
    facts = {
        "native": _facts("old-n", None, ("old-n", "pkg-n"), running={"llama-server": 10}),
        "rpc": _facts(None, None, ()),
    }
    steps = plan(load_playbook("deploy"), view, facts=facts, target=act)
    names = [s.name for s in steps]
    assert names.index("lease") < names.index("upload") < names.index("stop-native") < names.index("restart-rpc")
    assert (
        names.index("restart-rpc") < names.index("switch-native") < names.index("start-server") < names.index("verify")
    )
    assert names.index("verify") < names.index("route") < names.index("release-lease")
    by = {s.name: s for s in steps}
    assert by["stop-native"].hosts == ("lab-native",) and by["restart-rpc"].hosts == ("lab-rpc",)
    assert by["upload"].hosts == ("lab-native", "lab-rpc")
    assert "pid 10" in by["stop-native"].description
    assert "pkg-n present: send 0 bytes" in by["upload"].description
    assert "pkg-r absent: send" in by["upload"].description
    assert "previous -> releases/old-n" in by["switch-native"].description
    restart = by["restart-rpc"].argv["lab-rpc"]
    assert restart[-4:] == ("-H", "127.0.0.3", "-p", "50052")
    assert "current -> releases/pkg-r, previous -> (none)" in by["restart-rpc"].description
    server = list(by["start-server"].argv["lab-native"])
    assert "--rpc" in server and server[server.index("--rpc") + 1] == "127.0.0.3:50052"
    assert all(not s.changes for s in steps[: names.index("stop-native")])
    assert all(s.on_failure in ("rollback", "continue") for s in steps[names.index("stop-native") :])


def test_the_dry_runs_form_of_a_step_carries_its_decisions_and_never_the_key(inv):
    """Step.to_dict is what --dry-run prints and what the runner records for each step it runs:
    the upload's present / absent, the links, the route write; the key only as set or not."""
    view = pair_view(inv, "lab")
    facts = {"native": _facts("old-n", None, ("old-n", "pkg-n")), "rpc": _facts(None, None, ())}
    key = ApiKey(b"sekrit-key\n", "sekrit-key")
    steps = plan(
        load_playbook("deploy"), view, facts=facts, target=_activation(view, load_profile("lab"), inv), key=key
    )
    by = {s.name: s.to_dict() for s in steps}
    up = by["upload"]["upload"]
    assert up["lab-native"]["present"] is True and up["lab-rpc"] == {"release": "pkg-r", "present": False, "files": {}}
    assert by["switch-native"]["links"] == {"lab-native": ["pkg-n", "old-n"]}
    assert by["secret"]["has_key"] is True and "sekrit" not in repr(by)
    assert "upload" not in by["switch-native"] and "links" not in by["upload"]


def test_auto_rollback_plan_skips_manual_steps(inv):
    view = pair_view(inv, "lab")
    steps = plan(
        back_out(load_playbook("rollback")),
        view,
        facts={},
        target=None,
        restore=None,
        restore_links={"native": (None, "z"), "rpc": (None, None)},
    )
    assert [s.name for s in steps][0] == "stop-native"
    assert "no pair to start" in next(s for s in steps if s.name == "restart-rpc").description
    assert (
        "current -> (none), previous -> releases/z" in next(s for s in steps if s.name == "switch-native").description
    )
    manual = plan(load_playbook("rollback"), view, facts={}, target=None)
    assert [s.name for s in manual][:3] == ["connect", "lease", "facts"]  # facts once the hosts are held (issue 21)


def test_links_after_deploy():
    f = _facts("a", "z", ("a", "z"))
    assert links_after_deploy(f, "b") == ("b", "a")
    assert links_after_deploy(f, "a") == ("a", "z")  # re-deploy keeps the older previous
    assert links_after_deploy(_facts(None, None, ()), "b") == ("b", None)
    assert links_after_deploy(None, "b") == ("b", None)


def _entry(n: str) -> RouteEntry:
    return RouteEntry.build(
        native_package=n,
        rpc_package=n + "-r",
        package_revision="a" * 40,
        profile={"name": "lab", "ctx_size": 4096},
        native_argv=["x", "--port", "1"],
        rpc_argv=["y"],
    )


def test_route_records_count_up_and_round_trip_byte_exact():
    now = datetime(2026, 12, 2, tzinfo=UTC)
    r1 = next_record(None, pair="lab", active=_entry("a"), previous=None, run_id="run1", now=now)
    assert r1.revision == 1
    data = r1.to_bytes()
    assert parse_route(data) == r1 and parse_route(data).to_bytes() == data
    r2 = next_record(parse_route(data), pair="lab", active=_entry("b"), previous=r1.active, run_id="run2", now=now)
    assert r2.revision == 2 and r2.previous.native_package == "a"
    assert content_sha(None) is None and content_sha(data) != content_sha(r2.to_bytes())
    assert (
        _entry("a").argv_sha256
        != RouteEntry.build(
            native_package="a",
            rpc_package="a-r",
            package_revision="a" * 40,
            profile={"name": "lab", "ctx_size": 4096},
            native_argv=["x", "--port", "2"],
            rpc_argv=["y"],
        ).argv_sha256
    )
    with pytest.raises(HostStateError, match="native-host:/r/route.json does not parse"):
        parse_route(b'{"pair": "lab"}', where="native-host:/r/route.json", pair="lab")


def test_pack_is_stable_and_keeps_modes(tmp_path):
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "llama-server"
    exe.write_bytes(b"\x7fELF fake")
    exe.chmod(0o755)
    (tmp_path / "manifest.json").write_text("{}")
    a, b = pack(tmp_path), pack(tmp_path)
    assert a == b
    with tarfile.open(fileobj=io.BytesIO(a)) as t:
        names = t.getnames()
        assert names == ["manifest.json", "bin/llama-server"]
        assert t.getmember("bin/llama-server").mode & 0o111


def test_deploy_reads_facts_only_after_the_lease_is_held():
    """Issue 21 item 3: host state that decides anything (and the route's compare-and-swap base)
    is read after the lease: an operator delayed between facts and lease used stale bytes."""
    names = [s.name for s in load_playbook("deploy").steps]
    assert names.index("lease") < names.index("facts") < names.index("prepare")


def test_the_plan_carries_the_commands_the_executor_runs(inv):
    """Issue 29: the dry run's service commands carry the supervisor options and bounds the
    executor uses (they carried none, and a literal 20), and the executor is handed them."""
    import inspect

    view = pair_view(inv, "lab")
    act = _activation(view, load_profile("lab"), inv)
    facts = {"native": _facts("pkg-n", None, ("pkg-n",)), "rpc": _facts(None, None, ())}
    by = {s.name: s for s in plan(load_playbook("deploy"), view, facts=facts, target=act)}
    server = by["start-server"].execs["lab-native"]
    assert server.sup == view.sup["native"] and any(w.startswith("sup.peer=") for w in server.argv())
    assert server.service_argv == act.native_argv and server.bound_s == view.layouts["native"].manager.bound_s("start")
    rpc = by["restart-rpc"].execs["lab-rpc"]
    assert str(services.RPC_LISTEN_S) in rpc.argv() and any(w.startswith("sup.") for w in rpc.argv())
    assert by["stop-native"].execs["lab-native"].verify_release == "pkg-n"  # present: verified before the stop
    assert rpc.verify_release is None  # absent: uploaded and verified by the upload
    assert all("step" in inspect.signature(ACTIONS[a]).parameters for a in ACTIONS)  # every executor is handed it


def test_a_restore_keeps_the_previous_links_it_was_given(inv):
    """Qualify's restore: `previous` names what the qualification found, not the last arm's release."""
    from dataclasses import replace

    view = pair_view(inv, "lab")
    act = replace(_activation(view, load_profile("lab"), inv), keep_previous=("found-n", None))
    facts = {"native": _facts("arm-n", "found-n", ("arm-n", "pkg-n", "found-n")), "rpc": _facts("arm-r", None, ())}
    by = {s.name: s for s in plan(load_playbook("deploy"), view, facts=facts, target=act)}
    assert "current -> releases/pkg-n, previous -> releases/found-n" in by["switch-native"].description
    assert "current -> releases/pkg-r, previous -> (none)" in by["restart-rpc"].description
    # the links are decided once, on the step, and the executor is handed them (never recomputed)
    assert by["switch-native"].links == {"lab-native": ("pkg-n", "found-n")}
    assert by["restart-rpc"].links == {"lab-rpc": ("pkg-r", None)}
    rpc = by["restart-rpc"].execs["lab-rpc"].argv()
    assert rpc[rpc.index("restart") + 4 : rpc.index("restart") + 6] == ("pkg-r", "-")  # root, name, verify, links
