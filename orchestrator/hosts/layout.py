"""Where things live on a host, and the remote commands that read or change that layout.

On each host, under the inventory's install_root:

    releases/<package-id>/   immutable, uploaded under a temporary name and renamed in
    secrets/                 0700; the API key file, 0600
    bin/pairctl-svc          the pidfile supervisor (orchestrator/hosts/pairctl-svc.sh)
    run/                     a link to the host's state_dir (ROOT.state by default: see
                             install_helper), holding everything written after the upload:
      current, previous      symlinks to ROOT/releases/<id>, switched by rename (never rm + ln)
      route.json             the route record (orchestrator.hosts.route)
      leases/                lease directories (orchestrator.hosts.leases), reached as
                             ROOT/leases, a link to run/leases
      *.pid, *.log, ...      pidfiles, supervisor state, stdout/stderr and server logs

So the root is written at upload only: a root that turns read-only after it still lets a rollback
switch, record and release its leases (issue 49). A state dir that turns read-only too still lets a
rollback start the release `current` names: that run's pidfiles, supervisor state and stdout go to
the host's runtime dir (/run, /dev/shm: pairctl-svc.sh), where the helper's readers look first.

Every command here is data (a `Cmd` rendering an argv). The helper script is fixed text and
takes every value as an argument, so no user value is ever parsed as shell code. An SSH exec
costs a process (and the user's login shell) on the host; SFTP requests do not, so links,
the helper itself and secrets are written over SFTP and execs are kept to the few steps that
need a process (hashing, starting, stopping).
"""

from __future__ import annotations

import errno
import json
import posixpath
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from orchestrator.errors import HostError, HostStateError, LeaseLost
from orchestrator.hashing import sha256_bytes
from orchestrator.hosts import writable
from orchestrator.hosts.managers.base import ServiceManager
from orchestrator.hosts.managers.pairctl import PAIRCTL
from orchestrator.hosts.probes import HostFacts, judged_link
from orchestrator.hosts.root_trust import check_root, put_new
from orchestrator.hosts.units import supervise_argv
from orchestrator.log import get_logger
from orchestrator.remote.command import Cmd
from orchestrator.remote.transport import HOST_FILE_MAX, Lstat, MountFlags, Readlink, Transport, fs_batch

# The services a layout runs; spelled in orchestrator.roles and named here for the modules that manage them.
from orchestrator.roles import LLAMA_SERVER as LLAMA_SERVER
from orchestrator.roles import RPC_SERVER as RPC_SERVER
from orchestrator.roles import SERVICE_OF_ROLE as SERVICE_OF_ROLE

SVC_SOURCE = Path(__file__).with_name("pairctl-svc.sh")
GUARD = "pairctl-rpc-guard.so"  # as GUARD in pairctl-svc.sh

API_KEY_NAME = "api-key"


@lru_cache(maxsize=1)
def svc_script() -> bytes:
    return SVC_SOURCE.read_bytes()


def svc_sha256() -> str:
    return sha256_bytes(svc_script())


@dataclass(frozen=True)
class HostLayout:
    """Paths under one host's install root (POSIX paths on the host, not here), and the service
    manager its supervisors run under (hosts/managers)."""

    root: str
    manager: ServiceManager = PAIRCTL
    state: str | None = None  # the inventory's state_dir: run/ links there

    def _p(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    @property
    def releases(self) -> str:
        return self._p("releases")

    def release(self, package_id: str) -> str:
        return self._p("releases", package_id)

    def binary(self, package_id: str, name: str) -> str:
        """A binary by its release path, so argv[0] names the release it runs from."""
        return self._p("releases", package_id, "bin", name)

    @property
    def current(self) -> str:
        return self._p("run", "current")

    @property
    def previous(self) -> str:
        return self._p("run", "previous")

    @property
    def leases(self) -> str:
        return self._p("leases")

    @property
    def route(self) -> str:
        return self._p("run", "route.json")

    @property
    def run(self) -> str:
        return self._p("run")

    def log(self, name: str) -> str:
        return self._p("run", name)

    @property
    def secrets(self) -> str:
        return self._p("secrets")

    @property
    def api_key(self) -> str:
        return self._p("secrets", API_KEY_NAME)

    @property
    def svc(self) -> str:
        return self._p("bin", "pairctl-svc")

    @property
    def guard(self) -> str:
        """ggml-rpc-server's preloaded guard (orchestrator/hosts/rpc_guard.py)."""
        return self._p("bin", GUARD)

    def guard_cmd(self, name: str) -> Cmd:
        """The guard as running NAME has it: `guard=NAME:SHA256:ALLOW:KEYID` (rpc_guard.parse_guard)."""
        return self.svc_cmd("guard", name)

    def supervise_argv(self, name: str, argv: Sequence[str], sup: Sequence[str]) -> list[str]:
        return supervise_argv(self.svc, self.root, name, sup, argv)

    # --- commands (each one SSH exec: keep them few) ----------------------------------------

    def svc_cmd(self, sub: str, *args: str) -> Cmd:
        """Run the installed helper: `sh <root>/bin/pairctl-svc SUB ROOT ARGS...`."""
        return Cmd(("sh", self.svc, sub, self.root, *args))

    def start_cmd(self, name: str, argv: list[str], sup: Sequence[str] = ()) -> Cmd:
        """Start NAME under its supervisor (as its manager starts it; `sup.KEY=VALUE` options,
        hosts/supervisor.py); prints `pid=` and its identity line (and the unit read back)."""
        return self.svc_cmd("start", name, *self.manager.words(name), *sup, *argv)

    def stop_cmd(self, name: str, verify_release: str | None = None) -> Cmd:
        """Stop NAME; with `verify_release`, first check that release against the manifest on stdin
        (nothing is stopped if it does not match)."""
        return self.svc_cmd("stop", name, *((verify_release,) if verify_release else ()))

    def restart_cmd(
        self,
        name: str,
        current: str | None,
        previous: str | None,
        address: str,
        port: int,
        timeout_s: int,
        argv: list[str],
        verify_release: str | None = None,
        sup: Sequence[str] = (),
    ) -> Cmd:
        """(Verify a release,) stop NAME, switch the links, start argv under its supervisor, wait for
        address:port, print identity: one exec."""
        return self.svc_cmd(
            "restart",
            name,
            verify_release or "-",
            current or "-",
            previous or "-",
            address,
            str(port),
            str(timeout_s),
            *self.manager.words(name),
            *sup,
            *argv,
        )

    def wait_listen_cmd(self, name: str, address: str, port: int, timeout_s: int) -> Cmd:
        return self.svc_cmd("wait-listen", name, address, str(port), str(timeout_s))

    def units_cmd(self, *names: str) -> Cmd:
        """Per NAME, its installed unit read back (hosts/units.py parse_readback), or `unit=-`."""
        return self.svc_cmd("units", *names)

    def identity_cmd(self, *names: str) -> Cmd:
        return self.svc_cmd("identity", *names)

    def rpc_probe_cmd(self, name: str, address: str, port: int, timeout_s: int) -> Cmd:
        """Is NAME (ggml-rpc-server) hung: stopped, or no answer to the RPC HELLO (probes.parse_rpc_probe)."""
        return self.svc_cmd("rpc-probe", name, address, str(port), str(timeout_s))

    def alive_cmd(self, name: str) -> Cmd:
        return self.svc_cmd("alive", name)

    def log_grep_cmd(self, file: str, text: str) -> Cmd:
        return self.svc_cmd("log-grep", file, text)

    def log_tail_cmd(self, file: str, lines: int = 40) -> Cmd:
        return self.svc_cmd("log-tail", file, str(lines))

    def switch_cmd(self, current: str | None, previous: str | None) -> Cmd:
        """Point current/previous at releases by rename; None removes a link."""
        return self.svc_cmd("switch", current or "-", previous or "-")

    def unpack_cmd(self, tmp_name: str) -> Cmd:
        """A tar stream (stdin) into releases/TMP; prints sha256sum of every file."""
        return self.svc_cmd("unpack", tmp_name)

    def hash_cmd(self, dirname: str) -> Cmd:
        return self.svc_cmd("hash", dirname)

    def model_hash_cmd(self, paths: list[str]) -> Cmd:
        """sha256 of each model file, cached on the host by (device, inode, size, mtime, ctime)."""
        return self.svc_cmd("model-hash", *paths)

    def discard_cmd(self, tmp_name: str) -> Cmd:
        return self.svc_cmd("discard", tmp_name)


# -- SFTP operations (no process on the host: cheap) -------------------------------------------


def install_helper(transport: Transport, layout: HostLayout, *, strict: bool = False) -> None:
    """The layout's directories (secrets/ 0700) and bin/pairctl-svc, replaced by rename from an
    exclusive, per-run temporary name; the root is judged before and after (hosts/root_trust).
    An older layout is moved on the way, under the caller's lease (move_layout). `strict` (a
    deploy's prepare only: the root is about to take a release) refuses a run/ that would stay
    inside the root; a rollback, stop or repair still runs there. What an earlier move could not
    remove is tried again (_sweep_aside: one listing)."""
    if not move_layout(transport, layout, strict=strict):
        _sweep_aside(transport, layout)
    for d in (layout.releases, posixpath.dirname(layout.svc)):
        transport.makedirs(d, 0o755)
    transport.makedirs(layout.secrets, 0o700)
    check_root(transport, layout.root, layout.state)  # what makedirs found there already
    put_new(transport, svc_script(), layout.svc, 0o755)


def move_layout(transport: Transport, layout: HostLayout, *, strict: bool = False) -> bool:
    """An older layout moved into run/ under the caller's lease (_link_run, _move_into_run), so
    that links, the route record and leases are found in run/ only. Every leased command passes
    here (hosts.leases.hold_pair_leases, the engine's lease step through install_helper); a root
    whose leases/ and run/ are already the links is left untouched (two readlinks). False then.
    `strict`: a state dir that cannot be made is refused, not left as run/ inside the root."""
    if transport.readlink(layout.leases) == LEASES_LINK and (
        layout.state is None or transport.readlink(layout.run) == layout.state
    ):
        return False
    check_root(transport, layout.root, layout.state)
    if layout.state:
        _link_run(transport, layout, layout.state, strict)
    transport.makedirs(layout.run, 0o755)
    _move_into_run(transport, layout)
    check_root(transport, layout.root, layout.state)
    return True


_REFUSED_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)  # the local transport's own OSError


def _link_run(transport: Transport, layout: HostLayout, state: str, strict: bool) -> None:
    """run/ -> STATE (0755, judged as a root is), outside the root: a root that turned read-only
    still lets a rollback switch, record and start the previous release (issue 49). A run/
    directory from before is moved under the lease (a_prepare), while supervisors are passive (no
    pid changes): its small files are copied to STATE and the directory is swapped for the link
    (_swap_for_link). A live supervisor writes its state through the link, and its open logs
    into the removed directory until the restart that follows. Where the default STATE cannot be
    made (the root's parent is not the login user's), run/ stays the directory it was for a
    command that uploads nothing (a rollback still runs there); a deploy (`strict`) is refused
    before any change, naming state_dir: a root turning read-only would stop its pair (issue 49)."""
    check_root(transport, state)
    try:
        transport.makedirs(state, 0o755)
    except OSError as exc:  # over SSH a refused mkdir is a HostError saying so (remote/ssh.py); locally an OSError
        refused = (isinstance(exc, HostError) and exc.write_refused) or exc.errno in _REFUSED_ERRNOS
        if not _default_state(layout, state) or not refused:
            raise
        if strict:
            raise _state_refused(transport.name, layout, state, str(exc.strerror or exc)) from None
        return
    check_root(transport, state)
    if transport.readlink(layout.run) == state:
        return  # a link elsewhere: check_root refused it
    transport.makedirs(layout.root, 0o755)
    if transport.stat(layout.run) is not None:
        for name in transport.listdir(layout.run):
            st = transport.stat(src := posixpath.join(layout.run, name))
            if st is not None and st.is_file and st.size <= HOST_FILE_MAX:
                put_new(transport, transport.read_bytes(src, HOST_FILE_MAX), posixpath.join(state, name), st.perms)
        links = [_release(transport, layout, posixpath.join(layout.run, n)) for n in ("current", "previous")]
        if any(links) and transport.readlink(posixpath.join(state, "current")) is None:
            switch_links(transport, layout, links[0], links[1], run=state)  # only these links: each judged first
        nonce = _carry_lease(transport, posixpath.join(layout.run, "leases"), posixpath.join(state, "leases"))
    else:
        nonce = None
    _swap_for_link(transport, layout.run, state)
    _still_ours(transport, posixpath.join(layout.run, "leases"), nonce)
    if (fs := fs_type(transport, state)) in ("tmpfs", "ramfs"):
        get_logger(host=transport.name).warning(
            "state_dir is on " + fs + ": a reboot loses the links, the route record and the leases", state_dir=state
        )


def _default_state(layout: HostLayout, state: str) -> bool:
    """STATE is the computed default beside the root (config/inventory.py default_state_dir): only
    that one may be left unmade, run/ staying inside the root; a state_dir the inventory names must
    be made."""
    return state == layout.root + ".state"


def _state_refused(host: str, layout: HostLayout, state: str, why: str) -> HostStateError:
    """A deploy's refusal of a state dir that cannot be made, the one message for both the real
    run's failed mkdir (_link_run) and what SFTP facts predict before prepare (check_state_dir)."""
    return HostStateError(
        f"{host}: {state} cannot be made ({why}), so "
        f"{layout.run} would stay inside the root, where a root that turns read-only stops the pair",
        hint=f"make a directory the login user can write, outside the root and not on tmpfs (e.g. `sudo "
        f"install -d -o USER -m 0700 /var/lib/pairctl-{host}`), set hosts.{host}.state_dir "
        "to it in the inventory, then run the command again",
    )


def check_state_dir(transport: Transport, layout: HostLayout, facts: HostFacts | None = None) -> None:
    """What a deploy's prepare would refuse (_link_run, strict) as a read-only file system, refused
    by a dry run and by the real deploy before prepare (a dry run changes nothing; the real one has
    taken its leases, and on a fresh or older-layout host the lease step's install_helper, not
    strict, may already have made root/run/ and moved that layout into it): run/ not yet the link,
    the default state dir missing, and statvfs of the nearest existing directory above it saying
    read-only (hosts/writable, which says what is not predicted and why). FACTS: read_facts' own
    readlink of run/ and lstat of the state dir, so the usual host (linked, or the state dir there)
    costs no round trip; else one batch. Only the computed default is judged: a named state_dir's
    mkdir must work, and says why where it does not."""
    state = layout.state
    if state is None or not _default_state(layout, state):
        return
    if facts is not None and (facts.run_link == state or facts.state_there):
        return  # linked already, or there (as it is today): nothing to make
    chain = writable.ancestors(state)
    got = fs_batch(
        transport,
        [Readlink(layout.run), *(Lstat(p, soft=True) for p in chain), *(MountFlags(p) for p in chain[1:])],
    )
    if got[0] != state and (why := writable.why_not_made(got[1 : len(chain) + 1], got[len(chain) + 1 :])):
        raise _state_refused(transport.name, layout, state, why)


def fs_type(transport: Transport, path: str) -> str | None:
    """The type of the file system PATH is on, from the host's /proc/self/mounts over SFTP (no
    process): the longest mount point that holds PATH. None where it cannot be read."""
    try:
        mounts = transport.read_bytes("/proc/self/mounts", HOST_FILE_MAX)
    except OSError:
        return None
    m = writable.mount_of(writable.parse_mounts(mounts), path)
    return m.fstype if m else None


def _move_into_run(transport: Transport, layout: HostLayout) -> None:
    """What an older layout kept in the root itself moves into run/, under the caller's lease:
    current and previous (re-pointed at absolute release paths, as run/ may be elsewhere),
    route.json, and leases/ (this run's lease copied, then the directory swapped for the link
    `leases -> run/leases`, which pairctl's lease code and older supervisors follow)."""
    old = {n: posixpath.join(layout.root, n) for n in ("current", "previous", "route.json")}
    links = [_release(transport, layout, old[n]) for n in ("current", "previous")]
    if any(links) and transport.readlink(layout.current) is None:
        switch_links(transport, layout, *links)
    if transport.stat(old["route.json"]) is not None and transport.stat(layout.route) is None:
        put_new(transport, transport.read_bytes(old["route.json"], HOST_FILE_MAX), layout.route, 0o644)
    for path in old.values():
        if transport.stat(path) is not None:
            transport.remove(path)
    if transport.readlink(layout.leases) != LEASES_LINK:
        nonce = _carry_lease(transport, layout.leases, posixpath.join(layout.run, "leases"))
        _swap_for_link(transport, layout.leases, LEASES_LINK)
        _still_ours(transport, layout.leases, nonce)
    _sweep_aside(transport, layout)


def _sweep_aside(transport: Transport, layout: HostLayout) -> None:
    """What a move set aside and could not remove (or an earlier pairctl's move kept), removed."""
    for name in transport.listdir(layout.root):
        if name.startswith((".run.old.tmp-", ".leases.old.tmp-")):
            remove_tree(transport, posixpath.join(layout.root, name))


LEASES_LINK = "run/leases"  # ROOT/leases, as root_trust allows it
_HOLDER_HINT = "`pairctl lease show {host}` names the holder; retry once that run has ended"


def _release(transport: Transport, layout: HostLayout, link: str) -> str | None:
    return judged_link(transport.name, link, transport.readlink(link), layout.root)


def _lease_bytes(transport: Transport, leases: str) -> bytes | None:
    """LEASES/host.lock/lease.json as the host holds it (None: there is none)."""
    try:
        return transport.read_bytes(posixpath.join(leases, "host.lock", "lease.json"), HOST_FILE_MAX)
    except FileNotFoundError:
        return None


def _nonce_of(data: bytes | None) -> str | None:
    """The nonce in a lease.json's bytes (None: no lease.json; "?" for a file that is not a
    lease: never this run's)."""
    if data is None:
        return None
    try:
        d = json.loads(data)
    except ValueError:
        return "?"
    return str(d.get("nonce")) if isinstance(d, dict) else "?"


def _lease_nonce(transport: Transport, leases: str) -> str | None:
    return _nonce_of(_lease_bytes(transport, leases))


def _carry_lease(transport: Transport, src: str, dst: str) -> str | None:
    """DST made (0700), with a copy of the lease in SRC (the caller's, taken there before the move),
    so the lease holds without a gap while SRC is swapped for a link; its nonce returned. DST's
    host.lock is made exclusively: one that holds another run's lease is LeaseLost, never
    overwritten (an interrupted move of this run's own is finished)."""
    transport.makedirs(dst, 0o700)
    if (data := _lease_bytes(transport, src)) is None:
        return None
    nonce = _nonce_of(data)
    try:
        transport.mkdir(posixpath.join(dst, "host.lock"), 0o700)
    except FileExistsError:
        if _lease_nonce(transport, dst) not in (None, nonce):
            raise LeaseLost(
                f"{transport.name}: {dst}/host.lock holds another run's lease; the layout was not moved",
                hint=_HOLDER_HINT.format(host=transport.name),
            ) from None
    put_new(transport, data, posixpath.join(dst, "host.lock", "lease.json"), 0o600)
    return nonce


def _still_ours(transport: Transport, leases: str, nonce: str | None) -> None:
    """After a swap, the lease read back through the new link must be the one carried: between
    the rename aside and the rename in, another run's take_lease may have made a directory there."""
    if nonce is not None and _lease_nonce(transport, leases) != nonce:
        raise LeaseLost(
            f"{transport.name}: the lease under {leases} is not this run's after moving the layout into run/",
            hint=_HOLDER_HINT.format(host=transport.name),
        )


def _swap_for_link(transport: Transport, path: str, target: str) -> None:
    """PATH replaced by a link to TARGET by rename: the link made under a temporary name, PATH
    (if any) renamed aside (.NAME.old.tmp-*), the link renamed in, and what was set aside
    removed. A directory cannot be renamed over, so PATH is missing in between: the caller reads
    its lease back afterwards (_still_ours)."""
    tmp = unique_tmp(path)
    transport.symlink(target, tmp)
    moved = None
    if transport.stat(path) is not None:
        transport.rename(path, moved := unique_tmp(path + ".old"))
    try:
        transport.rename(tmp, path)
    except OSError:
        transport.remove(tmp)
        if moved:
            try:
                transport.rename(moved, path)
            except OSError:
                raise LeaseLost(
                    f"{transport.name}: {path} was made by another run while the layout was moved; "
                    f"this run's lease is set aside in {moved}",
                    hint=f"`pairctl lease show {transport.name}` names the holder; "
                    f"remove {moved} once no run of yours is left",
                ) from None
        raise
    if moved:
        remove_tree(transport, moved)


def remove_tree(transport: Transport, path: str) -> None:
    """`rm -rf --one-file-system -- PATH` on the host, best-effort. Never over SFTP by path: a
    directory under PATH that a service user owns (run/home/SERVICE) can be swapped for a link
    between a check and a delete; GNU rm removes a link inside the tree and never follows it.
    A failure is logged, not raised: what is set aside is left for the next move to retry."""
    try:
        transport.run(Cmd(("rm", "-rf", "--one-file-system", "--", path)), timeout=HOST_RM_TIMEOUT_S)
    except OSError as exc:  # a host's refusal or a timeout (HostError is an OSError)
        get_logger(host=transport.name).warning("leftover not removed", path=path, error=str(exc))


HOST_RM_TIMEOUT_S = 120.0  # a few small files and a service user's home; a hung host stops here


def switch_links(
    transport: Transport, layout: HostLayout, current: str | None, previous: str | None, run: str | None = None
) -> None:
    """current/previous (in RUN, run/ by default) -> releases/<id>: a new symlink under a
    temporary name, renamed over the old one (never rm + ln); None removes the link. A link that
    already names its release is left as it is. The targets are absolute: run/ may be a link to
    a state_dir elsewhere."""
    run = run or layout.run
    for link, rel in ((posixpath.join(run, "current"), current), (posixpath.join(run, "previous"), previous)):
        if rel is None:
            if transport.readlink(link) is not None:
                transport.remove(link)
            continue
        if transport.readlink(link) == layout.release(rel):
            continue
        tmp = unique_tmp(link)
        transport.symlink(layout.release(rel), tmp)
        transport.rename(tmp, link)


def put_secret(transport: Transport, layout: HostLayout, data: bytes, name: str = API_KEY_NAME) -> str:
    """A secret file (0600 in the 0700 secrets/), by rename; its value is never an argument.
    The temporary file is created 0600 and exclusively (never chmod after); secrets/ is tightened
    to 0700 on every call, and refused when it is a symlink or not a directory. A file that already
    holds DATA (0600, not a link) is left as it is."""
    transport.makedirs(layout.secrets, 0o700)
    st = transport.stat(layout.secrets)
    if st is None or st.is_link or not st.is_dir:
        raise HostError(
            f"{transport.name}: {layout.secrets} is not a directory (a symlink?); the API key is not written there",
            hint="remove it on the host; pairctl creates it 0700",
        )
    if st.perms != 0o700:
        transport.chmod(layout.secrets, 0o700)
    dest = posixpath.join(layout.secrets, name)
    if (got := transport.stat(dest)) is not None and got.is_file and got.perms == 0o600:
        if transport.read_bytes(dest, len(data)) == data:
            return dest  # as it is: a root written at upload only (a read-only one) needs no write here
    for left in transport.listdir(layout.secrets):  # left by an interrupted run, in our own 0700 folder
        if left.startswith(f".{name}.tmp"):
            transport.remove(posixpath.join(layout.secrets, left))
    tmp = unique_tmp(dest)
    transport.put_private(data, tmp)
    transport.rename(tmp, dest)
    return dest


def unique_tmp(path: str) -> str:
    """A temporary name beside PATH that no other run uses (`.NAME.tmp-RANDOM`): a step that
    timed out on the host, or another run, never renames this run's file into place (issue 33:
    a shared `.current.tmp` let a late step switch `current` after the rollback's own switch)."""
    return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp-{secrets.token_hex(6)}")


def tmp_release_name(package_id: str, nonce: str) -> str:
    return f".{package_id}.tmp-{nonce}"
