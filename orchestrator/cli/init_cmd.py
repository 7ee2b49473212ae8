"""`pairctl init DIR`: scaffold an operator's config repo.

The repo holds what is the operator's own (an inventory for their real pair, a production
profile, answer fixtures, a README); everything else resolves to the bundled defaults. What it
writes passes `pairctl --config DIR config check` as written: placeholders are valid values
(TEST-NET addresses, example paths), to be replaced with the real hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from orchestrator.checks.fixtures import Expect, Fixture
from orchestrator.cli.context import get_ctx
from orchestrator.errors import ConfigError
from orchestrator.evidence import atomic

INVENTORY = """\
# pairctl inventory: one matched pair, a V100 native host and an RTX 5060 Ti RPC host.
# Use it with `pairctl --config DIR -i site ...` (or export PAIRCTL_CONFIG / PAIRCTL_INVENTORY).
# Replace the addresses, user, key and model paths with your own; `pairctl --config DIR
# config check` validates every field and every name it uses (profile, targets, model roles).

# Strict host-key checking against this file: add both hosts first (`ssh-keyscan -H ADDR >> FILE`,
# checked by hand), `pairctl doctor` names any that is missing or changed.
known_hosts: ~/.ssh/known_hosts

# Releases kept on each host after a deploy (oldest removed first; current, previous and any
# release another pair's route names are always kept). A CUDA package is ~300 MB per host.
keep_releases: 5

hosts:
  v100:                          # the native host: runs llama-server with --rpc to the RPC host
    address: 192.0.2.10          # TEST-NET placeholder: your V100 box's address or DNS name
    port: 22
    user: pairctl                # a user that owns install_root (no root needed)
    key: ~/.ssh/id_ed25519       # operator-side private key for this host
    install_root: /opt/pairctl   # releases/, current, previous, leases/, run/ live here
    # Runtime files (pidfiles, supervisor state, logs) outside install_root: run/ becomes a link
    # here, so a root that turns read-only mid-deploy still lets the rollback restart the previous
    # pair. Set it before the first deploy (an existing run/ directory is refused, not moved).
    # state_dir: /var/lib/pairctl
    role: native
    gpu: Tesla V100              # substring expected in nvidia-smi's GPU name
    # Who keeps the services up: pairctl's own supervisor (default; an @reboot crontab line
    # starts it at boot) or, on a host with systemd, one enabled unit per service. A user
    # manager starts at boot only after `loginctl enable-linger pairctl` on the host.
    # service_manager: systemd
    # systemd_scope: user
    # With `user: root` (and always with systemd_scope: system) name an unprivileged user the
    # servers run as; it must read the models and use the GPUs:
    # service_user: llama
  rtx5060ti:                     # the RPC host: runs ggml-rpc-server, serving its GPU to the native host
    address: 192.0.2.11
    port: 22
    user: pairctl
    key: ~/.ssh/id_ed25519
    install_root: /opt/pairctl
    role: rpc
    gpu: RTX 5060 Ti

pairs:
  prod:
    native: v100
    rpc: rtx5060ti
    profile: production          # profiles/production.yaml in this repo
    server_port: 8080
    rpc_port: 50052
    # ggml-rpc-server is not secure (it runs any graph a client sends): it binds the RPC host's
    # address above, one specific address, never 0.0.0.0; keep the link between the hosts private.
    target_native: v100          # CUDA 12.x builds sm_70 (CUDA 13 cannot)
    target_rpc: rtx5060ti        # sm_120
    # llama-server listens on the native host's address, so it needs an API key: create this
    # operator-side file (one line, printable ASCII, mode 0600) before the first deploy; it is
    # uploaded 0600, never argv. Without one, set server_bind to a loopback address.
    api_key_file: ~/.config/pairctl/prod.key
    models:
      # role -> GGUF path on the native host; sha256 pins the exact file (deploy refuses another)
      target: {path: /srv/models/target.gguf}
"""

README = """\
# pairctl config repo

pairctl looks up every inventory, profile, target, fixture set, plan and playbook by name on a
search path, first match wins:

1. `--config DIR` or `PAIRCTL_CONFIG`
2. `./pairctl/` in the working directory or its nearest parent that has one
3. the user config directory (`~/.config/pairctl` on Linux)
4. the defaults bundled with pairctl

Files here override bundled ones of the same name. `pairctl config show` prints where each
name resolves.

| folder | holds |
|---|---|
| `inventories/site.yaml` | your hosts and pairs (a V100 native + RTX 5060 Ti RPC pair to start from) |
| `profiles/production.yaml` | the serving configuration deploy renders to llama-server's argv |
| `fixtures/site.yaml` | answer fixtures for `pairctl accept --fixtures site` (each frozen by sha256) |

Add `targets/`, `plans/` or `playbooks/` the same way when you need your own.

```
export PAIRCTL_CONFIG=$PWD PAIRCTL_INVENTORY=site
pairctl config check                      # every file, field and cross-reference, in one pass
pairctl doctor --target v100 --target rtx5060ti
pairctl build --rev REV --target v100 --target rtx5060ti --profile production
pairctl deploy --pair prod --packages NATIVE_ID RPC_ID
pairctl status --pair prod
pairctl rollback --pair prod
```

A fixture's `sha256` covers its other fields: after editing one, `pairctl config check` prints
the hash its content has now; update it on purpose.
"""

_FIXTURES: list[dict[str, Any]] = [
    {
        "id": "greeting",
        "family": "prose",
        "prompt": "Say hello in one short sentence.",
        "n_predict": 32,
        "expect": {"regex": r"\S"},
    },
    {
        "id": "capital",
        "family": "facts",
        "prompt": "The capital of France is",
        "n_predict": 16,
        "expect": {"same_as_baseline": True},
    },
]


def fixtures_text() -> str:
    """The starter fixture set with each fixture's sha256 computed from its content."""
    fixtures = []
    for f in _FIXTURES:
        probe = Fixture.model_construct(**{**f, "expect": Expect(**f["expect"])})
        fixtures.append({**f, "sha256": probe.computed_sha256()})
    head = (
        "# Answer fixtures (kind: fixtures): `pairctl accept --pair prod --fixtures site`.\n"
        "# Each sha256 covers its fixture's other fields (canonical JSON).\n"
    )
    return head + yaml.safe_dump(
        {"name": "site", "description": "starter answer fixtures", "fixtures": fixtures},
        sort_keys=False,
        allow_unicode=True,
    )


def scaffold() -> dict[str, str]:
    """Relative path -> text of every file `init` writes (pure)."""
    from orchestrator.config.search import bundled_folder

    profile = (bundled_folder("profile") / "production.yaml").read_text(encoding="utf-8")
    return {
        "README.md": README,
        "inventories/site.yaml": INVENTORY,
        "profiles/production.yaml": profile,
        "fixtures/site.yaml": fixtures_text(),
    }


def write_scaffold(root: Path, *, force: bool = False) -> list[Path]:
    files = scaffold()
    clash = [root / rel for rel in files if (root / rel).exists()]
    if clash and not force:
        raise ConfigError(
            f"{root}: would overwrite {', '.join(str(p) for p in clash)}",
            hint="pick an empty directory, or pass --force to replace these files",
        )
    written = []
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        # an exclusive temp name (O_EXCL) renamed over p: a link planted at a predictable name is never followed
        atomic.replace(p, text.encode("utf-8"), mode=0o644)
        written.append(p)
    return written


def init(
    ctx: typer.Context,
    directory: Path = typer.Argument(..., help="The config repo to create (made if missing)."),
    force: bool = typer.Option(False, "--force", help="Replace files init would write that already exist."),
) -> None:
    """Scaffold an operator config repo: an inventory for a V100 native + RTX 5060 Ti RPC pair (with
    comments), a production profile, answer fixtures and a README; it passes `config check` once the
    API key file the inventory names exists (one line, mode 600: deploy and `config check` refuse others)."""
    c = get_ctx(ctx)
    root = directory.expanduser().resolve()
    written = write_scaffold(root, force=force)
    c.say(
        {"config_dir": str(root), "files": [str(p) for p in written]},
        *(f"wrote {p}" for p in written),
        f"\nnext: export PAIRCTL_CONFIG={root} PAIRCTL_INVENTORY=site; edit inventories/site.yaml; "
        "write the server's API key, one line, to the api_key_file it names "
        "(umask 077; mkdir -p ~/.config/pairctl; cat > ~/.config/pairctl/prod.key); pairctl config check",
    )
