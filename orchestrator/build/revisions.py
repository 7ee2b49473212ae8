"""One source revision per pair: the check every start path makes before a service starts.

The RPC handshake compares protocol versions only, and mismatched builds have crashed in the field.
A pair whose packages (or `current` links) name two revisions is refused before anything starts
(exit 6). Revisions come from this home's verified package store; a package not in it is refused too.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.build.store import PackageStore
from orchestrator.errors import HostStateError, PairctlError


@dataclass(frozen=True)
class PairRevisions:
    """The revisions of a pair's two packages (None: the package is not in the local store)."""

    native_package: str
    rpc_package: str
    native: str | None
    rpc: str | None

    @property
    def one(self) -> bool:
        return not differ(self.native, self.rpc)

    def describe(self) -> str:
        def r(x: str | None) -> str:
            return x[:12] if x else "unknown: not in the local package store"

        return f"{self.native_package} (revision {r(self.native)}) and {self.rpc_package} (revision {r(self.rpc)})"


def differ(a: str | None, b: str | None) -> bool:
    """Two revisions that are not one known revision (the one comparison every check here makes)."""
    return a is None or b is None or a != b


def revision_of(store: PackageStore, package_id: str) -> str | None:
    try:
        return store.get(package_id).manifest.revision
    except PairctlError:
        return None


def pair_revisions(store: PackageStore, native_package: str, rpc_package: str) -> PairRevisions:
    return PairRevisions(
        native_package, rpc_package, revision_of(store, native_package), revision_of(store, rpc_package)
    )


def mixed_problem(store: PackageStore, native_package: str | None, rpc_package: str | None) -> str | None:
    """A one-line problem when two packages named as one pair are not of one known revision."""
    if native_package is None or rpc_package is None:
        return None
    revs = pair_revisions(store, native_package, rpc_package)
    if revs.one:
        return None
    return f"the pair {revs.describe()} is not of one source revision"


def require_one_revision(
    store: PackageStore, pair: str, native_package: str, rpc_package: str, *, what: str, hint: str | None = None
) -> None:
    """Refuse (exit 6) before `what` when the two packages are not of one known revision."""
    problem = mixed_problem(store, native_package, rpc_package)
    if problem is None:
        return
    raise HostStateError(
        f"pair {pair}: {what} refused, nothing was started: {problem} (a pair runs one revision: the RPC "
        "handshake does not prove the builds match)",
        hint=hint
        or f"deploy one revision to both hosts: `pairctl deploy --pair {pair} --packages NATIVE RPC` with "
        "packages built from one commit",
    )
