"""The example commands of README.md and of every guide (docs/guides/*.md), expanded the way a
reader takes them; tests/e2e/test_readme_examples.py runs them.

`examples()` reads every `pairctl ...` line of the documents' code blocks (fenced blocks without a
language or marked sh/shell/bash/console, and indented blocks), README first, then the guides
sorted by file name, and expands its notation into the command lines it stands for:
- `a|b` inside one word (`restart|stop|start`, `--host native|rpc`): each alternative;
- ` | ` between forms: an alternative to the first form's last option (`--dry-run | --to
  RELEASE`) or, when it starts with a word, to its subcommand (`list ... | show HASH`);
- `[...]`: once with every optional part, then once without any.
Placeholders (ID, HASH, RELEASE, ...) are left for the runner to fill in.

A block's context is named by an HTML comment on the line before its fence (or the indented
block): `<!-- examples: config-repo -->` runs its lines in a config repository that the
document's own `pairctl init` made (PAIRCTL_CONFIG, PAIRCTL_INVENTORY=site, a home of its own);
every other block runs against the lab pair.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = ROOT / "docs" / "guides"
_FENCE_LANGS = {"", "sh", "shell", "bash", "console"}
_CONTEXT = re.compile(r"^<!--\s*examples:\s*([a-z-]+)\s*-->\s*$")
CONTEXTS = ("lab", "config-repo")


def documents() -> list[Path]:
    """The documents whose examples run: README.md, then every guide by file name."""
    return [README, *sorted(GUIDES.glob("*.md"))]


@dataclass(frozen=True)
class Example:
    lineno: int
    line: str  # the line without its comment: what a list of lines not run is keyed by
    argv: tuple[str, ...]  # the words after `pairctl`, placeholders not yet filled
    source: Path = README
    context: str = "lab"  # "config-repo": run in the config repo the document's `init` made

    @property
    def where(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.lineno}"


def example_lines(text: str) -> list[tuple[int, str]]:
    """(line number, `pairctl ...` without `$ ` and comment) of every example line."""
    return [(n, line) for n, line, _ in example_lines_in_context(text)]


def example_lines_in_context(text: str) -> list[tuple[int, str, str]]:
    """(line number, `pairctl ...` line, context) of every example line."""
    return [(n, line, c) for n, line, c in code_lines(text) if line.startswith("pairctl ")]


def code_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, line without `$ ` and comment, context) of every non-empty line of the code
    blocks whose `pairctl` lines are examples: a guide followed as a whole reads its other lines
    (`export`, `$EDITOR`, ...) too."""
    out: list[tuple[int, str, str]] = []
    fence: str | None = None
    pending = context = "lab"  # the marker waiting for the next block; the current block's context
    indented = False  # inside an indented block (blank lines keep it)
    for n, raw in enumerate(text.splitlines(), 1):
        if fence is None:
            m = _CONTEXT.match(raw.strip())
            if m:
                assert m.group(1) in CONTEXTS, f"line {n}: unknown examples context {m.group(1)!r}"
                pending = m.group(1)
                continue
            if raw.startswith("```"):
                fence, context, pending, indented = raw[3:].strip(), pending, "lab", False
                continue
            if raw.startswith("    "):
                if not indented:
                    context, pending, indented = pending, "lab", True
            elif raw.strip():
                indented = False
            in_code = indented and raw.startswith("    ")
        else:
            if raw.startswith("```"):
                fence = None
                continue
            in_code = fence in _FENCE_LANGS
        line = " ".join(raw.strip().removeprefix("$ ").split("#", 1)[0].split())
        if in_code and line:
            out.append((n, line, context))
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


def examples(docs: list[Path] | None = None) -> list[Example]:
    """Every expanded example of `docs` (default: README.md and the guides), in the order they run."""
    return [
        Example(n, line, argv, path, context)
        for path in (documents() if docs is None else docs)
        for n, line, context in example_lines_in_context(path.read_text())
        for argv in expand(line)
    ]
