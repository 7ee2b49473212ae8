"""systemd units for a pair's services (pure rendering), and their check by `systemd-analyze verify`.

For hosts with systemd (`service_manager: systemd` in the inventory), the units carry what the
supervisor does on hosts without it: Restart=on-failure with the inventory's backoff, a start
limit (the crash loop), a cleared environment (systemd gives a service none of the user's), the
exact argv pairctl verifies, and, where both services share a host, rpc-before-native ordering
with llama-server bound to ggml-rpc-server (restarted when it restarts). Rendering is pure; the
verification runs the real `systemd-analyze verify` on the rendered files before anything is
installed.
"""

from __future__ import annotations

import math
import posixpath
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.config.inventory import Supervision
from orchestrator.errors import ConfigError
from orchestrator.roles import LLAMA_SERVER, RPC_SERVER


def unit_name(pair: str, service: str) -> str:
    return f"pairctl-{pair}-{service}.service"


def exec_quote(arg: str) -> str:
    """One ExecStart= word: double-quoted, with systemd's C-style escapes, and `$`/`%` doubled so
    neither environment expansion nor specifiers change the argv."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in arg):
        raise ConfigError(f"argument {arg!r} holds a control character; it cannot be written into a unit")
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    return f'"{escaped}"'


def _spec(value: str) -> str:
    """A path setting: `%` doubled (specifiers); control characters refused."""
    exec_quote(value)
    return value.replace("%", "%%")


def _env_quote(assignment: str) -> str:
    exec_quote(assignment)
    return '"' + assignment.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'


def render_unit(
    *,
    pair: str,
    service: str,
    argv: Sequence[str],
    root: str,
    supervision: Supervision,
    after: str | None = None,
    user: bool = False,
) -> str:
    """One service unit. `after`: the unit this one needs first on the same host (the RPC server)."""
    bindir = posixpath.dirname(argv[0])
    home = posixpath.join(root, "run", "home", service)
    lines = [
        "# written by pairctl; the argv is the one pairctl verifies (do not edit: a deploy rewrites it)",
        "[Unit]",
        f"Description=pairctl pair {pair}: {service}",
        f"StartLimitIntervalSec={supervision.loop_window_s}",
        f"StartLimitBurst={supervision.loop_starts}",
    ]
    if after:
        lines += [f"After={after}", f"BindsTo={after}"]
    elif not user:
        lines += ["After=network-online.target", "Wants=network-online.target"]
    lines += [
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={' '.join(exec_quote(a) for a in argv)}",
        "Restart=on-failure",
        f"RestartSec={max(1, math.ceil(supervision.backoff_s))}",
        "Environment=PATH=/usr/local/bin:/usr/bin:/bin",
        f"Environment={_env_quote('LD_LIBRARY_PATH=' + bindir)}",
        f"Environment={_env_quote('HOME=' + home)}",
        f"WorkingDirectory={_spec(home)}",
        f"StandardOutput=append:{_spec(posixpath.join(root, 'run', service + '.out'))}",
        f"StandardError=append:{_spec(posixpath.join(root, 'run', service + '.out'))}",
        "",
        "[Install]",
        f"WantedBy={'default.target' if user else 'multi-user.target'}",
        "",
    ]
    return "\n".join(lines)


def render_pair_units(
    *,
    pair: str,
    native_argv: Sequence[str],
    rpc_argv: Sequence[str],
    native_root: str,
    rpc_root: str,
    same_host: bool,
    supervision: Supervision,
    user: bool = False,
) -> dict[str, dict[str, str]]:
    """role -> {unit file name: text}. Sharing a host, llama-server's unit comes after (and is
    bound to) ggml-rpc-server's, so it starts once its peer runs and restarts with it."""
    rpc_unit = unit_name(pair, RPC_SERVER)
    return {
        "rpc": {
            rpc_unit: render_unit(
                pair=pair, service=RPC_SERVER, argv=rpc_argv, root=rpc_root, supervision=supervision, user=user
            )
        },
        "native": {
            unit_name(pair, LLAMA_SERVER): render_unit(
                pair=pair,
                service=LLAMA_SERVER,
                argv=native_argv,
                root=native_root,
                supervision=supervision,
                after=rpc_unit if same_host else None,
                user=user,
            )
        },
    }


def verify_units(units: Mapping[str, str], *, user: bool = False, timeout_s: float = 60.0) -> list[str]:
    """Run `systemd-analyze verify` on the rendered files (in a temporary directory, together,
    so their references resolve); returns its complaints, [] when they verify."""
    with tempfile.TemporaryDirectory(prefix="pairctl-units-") as d:
        paths = []
        for name, text in units.items():
            p = Path(d, name)
            p.write_text(text)
            paths.append(str(p))
        argv = ["systemd-analyze", *(["--user"] if user else []), "verify", *paths]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except FileNotFoundError:
            return ["systemd-analyze is not installed here"]
        out = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
        return out if res.returncode != 0 or out else []
