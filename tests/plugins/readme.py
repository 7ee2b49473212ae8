"""The README's example commands, expanded the way a reader takes them (issue 34: "The README's
examples are checked by a test that runs them"; tests/e2e/test_readme_examples.py runs them).

`examples()` reads every `pairctl ...` line of README.md's code blocks (fenced blocks without a
language, and indented blocks) and expands its notation into the command lines it stands for:
- `a|b` inside one word (`restart|stop|start`, `--host native|rpc`): each alternative;
- ` | ` between forms: an alternative to the first form's last option (`--dry-run | --to
  RELEASE`) or, when it starts with a word, to its subcommand (`list ... | show HASH`);
- `[...]`: once with every optional part, then once without any.
Placeholders (ID, HASH, RELEASE, ...) are left for the runner to fill in.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_FENCE_LANGS = {"", "sh", "shell", "bash", "console"}


@dataclass(frozen=True)
class Example:
    lineno: int
    line: str  # the README line without its comment: what a list of lines not run is keyed by
    argv: tuple[str, ...]  # the words after `pairctl`, placeholders not yet filled


def example_lines(text: str) -> list[tuple[int, str]]:
    """(line number, `pairctl ...` without `$ ` and comment) of every example line."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("```"):
            fence = None if fence is not None else raw[3:].strip()
            continue
        in_code = fence in _FENCE_LANGS if fence is not None else raw.startswith("    ")
        line = raw.strip().removeprefix("$ ")
        if in_code and line.startswith("pairctl "):
            out.append((n, " ".join(line.split("#", 1)[0].split())))
    return out


def _forms(words: list[str]) -> list[list[str]]:
    """` | ` alternatives, each made whole (see the module docstring)."""
    parts: list[list[str]] = [[]]
    for w in words:
        if w == "|":
            parts.append([])
        else:
            parts[-1].append(w)
    first, out = parts[0], [parts[0]]
    for alt in parts[1:]:
        if alt[0].startswith("-"):
            cut = max(i for i, w in enumerate(first) if w.lstrip("[").startswith("-"))
        else:
            cut = next((i for i, w in enumerate(first) if w.startswith(("-", "["))), len(first)) - 1
        out.append(first[:cut] + alt)
    return out


def _optional(line: str) -> list[str]:
    """With every `[...]` part, then (if different) without any."""
    full = " ".join(line.replace("[", " ").replace("]", " ").split())
    bare = line
    while True:
        shorter = re.sub(r"\[[^\[\]]*\]", "", bare)
        if shorter == bare:
            break
        bare = shorter
    bare = " ".join(bare.split())
    return [full] if bare == full else [full, bare]


def _alternatives(word: str) -> list[str]:
    """`native|rpc]` -> `native]`, `rpc]`: the brackets around a word belong to each alternative."""
    core = word.strip("[]")
    lead, trail = word[: len(word) - len(word.lstrip("["))], word[len(word.rstrip("]")) :]
    return [lead + alt + trail for alt in core.split("|")] if core else [word]


def expand(line: str) -> list[tuple[str, ...]]:
    """Every command line `line` (`pairctl ...`) stands for, in the order a test runs them."""
    out: list[tuple[str, ...]] = []
    for form in _forms(line.split()[1:]):
        choices = [_alternatives(w) for w in form]
        for words in itertools.product(*choices):
            for variant in _optional(" ".join(words)):
                argv = tuple(variant.split())
                if argv not in out:
                    out.append(argv)
    return out


def examples(readme: Path = README) -> list[Example]:
    return [Example(n, line, argv) for n, line in example_lines(readme.read_text()) for argv in expand(line)]
