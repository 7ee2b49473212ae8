"""Acceptance results for the Prometheus node-exporter textfile collector, one file per pair.

prometheus_client renders the exposition format and writes the file atomically (temp + rename),
so a scrape never sees half a file. The last-success timestamp survives a failed run by being
read back from the previous file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile
from prometheus_client.parser import text_string_to_metric_families

LAST_SUCCESS = "pairctl_acceptance_last_success_timestamp_seconds"
LAST_RUN = "pairctl_acceptance_last_run_timestamp_seconds"


def textfile_path(directory: Path, pair: str) -> Path:
    return directory / f"pairctl_{re.sub(r'[^A-Za-z0-9_]', '_', pair)}.prom"


def _previous_success(path: Path) -> float | None:
    if not path.exists():
        return None
    try:
        for fam in text_string_to_metric_families(path.read_text()):
            if fam.name == LAST_SUCCESS:
                for s in fam.samples:
                    return float(s.value)
    except Exception:
        return None
    return None


def write_acceptance(
    directory: Path,
    *,
    pair: str,
    now: float,
    passed: bool,
    checks: Mapping[str, bool],
    tokens_per_second: float | None,
    skipped: bool = False,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = textfile_path(directory, pair)
    previous = _previous_success(path)
    reg = CollectorRegistry()
    last_ok = now if passed and not skipped else previous
    # in this order in the file; a value of None registers the gauge without a sample
    for name, doc, value in (
        (LAST_RUN, "Unix time of the last acceptance run", now),
        (LAST_SUCCESS, "Unix time of the last passing acceptance run", last_ok),
        ("pairctl_acceptance_passed", "1 if the last acceptance run passed", 1 if passed else 0),
        ("pairctl_acceptance_skipped", "1 if the last scheduled run was skipped (pair leased)", 1 if skipped else 0),
    ):
        g = Gauge(name, doc, ["pair"], registry=reg)
        if value is not None:
            g.labels(pair).set(value)
    cg = Gauge(
        "pairctl_acceptance_check_passed", "1 if the check passed in the last run", ["pair", "check"], registry=reg
    )
    for name, ok in sorted(checks.items()):
        cg.labels(pair, name).set(1 if ok else 0)
    if tokens_per_second is not None:
        doc = "Generation tokens/s measured by the last acceptance run"
        Gauge("pairctl_generation_tokens_per_second", doc, ["pair"], registry=reg).labels(pair).set(tokens_per_second)
    write_to_textfile(str(path), reg)
    path.chmod(0o644)
    return path
