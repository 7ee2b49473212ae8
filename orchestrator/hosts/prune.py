"""Keep hosts tidy: remove the oldest releases beyond the inventory's `keep_releases`.

Never removed: `current`, `previous`, the pair's pinned reference, and every release a route
record on the same host names. Planning is pure (`plan_prune`); the caller holds the leases.
A release is first renamed (atomic) to `releases/.<id>.tomb-<nonce>`, which no reader takes for
a release, then deleted: a killed prune leaves a tomb, which the next one deletes first.
"""

from __future__ import annotations

import posixpath
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.config.inventory import HostSpec, Inventory
from orchestrator.errors import HostError, HostStateError
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.probes import judged_link
from orchestrator.hosts.root_trust import check_root
from orchestrator.hosts.route import parse_route
from orchestrator.remote.command import Cmd
from orchestrator.remote.transport import HOST_FILE_MAX, FileStat, Lstat, Transport, fs_batch

TOMB = re.compile(r"^\.(?P<id>[^/]+)\.tomb-[0-9a-f]+$")

# Fixed text run as `sh -c SCRIPT pairctl-prune RELEASES_DIR TOMB...`: every value is an
# argument, only tomb names are accepted, and each removal prints its apparent size first.
REMOVE_SH = r"""
d=$1; shift
if [ -L "$d" ] || [ ! -d "$d" ] || [ "$(cd -P -- "$d" && pwd)" != "$d" ]; then
  echo "pairctl-prune: refused $d (a link, or a path through one)" >&2; exit 2
fi
for t in "$@"; do
  case "$t" in .*.tomb-*) ;; *) echo "pairctl-prune: refused $t (not a tomb name)" >&2; exit 2 ;; esac
  if [ ! -e "$d/$t" ]; then echo "gone $t"; continue; fi
  b=$(du -sb -- "$d/$t" | cut -f1)
  rm -rf -- "$d/$t" || exit 1
  echo "removed $t ${b:-0}"
done
"""


def tomb_name(package_id: str, nonce: str | None = None) -> str:
    return f".{package_id}.tomb-{nonce or secrets.token_hex(4)}"


@dataclass(frozen=True)
class PrunePlan:
    """What one host keeps and removes (pure)."""

    host: str
    keep_releases: int
    keep: tuple[str, ...]  # newest first
    remove: tuple[str, ...]  # oldest first
    protected: Mapping[str, str]  # release -> why it is kept whatever its age
    tombs: tuple[str, ...] = ()  # left by an interrupted prune: deleted again

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "keep_releases": self.keep_releases,
            "keep": list(self.keep),
            "remove": list(self.remove),
            "protected": dict(self.protected),
            "leftover_tombs": list(self.tombs),
        }


def plan_prune(
    host: str,
    releases: Mapping[str, float],
    *,
    keep_releases: int,
    protected: Mapping[str, str],
    tombs: Iterable[str] = (),
) -> PrunePlan:
    """Keep the `keep_releases` newest releases (by mtime, then name), counting protected ones,
    which are kept whatever their age and number; remove the rest, oldest first."""
    newest = sorted(releases, key=lambda r: (releases[r], r), reverse=True)
    guard = {r: why for r, why in protected.items() if r in releases}
    room = max(keep_releases - len(guard), 0)
    unprotected = [r for r in newest if r not in guard]
    kept = set(guard) | set(unprotected[:room])
    return PrunePlan(
        host=host,
        keep_releases=keep_releases,
        keep=tuple(r for r in newest if r in kept),
        remove=tuple(reversed([r for r in newest if r not in kept])),
        protected=guard,
        tombs=tuple(sorted(tombs)),
    )


@dataclass
class HostPrune:
    """What pruning one host did (for the receipt)."""

    host: str
    plan: PrunePlan | None = None
    removed: list[dict[str, Any]] = field(default_factory=list)  # {"release", "bytes"}
    leftover_tombs_removed: int = 0
    skipped: str | None = None

    @property
    def bytes_freed(self) -> int:
        return sum(int(r["bytes"]) for r in self.removed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "plan": self.plan.as_dict() if self.plan else None,
            "removed": self.removed,
            "bytes_freed": self.bytes_freed,
            "leftover_tombs_removed": self.leftover_tombs_removed,
            "skipped": self.skipped,
        }


def pinned_references(pair_name: str) -> dict[str, str]:
    """Releases the pair's pinned reference package names (release -> why): none until the
    reference record (DESIGN.md "Acceptance compares against a reference") exists."""
    return {}


def _same_host(a: HostSpec, b: HostSpec) -> bool:
    return (a.address, a.port, a.install_root) == (b.address, b.port, b.install_root)


def pairs_on_host(inventory: Inventory, host_name: str) -> list[str]:
    """Every pair of the inventory with a host that is this host (by name, or by the same
    address, port and install root under another name)."""
    me = inventory.host(host_name)
    pairs = sorted(inventory.pairs.items())
    return [n for n, p in pairs if any(h == host_name or _same_host(inventory.host(h), me) for h in (p.native, p.rpc))]


def route_protected(inventory: Inventory, get: Callable[[str], Transport], host_name: str) -> dict[str, str]:
    """Releases named by the route record (active and previous) of every pair on this host; a
    record that cannot be read raises HostError (nothing may be pruned on a guess)."""
    out: dict[str, str] = {}
    for pname in pairs_on_host(inventory, host_name):
        native = inventory.pair(pname).native
        layout = HostLayout(inventory.host(native).install_root)
        try:
            t = get(native)
            raw = t.read_bytes(layout.route, max_bytes=HOST_FILE_MAX) if t.stat(layout.route) is not None else None
        except Exception as exc:
            raise HostError(
                f"{host_name}: cannot read pair {pname}'s route record on {native} ({exc}); "
                "nothing pruned, since a release it names might be removed"
            ) from None
        rec = parse_route(raw)
        if rec is None:
            continue
        for which, entry in (("active", rec.active), ("previous", rec.previous)):
            if entry is not None:
                for pid in (entry.native_package, entry.rpc_package):
                    out.setdefault(pid, f"named by pair {pname}'s route ({which})")
    return out


def read_releases(transport: Transport, layout: HostLayout) -> tuple[dict[str, float], list[str]]:
    """({release: mtime}, leftover tomb names) under releases/, over SFTP."""
    if transport.stat(layout.releases) is None:
        return {}, []
    names = transport.listdir(layout.releases)
    cands = [n for n in names if not TOMB.match(n) and not n.startswith(".")]
    stats = fs_batch(transport, [Lstat(layout.release(n)) for n in cands])  # one pipelined batch
    releases = {n: st.mtime for n, st in zip(cands, stats, strict=True) if isinstance(st, FileStat) and st.is_dir}
    return releases, [n for n in names if TOMB.match(n)]


def link_protected(transport: Transport, layout: HostLayout) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, link in (("current", layout.current), ("previous", layout.previous)):
        rel = judged_link(transport.name, link, transport.readlink(link), layout.root)
        if rel is not None:
            out[rel] = name
    return out


def host_plan(
    inventory: Inventory,
    get: Callable[[str], Transport],
    host_name: str,
    pair_name: str,
    keep_releases: int | None = None,
) -> PrunePlan:
    """Read one host (links, releases, every route on it) and plan its prune."""
    t = get(host_name)
    layout = HostLayout(inventory.host(host_name).install_root, state=inventory.host(host_name).state_dir)
    check_root(t, layout.root, layout.state)  # releases/ (or any directory to it) a link: never prune through it
    releases, tombs = read_releases(t, layout)
    protected = {
        **route_protected(inventory, get, host_name),
        **pinned_references(pair_name),
        **link_protected(t, layout),
    }
    return plan_prune(
        host_name, releases, keep_releases=keep_releases or inventory.keep_releases, protected=protected, tombs=tombs
    )


def _parse_removed(output: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "removed" and parts[2].isdigit():
            out[parts[1]] = int(parts[2])
    return out


def execute(transport: Transport, layout: HostLayout, plan: PrunePlan) -> HostPrune:
    """Rename each release to remove to a tomb name, then delete every tomb in one exec."""
    res = HostPrune(plan.host, plan)
    fresh = {}
    for pid in plan.remove:
        tomb = tomb_name(pid)
        transport.rename(layout.release(pid), posixpath.join(layout.releases, tomb))
        fresh[tomb] = pid
    names = list(plan.tombs) + list(fresh)
    if not names:
        return res
    out = transport.run(
        Cmd(("sh", "-c", REMOVE_SH, "pairctl-prune", layout.releases, *names)), timeout=120 + 30 * len(names)
    )
    sizes = _parse_removed(out.stdout)
    res.removed = [{"release": pid, "bytes": sizes.get(tomb, 0)} for tomb, pid in fresh.items()]
    res.leftover_tombs_removed = len([t for t in plan.tombs if t in sizes])
    return res


def prune_pair(
    inventory: Inventory,
    get: Callable[[str], Transport],
    pair_name: str,
    *,
    keep_releases: int | None = None,
    dry_run: bool = False,
) -> list[HostPrune]:
    """Prune both hosts of a pair (the caller holds their leases). A host whose state cannot be
    read is skipped with the reason; an unsafe install root refuses the whole prune first."""
    pair = inventory.pair(pair_name)
    out = []
    for host in (pair.native, pair.rpc):
        try:
            plan = host_plan(inventory, get, host, pair_name, keep_releases)
            layout = HostLayout(inventory.host(host).install_root)
            out.append(HostPrune(host, plan) if dry_run else execute(get(host), layout, plan))
        except HostStateError:
            raise  # an install root others can change (releases/ a link ...): refuse the whole prune, exit 6
        except Exception as exc:
            out.append(HostPrune(host, skipped=str(exc)))
    return out


def summary(results: list[HostPrune]) -> dict[str, Any]:
    return {
        "hosts": [r.as_dict() for r in results],
        "bytes_freed": sum(r.bytes_freed for r in results),
        "removed": sum(len(r.removed) for r in results),
    }


class _Pool(Protocol):
    def get(self, host_name: str) -> Transport: ...


class _Journal(Protocol):
    def set(self, key: str, value: Any) -> None: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class DeployRun(Protocol):
    """What `prune_after_deploy` needs of a deploy run (read-only: its inputs are)."""

    @property
    def inventory(self) -> Inventory: ...
    @property
    def pool(self) -> _Pool: ...
    @property
    def journal(self) -> _Journal: ...
    @property
    def view(self) -> _Named: ...


def prune_after_deploy(ctx: DeployRun) -> dict[str, Any]:
    """After a successful activation, under the deploy's leases: prune both hosts and record what
    was removed in the receipt (`prune`). Never fails the deploy: a problem is recorded."""
    try:
        result = summary(prune_pair(ctx.inventory, ctx.pool.get, ctx.view.name))
    except Exception as exc:  # pruning is housekeeping: the pair is deployed and accepted
        result = {"error": str(exc)}
    ctx.journal.set("prune", result)
    return result
