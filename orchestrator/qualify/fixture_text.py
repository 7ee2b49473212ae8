"""Deterministic fixture prompts (code / prose / structured): the shipped files under
manifests/fixtures/qualify/ are this module's output (a test regenerates them and compares
hashes), from `random.Random(seed)` only, long enough for any tokenizer's `tokens` prefix."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

WORDS = (
    "river stone light harbor quiet engine morning signal garden winter paper window orbit copper "
    "lantern valley market thread season mirror forest ladder bridge letter ocean shadow canvas "
    "silver meadow compass anchor feather candle harvest island journey kettle marble needle "
    "orchard pebble quarry rocket saddle timber umbrella velvet wagon yonder zephyr"
).split()
IDENTS = "count total index value buffer offset length result node item key weight scale row col acc".split()


def _text(piece: Callable[[random.Random, int], str]) -> Callable[[int, int], str]:
    """`piece(rng, k)` -> a generator `(n_chars, seed) -> text`: pieces 0, 1, ... drawn from one
    `random.Random(seed)` until the text is at least n_chars long."""

    def generate(n_chars: int, seed: int) -> str:
        rng = random.Random(seed)
        out: list[str] = []
        size = k = 0
        while size < n_chars:
            out.append(piece(rng, k))
            size += len(out[-1])
            k += 1
        return "".join(out)

    return generate


@_text
def prose(rng: random.Random, k: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 16))]
    sentence = " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])
    return sentence + ("\n\n" if rng.random() < 0.15 else " ")


@_text
def code(rng: random.Random, k: int) -> str:
    a, b, c = rng.sample(IDENTS, 3)
    op = rng.choice(["+", "-", "*", "^", "|"])
    lim = rng.randint(2, 64)
    return (
        f"def {rng.choice(WORDS)}_{k}({a}, {b}):\n"
        f"    {c} = 0\n"
        f"    for i in range({lim}):\n"
        f"        if ({a} + i) % {rng.randint(2, 9)} == 0:\n"
        f"            {c} = {c} {op} ({b} * i)\n"
        f"        else:\n"
        f"            {c} += {a}\n"
        f"    return {c}\n\n\n"
    )


@_text
def structured(rng: random.Random, k: int) -> str:
    rec = {
        "id": k,
        "name": f"{rng.choice(WORDS)}-{rng.choice(WORDS)}",
        "tags": rng.sample(WORDS, 3),
        "qty": rng.randint(0, 9999),
        "price": round(rng.uniform(0.5, 999.0), 2),
        "active": rng.random() < 0.5,
    }
    return json.dumps(rec, sort_keys=True) + "\n"


GENERATORS = {"code": code, "prose": prose, "structured": structured}

# (file name, family, characters, seed): what the shipped fixtures are.
SHIPPED = [
    ("lab-code.txt", "code", 600, 1),
    ("lab-prose.txt", "prose", 600, 2),
    ("field-code.txt", "code", 64_000, 11),
    ("field-prose.txt", "prose", 64_000, 12),
    ("field-structured.txt", "structured", 64_000, 13),
]


def write_shipped(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, family, n, seed in SHIPPED:
        p = folder / name
        p.write_text(GENERATORS[family](n, seed), encoding="utf-8")
        out[name] = p
    return out


if __name__ == "__main__":  # python -m orchestrator.qualify.fixture_text DIR
    import sys

    from orchestrator.hashing import sha256_file

    for name, p in write_shipped(Path(sys.argv[1])).items():
        print(sha256_file(p), name)
