"""Fixtures the integration tests share."""

from __future__ import annotations

import pytest

from orchestrator.remote.pool import open_transport


@pytest.fixture(scope="module")
def t(lab):
    """An SSH transport to the session lab's native host (`lab-native`, strict host keys), one per module."""
    tr = open_transport(lab.inventory, "lab-native")
    yield tr
    tr.close()
