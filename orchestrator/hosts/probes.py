"""Facts read from a host: pure parsers of real output, and the comparisons made on them.

The exec commands live in `layout.py` (they run the fixed helper `pairctl-svc`); `read_facts`
reads links, pid files and route.json over SFTP and hands the raw bytes to the pure
`facts_from`, so every probe is tested from captured output with no host at all.
`identity_problems` is the one place that decides whether a running pair is what its
manifests and profile say: deploy, rollback, status and acceptance all call it.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import posixpath
import re
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.errors import HostStateError
from orchestrator.hashing import sha256_bytes
from orchestrator.hosts.root_trust import check_root, login_uid
from orchestrator.hosts.units import root_tag
from orchestrator.remote.command import Cmd
from orchestrator.remote.transport import (
    HOST_FILE_MAX,
    FileStat,
    FsRead,
    FsResult,
    Lstat,
    ReadFile,
    Readlink,
    Transport,
    fs_batch,
)

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
RELEASE_PREFIX = "releases/"


class ProbeError(ValueError):
    """Output did not have the shape the helper prints."""


def parse_kv_lines(text: str) -> list[tuple[str, str]]:
    """`key=value` lines in order (keys may repeat); blank lines skipped, anything else an error."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key or not key.replace("_", "").isalnum():
            raise ProbeError(f"unexpected line {line[:120]!r}")
        out.append((key, value))
    return out


def release_of_link(target: str, root: str | None = None, *, absolute: bool = False) -> str | None:
    """`<root>/releases/<id>` (what `switch` writes) -> `<id>`; "-" (no link) -> None. The id is
    one plain component, under `root` when known. A relative `releases/<id>` (an older layout's
    link in the root itself) only without `absolute`: in run/ it would name another directory."""
    if target in ("", "-"):
        return None
    t = target.rstrip("/")
    if absolute and not t.startswith("/"):
        raise ProbeError(f"link in run/ names no absolute {root or 'ROOT'}/releases/ID: {target!r}")
    if t.startswith("/"):
        base, sep, rel = t.rpartition("/releases/")
        if not sep or (root is not None and base != root.rstrip("/")):
            raise ProbeError(f"link points outside {root.rstrip('/') + '/' if root else ''}releases/: {target!r}")
        t = RELEASE_PREFIX + rel
    rid = t[len(RELEASE_PREFIX) :]
    if not t.startswith(RELEASE_PREFIX) or "/" in rid or rid in ("", ".", "..") or rid.startswith("."):
        raise ProbeError(f"link names no release in releases/: {target!r}")
    return rid


@dataclass(frozen=True)
class ModelHash:
    """One model file as `pairctl-svc model-hash` saw it (sha256 None: the file is missing)."""

    path: str
    sha256: str | None
    size: int | None
    how: str  # hashed | cached | missing | notfile (a directory or special file)


def parse_model_hashes(text: str) -> dict[str, ModelHash]:
    """`model=SHA256:SIZE:cached|hashed:PATH` lines (or `model=-:-:missing:PATH`) -> by path."""
    out: dict[str, ModelHash] = {}
    for key, value in parse_kv_lines(text):
        if key != "model":
            raise ProbeError(f"unexpected key {key!r} in model-hash output")
        parts = value.split(":", 3)
        if len(parts) != 4 or not parts[3]:
            raise ProbeError(f"bad model line {value[:120]!r}")
        sha, size, how, path = parts
        if how in ("missing", "notfile") and sha == size == "-":
            out[path] = ModelHash(path, None, None, how)
        elif how in ("hashed", "cached") and _HEX64.match(sha) and size.isdigit():
            out[path] = ModelHash(path, sha, int(size), how)
        else:
            raise ProbeError(f"bad model line {value[:120]!r}")
    return out


@dataclass(frozen=True)
class HostFacts:
    """What `pairctl-svc facts` saw on one host: links, releases, running services, route record."""

    root_exists: bool
    current: str | None
    previous: str | None
    releases: tuple[str, ...] = ()
    svc_sha256: str | None = None
    running: Mapping[str, int] = field(default_factory=dict)
    route_bytes: bytes | None = None
    # run/'s link target and whether the state dir is there, read in the same batch for the deploy's
    # check of a state dir that cannot be made (layout.check_state_dir); None where not read or not known
    run_link: str | None = None
    state_there: bool | None = None
    # each service's folder now, as service_dirs would answer, from the same batch (diff reads it)
    folders: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root_exists": self.root_exists,
            "current": self.current,
            "previous": self.previous,
            "releases": list(self.releases),
            "running": dict(self.running),
            "route_present": self.route_bytes is not None,
        }


def argv0_is(cmdline: bytes, name: str) -> bool:
    """/proc/PID/cmdline names NAME as argv[0]'s basename (a pid file's process is still ours)."""
    argv0 = cmdline.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return bool(argv0) and argv0.rsplit("/", 1)[-1] == name


def facts_from(
    *,
    root_exists: bool,
    current_link: str | None,
    previous_link: str | None,
    release_names: Iterable[str],
    svc_bytes: bytes | None,
    route_bytes: bytes | None,
    procs: Mapping[str, tuple[int, bytes]],
    root: str | None = None,
) -> HostFacts:
    """HostFacts from raw reads (links, release directory names, pid files + /proc cmdline). Pure."""
    return HostFacts(
        root_exists=root_exists,
        current=release_of_link(current_link or "-", root),
        previous=release_of_link(previous_link or "-", root),
        releases=tuple(sorted(n for n in release_names if not n.startswith("."))),
        svc_sha256=sha256_bytes(svc_bytes) if svc_bytes is not None else None,
        running={name: pid for name, (pid, cmdline) in procs.items() if argv0_is(cmdline, name)},
        route_bytes=route_bytes,
    )


def parse_pid(data: bytes) -> int | None:
    text = data.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


# id(transport) -> (a weak reference to it, uid, its answer): the lingering answer per transport,
# read once (every service_dir of a non-root login asked again: /etc/passwd and the linger file);
# an entry goes with its transport. An answer that could not be read is not kept.
_LINGERS: dict[int, tuple[weakref.ref[Any], int, bool]] = {}


def _lingers(transport: Transport, uid: int) -> bool:
    """/var/lib/systemd/linger/NAME exists for UID's name in the host's /etc/passwd (SFTP reads only)."""
    key = id(transport)
    got = _LINGERS.get(key)
    if got is not None and got[0]() is transport and got[1] == uid:
        return got[2]
    try:
        text = transport.read_bytes("/etc/passwd", HOST_FILE_MAX).decode("utf-8", "replace")
        names = [f[0] for f in (line.split(":") for line in text.splitlines()) if len(f) > 2 and f[2] == str(uid)]
        answer = any(transport.stat(f"/var/lib/systemd/linger/{n}") is not None for n in names if "/" not in n)
    except OSError:
        return False
    try:
        _LINGERS[key] = (weakref.ref(transport, lambda _r: _LINGERS.pop(key, None)), uid, answer)
    except TypeError:  # a transport that takes no weak reference: asked each time
        pass
    return answer


def runtime_path(uid: int, root: str) -> str:
    """The helper's runtime dir for ROOT as user UID (pairctl-svc.sh rt_where), before any trust check."""
    return f"{'/run' if uid == 0 else '/dev/shm'}/pairctl-{uid}/{root_tag(root)}"


@dataclass(frozen=True)
class RuntimeDir:
    """Where `pairctl-svc` keeps a service's pidfiles, supervisor state and stdout when run/ takes no
    new file (issue 49): /run/pairctl-0/ROOTTAG as root, else /dev/shm/pairctl-UID/ROOTTAG (its
    rt_init; test_probes_svc holds the two to one path). Its readers there, and these, trust it only
    as the helper does: both levels this uid's directories, not links, mode 0700; and a service's
    files are there only while it holds NAME.state (else they are in run/)."""

    uid: int
    path: str

    @classmethod
    def of(cls, transport: Transport, root: str) -> RuntimeDir | None:
        """The login user's, or None where the transport cannot tell that user, or that user is not
        root and does not linger (logind removes its /dev/shm files with its last session; the helper's
        lingers): run/ only then."""
        uid = login_uid(transport)
        if uid is None or (uid != 0 and not _lingers(transport, uid)):
            return None
        return cls(uid, runtime_path(uid, root))

    def lstats(self, services: Iterable[str]) -> list[FsRead]:
        """What `holding` judges, for one SFTP batch: both levels, then each NAME.state. A refused
        lstat (a stranger made the first level 0700 first) is a result, never the batch's error:
        the helper's rt_safe calls that dir not its own and uses run/, and so do these readers."""
        paths = [posixpath.dirname(self.path), self.path, *(self.state(n) for n in services)]
        return [Lstat(p, soft=True) for p in paths]

    def state(self, name: str) -> str:
        return f"{self.path}/{name}.state"

    def holding(self, services: Iterable[str], got: list[FsResult]) -> set[str]:
        """The services (of `lstats`' results) whose files are here; none where the dir is not ours."""

        def ours(r: FsResult) -> bool:
            return isinstance(r, FileStat) and r.is_dir and r.uid == self.uid and r.perms == 0o700

        if not (ours(got[0]) and ours(got[1])):
            return set()
        return {n for n, r in zip(services, got[2:], strict=True) if isinstance(r, FileStat) and r.is_file}


def service_dirs(transport: Transport, root: str, services: Iterable[str]) -> dict[str, str]:
    """Where each service's files are now (pidfiles, supervisor state, NAME.out, its --log-file), as
    the helper's own readers find them (svc_dir): the runtime dir while it holds NAME.state there
    (RuntimeDir's trust rule), else ROOT/run. run/ keeps an earlier run's files while the service
    runs from the runtime dir, so every reader of them asks here first (one SFTP batch, none
    where no runtime dir can be)."""
    services = tuple(services)
    rt = RuntimeDir.of(transport, root)
    held = rt.holding(services, fs_batch(transport, rt.lstats(services))) if rt is not None else set()
    return {n: rt.path if rt is not None and n in held else posixpath.join(root, "run") for n in services}


def service_dir(transport: Transport, root: str, service: str) -> str:
    return service_dirs(transport, root, (service,))[service]


def sup_user(cmdline: bytes, service: str) -> str | None:
    """The sup.user=U a supervisor of SERVICE was started with (`sh .../pairctl-svc supervise ROOT
    NAME sup.KEY=VALUE... PROGRAM ...`, its /proc/PID/cmdline), or None: none given, or not that."""
    args = cmdline.decode("utf-8", "surrogateescape").split("\0")
    if "supervise" not in args:
        return None
    i = args.index("supervise")
    if args[i + 2 : i + 3] != [service]:
        return None
    for a in args[i + 3 :]:
        if not a.startswith("sup."):
            break
        if a.startswith("sup.user="):
            return a[len("sup.user=") :] or None
    return None


def log_unwritable(transport: Transport, host: str, root: str, folder: str, service: str) -> str | None:
    """Why SERVICE's --log-file in FOLDER holds nothing, where that is known: it runs from the
    runtime dir (run/ read-only) as a service user (setpriv), which cannot enter that root-only 0700
    dir, so llama-server never opens its log there. None on the normal path (run/: no read at all),
    and where it runs as the login user or the host does not say."""
    if folder == posixpath.join(root, "run"):
        return None
    try:
        spid = parse_pid(transport.read_bytes(f"{folder}/{service}.sup.pid", max_bytes=64))
        user = sup_user(transport.read_bytes(f"/proc/{spid}/cmdline", HOST_FILE_MAX), service) if spid else None
    except OSError:
        return None
    if user is None:
        return None
    return (
        f"{host}: {service} runs from the runtime dir {folder} ({root}/run is read-only) as service user "
        f"{user}, which cannot write its log there: make {root}/run writable and restart {service}"
    )


def argv_from(argv: Iterable[str], root: str, service: str, folder: str) -> tuple[str, ...]:
    """ARGV as the helper starts SERVICE with its files in FOLDER (pairctl-svc.sh start_svc): every
    argument exactly equal to ROOT/run/SERVICE.log (wherever it is, not only after --log-file: that
    is llama-server's log file) names FOLDER's instead; every other argument is kept as it is."""
    here, there = posixpath.join(root, "run", f"{service}.log"), posixpath.join(folder, f"{service}.log")
    return tuple(there if a == here else a for a in argv)


def read_facts(transport: Transport, layout: Any, services: Iterable[str]) -> HostFacts:
    """What is installed and running on one host, read over SFTP only (no process on the host):
    the small files and links in one pipelined batch, then the processes their pid files name (a
    service started in the host's runtime dir: its pid file there, RuntimeDir)."""
    services = tuple(services)

    def got(r: FsResult) -> bytes | None:
        return r if isinstance(r, bytes) else None  # a missing or unreadable file reads as none

    check_root(transport, layout.root, layout.state)  # before the helper is hashed here and run by the caller
    rt = RuntimeDir.of(transport, layout.root) if services else None
    pidfiles = [layout.log(f"{name}.pid") for name in services]
    ops: list[FsRead] = [
        Lstat(layout.root),
        Lstat(layout.releases),
        Readlink(layout.current),
        Readlink(layout.previous),
        ReadFile(layout.svc, HOST_FILE_MAX),
        ReadFile(layout.route, HOST_FILE_MAX),
        # an older layout's, in the root itself, until a deploy or rollback moves them (layout.install_helper)
        Readlink(f"{layout.root}/current"),
        Readlink(f"{layout.root}/previous"),
        ReadFile(f"{layout.root}/route.json", HOST_FILE_MAX),
        Readlink(layout.run),
        Lstat(layout.state or layout.run, soft=True),  # an error (under an unsearchable dir): not known
        *(ReadFile(f, HOST_FILE_MAX) for f in pidfiles),
        *(rt.lstats(services) if rt else ()),
    ]
    first = fs_batch(transport, ops)
    n = len(services)
    pid_reads = dict(zip(services, first[11 : 11 + n], strict=True))
    in_rt = sorted(rt.holding(services, first[11 + n :])) if rt else []
    if rt and in_rt:  # read only once the dir is judged ours (a stranger's could hold a FIFO there)
        reads = fs_batch(transport, [ReadFile(f"{rt.path}/{s}.pid", HOST_FILE_MAX) for s in in_rt])
        pid_reads |= zip(in_rt, reads, strict=True)
    paths = {2: layout.current, 3: layout.previous}
    for new, old in ((2, 6), (3, 7), (5, 8)):  # run/'s where it has one
        if not isinstance(first[new], (str, bytes)):
            first[new], paths[new] = first[old], ops[old].path  # judged as the root's link it is
    root_exists = first[0] is not None
    releases: list[str] = []
    procs: dict[str, tuple[int, bytes]] = {}
    if root_exists:
        if first[1] is not None:
            releases = transport.listdir(layout.releases)
        pids = {name: parse_pid(raw) for name, r in pid_reads.items() if (raw := got(r))}
        running = [(name, pid) for name, pid in pids.items() if pid is not None]
        cmdlines = fs_batch(transport, [ReadFile(f"/proc/{pid}/cmdline", HOST_FILE_MAX) for _, pid in running])
        for (name, pid), r in zip(running, cmdlines, strict=True):
            if cmdline := got(r):
                procs[name] = (pid, cmdline)
    links = {
        layout.current: _link(first[2]) if root_exists else None,
        layout.previous: _link(first[3]) if root_exists else None,
    }
    for i, target in zip((2, 3), links.values(), strict=True):
        judged_link(transport.name, paths[i], target, layout.root)  # a bad one: HostStateError
    facts = facts_from(
        root_exists=root_exists,
        current_link=links[layout.current],
        previous_link=links[layout.previous],
        release_names=releases,
        svc_bytes=got(first[4]) if root_exists else None,
        route_bytes=got(first[5]) if root_exists else None,
        procs=procs,
        root=layout.root,
    )
    there = None if layout.state is None or isinstance(first[10], OSError) else first[10] is not None
    folders = {s: rt.path if rt is not None and s in in_rt else layout.run for s in services}
    return replace(facts, run_link=first[9] if isinstance(first[9], str) else None, state_there=there, folders=folders)


def judged_link(host: str, path: str, target: str | None, root: str) -> str | None:
    """The release the link PATH -> TARGET on HOST names (absolute only in run/); one that names
    none is refused with the way to repair it (HostStateError, exit 6)."""
    try:
        return release_of_link(target or "-", root, absolute=posixpath.dirname(path) != root.rstrip("/"))
    except ProbeError as exc:
        raise HostStateError(
            f"{host}: {path} -> {target}: {str(exc).split(': ')[0]}; it is not a release pairctl installed",
            hint=f"on {host}, point it at an installed release (`ln -sfn {root}/releases/ID {root}/run/current`) "
            "or remove it; then `pairctl repair --pair PAIR` rebuilds the route record from the links",
        ) from None


def _link(r: FsResult) -> str | None:
    return r if isinstance(r, str) else None


def parse_sha256sum(text: str) -> dict[str, str]:
    """`sha256sum` output -> {path: hex}; a leading "./" is dropped; binary-mode "*" accepted; the
    helper's `entries=N` line (release.check_hash_output judges it) is skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("entries="):
            continue
        if line.startswith("\\"):
            raise ProbeError(f"escaped file name in sha256sum output (unsupported): {line[:120]!r}")
        digest, sep, rest = line.partition(" ")
        if not sep or not _HEX64.match(digest) or not rest or rest[0] not in " *":
            raise ProbeError(f"not a sha256sum line: {line[:120]!r}")
        path = rest[1:]
        if path.startswith("./"):
            path = path[2:]
        if path in out:
            raise ProbeError(f"{path} listed twice")
        out[path] = digest
    return out


def hash_problems(expected: Mapping[str, str], observed: Mapping[str, str]) -> list[str]:
    """Every file the manifest names must be present with its sha256 (files it does not name are
    judged by release.check_hash_output, which sees the whole listing)."""
    problems = []
    for path, digest in sorted(expected.items()):
        got = observed.get(path)
        if got is None:
            problems.append(f"{path}: missing")
        elif got != digest:
            problems.append(f"{path}: sha256 {got[:16]}… expected {digest[:16]}…")
    return problems


@dataclass(frozen=True)
class ProcIdentity:
    name: str
    pid: int | None
    exe_sha256: str | None = None
    argv: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        return self.pid is not None


def parse_identity(text: str) -> dict[str, ProcIdentity]:
    """`pairctl-svc identity` lines: `proc=NAME:PID:SHA256:BASE64(cmdline)` or `proc=NAME:-`."""
    out = {}
    for key, value in parse_kv_lines(text):
        if key != "proc":
            raise ProbeError(f"unexpected {key!r} in identity output")
        parts = value.split(":")
        if len(parts) == 2 and parts[1] == "-":
            out[parts[0]] = ProcIdentity(parts[0], None)
            continue
        if len(parts) != 4 or not parts[1].isdigit() or not _HEX64.match(parts[2]):
            raise ProbeError(f"bad identity line {value[:120]!r}")
        try:
            raw = base64.b64decode(parts[3], validate=True)
        except binascii.Error:
            raise ProbeError("bad base64 cmdline") from None
        argv = tuple(a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0"))
        if argv and argv[-1] == "":
            argv = argv[:-1]
        out[parts[0]] = ProcIdentity(parts[0], int(parts[1]), parts[2], argv)
    return out


_BUILD_INFO = re.compile(r"^b(\d+)-([0-9a-f]{7,40})$")


def build_info_problems(build_info: str | None, revision: str, expected: str | None = None) -> list[str]:
    """`/props` build_info is `b<N>-<commit>`; the commit must be a prefix of the package's revision."""
    if not build_info:
        return ["/props has no build_info"]
    m = _BUILD_INFO.match(build_info)
    if not m:
        return [f"/props build_info {build_info!r} does not name a revision (b<N>-<commit>)"]
    if not revision.startswith(m.group(2)):
        return [f"/props build_info {build_info!r} names {m.group(2)}, package revision is {revision[:12]}"]
    if expected and build_info != expected:
        return [f"/props build_info {build_info!r}, package manifest says {expected!r}"]
    return []


def slots_problems(slots: Iterable[Mapping[str, Any]], parallel: int, per_slot_ctx: int) -> list[str]:
    slots = list(slots)
    problems = []
    if len(slots) != parallel:
        problems.append(f"/slots lists {len(slots)} slots, profile wants {parallel}")
    for s in slots:
        if s.get("n_ctx") != per_slot_ctx:
            problems.append(f"slot {s.get('id')}: n_ctx {s.get('n_ctx')}, profile gives {per_slot_ctx} per slot")
    return problems


@dataclass(frozen=True)
class ExpectedProc:
    """What one supervised process must be: the manifest's binary hash and the exact argv."""

    name: str
    exe_sha256: str
    argv: tuple[str, ...]


def proc_problems(host: str, expected: ExpectedProc, seen: ProcIdentity | None) -> list[str]:
    if seen is None or not seen.running:
        return [f"{host}: {expected.name} is not running"]
    problems = []
    if seen.exe_sha256 != expected.exe_sha256:
        problems.append(
            f"{host}: running {expected.name} (pid {seen.pid}) has sha256 {str(seen.exe_sha256)[:16]}…, "
            f"manifest says {expected.exe_sha256[:16]}…"
        )
    if tuple(seen.argv) != tuple(expected.argv):
        diff = _first_difference(expected.argv, seen.argv)
        problems.append(f"{host}: {expected.name} argv differs from the rendered profile ({diff})")
    return problems


def _first_difference(want: tuple[str, ...], got: tuple[str, ...]) -> str:
    for i, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return f"argument {i}: {b!r}, expected {a!r}"
    if len(want) != len(got):
        return f"{len(got)} arguments, expected {len(want)}"
    return "identical"


def parse_rpc_bind(argv: Iterable[str]) -> tuple[str | None, int | None]:
    """`-H ADDR -p PORT` from a ggml-rpc-server argv (the defaults if absent: 127.0.0.1, 50052)."""
    host, port = None, None
    args = list(argv)
    for i, a in enumerate(args[:-1]):
        if a in ("-H", "--host"):
            host = args[i + 1]
        elif a in ("-p", "--port") and args[i + 1].isdigit():
            port = int(args[i + 1])
    return host, port


def parse_rpc_probe(out: str, name: str) -> str | None:
    """`rpc=NAME:STATE` from `pairctl-svc rpc-probe` -> STATE: down | stopped | serving |
    unanswered | unprobed | hello:M.m.p (None when the helper printed no such line)."""
    for line in out.splitlines():
        if line.startswith(f"rpc={name}:"):
            return line.split(":", 1)[1][:40]
    return None


def rpc_probe_problem(host: str, name: str, state: str | None, hang_s: float) -> str | None:
    """A problem line when the probe found NAME hung (a TCP connect cannot: the kernel accepts)."""
    if state == "stopped":
        return f"{host}: {name} is stopped (SIGSTOP): it accepts connections but answers nothing"
    if state == "unanswered":
        return f"{host}: {name} did not answer the RPC HELLO within {hang_s:g} s (hung)"
    return None


# TCP listeners from the kernel's own tables, not `ss` (iproute2 is missing on minimal images).
PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN = 10


def _proc_addr(hex_addr: str) -> str:
    """A /proc/net/tcp{,6} address (each 32-bit word in host byte order, x86/arm little-endian)."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) not in (4, 16):
        raise ValueError(f"not an IPv4 or IPv6 address: {hex_addr!r}")
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(packed)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def parse_proc_net_tcp(text: str) -> list[tuple[str, int]]:
    """(address, port) of every listening socket in /proc/net/tcp and /proc/net/tcp6 text (both
    files concatenated, each with its header line). A line that is not a socket entry is ignored."""
    out: list[tuple[str, int]] = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 4 or not f[0].endswith(":") or not f[0][:-1].isdigit() or f[3].upper() != TCP_LISTEN:
            continue
        host, _, port = f[1].partition(":")
        try:
            out.append((_proc_addr(host), int(port, 16)))
        except ValueError:
            continue
    return out


def listeners_cmd() -> Cmd:
    """Both kernel tables; the command exits 1 on a host without IPv6 (tcp6 absent): judge stdout."""
    return Cmd(("cat", *PROC_NET_TCP))


def tcp_listeners(transport: Transport) -> list[tuple[str, int]]:
    """The host's listening TCP sockets, read from its /proc (no `ss` needed on the host)."""
    r = transport.run(listeners_cmd(), check=False, timeout=30)
    if "local_address" not in r.stdout:
        raise HostStateError(
            f"{transport.name}: cannot read {' '.join(PROC_NET_TCP)} (exit {r.exit_status}): {r.stderr.strip()[:200]}"
        )
    return parse_proc_net_tcp(r.stdout)


def port_taken(listeners: Iterable[tuple[str, int]], bind: str, port: int) -> list[str]:
    """Listening addresses that would clash with binding bind:port (the same address or a wildcard)."""
    clash = {bind, "0.0.0.0", "::"}
    return [f"[{a}]:{p}" if ":" in a else f"{a}:{p}" for a, p in listeners if p == port and a in clash]


def parse_proc_stat(data: bytes) -> tuple[str, int] | None:
    """(state, utime + stime in clock ticks) from /proc/<pid>/stat (proc(5): the command name in
    parentheses may hold spaces, so fields are counted after its closing parenthesis: state is
    field 3, utime 14 and stime 15). None when the text is not such a line."""
    text = data.decode("ascii", "replace")
    _, sep, rest = text.rpartition(")")
    f = rest.split()
    if not sep or len(f) < 13 or not f[11].isdigit() or not f[12].isdigit():
        return None
    return f[0], int(f[11]) + int(f[12])
