"""Issue 32 #14, the pure half: answer-changing files a profile names must be declared with their
sha256 (and then enter the route's identity), CORS is rendered from the profile and a wildcard
or credentials need a reason, and systemd units carry hardening (system scope: a service user).
The host half (files hashed on the host, the CORS answer of a real server, the units under a
real systemd): tests/e2e/test_security.py and tests/e2e/test_systemd.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.config.flags import file_args, file_problems, server_policy_problems
from orchestrator.config.inventory import HostSpec, Supervision
from orchestrator.config.profiles import RouteProfile, load_profile
from orchestrator.errors import ConfigError
from orchestrator.hosts.probes import ExpectedProc, ProcIdentity, proc_problems
from orchestrator.hosts.route import RouteEntry
from orchestrator.hosts.supervisor import sup_args
from orchestrator.hosts.units import render_unit, verify_units

SHA = "a" * 64
BASE = {"name": "p", "ctx_size": 4096, "parallel": 2}
HELP = Path(__file__).parent / "golden" / "llama_server_help.txt"


def _profile(tmp_path: Path, **fields: object) -> RouteProfile:
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({**BASE, **fields}))
    return load_profile(str(p))


def _refused(tmp_path: Path, **fields: object) -> str:
    with pytest.raises(ConfigError) as e:
        _profile(tmp_path, **fields)
    msg = str(e.value)
    assert "Traceback" not in msg
    return msg


def _args(profile: RouteProfile) -> list[str]:
    return profile.render_args(model_paths={"target": "/m.gguf"}, host="127.0.0.1", port=8080, rpc=[])


def _entry(p: RouteProfile) -> RouteEntry:
    return RouteEntry.build(
        native_package="n", rpc_package="r", package_revision="x", profile=p.model_dump(mode="json"),
        native_argv=_args(p), rpc_argv=["r"],
    )  # fmt: skip


# -- files that change answers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "paths"),
    [
        (["--control-vector", "/srv/cv.gguf"], ["/srv/cv.gguf"]),
        (["--control-vector-scaled", "/srv/a.gguf:0.8,/srv/b.gguf:-1"], ["/srv/a.gguf", "/srv/b.gguf"]),
        (["-mm", "/srv/proj.gguf"], ["/srv/proj.gguf"]),
        (["--mmproj", "/srv/proj.gguf"], ["/srv/proj.gguf"]),
        (["-lcs", "/srv/static.bin"], ["/srv/static.bin"]),
        (["--lookup-cache-dynamic", "/srv/dyn.bin"], ["/srv/dyn.bin"]),
        (["--lookup_cache_static", "/srv/static.bin"], ["/srv/static.bin"]),  # llama.cpp maps _ to -
    ],
)
def test_an_answer_changing_file_without_its_sha256_is_refused(tmp_path, args, paths):
    msg = _refused(tmp_path, extra_args=args)
    for path in paths:
        assert f"{path} reads a file that changes the server's answers" in msg and "profile's files" in msg, msg
        assert f"sha256sum {path}" in msg
    # declared, the same profile loads; the hashes are part of what the route entry records
    ok = _profile(tmp_path, extra_args=args, files=dict.fromkeys(paths, SHA))
    assert ok.files == dict.fromkeys(paths, SHA)
    other = _profile(tmp_path, extra_args=args, files=dict.fromkeys(paths, "b" * 64))
    dumps = [_entry(p) for p in (ok, other)]
    assert dumps[0].profile_sha256 != dumps[1].profile_sha256 and dumps[0].profile["files"] == ok.files


def test_risky_file_options_also_need_their_sha256(tmp_path):
    """--lora, --grammar-file, --chat-template-file, --json-schema-file stay behind allow_flags
    and must be declared as well: an allowed adapter swapped on the host is still a new model."""
    for args in (["--lora", "/a.gguf,/b.gguf"], ["--grammar-file", "/g.gbnf"], ["-jf", "/s.json"],
                 ["--chat-template-file", "/t.jinja"], ["--lora-scaled", "/a.gguf:0.5"]):  # fmt: skip
        probs = file_problems(args, {})
        assert probs and all("profile's files" in p for p in probs), (args, probs)
        assert file_problems(args, {p: SHA for _, p in file_args(args)}) == []


def test_declared_files_must_be_used_absolute_and_hashes(tmp_path):
    assert "declared but no option" in _refused(tmp_path, files={"/srv/x.gguf": SHA})
    assert "not an absolute path" in _refused(tmp_path, extra_args=["--control-vector", "cv.gguf"])
    bad = _refused(tmp_path, extra_args=["--mmproj", "/p.gguf"], files={"/p.gguf": "nothex"})
    assert "64-hex-digit sha256" in bad


def test_a_newer_servers_file_option_is_found_through_its_help(tmp_path):
    """An option the tables here do not know, whose own --help value hint names a file."""
    help_text = HELP.read_text() + "--style-vector FNAME                    add a style vector\n"
    probs = file_problems(["--style-vector", "/srv/s.gguf"], {}, help_text=help_text)
    assert len(probs) == 1 and "/srv/s.gguf reads a file" in probs[0]
    # TLS material is a file but changes no answer
    assert file_problems(["--ssl-cert-file", "/c.pem"], {}, help_text=HELP.read_text()) == []
    # preflight (against the package's help) reports it too
    pol = server_policy_problems({}, ["--style-vector", "/srv/s.gguf"], [], ["-H", "127.0.0.3"], help_text=help_text,
                                 api_key=False, files={})  # fmt: skip
    assert any("/srv/s.gguf reads a file" in p for p in pol.problems)


def test_answer_changing_values_are_part_of_identity(tmp_path):
    """--override-kv and --chat-template are values: they are in the argv the route entry
    hashes and that identity compares with /proc, so a different value is a different route."""
    a = _profile(tmp_path, extra_args=["--override-kv", "tokenizer.ggml.add_bos_token=bool:false"])
    b = _profile(tmp_path, extra_args=["--override-kv", "tokenizer.ggml.add_bos_token=bool:true"])
    entries = [_entry(p) for p in (a, b)]
    assert entries[0].argv_sha256 != entries[1].argv_sha256
    seen = ProcIdentity(name="llama-server", pid=1, exe_sha256=SHA, argv=tuple(_args(b)))
    probs = proc_problems("h", ExpectedProc(name="llama-server", exe_sha256=SHA, argv=tuple(_args(a))), seen)
    assert probs and any("argv" in p for p in probs), probs


def test_bundled_profiles_still_load():
    for p in Path(__file__).parents[2].joinpath("manifests", "profiles").glob("*.yaml"):
        load_profile(str(p))
    assert "--override-kv" in load_profile("lab-unloadable").extra_args


# -- CORS ---------------------------------------------------------------------------------------


def test_cors_is_rendered_closed_by_default(tmp_path):
    args = _args(_profile(tmp_path))
    i = args.index("--cors-origins")
    assert args[i + 1] == "localhost" and "--no-cors-credentials" in args and "--cors-credentials" not in args


@pytest.mark.parametrize(
    "extra",
    [
        ["--cors-origins", "*"],
        ["--cors_origins", "*"],
        ["--cors-credentials"],
        ["--cors-origins", "https://evil.example", "--cors-credentials"],
    ],
)
def test_cors_in_extra_args_is_refused_naming_the_field(tmp_path, extra):
    msg = _refused(tmp_path, extra_args=extra)
    assert "set the profile's cors." in msg, msg


def test_a_cors_wildcard_or_credentials_needs_a_reason(tmp_path):
    for cors in ({"origins": "*"}, {"credentials": True}, {"origins": "localhost,*"}):
        msg = _refused(tmp_path, cors=cors)
        assert "cors.reason" in msg and "any web page" in msg, msg
    assert "exact origin" in _refused(tmp_path, cors={"origins": "evil.example/path"})
    p = _profile(tmp_path, cors={"origins": "*", "reason": "public demo, no key, nothing private"})
    args = _args(p)
    assert args[args.index("--cors-origins") + 1] == "*" and "--no-cors-credentials" in args
    p = _profile(tmp_path, cors={"origins": "https://app.example.com:8443,http://[::1]:3000"})
    assert _args(p)[_args(p).index("--cors-origins") + 1] == "https://app.example.com:8443,http://[::1]:3000"


# -- systemd units and the service user -----------------------------------------------------------


def _unit(*, user: bool) -> str:
    return render_unit(
        pair="p", service="llama-server", root="/srv/pairctl", supervision=Supervision(), user=user,
        exec_argv=["/bin/sh", "/srv/pairctl/bin/pairctl-svc", "supervise", "/srv/pairctl", "llama-server", "/bin/true"],
    )  # fmt: skip


def test_units_are_hardened_for_their_scope():
    system, user = _unit(user=False), _unit(user=True)
    for text in (system, user):
        for line in ("NoNewPrivileges=yes", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
                     "RestrictNamespaces=yes", "SystemCallErrorNumber=EPERM", "UMask=0077"):  # fmt: skip
            assert line in text.splitlines(), line
    for line in ("ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=read-only", "ReadWritePaths=/srv/pairctl/run"):
        assert line in system.splitlines() and line not in user
    assert "PrivateDevices" not in system  # the GPUs' device nodes stay reachable
    assert re.search(r"^CapabilityBoundingSet=.*CAP_SETUID", system, re.M) and "CAP_SYS_ADMIN" not in system


def test_a_private_tmp_is_left_out_when_it_would_hide_what_the_service_reads():
    """A root or a model under /tmp or /var/tmp would vanish under PrivateTmp= (226/NAMESPACE)."""

    def unit(root: str, *argv: str) -> list[str]:
        exec_argv = ["/bin/sh", f"{root}/bin/pairctl-svc", "supervise", root, *argv]
        text = render_unit(
            pair="p", service="llama-server", root=root, supervision=Supervision(), user=False, exec_argv=exec_argv
        )
        return text.splitlines()

    assert "PrivateTmp=yes" in unit("/srv/pairctl", "/srv/m.gguf")
    assert "PrivateTmp=yes" not in unit("/tmp/ci/state/root", "/bin/true")
    assert "PrivateTmp=yes" not in unit("/srv/pairctl", "-m", "/var/tmp/models/m.gguf")
    assert "PrivateTmp=yes" not in unit("/srv/pairctl", "--model=/tmp/m.gguf")
    assert "PrivateTmp=yes" in unit("/srv/pairctl", "/tmpfoo/m.gguf")  # only /tmp itself and below
    assert "ProtectSystem=strict" in unit("/tmp/r")  # the rest of the sandbox stays


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_hardened_units_verify_and_score_on_this_hosts_systemd(tmp_path):
    """The host's own systemd-analyze: both scopes verify; `security --offline` scores the system
    unit's exposure (9.6 "UNSAFE" before this hardening; measured 3.4 on systemd 252)."""
    name = "pairctl-p-llama-server-00000000.service"
    assert verify_units({name: _unit(user=False)}) == []
    assert verify_units({name: _unit(user=True)}) == []  # (a user manager needs a runtime dir this test lacks)
    (tmp_path / name).write_text(_unit(user=False))
    res = subprocess.run(["systemd-analyze", "security", "--offline=true", str(tmp_path / name)],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", res.stdout + res.stderr)
    if m is None:
        pytest.skip(f"this systemd-analyze has no offline security scoring: {res.stderr[-200:]}")
    assert float(m.group(1)) <= 4.0, res.stdout[-3000:]


def _host(**kw: object) -> HostSpec:
    return HostSpec.model_validate({"address": "10.0.0.1", "install_root": "/srv/p", "role": "native", **kw})


def test_system_scope_needs_an_unprivileged_service_user():
    with pytest.raises(ValueError, match="would run llama-server and ggml-rpc-server as root; set service_user"):
        _host(user="root", service_manager="systemd", systemd_scope="system")
    assert _host(user="root", service_manager="systemd", systemd_scope="system", service_user="pairctl")
    with pytest.raises(ValueError, match="needs `user: root`"):
        _host(user="deploy", service_user="pairctl")
    with pytest.raises(ValueError, match="must not be root"):
        _host(user="root", service_user="root")
    with pytest.raises(ValueError):
        _host(user="root", service_user="bad name;rm")


def test_the_service_user_reaches_the_supervisor():
    assert "sup.user=pairctl" in sup_args(Supervision(), user="pairctl")
    assert not any(a.startswith("sup.user=") for a in sup_args(Supervision()))


def test_the_kernel_checks_rpc_server_runs_as_the_service_user(tmp_path):
    from orchestrator.checks.kernels import RpcServerPlan

    plan = RpcServerPlan(host="h", root="/r/run/kernel-check", binary="/r/b", bind="10.0.0.2", port=2,
                         allow=("10.0.0.1",), user="pairctl")  # fmt: skip
    argv = list(plan.start_cmd().argv)
    assert (
        "sup.allow=10.0.0.1" in argv
        and "sup.user=pairctl" in argv
        and argv.index("sup.user=pairctl") < argv.index("/r/b")
    )


def test_a_units_writable_path_is_the_state_dir_run_links_to():
    """run/ is a link to the host's state_dir: ReadWritePaths= names the directory it resolves to
    (not the link's name), and a state_dir under /tmp, which PrivateTmp= would hide, leaves the
    private /tmp out as a root there does."""

    def unit(state: str) -> list[str]:
        return render_unit(
            pair="p", service="llama-server", root="/srv/pairctl", supervision=Supervision(), user=False,
            exec_argv=["/bin/sh", "/srv/pairctl/bin/pairctl-svc", "supervise", "/srv/pairctl", "llama-server"],
            state=state,
        ).splitlines()  # fmt: skip

    lines = unit("/srv/pairctl.state")
    assert "ReadWritePaths=/srv/pairctl.state" in lines and "PrivateTmp=yes" in lines
    assert not any(x.startswith("ReadWritePaths=/srv/pairctl/run") for x in lines)
    lines = unit("/tmp/pairctl-state")
    assert "ReadWritePaths=/tmp/pairctl-state" in lines and "PrivateTmp=yes" not in lines
