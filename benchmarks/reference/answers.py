"""Raw figures of `reference_logprobs` from a test home's receipts, and the section of
docs/reference-answers.md written from them (issue 30: no figure there is typed by hand).

    python benchmarks/reference/answers.py collect HOME [--pair lab]   # merge into RAW
    python benchmarks/reference/answers.py render                      # RAW -> the docs section

`collect` keeps, per receipt with a `check:reference_logprobs` step, what the check recorded:
for a recording (role `reference`) the numerics key, the replay floor and the gates derived from
it; for a comparison (role `candidate`) the figures, the gates in force and the verdict, with the
candidate package's patch (a mutant's name) read from the package store. RAW is a JSON list kept
in the repo; `render` replaces the section from its heading to the next `## ` heading.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "benchmarks/results/reference_answers.json"
DOC = ROOT / "docs/reference-answers.md"
HEADING = "## Measured per numerics key (generated)"
STEP = "check:reference_logprobs"


def _profile(r: Any, raw: Mapping[str, Any]) -> str:
    if raw.get("profile"):
        return str(raw["profile"])
    argv = list(r.argv)
    return argv[argv.index("--profile") + 1] if "--profile" in argv else "(active)"


def _patch(home: Path, package: str) -> str:
    """The package's patch name; a mutant built from an older version of its folder is `NAME@old`."""
    try:
        m = json.loads((home / "packages" / package / "manifest.json").read_text())
    except (OSError, ValueError):
        return "?"
    patch = m.get("patch") or {}
    name = str(patch.get("name") or "none")
    meta = ROOT / "tests/mutants" / name / "kernel.yaml"
    if name != "none" and meta.is_file() and f"patch_sha256: {patch.get('sha256')}" not in meta.read_text():
        return name + "@old"
    return name


def rows(home: Path, receipts: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for r in receipts:
        st = r.step(STEP)
        raw = (st.data.get("raw") if st is not None else None) or {}
        if not raw.get("numerics") or raw.get("role") not in ("reference", "candidate", "replay"):
            continue  # before numerics keys (issue 30), or a check that did not get as far
        row: dict[str, Any] = {
            "receipt": r.sha256,
            "finished_at": r.finished_at,
            "command": r.command,
            "outcome": r.outcome,
            "profile": _profile(r, raw),
            "role": raw["role"],
            "key": str(raw.get("key", ""))[:12],
            "numerics": raw["numerics"],
            "models": raw.get("models"),
            "package": (raw.get("packages") or ["?"])[0],
            "verdict": st.data.get("verdict") if st is not None else None,
            "message": (st.data.get("message") or "")[:300] if st is not None else "",
        }
        row["patch"] = _patch(home, row["package"])
        if raw["role"] in ("reference", "replay"):
            row |= {k: raw.get(k) for k in ("floor", "floor_factor", "minimum", "derived_gates")}
        else:
            row |= {k: raw.get(k) for k in ("summary", "spread", "gates_in_force", "tolerance", "reference_floor")}
            row["greedy_flips"] = sum(int(f.get("greedy_flips") or 0) for f in raw.get("fixtures") or [])
        out.append(row)
    return out


def collect(home: Path, pair: str) -> int:
    from orchestrator.evidence.store import EvidenceStore

    old = json.loads(RAW.read_text()) if RAW.is_file() else []
    seen = {x["receipt"] for x in old}
    found = rows(home, EvidenceStore(home / "evidence").iter(pair=pair))
    new = [x for x in found if x["receipt"] not in seen and not x["patch"].endswith("@old")]
    RAW.parent.mkdir(parents=True, exist_ok=True)
    RAW.write_text(json.dumps(old + new, indent=1, sort_keys=True) + "\n")
    print(f"{RAW.relative_to(ROOT)}: {len(new)} new rows, {len(old) + len(new)} in all")
    return 0


def g(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return "0" if x == 0 else f"{x:.3g}"
    return str(x)


def _numerics(n: Mapping[str, Any]) -> str:
    kv = f"KV {n.get('cache_type_k')}/{n.get('cache_type_v')}"
    s = f"{kv}, FA {n.get('flash_attn')}, devices {'+'.join(n['device_kinds'])}"
    s += f", threads {n['threads']}" if "threads" in n else ""
    s += f", ubatch {n['ubatch_size']}" if "ubatch_size" in n else ""
    return s + (f", split {json.dumps(n['split'])}" if n.get("split") else "")


def _model(row: Mapping[str, Any]) -> str:
    return ", ".join(sorted((row.get("models") or {}).keys())) or "?"


def render(data: list[dict[str, Any]]) -> str:
    named = {x["key"]: x["profile"] for x in data if not x["profile"].startswith("(")}
    # rows from before the check kept its profile name: the name another row of the same key carries
    data = [{**x, "profile": named.get(x["key"], x["profile"]) if x["profile"].startswith("(") else x["profile"]}
            for x in data]  # fmt: skip
    refs = [x for x in data if x["role"] in ("reference", "replay")]
    cands = [x for x in data if x["role"] == "candidate"]
    md = [
        HEADING,
        "",
        f"Written by `benchmarks/reference/answers.py render` from `{RAW.relative_to(ROOT)}` (collected from the "
        "receipts of lab runs with `... collect HOME`); nothing here is typed by hand.",
        "",
        "### Replay floor and derived gates, per numerics key",
        "",
        "The reference pair records its answers, replays them at once, and derives each gate as floor x factor, "
        "at least the minimum. `devices unknown`: recorded before the check read the device kind from the "
        "package manifest (the lab's CPUs); the comparisons are the same.",
        "",
        "| key | profile | numerics | positions | floor mean KL | floor max KL | floor max abs dlogprob | factor "
        "| gate mean KL | gate max KL | gate max abs dlogprob | recorded |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    latest: dict[str, dict[str, Any]] = {}
    for x in refs:
        latest[x["key"]] = x
    for x in latest.values():
        f, d = x.get("floor") or {}, x.get("derived_gates") or {}
        md.append(
            f"| `{x['key']}` | {x['profile']} | {_numerics(x['numerics'])} | {g(f.get('positions'))} | "
            f"{g(f.get('mean_kl'))} | {g(f.get('max_kl'))} | {g(f.get('max_abs_dlogprob'))} | "
            f"{g(x.get('floor_factor'))} | {g(d.get('max_mean_kl'))} | {g(d.get('max_kl'))} | "
            f"{g(d.get('max_abs_dlogprob'))} | {x['finished_at'][:16]} |"
        )
    md += [
        "",
        "### Candidates judged against them",
        "",
        "Patch `none` is the baseline package (a legitimate change of settings); any other is a mutant "
        "(tests/mutants). Gates: those in force (derived, or a profile tolerance with its reason).",
        "",
        "`max abs dlogprob` is gated: the union of both sides' top-K, a token that crosses the cut counted at "
        "the other side's smallest listed logprob. `both listed` is the largest movement of a token both "
        "sides list (the cut left out: how far the numbers themselves moved); `–` where the receipt predates it.",
        "",
        "| key | profile | patch | positions | mean KL | max KL | top-1 | median abs dlogprob | max abs dlogprob "
        "| both listed | greedy flips | gate max KL | gate max abs dlogprob | verdict | deploy |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for x in sorted(cands, key=lambda x: (x["key"], x["patch"] != "none", x["patch"], x["profile"], x["finished_at"])):
        s, gi = x.get("summary") or {}, x.get("gates_in_force") or {}
        tol = " (tolerance)" if x.get("tolerance") else ""
        md.append(
            f"| `{x['key']}` | {x['profile']} | {x['patch']} | {g(s.get('positions'))} | {g(s.get('mean_kl'))} | "
            f"{g(s.get('max_kl'))} | {g(s.get('top1'))} | {g((x.get('spread') or {}).get('median_abs_dlogprob'))} | "
            f"{g(s.get('max_abs_dlogprob'))} | "
            f"{g((x.get('spread') or {}).get('shared_max_abs_dlogprob'))} | "
            f"{g(x.get('greedy_flips'))} | "
            f"{g(gi.get('max_kl'))}{tol} | {g(gi.get('max_abs_dlogprob'))}{tol} | {x['verdict']} | "
            f"{x['command']} {x['outcome']} |"
        )
    reasons = sorted({(x["profile"], x["tolerance"]["reason"]) for x in cands if x.get("tolerance")})
    if reasons:
        md += ["", "Tolerances in force (profile: reason):", ""]
        md += [f"- `{p}`: {r}" for p, r in reasons]
    return "\n".join(md) + "\n"


def write_doc(section: str) -> None:
    text = DOC.read_text()
    if HEADING in text:
        start = text.index(HEADING)
        nxt = text.find("\n## ", start + len(HEADING))
        text = text[:start] + section + (text[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOC.write_text(text)


def main(argv: list[str]) -> int:
    if argv[:1] == ["collect"] and len(argv) >= 2:
        pair = argv[argv.index("--pair") + 1] if "--pair" in argv else "lab"
        return collect(Path(argv[1]), pair)
    if argv[:1] == ["render"]:
        write_doc(render(json.loads(RAW.read_text())))
        print(f"{DOC.relative_to(ROOT)}: section {HEADING!r} written")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
