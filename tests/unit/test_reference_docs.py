"""docs/reference/ is what the code generates (`python -m orchestrator.docs`): a CLI option, a config
field, an exit code or a record field that changes without the checked-in reference fails here."""

from __future__ import annotations

from orchestrator import docs


def test_the_checked_in_reference_is_what_the_code_generates():
    bad = docs.stale()
    assert not bad, (
        f"docs/reference/ differs from the code in {', '.join(bad)}: run `{docs.REGENERATE}` and commit the result"
    )


def test_the_reference_covers_every_command_kind_and_exit_code():
    from orchestrator.cli.commands import COMMANDS
    from orchestrator.cli.config_registry import schemas
    from orchestrator.errors import ExitCode

    pages = docs.render()
    assert all(f"### pairctl {name}\n" in pages["cli.md"] for name in COMMANDS)
    assert "### pairctl receipts prune\n" in pages["cli.md"] and "`--older-than` DAYS" in pages["cli.md"]
    assert all(f"## `{kind}`\n" in pages["config.md"] for kind in schemas())
    assert "`keep_releases` | integer | 5 |" in pages["config.md"]
    assert all(f"| {c.value} | `{c.name}` |" in pages["exit-codes.md"] for c in ExitCode)
    assert "`evidence_head`" in pages["formats.md"] and "`reused_steps`" in pages["formats.md"]


def test_generation_is_deterministic_and_names_no_machine_paths(monkeypatch, tmp_path):
    first = docs.render()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PAIRCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "40")
    assert docs.render() == first
    text = "".join(first.values())
    assert str(docs.REFERENCE.parents[1]) not in text


def test_check_mode_names_a_stale_file_and_the_command(tmp_path, capsys):
    assert docs.main(["--out", str(tmp_path)]) == 0
    (tmp_path / "cli.md").write_text("old\n")
    assert docs.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "cli.md" in err and docs.REGENERATE in err
