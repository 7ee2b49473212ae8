"""Prompts of an exact token length, built from the server's own tokenizer.

A prompt is sent as a list of token ids, so its length is exact no matter how the model's
tokenizer merges text at the seams. Near-full lanes carry a random nonce each, to test that a
lane's answer mentions its own nonce and never the other lane's (for models that can recall).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from orchestrator.server.client import ServerClient

# Varied, deterministic filler text: cheap to tokenize once, then cycled to any length.
_WORDS = (
    "river stone lantern harbor copper meadow signal orbit cedar thunder velvet prism anchor "
    "falcon ember glacier mosaic quartz saffron tundra willow zephyr basalt canyon delta fjord "
    "granite horizon island jasmine kestrel lagoon marble nectar opal pepper quiver raven "
    "summit timber umber vertex walnut yarrow zinc"
).split()


def filler_text(seed: int, words: int = 600) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(words):
        out.append(rng.choice(_WORDS))
        if i % 12 == 11:
            out.append(f"({i // 12}).\n")
    return " ".join(out)


def make_nonce(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(10))


@dataclass(frozen=True)
class BuiltPrompt:
    tokens: tuple[int, ...]
    nonce: str | None = None

    def __len__(self) -> int:
        return len(self.tokens)


def contains_run(haystack: tuple[int, ...] | list[int], needle: tuple[int, ...] | list[int]) -> bool:
    """True when `needle` occurs as a contiguous run of token ids in `haystack`."""
    n = len(needle)
    if n == 0:
        return False
    first = needle[0]
    for i in range(len(haystack) - n + 1):
        if haystack[i] == first and tuple(haystack[i : i + n]) == tuple(needle):
            return True
    return False


class PromptBuilder:
    """Builds exact-length prompts with one tokenizer round trip per distinct piece of text."""

    def __init__(self, client: ServerClient, seed: int) -> None:
        self.client = client
        self.seed = seed
        self._cache: dict[tuple[str, bool], tuple[int, ...]] = {}

    def tok(self, text: str, *, bos: bool = False) -> tuple[int, ...]:
        key = (text, bos)
        if key not in self._cache:
            self._cache[key] = tuple(self.client.tokenize(text, add_special=bos))
        return self._cache[key]

    def filler(self, n: int, *, variant: int = 0) -> tuple[int, ...]:
        base = self.tok(filler_text(self.seed + variant))
        if not base:
            raise ValueError("the tokenizer returned no tokens for the filler text")
        reps = n // len(base) + 1
        return (base * reps)[:n]

    def exact(self, n: int, *, variant: int = 0, head: str = "", tail: str = "") -> tuple[int, ...]:
        """`head` (with BOS) + filler + `tail`, exactly `n` tokens."""
        h = self.tok(head, bos=True) if head else self.tok("", bos=True)
        t = self.tok(tail) if tail else ()
        body = n - len(h) - len(t)
        if body < 0:
            raise ValueError(f"a prompt of {n} tokens cannot hold its head and tail ({len(h) + len(t)} tokens)")
        out = h + self.filler(body, variant=variant) + t
        if len(out) != n:  # the server's tokenizer answered pieces that do not add up
            raise ValueError(
                f"a prompt of {n} tokens came out {len(out)} long: the server tokenized the head into {len(h)}, "
                f"the tail into {len(t)} tokens"
            )
        return out

    def with_nonce(self, n: int, nonce: str, *, variant: int = 0) -> BuiltPrompt:
        """A lane prompt: states its nonce at the start and asks for it at the end."""
        head = f"The secret code for this conversation is {nonce}. Remember it.\n"
        tail = "\nQuestion: what is the secret code for this conversation? Answer: the secret code is"
        return BuiltPrompt(tokens=self.exact(n, variant=variant, head=head, tail=tail), nonce=nonce)
