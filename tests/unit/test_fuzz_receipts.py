"""Issue 10, bad input: the receipt reader under hypothesis, through the real CLI.

A small evidence store is written with the real `EvidenceStore` (receipts with steps,
identities, samples, notes; a pair chain and the pair-less chain), then each example copies it
and damages it: bytes flipped, files truncated, a receipt replaced by garbage *renamed to the
hash of the garbage* (so the name check passes and the parser sees it), random JSON under a
valid name, junk in heads/, index/, journal/ and locks/, files deleted, a directory or a dangling
symlink where a file should be. Then `pairctl receipts list|show|verify --evidence DIR` runs.

The promise on every input: no traceback and no "internal error" reaches the user, only a clear
message and a nonzero exit where something is wrong; `verify` fails (exit 10, EVIDENCE) whenever
a receipt's bytes changed; and nothing outside the process is touched (same audit hook as the
config fuzzing).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from orchestrator.evidence.store import EvidenceStore
from tests.unit.test_fuzz_config import _TOUCHES, _install_hook

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each example runs the CLI ~10 times
)

OK_OR_ERROR = {0, 1, 2, 10}  # 2: usage (e.g. a hash that is not hex), 10: evidence problem


def _write_store(root: Path) -> list[str]:
    store = EvidenceStore(root)
    shas = []
    for i, outcome in enumerate(["passed", "failed", "passed"]):
        j = store.begin(
            "deploy",
            argv=["pairctl", "deploy", "--pair", "lab", f"#{i}"],
            pair="lab",
            inputs={"package:native": f"pkg-{i}", "profile": "0" * 64},
        )
        with j.step("preflight", host="local") as s:
            s.data["n"] = i
        with j.step("upload", host="lab-native") as s:
            s.data["bytes"] = 1000 * i
        j.identity("lab-native", {"exe_sha256": "a" * 64, "argv": ["llama-server", "-np", "2"]})
        j.samples("upload", [{"i": k, "t": k / 10} for k in range(5)])
        j.note(f"note {i}")
        shas.append(j.finish(outcome, f"run {i} {outcome}"))
    j = store.begin("status", argv=["pairctl", "status"], pair=None)
    with j.step("host", host="lab-rpc") as s:
        s.data["running"] = True
    shas.append(j.finish("passed", "pair as recorded"))
    return shas


@pytest.fixture(scope="module")
def base_store(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("evidence-base") / "evidence"
    shas = _write_store(root)
    return root, shas


@pytest.fixture
def run_receipts(cli):
    _install_hook()

    def run(*args: str):
        _TOUCHES.events = []
        _TOUCHES.armed = True
        try:
            res = cli("receipts", *args)
        finally:
            _TOUCHES.armed = False
        out = res.output
        assert "Traceback" not in out, out[-3000:]
        assert "internal error" not in out, (args, out[-3000:])
        assert not _TOUCHES.events, _TOUCHES.events
        assert res.exit_code in OK_OR_ERROR, (args, res.exit_code, out[-2000:])
        if res.exit_code not in (0,):
            assert out.strip(), "a failure with no message"
        return res

    return run


def test_base_store_verifies_and_shows(base_store, run_receipts):
    root, shas = base_store
    assert run_receipts("verify", "--evidence", str(root)).exit_code == 0
    for sha in shas:
        r = run_receipts("show", sha, "--evidence", str(root))
        assert r.exit_code == 0 and sha in r.stdout
    assert run_receipts("list", "--evidence", str(root)).exit_code == 0


def test_one_flipped_byte_fails_verify(base_store, run_receipts, tmp_path):
    """The check can fail: one changed byte in one receipt is exit 10 naming it."""
    root, shas = base_store
    d = tmp_path / "ev"
    shutil.copytree(root, d)
    p = d / "receipts" / f"{shas[1]}.json"
    os.chmod(p, 0o644)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    r = run_receipts("verify", "--evidence", str(d))
    assert r.exit_code == 10 and shas[1][:12] in r.output


# -- damage -------------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=15,
)


@st.composite
def damage(draw, shas: list[str]):
    """A list of (operation, target, payload) applied in order to a copy of the store."""
    targets = ["receipt", "heads", "index", "journal", "locks", "root"]
    ops = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        where = draw(st.sampled_from(targets))
        sha = draw(st.sampled_from(shas))
        op = draw(
            st.sampled_from(
                [
                    "flip",
                    "truncate",
                    "garbage-renamed",
                    "json-renamed",
                    "mutate-json",
                    "junk-file",
                    "delete",
                    "dir-instead",
                    "dangling-link",
                ]
            )
        )
        payload = {
            "pos": draw(st.integers(min_value=0, max_value=10_000)),
            "bytes": draw(st.binary(max_size=200)),
            "json": draw(json_values),
            "name": draw(
                st.sampled_from(
                    [
                        "lab",
                        "_no-pair",
                        "x.json",
                        "0" * 64 + ".json",
                        "run-1.jsonl",
                        "lab.pending",
                        "lab.lock",
                        ".hidden",
                        "y" * 200,
                    ]
                )
            ),
        }
        ops.append((op, where, sha, payload))
    return ops


def _set(obj, path_choice: int, value):
    """Replace one field somewhere in a parsed receipt (deterministic walk by index)."""
    nodes = []

    def walk(o):
        if isinstance(o, dict):
            for k in o:
                nodes.append((o, k))
                walk(o[k])
        elif isinstance(o, list):
            for i in range(len(o)):
                nodes.append((o, i))
                walk(o[i])

    walk(obj)
    if nodes:
        parent, key = nodes[path_choice % len(nodes)]
        parent[key] = value
    return obj


def _apply(root: Path, ops) -> bool:
    """Damage the copy; returns whether any receipt file's bytes (or presence) changed."""
    receipts_changed = False
    for op, where, sha, pl in ops:
        rdir = root / "receipts"
        folder = {
            "receipt": rdir,
            "heads": root / "heads",
            "index": root / "index",
            "journal": root / "journal",
            "locks": root / "locks",
            "root": root,
        }[where]
        folder.mkdir(parents=True, exist_ok=True)
        existing = sorted(p for p in folder.iterdir() if p.is_file() and not p.is_symlink())
        target = (
            (rdir / f"{sha}.json")
            if where == "receipt"
            else (existing[pl["pos"] % len(existing)] if existing else folder / pl["name"])
        )
        if target.is_file():
            os.chmod(target, 0o644)
        if op in ("flip", "truncate", "mutate-json", "delete") and not target.is_file():
            op = "junk-file"
        if op == "flip":
            data = bytearray(target.read_bytes())
            if data:
                data[pl["pos"] % len(data)] ^= 1 + (pl["pos"] % 255)
                target.write_bytes(bytes(data))
        elif op == "truncate":
            data = target.read_bytes()
            target.write_bytes(data[: pl["pos"] % max(1, len(data))])
        elif op == "mutate-json":
            try:
                obj = json.loads(target.read_bytes())
                target.write_text(json.dumps(_set(obj, pl["pos"], pl["json"])))
            except ValueError:
                target.write_bytes(pl["bytes"])
        elif op == "delete":
            target.unlink()
        elif op in ("garbage-renamed", "json-renamed"):
            data = pl["bytes"] if op == "garbage-renamed" else json.dumps(pl["json"]).encode()
            name = hashlib.sha256(data).hexdigest() + ".json" if where == "receipt" else pl["name"]
            if (folder / name).is_dir():  # an earlier dir-instead took the name (found 2026-12-06): beside it
                name += ".junk"
            (folder / name).write_bytes(data)
        elif op == "junk-file":
            junk = folder / pl["name"]
            if junk.is_dir():  # an earlier dir-instead took the name: the junk goes beside it
                junk = folder / (pl["name"] + ".junk")
            junk.write_bytes(pl["bytes"])
        elif op == "dir-instead":
            victim = folder / pl["name"]
            if victim.is_file() or victim.is_symlink():  # a dangling link left by an earlier op is no dir either
                victim.unlink()
            victim.mkdir(exist_ok=True)
        elif op == "dangling-link":
            victim = folder / pl["name"]
            if victim.is_file() or victim.is_symlink():
                victim.unlink()
            if not victim.exists():
                victim.symlink_to(folder / "does-not-exist")
        if where in ("receipt",) or (where == "root"):
            receipts_changed = receipts_changed or where == "receipt"
    return receipts_changed


def _receipt_bytes(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    rdir = root / "receipts"
    for p in sorted(rdir.iterdir()) if rdir.is_dir() else []:
        out[p.name] = p.read_bytes() if p.is_file() else None
    return out


@FUZZ
@given(data=st.data())
def test_damaged_store(base_store, run_receipts, tmp_path_factory, data):
    root, shas = base_store
    d = tmp_path_factory.mktemp("ev") / "evidence"
    shutil.copytree(root, d, symlinks=True)
    before = _receipt_bytes(d)
    _apply(d, data.draw(damage(shas)))
    after = _receipt_bytes(d)

    v = run_receipts("verify", "--evidence", str(d))
    if after != before:
        assert v.exit_code == 10, f"receipts changed but verify passed:\n{v.output[-2000:]}"
    run_receipts("verify", "--json", "--evidence", str(d))
    run_receipts("list", "--evidence", str(d))
    run_receipts("list", "--json", "--pair", "lab", "--evidence", str(d))
    for sha in shas + [shas[0][:8]]:
        r = run_receipts("show", sha, "--evidence", str(d))
        if r.exit_code == 0:
            # a receipt that shows must be one that is byte-identical to what was written
            assert before.get(f"{r.stdout.split()[1]}.json") == after.get(f"{r.stdout.split()[1]}.json")
    run_receipts("show", "--json", shas[0], "--evidence", str(d))
    for name in after:
        if name.endswith(".json") and name[:-5] not in shas:
            run_receipts("show", name[:-5], "--evidence", str(d))  # what the damage added


@FUZZ
@given(ref=st.text(max_size=80))
def test_show_with_any_reference(base_store, run_receipts, ref):
    root, _ = base_store
    if ref.startswith("-"):
        ref = "x" + ref
    run_receipts("show", ref, "--evidence", str(root))
