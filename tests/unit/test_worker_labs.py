"""tests/plugins/workers.py's address plan: every xdist worker's lab hosts on addresses of their own."""

from __future__ import annotations

import itertools

import pytest
import yaml

from orchestrator.paths import MANIFESTS
from tests.plugins import workers


def _addresses(name: str) -> list[str]:
    return [
        h["address"] for h in yaml.safe_load((MANIFESTS / "inventories" / f"{name}.yaml").read_text())["hosts"].values()
    ]


def test_no_two_workers_or_inventories_share_an_address(monkeypatch):
    monkeypatch.delenv(workers.NET_ENV, raising=False)
    bundled = [a for name in ("lab", "lab3", "labfaults") for a in _addresses(name)]
    assert len(set(bundled)) == len(bundled)  # the inventories among themselves
    seen: dict[str, tuple[int, str]] = {}
    for index, address in itertools.product(range(8), bundled):
        mine = workers.worker_address(address, index)
        assert mine.startswith("127.0.4.") and mine not in seen, (index, address, seen.get(mine))
        seen[mine] = (index, address)
    spare = {workers.worker_address(a, i) for i in range(8) for a in ("127.0.0.30", "127.0.0.31")}
    assert not spare & set(seen)  # spare_addresses() under xdist: clear of every worker's inventories


def test_an_address_or_worker_outside_the_plan_is_refused():
    for address, index in (("127.0.0.40", 0), ("10.0.0.2", 0), ("127.0.0.2", 8)):
        with pytest.raises(ValueError, match="no worker address"):
            workers.worker_address(address, index)


def test_the_worker_id_and_offset_give_the_block(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv(workers.OFFSET_ENV, "6")
    assert workers.worker_index() == 7
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert workers.worker_index() is None
