"""Inventories: hosts (how to reach them, where to install) and pairs (a native + an RPC host)."""

from __future__ import annotations

import os
import posixpath
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from orchestrator.config import search
from orchestrator.config.base import StrictModel
from orchestrator.config.evidence_remote import EvidenceRemote, resolve_remote
from orchestrator.config.flags import RISKY, argv_text_problem, canonical_risky, rpc_bind_problem, server_bind_problem
from orchestrator.config.loader import expand, load_model
from orchestrator.errors import ConfigError
from orchestrator.paths import MANIFESTS

# Host and pair names travel into paths, lease owners, receipts and remote argv: keep them plain.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class ModelRef(StrictModel):
    path: str = Field(description="path of the GGUF on the native host")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _argv(cls, v: str) -> str:
        if why := argv_text_problem(v):
            raise ValueError(f"the model path {why}")
        return v


class HostSpec(StrictModel):
    address: str = Field(min_length=1)
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    key: str | None = Field(default=None, description="private key for this host (operator side)")
    install_root: str = Field(description="absolute directory on the host: releases/, bin/, secrets/, run/ (a link)")
    state_dir: str | None = Field(
        default=None,
        description="absolute directory on the host, outside install_root, for all that is written after the "
        "upload (current/previous links, route.json, leases, pidfiles, supervisor state, logs): install_root/run "
        "becomes a link to it, judged like the root, so an install root that turned read-only stops nothing; "
        "default: install_root with `.state` appended, beside it (a deploy is refused where that cannot be made); "
        "it must survive a reboot: on tmpfs (e.g. under /run) a reboot loses the links, the route record and the "
        "leases, and the host reads as never deployed",
    )
    role: Literal["native", "rpc"]
    transport: Literal["ssh", "local"] = "ssh"
    gpu: str | None = Field(default=None, description="expected GPU, e.g. 'Tesla V100'; none for CPU lab hosts")
    service_manager: Literal["pairctl", "systemd"] = Field(
        default="pairctl",
        description=(
            "what runs each service's supervisor: 'pairctl' (setsid, started again at boot by an @reboot "
            "crontab line) or 'systemd' (an enabled unit per service, installed, verified and read back by deploy)"
        ),
    )
    systemd_scope: Literal["user", "system"] = Field(
        default="user",
        description="with service_manager: systemd, the login user's manager (needs `loginctl enable-linger` "
        "to start at boot) or the system manager (/etc/systemd/system; the user must be root)",
    )

    service_user: str | None = Field(
        default=None,
        pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
        description="the unprivileged host user the servers run as (the supervisor, run as root, drops them to it "
        "with setpriv); needs `user: root`; required with systemd_scope: system",
    )

    @model_validator(mode="after")
    def _check(self) -> HostSpec:
        if self.service_manager == "systemd" and self.systemd_scope == "system" and self.user != "root":
            raise ValueError(
                f"systemd_scope: system needs `user: root` written here (units go to /etc/systemd/system), not "
                f"{self.user or 'a user taken from ssh_config or the local login'}; "
                "use systemd_scope: user for a login user's own manager"
            )
        if self.service_user is not None and (self.user != "root" or self.service_user == "root"):
            raise ValueError(
                f"service_user: {self.service_user} needs `user: root` written here (only root can run the servers as "
                "another user) and must not be root; remove it to run them as the login user"
            )
        if self.service_manager == "systemd" and self.systemd_scope == "system" and self.service_user is None:
            raise ValueError(
                "systemd_scope: system would run llama-server and ggml-rpc-server as root; set service_user to an "
                "unprivileged host user that can read the models and use the GPUs (e.g. `useradd --system "
                "--no-create-home pairctl` on the host, then service_user: pairctl)"
            )
        if problem := state_problem(self.state_dir, self.install_root):
            raise ValueError(problem)
        return self

    @field_validator("install_root", "state_dir")
    @classmethod
    def _abs(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        if not (v.startswith("/") or v.startswith("${") or v.startswith("~")):
            raise ValueError(f"{info.field_name} must be an absolute path")
        try:
            check_canonical_root(v)
        except ValueError as exc:
            raise ValueError(str(exc).replace("install_root", str(info.field_name))) from None
        return v


def state_problem(s: str | None, r: str) -> str | None:
    """A state_dir inside install_root (or holding it): judged as written and again as expanded."""
    if s is not None and (s == r or s.startswith(r + "/") or r.startswith(s + "/")):
        return (
            f"state_dir {s} must lie outside install_root {r} (and not hold it): it is what "
            "keeps working when the root turns read-only"
        )
    return None


def default_state_dir(root: str) -> str:
    """Where run/ links without a state_dir: beside the root, so a read-only root still lets a
    rollback start; computed, never asked of the host, so every reader names it alike."""
    return root + ".state"


def check_canonical_root(v: str) -> None:
    """An install root is written the way it resolves: no `.`/`..`/empty segments, not `/`.
    `/.` and `/var/..` both name `/`; a root that normalises elsewhere than it reads is refused.
    A `${VAR}` or `~` prefix is judged on what follows it."""
    rest = v.split("/", 1)[1] if "/" in v else ""
    if v.startswith("/") and posixpath.normpath(v) in ("/", "//"):
        raise ValueError(f"install_root {v!r} is / (it normalises to {posixpath.normpath(v)!r})")
    if why := argv_text_problem(v):
        raise ValueError(f"install_root {why}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise ValueError(f"install_root {v!r} holds a control character (a line break, a tab, an escape)")
    if any(seg in ("", ".", "..") for seg in rest.split("/")) and rest != "":
        raise ValueError(
            f"install_root {v!r} is not canonical (it normalises to {posixpath.normpath(v)!r}); write it without "
            "'.', '..', repeated or trailing '/'"
        )


def check_expanded_root(host: str, written: str, root: str, field: str = "install_root") -> None:
    """What `${VAR}` or `~` in an install root (or state_dir) expanded to is judged as if it had
    been written: `${ROOT}` with ROOT=/ is the root directory, ROOT=srv a relative path."""
    try:
        if not root.startswith("/"):
            raise ValueError(f"{field} expands to {root!r}, not an absolute path")
        check_canonical_root(root)
    except ValueError as exc:
        why = str(exc).replace("install_root", field)
        raise ConfigError(f"hosts.{host}.{field}: {why} (from {written!r})") from None


class PairSpec(StrictModel):
    native: str = Field(pattern=NAME_PATTERN)
    rpc: str = Field(pattern=NAME_PATTERN)
    profile: str = Field(default="lab", description="default route profile for this pair")
    server_port: int = Field(default=8080, ge=1, le=65535)
    server_bind: str | None = Field(default=None, description="llama-server --host; default: the native host's address")
    rpc_port: int = Field(default=50052, ge=1, le=65535)
    rpc_bind: str | None = Field(default=None, description="ggml-rpc-server -H; default: the RPC host's address")
    rpc_peers: list[str] | None = Field(
        default=None,
        description="the IPv4 addresses ggml-rpc-server serves (its guard resets every other peer); default: "
        "the native host's address and the RPC host's own (its supervisor's probe), or 127.0.0.1 for a "
        "loopback rpc_bind",
    )
    allow_rpc_bind_any: bool = Field(
        default=False, description="no longer honoured: ggml-rpc-server binds to one specific unicast address"
    )
    allow_flags: dict[str, str] = Field(
        default_factory=dict,
        description="risky llama-server flags this pair may use (e.g. --tools), each with the reason; "
        "needs api_key_file",
    )
    models: dict[str, ModelRef] = Field(default_factory=dict)
    api_key_file: str | None = Field(default=None, description="operator-side file holding the API key (never argv)")
    target_native: str | None = Field(default=None, description="build target expected on the native host")
    target_rpc: str | None = Field(default=None, description="build target expected on the RPC host")

    @model_validator(mode="after")
    def _check(self) -> PairSpec:
        if self.native == self.rpc:
            raise ValueError("native and rpc must be two different hosts")
        if self.allow_rpc_bind_any:
            raise ValueError(
                "allow_rpc_bind_any is not honoured: ggml-rpc-server runs any graph a client sends, so it "
                "binds to one specific unicast address; remove the key and set rpc_bind"
            )
        if self.rpc_bind is not None and (why := rpc_bind_problem(self.rpc_bind)):
            raise ValueError(f"rpc_bind {why}")
        for peer in self.rpc_peers or ():
            if rpc_bind_problem(peer):
                raise ValueError(f"rpc_peers: {peer!r} is not one specific unicast IPv4 address")
        if self.rpc_peers is not None and not self.rpc_peers:
            raise ValueError("rpc_peers is empty: ggml-rpc-server would serve no one (leave it out for the default)")
        has_key = bool(self.api_key_file)
        if self.server_bind is not None and (why := server_bind_problem(self.server_bind, api_key=has_key)):
            raise ValueError(f"server_bind {why}")
        for flag, reason in self.allow_flags.items():
            if canonical_risky(flag) is None:
                raise ValueError(
                    f"allow_flags: {flag!r} is not a flag pairctl refuses (known: {', '.join(sorted(RISKY))})"
                )
            if not reason.strip():
                raise ValueError(f"allow_flags: {flag!r} needs a reason (it is recorded in every receipt)")
        if self.allow_flags and not self.api_key_file:
            raise ValueError("allow_flags needs api_key_file: a risky flag is never served without an API key")
        return self


HookEvent = Literal[
    "pre-deploy",  # before any host changes; a hook that fails vetoes the deploy (Kamal's pre-deploy)
    "deploy.passed",
    "deploy.rolled_back",
    "deploy.rollback_failed",
    "rollback.passed",
    "rollback.failed",
    "accept.scheduled_failed",
    "accept.scheduled_skipped",
    "fleet.finished",
    "fleet.paused",  # `--waves N` ran its N waves and waves are left (the same command continues)
]


class HookSpec(StrictModel):
    """A command run on the operator's machine on events (orchestrator/ops/hooks.py): argv, never
    a shell line; the event arrives as one JSON document on stdin; its failure never changes the
    outcome of the run that fired it."""

    on: list[HookEvent] = Field(min_length=1, description="events that run it")
    argv: list[str] = Field(min_length=1, description="program and arguments (no shell); secrets in files, not here")
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="killed after this many seconds")

    @model_validator(mode="before")
    @classmethod
    def _bare_on(cls, data: Any) -> Any:
        """YAML 1.1 (PyYAML) reads a bare `on:` key as the boolean true (as GitHub Actions files
        know): that key is `on`, so what operators write works, quoted or not."""
        if isinstance(data, dict) and True in data:
            data = dict(data)
            if "on" in data:
                raise ValueError('both `on:` and `"on":` given; keep one')
            data["on"] = data.pop(True)
        return data


class Supervision(StrictModel):
    """How each host's supervisor (pairctl-svc `supervise`) keeps a service up: restart after a
    crash with exponential backoff, give up after a crash loop, restart a hung llama-server."""

    backoff_s: float = Field(default=1.0, gt=0, le=3600, description="first restart delay; doubles per restart")
    backoff_max_s: float = Field(default=30.0, gt=0, le=3600, description="restart delay (and RPC-peer wait) cap")
    loop_starts: int = Field(default=5, ge=1, le=1000, description="this many starts within loop_window_s: give up")
    loop_window_s: int = Field(default=60, ge=1, le=86400, description="the crash-loop window")
    hang_after_s: int = Field(
        default=30, ge=0, le=86400, description="llama-server /health unanswered this long: restarted (0: never)"
    )
    probe_every_s: float = Field(default=1.0, gt=0, le=600, description="how often the service is looked at")
    log_max_bytes: int = Field(default=64 << 20, ge=0, description="run/NAME.out rotates past this size (0: never)")
    log_keep: int = Field(default=3, ge=1, le=100, description="rotated logs kept per file")

    @model_validator(mode="after")
    def _check(self) -> Supervision:
        if self.backoff_max_s < self.backoff_s:
            raise ValueError("supervision.backoff_max_s must be at least backoff_s")
        return self


class Inventory(StrictModel):
    known_hosts: str = Field(default="~/.ssh/known_hosts", description="strict host-key checking against this file")
    use_ssh_config: bool = Field(default=False, description="fill user/port/key left out here from ~/.ssh/config")
    keep_releases: int = Field(default=5, ge=1, description="releases kept per host by deploy and `releases prune`")
    supervision: Supervision = Field(default_factory=Supervision, description="the hosts' service supervisors")
    hosts: dict[str, HostSpec]
    pairs: dict[str, PairSpec] = Field(default_factory=dict)
    hooks: list[HookSpec] = Field(default_factory=list, description="commands run on events (deploy, accept, fleet)")
    evidence_remote: EvidenceRemote | None = Field(
        default=None, description="the team's shared evidence remote: receipts pushed to a git repository over SSH"
    )

    @model_validator(mode="after")
    def _check(self) -> Inventory:
        for kind, names in (("host", self.hosts), ("pair", self.pairs)):
            for n in names:
                if not re.fullmatch(NAME_PATTERN, n):
                    raise ValueError(
                        f"{kind} name {n!r} may hold only letters, digits, '.', '_' and '-' "
                        "(it becomes part of paths, lease owners and commands)"
                    )
        states: dict[tuple[str, int, str], tuple[str, str]] = {}
        for n, h in self.hosts.items():  # two roots on one machine sharing run/: one's stop kills the other's
            if h.state_dir is None:
                continue
            other, root = states.setdefault((h.address, h.port, h.state_dir), (n, h.install_root))
            if root != h.install_root:  # two names for one root share its state, as they share the root
                raise ValueError(f"hosts {other!r} and {n!r} share state_dir {h.state_dir} on {h.address}: one each")
        for pname, pair in self.pairs.items():
            for side, expect in (("native", "native"), ("rpc", "rpc")):
                host = getattr(pair, side)
                if host not in self.hosts:
                    raise ValueError(f"pair {pname!r}: {side} host {host!r} is not in hosts ({sorted(self.hosts)})")
                if self.hosts[host].role != expect:
                    raise ValueError(
                        f"pair {pname!r}: host {host!r} has role {self.hosts[host].role}, expected {expect}"
                    )
            if pair.rpc_bind is None and (why := rpc_bind_problem(self.hosts[pair.rpc].address)):
                raise ValueError(
                    f"pair {pname!r}: ggml-rpc-server binds to the rpc host's address, and {why}; set rpc_bind"
                )
            if pair.rpc_peers is None and _default_peers(self.hosts[pair.native].address, self.rpc_bind(pname)) is None:
                raise ValueError(
                    f"pair {pname!r}: the native host's address {self.hosts[pair.native].address!r} is not an IPv4 "
                    "address, so ggml-rpc-server's guard cannot default to it; set rpc_peers to the address(es) "
                    "the native host connects from"
                )
            if pair.server_bind is None and (
                why := server_bind_problem(self.hosts[pair.native].address, api_key=bool(pair.api_key_file))
            ):
                raise ValueError(
                    f"pair {pname!r}: llama-server binds to the native host's address: {why}; set server_bind"
                )
        resolve_remote(self)  # the remote's host must be one of these hosts
        return self

    def pair(self, name: str) -> PairSpec:
        try:
            return self.pairs[name]
        except KeyError:
            raise ConfigError(
                f"no pair named {name!r} in the inventory (pairs: {', '.join(sorted(self.pairs)) or 'none'})"
            ) from None

    def api_key(self, pair_name: str) -> ApiKey | None:
        """The pair's API key, read by `read_api_key` (the one reader: deploy, rollback, accept, qualify)."""
        return read_api_key(pair_name, self.pair(pair_name))

    def host(self, name: str) -> HostSpec:
        try:
            return self.hosts[name]
        except KeyError:
            raise ConfigError(
                f"no host named {name!r} in the inventory (hosts: {', '.join(sorted(self.hosts))})"
            ) from None

    def rpc_bind(self, pair: str) -> str:
        p = self.pair(pair)
        return p.rpc_bind or self.hosts[p.rpc].address

    def rpc_peers(self, pair: str) -> list[str]:
        """The peers ggml-rpc-server serves (orchestrator/hosts/rpc_guard.c): the pair's rpc_peers,
        else the native host's address plus the RPC host's own (its supervisor probes the server),
        else, for a loopback rpc_bind, 127.0.0.1 (the kernel's source address towards 127/8)."""
        p = self.pair(pair)
        peers = p.rpc_peers or _default_peers(self.hosts[p.native].address, self.rpc_bind(pair))
        if not peers:
            raise ConfigError(f"pair {pair!r}: set rpc_peers (the native host's address is not IPv4)")
        return peers

    def server_bind(self, pair: str) -> str:
        p = self.pair(pair)
        return p.server_bind or self.hosts[p.native].address

    def resolved(self, variables: dict[str, str] | None = None) -> Inventory:
        """A copy with `${VAR}` and `~` expanded in every path."""

        def hx(name: str, h: HostSpec) -> HostSpec:
            root = expand(h.install_root, variables)
            check_expanded_root(name, h.install_root, root)
            state = expand(h.state_dir, variables) if h.state_dir else default_state_dir(root)
            check_expanded_root(name, h.state_dir or root, state, "state_dir")
            if problem := state_problem(state, root):
                raise ConfigError(f"hosts.{name}.state_dir: {problem} (as expanded)")
            return h.model_copy(
                update={"install_root": root, "state_dir": state, "key": expand(h.key, variables) if h.key else None}
            )

        def px(p: PairSpec) -> PairSpec:
            return p.model_copy(
                update={
                    "models": {
                        k: m.model_copy(update={"path": expand(m.path, variables)}) for k, m in p.models.items()
                    },
                    "api_key_file": expand(p.api_key_file, variables) if p.api_key_file else None,
                }
            )

        return self.model_copy(
            update={
                "known_hosts": expand(self.known_hosts, variables),
                "hosts": {k: hx(k, h) for k, h in self.hosts.items()},
                "pairs": {k: px(p) for k, p in self.pairs.items()},
                "evidence_remote": None
                if self.evidence_remote is None
                else self.evidence_remote.model_copy(
                    update={
                        k: expand(v, variables)
                        for k in ("allowed_signers", "signing_key")
                        if (v := getattr(self.evidence_remote, k))
                    }
                ),
            }
        )


@dataclass(frozen=True)
class ApiKey:
    """A pair's API key: the file as uploaded for `--api-key-file`, and what clients send."""

    file_bytes: bytes = field(repr=False)
    value: str = field(repr=False)  # the file's first non-empty line (sent as the Bearer token)

    def __repr__(self) -> str:
        return "ApiKey(***)"


def read_api_key(pair_name: str, pair: PairSpec) -> ApiKey | None:
    """Read the operator-side key file once, alike for deploy, rollback and accept. Unreadable, empty
    or not printable ASCII (it goes into an HTTP header) is a config error, never a silent "no key"."""
    if not pair.api_key_file:
        return None
    try:
        data = Path(pair.api_key_file).read_bytes()
    except OSError as exc:
        raise ConfigError(f"pair {pair_name}: cannot read api_key_file {pair.api_key_file}: {exc.strerror}") from None
    value = _parse_api_key(pair_name, pair.api_key_file, data)
    warn_if_readable_by_others(pair.api_key_file, what=f"pair {pair_name}: api_key_file")
    return ApiKey(file_bytes=data, value=value)


def api_key_file_problems(pair_name: str, api_key_file: str) -> list[str]:
    """What deploy would refuse or warn about in a pair's api_key_file, for `config check` and `doctor`:
    missing or unreadable, not a regular file, read differently by llama-server, readable by others."""
    p = Path(api_key_file)
    try:
        if not p.is_file():
            what = "does not exist" if not p.exists() else "is not a regular file"
            return [f"pair {pair_name}: api_key_file {api_key_file} {what}; write the key there (one line) and "
                    f"chmod 600 {api_key_file}"]  # fmt: skip
        data = p.read_bytes()
    except OSError as exc:
        return [f"pair {pair_name}: cannot read api_key_file {api_key_file}: {exc.strerror}"]
    out: list[str] = []
    try:
        _parse_api_key(pair_name, api_key_file, data)
    except ConfigError as exc:
        out.append(str(exc))
    mode = readable_by_others(api_key_file)
    if mode is not None:
        out.append(f"pair {pair_name}: api_key_file {api_key_file} is mode {mode:04o}, readable by other users; "
                   f"chmod 600 {api_key_file}")  # fmt: skip
    return out


def _parse_api_key(pair_name: str, api_key_file: str, data: bytes) -> str:
    """The key clients send (the first key line), or a ConfigError naming what llama-server would get wrong."""
    bad = next((i for i, b in enumerate(data) if not (0x20 <= b <= 0x7E or b in (0x09, 0x0A, 0x0D))), None)
    if bad is not None:
        line = data[:bad].count(b"\n") + 1
        raise ConfigError(
            f"pair {pair_name}: api_key_file {api_key_file} holds a byte that is not printable ASCII "
            f"(line {line}); an API key is sent in an HTTP header and must be printable ASCII",
            hint="write the key as letters, digits and punctuation only",
        )
    # llama-server's --api-key-file: every line but empty ones and those starting with '#' is a
    # key, taken verbatim (std::getline: spaces, tabs and a CRLF file's '\r' stay in the key). A
    # key line that is not its own stripped text would be a key nobody means (a line of spaces)
    # or one no client can send (a header value loses them): refused, naming the line.
    lines = data.decode("ascii").split("\n")
    for n, ln in enumerate(lines, start=1):
        if ln and not ln.startswith("#") and ln != ln.strip():
            raise ConfigError(
                f"pair {pair_name}: api_key_file {api_key_file} line {n} has spaces, tabs or a carriage "
                "return around its key; llama-server takes each line verbatim, so that key could never be sent",
                hint="remove them (and write the file with Unix line ends)",
            )
    value = next((ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")), "")
    if not value and not any(ln.strip() for ln in lines):
        raise ConfigError(f"pair {pair_name}: api_key_file {api_key_file} is empty")
    if not value:
        raise ConfigError(
            f"pair {pair_name}: api_key_file {api_key_file} holds no key "
            "(llama-server reads lines starting with '#' as comments)"
        )
    return value


def readable_by_others(path: str | os.PathLike[str]) -> int | None:
    """The file's mode when group or others may read it, else None (also when it cannot be read)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return stat.S_IMODE(mode) if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH) else None


def warn_if_readable_by_others(path: str | os.PathLike[str], *, what: str) -> str | None:
    """Warn (stderr, log) when an operator-side secret is group/world accessible; returns the text."""
    mode = readable_by_others(path)
    if mode is None:
        return None
    from orchestrator.log import get_logger  # log imports structlog; config stays light to import

    text = f"{what} {path} is mode {mode:04o}: readable by other users; chmod 600 {path}"
    get_logger().warning(text)
    return text


def inventories_dir() -> Path:
    return MANIFESTS / "inventories"


def load_inventory(name_or_path: str, variables: dict[str, str] | None = None) -> Inventory:
    p = search.resolve_ref("inventory", name_or_path)
    return load_model(Inventory, p).resolved(variables)


def _default_peers(native_address: str, rpc_bind: str) -> list[str] | None:
    import ipaddress

    try:
        bind = ipaddress.IPv4Address(rpc_bind)
    except ValueError:
        return None
    if bind.is_loopback:
        return ["127.0.0.1"]
    try:
        native = ipaddress.IPv4Address(native_address)
    except ValueError:
        return None
    return list(dict.fromkeys([str(native), str(bind)]))
