"""Issue 10, bad input: the YAML loaders under hypothesis, through the real CLI.

`pairctl config check --kind KIND FILE` is fed (a) arbitrary text and bytes, (b) the repo's own
valid manifests with random structural mutations (keys dropped or added, values replaced by
values of other types, huge numbers, NaN, dates, nesting) and (c) a fixed set of hostile YAML
documents (alias bombs, deep nesting, python tags, duplicate and unhashable keys, NUL bytes).

The promise checked on every input: the user sees either `ok` (exit 0) or a clear error that
names the file (exit 3, CONFIG) — never a traceback, never pairctl's "internal error" fallback
(which means an exception escaped the loaders' error handling) — and no host is touched: a
Python audit hook records every socket connect and every process spawned during the command,
and there must be none.
"""

from __future__ import annotations

import math
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]

# kind -> a valid file of that kind in the repo (the base the mutations start from)
BASES = {
    "inventory": REPO / "manifests" / "inventories" / "lab.yaml",
    "profile": REPO / "manifests" / "profiles" / "production.yaml",
    "target": REPO / "manifests" / "targets" / "v100.yaml",
    "playbook": REPO / "playbooks" / "deploy.yaml",
    "plan": REPO / "manifests" / "plans" / "lab.yaml",
}
KINDS = sorted(BASES)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)


# -- "no host is touched": an audit hook that records network connects and process spawns ------


class _Touches(threading.local):
    def __init__(self) -> None:
        self.armed = False
        self.events: list[tuple[str, str]] = []


_TOUCHES = _Touches()
_WATCHED = {"socket.connect", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _TOUCHES.armed and event in _WATCHED:
        _TOUCHES.events.append((event, repr(args)[:200]))


_HOOK_INSTALLED = False


def _install_hook() -> None:
    global _HOOK_INSTALLED
    if not _HOOK_INSTALLED:
        sys.addaudithook(_audit)  # cannot be removed; inert unless armed (per thread)
        _HOOK_INSTALLED = True


@pytest.fixture
def guarded_cli(cli):
    """`cli(...)` that also returns what it touched outside the process (connects, spawns)."""
    _install_hook()

    def run(*args: str):
        _TOUCHES.events = []
        _TOUCHES.armed = True
        try:
            res = cli(*args)
        finally:
            _TOUCHES.armed = False
        return res, list(_TOUCHES.events)

    return run


def test_audit_hook_sees_a_connect_and_a_spawn(guarded_cli):
    """The guard can fail: a command that does open a socket and spawn a process is seen."""
    import socket
    import subprocess

    _install_hook()
    _TOUCHES.events = []
    _TOUCHES.armed = True
    try:
        with socket.socket() as s:
            s.settimeout(0.2)
            try:
                s.connect(("127.0.0.1", 9))  # discard port: refused or not, the attempt is what counts
            except OSError:
                pass
        subprocess.run(["true"], check=False)
    finally:
        _TOUCHES.armed = False
    kinds = {e for e, _ in _TOUCHES.events}
    assert "socket.connect" in kinds and "subprocess.Popen" in kinds


def assert_clean_outcome(res, touched, path: Path) -> None:
    out = res.output
    assert "Traceback" not in out, out[-3000:]
    assert "internal error" not in out, out[-3000:]
    assert not touched, f"config check touched something outside the process: {touched}"
    assert res.exit_code in (0, 3), (res.exit_code, out[-3000:])
    if res.exit_code == 3:
        assert str(path) in out or path.name in out, f"the error does not name the file:\n{out[-2000:]}"
        assert "pairctl: error:" in res.stderr
    else:
        assert "ok" in res.stdout and "FAIL" not in res.stdout


def _check(guarded_cli, kind: str, path: Path):
    res, touched = guarded_cli("config", "check", "--kind", kind, str(path))
    assert_clean_outcome(res, touched, path)
    return res


def test_every_base_is_valid(guarded_cli):
    """The mutation bases load (else the fuzzing below only ever sees one error)."""
    for kind, path in BASES.items():
        assert _check(guarded_cli, kind, path).exit_code == 0, kind


def test_a_broken_file_is_a_config_error(guarded_cli, tmp_path):
    """The promise can fail to hold in the harmless direction too: a broken file is exit 3 with its name."""
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    assert _check(guarded_cli, "profile", p).exit_code == 3


# -- (a) arbitrary text and bytes ---------------------------------------------------------------


@FUZZ
@given(kind=st.sampled_from(KINDS), text=st.text(max_size=400))
def test_arbitrary_text(guarded_cli, tmp_path_factory, kind, text):
    p = tmp_path_factory.mktemp("fuzz") / "input.yaml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    res = _check(guarded_cli, kind, p)
    if not text.strip():
        assert res.exit_code == 3


@FUZZ
@given(kind=st.sampled_from(KINDS), data=st.binary(max_size=400))
def test_arbitrary_bytes(guarded_cli, tmp_path_factory, kind, data):
    p = tmp_path_factory.mktemp("fuzz") / "input.yaml"
    p.write_bytes(data)
    _check(guarded_cli, kind, p)


# -- (b) structural mutations of valid manifests ------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        [
            "",
            " ",
            "0.0.0.0",
            "::",
            "../../etc/passwd",
            "$(reboot)",
            "; rm -rf /",
            "${NOPE}",
            "${PAIRCTL_HOME}",
            "~root",
            "a" * 300,
            "\x00",
            "\u202e",
            "all",
            "on",
            "yes",
            "null",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def mutated(draw, kind: str) -> Any:
    doc = yaml.safe_load(BASES[kind].read_text())
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "delete", "add-key", "wrap", "duplicate-item"]))
        if path == ():
            if op == "replace":
                doc = draw(values)
            elif op == "add-key" and isinstance(doc, dict):
                doc[draw(st.text(max_size=12))] = draw(values)
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "replace":
            parent[key] = draw(values)
        elif op == "delete":
            del parent[key]
        elif op == "add-key":
            target = parent[key]
            if isinstance(target, dict):
                target[draw(st.text(max_size=12))] = draw(values)
            else:
                parent[key] = {"unexpected": target}
        elif op == "wrap":
            parent[key] = [parent[key]]
        elif op == "duplicate-item" and isinstance(parent, list):
            parent.append(parent[key])
    return doc


def _dump(doc: Any) -> str:
    def clean(v: Any) -> Any:  # yaml.safe_dump cannot write NaN keys etc.; keep them as values only
        if isinstance(v, dict):
            return {(k if isinstance(k, (str, int, bool)) or k is None else str(k)): clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return yaml.safe_dump(clean(doc), allow_unicode=True, sort_keys=False)


@FUZZ
@given(data=st.data(), kind=st.sampled_from(KINDS))
def test_mutated_manifests(guarded_cli, tmp_path_factory, data, kind):
    doc = data.draw(mutated(kind))
    p = tmp_path_factory.mktemp("fuzz") / f"{kind}.yaml"
    p.write_text(_dump(doc), encoding="utf-8", errors="surrogatepass")
    _check(guarded_cli, kind, p)


# -- (c) hostile YAML ---------------------------------------------------------------------------


def _laughs(levels: int, key: str) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    lines.append(f"{key}: *l{levels - 1}")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "alias-bomb-list-field": _laughs(8, "extra_args"),
    "alias-bomb-mapping-field": _laughs(8, "hosts"),
    "alias-bomb-steps": _laughs(8, "steps"),
    "deep-list": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep-map": "a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n",
    "deep-value-of-field": "name: x\nctx_size: " + "[" * 3000 + "]" * 3000 + "\n",
    "python-object": "name: !!python/object/apply:os.system ['touch /tmp/pairctl-fuzz-pwned']\n",
    "python-name": "name: !!python/name:os.system\n",
    "duplicate-keys": "name: a\nname: b\nctx_size: 1\nctx_size: 2\nparallel: 1\n",
    "unhashable-key": "? [a, b]\n: 1\n",
    "non-string-keys": "1: a\ntrue: b\nnull: c\n2020-01-01: d\n",
    "dates-and-sets": "name: 2020-01-01\nctx_size: !!set {a, b}\nparallel: 2001-12-14t21:59:43.10-05:00\n",
    "binary": "name: !!binary aGVsbG8=\n",
    "huge-int": "ctx_size: " + "9" * 5000 + "\nparallel: 1\nname: x\n",
    "float-specials": "ctx_size: .nan\nparallel: .inf\nbatch_size: -.inf\nname: x\n",
    "nul": "name: a\x00b\n",
    "bom-and-tabs": "\ufeffname:\tx\n\tctx_size: 1\n",
    "merge-key": "base: &b {ctx_size: 1}\n<<: *b\nname: x\n",
    "bad-merge": "<<: [1, 2]\n",
    "multi-doc": "name: a\n---\nname: b\n",
    "only-comment": "# nothing\n",
    "scalar-top": "just a string\n",
    "list-top": "- a\n- b\n",
    "undefined-alias": "name: *nope\n",
    "unknown-tag": "name: !custom x\n",
    "bad-escape": 'name: "\\xZZ"\n',
    "latin1": "name: caf\xe9\n",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_yaml(guarded_cli, tmp_path, kind, case):
    p = tmp_path / f"{case}.yaml"
    text = HOSTILE[case]
    if case == "latin1":
        p.write_bytes(text.encode("latin-1"))
    else:
        p.write_text(text, encoding="utf-8")
    res = _check(guarded_cli, kind, p)
    assert res.exit_code == 3, res.output[-2000:]  # none of these is a valid manifest of any kind
    assert not Path("/tmp/pairctl-fuzz-pwned").exists()


def test_hostile_catalogue_is_not_all_valid_yaml():
    """Sanity: the hostile set reaches both the YAML parser's errors and the validators' errors."""
    parse_errors = 0
    for text in HOSTILE.values():
        try:
            yaml.safe_load(text)
        except Exception:
            parse_errors += 1
    assert 0 < parse_errors < len(HOSTILE)


def test_floats_survive_the_dump():
    assert math.isnan(yaml.safe_load(_dump({"x": float("nan")}))["x"])


def test_base_copy_in_another_folder_still_loads(guarded_cli, tmp_path):
    """The plan's fixtures resolve against the repo's plans folder, so a copy elsewhere is a fair base."""
    for kind, path in BASES.items():
        dst = tmp_path / f"{kind}.yaml"
        shutil.copyfile(path, dst)
        assert _check(guarded_cli, kind, dst).exit_code == 0, kind


def test_an_internal_error_prints_no_traceback(tmp_path):
    """The last line of defence: an exception no loader anticipated is one line and exit 1 on
    the terminal (the traceback, with its locals, goes only to the JSON log file)."""
    import subprocess

    code = (
        "import sys\n"
        "from orchestrator.cli import app, main\n"
        "import orchestrator.cli.commands\n"
        "@app.command('boom')\n"
        "def boom():\n"
        "    api_key = 'sk-local-secret'\n"
        "    raise RuntimeError('unexpected')\n"
        "main(['--home', sys.argv[1], 'boom'])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert p.returncode == 1, p.stderr
    assert "internal error: RuntimeError: unexpected" in p.stderr
    assert "Traceback" not in p.stderr and "sk-local-secret" not in p.stderr and "locals" not in p.stderr, p.stderr
    log = (tmp_path / "logs" / "pairctl.jsonl").read_text()
    assert "RuntimeError" in log  # the details are kept for whoever debugs it
