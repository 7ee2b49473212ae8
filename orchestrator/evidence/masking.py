"""Secrets are masked at the source, before a journal, receipt or log: in an argv (after
`--api-key`, `--api-key=VALUE`, a `Secret`), a command line held as one string, and data whose
*keys* name a secret, matched on their last word so that `n_tokens` and the like stay intact."""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# A flag whose *name ends* with a secret word: --api-key, --hf-token, --password, --client-secret.
# --api-key-file (a path) and --max-tokens (a count) do not end with one and are left alone.
_SECRET_WORD = r"(?:api[-_]?key|token|secret|password|passphrase|passwd|authorization)"
# Short aliases carry no secret word: llama.cpp's -hft is --hf-token (common/arg.cpp).
_SECRET_ALIAS = r"(?:-hft)"
_FLAG = re.compile(rf"^(?:--?[A-Za-z0-9_-]*{_SECRET_WORD}|{_SECRET_ALIAS})$", re.I)
_FLAG_EQ = re.compile(rf"^(--?[A-Za-z0-9_-]*{_SECRET_WORD}|{_SECRET_ALIAS})=(.*)$", re.I)
_ENV_EQ = re.compile(rf"^([A-Za-z0-9_]*{_SECRET_WORD})=(.+)$", re.I)
# Inside one string (a whole command line, a URL).
_INLINE_FLAG = re.compile(
    rf"((?:--?[A-Za-z0-9_-]*{_SECRET_WORD}|{_SECRET_ALIAS}))(=|\s+)(\"[^\"]*\"|'[^']*'|\S+)", re.I
)
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)([^@\s/]+)(@)")
_BEARER = re.compile(r"(\bBearer\s+)(\S+)", re.I)

# Data keys (normalised: lower case, only letters and digits).
_KEY_SUFFIXES = ("apikey", "password", "passwd", "passphrase", "secret", "authorization", "token")
# Tokenizer fields in /props are not secrets.
_KEY_ALLOW = frozenset(
    {"bostoken", "eostoken", "eottoken", "padtoken", "unktoken", "septoken", "clstoken", "masktoken"}
)


def is_secret_object(value: Any) -> bool:
    """A `Secret` (orchestrator.remote.command) or anything that declares itself secret."""
    return getattr(value, "__pairctl_secret__", False) is True or type(value).__name__ == "Secret"


def is_secret_key(key: str) -> bool:
    norm = re.sub(r"[^a-z0-9]", "", key.lower())
    return norm not in _KEY_ALLOW and norm.endswith(_KEY_SUFFIXES)


def mask_text(text: str) -> str:
    """Mask secret flag values, URL passwords and bearer tokens inside one string."""
    if not text:
        return text
    text = _INLINE_FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}{m.group(3)}", text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", text)


def mask_argv(argv: list[Any] | tuple[Any, ...]) -> list[str]:
    """argv as strings with every secret replaced by `***` (the flags themselves are kept)."""
    out: list[str] = []
    mask_next = False
    for item in argv:
        if is_secret_object(item) or mask_next:
            out.append(MASK)
            mask_next = False
        elif _FLAG.match(s := str(item)):
            out.append(s)
            mask_next = True
        elif m := _FLAG_EQ.match(s) or _ENV_EQ.match(s):
            out.append(f"{m.group(1)}={MASK}")
        else:
            out.append(mask_text(s) if " " in s or "://" in s else s)
    return out


def _is_argv_like(items: list[Any]) -> bool:
    return any(isinstance(x, str) and (_FLAG.match(x) or _FLAG_EQ.match(x)) for x in items) or any(
        is_secret_object(x) for x in items
    )


def mask_data(obj: Any) -> Any:
    """A copy of `obj` with secret-named keys, secret flags in string lists and `Secret`s masked."""
    if is_secret_object(obj):
        return MASK
    if isinstance(obj, dict):
        return {
            k: (MASK if isinstance(k, str) and is_secret_key(k) and v is not None else mask_data(v))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        items = list(obj)
        if _is_argv_like(items):
            masked = mask_argv(items)  # strings only; other items keep their type
            return [m if isinstance(v, str) or m == MASK else mask_data(v) for v, m in zip(items, masked, strict=True)]
        return [mask_data(v) for v in items]
    if isinstance(obj, str):
        return mask_text(obj) if (" " in obj or "://" in obj) else obj
    return obj


# Quick pre-check on already serialised JSON: if none of these appear, mask_data cannot change
# anything, so 100k-row sample sets skip the walk.
_WORDS = tuple("apikey api_key api-key token secret password passphrase passwd authorization -hft".split())
_ENDS_WORD = frozenset(['"', "=", " ", "\t", ""])


def may_hold_secret(serialised: str) -> bool:
    """True if masking *might* change the JSON text `serialised`: substring scans, no regex over
    megabytes, for a secret word ending a key, flag or string, a bearer token, a URL password."""
    low = serialised.lower()
    if "bearer" in low or ("@" in low and _URL_PASSWORD.search(serialised)):
        return True
    return any((w in low and any(w + end in low for end in _ENDS_WORD if end)) or low.endswith(w) for w in _WORDS)
