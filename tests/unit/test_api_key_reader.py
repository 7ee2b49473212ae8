"""Every command reads a pair's API key through one reader (`Inventory.api_key`): qualify too,
so an empty or unreadable key file stops it as it stops deploy, instead of running keyless."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.inventory import Inventory
from orchestrator.errors import ConfigError
from orchestrator.paths import Home
from orchestrator.qualify.engine_driver import EngineDriver


def _inventory(key_file: Path) -> Inventory:
    return Inventory.model_validate(
        {
            "hosts": {
                "n": {"address": "127.0.0.1", "install_root": "/srv/p", "role": "native", "transport": "local"},
                "r": {"address": "127.0.0.1", "install_root": "/srv/q", "role": "rpc", "transport": "local"},
            },
            "pairs": {"p": {"native": "n", "rpc": "r", "api_key_file": str(key_file)}},
        }
    )


def test_inventory_reads_the_key(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("# the pair's key\n\ns3cret\n")
    k = _inventory(key).api_key("p")
    assert k is not None and k.value == "s3cret" and k.file_bytes == key.read_bytes()


@pytest.mark.parametrize("content", ["  s3cret  \n", "s3cret\r\n", "s3cret\n\t\n", "s3cret\n   \n"])
def test_a_key_line_llama_server_would_read_otherwise_is_refused(tmp_path: Path, content: str) -> None:
    """llama-server takes every non-comment line verbatim: spaces or a CRLF '\\r' would be part of
    a key no client can send, and a line of spaces a key nobody meant."""
    key = tmp_path / "key"
    key.write_text(content)
    with pytest.raises(ConfigError, match=r"line \d+ has spaces, tabs or a carriage return"):
        _inventory(key).api_key("p")


@pytest.mark.parametrize("content", [None, "  \n"], ids=["unreadable", "empty"])
def test_qualify_refuses_a_bad_key_file(tmp_path: Path, content: str | None) -> None:
    key = tmp_path / "key"
    if content is not None:
        key.write_text(content)
    with pytest.raises(ConfigError, match="api_key_file"):
        EngineDriver(Home(tmp_path / "home"), _inventory(key), "p", argv=["qualify"])
