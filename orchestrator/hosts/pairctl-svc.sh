#!/bin/sh
# pairctl-svc: the pidfile supervisor and host helper pairctl installs as <root>/bin/pairctl-svc.
#
# Fixed text: pairctl never formats it. Every value (root, names, ports, argv) arrives as a
# positional argument, so nothing a user writes is ever parsed by this shell as code.
# Processes run under setsid with stdio on files under <root>/run/ (or the runtime dir, below),
# so they outlive the SSH session that started them (no systemd in the lab). Exit codes: 0 ok,
# 2 usage, 3 refused (state differs from what the caller expected), 4 process died, 5 timed out.
#
# Each call is one SSH exec, and an exec is the expensive thing (a login shell per call), so
# the subcommands a deploy uses do a whole host step each: `restart` stops, switches, starts,
# waits for the port and prints the identity in one call. Reads and renames that need no
# process (links, route.json, leases) go over SFTP instead.
set -u

die() { echo "pairctl-svc: $*" >&2; exit "${CODE:-1}"; }

alive() { # alive PID: the process exists and is not a zombie; $state is its state (R S D T t Z ...)
    # read by the shell itself (no sed, no cut: the wait loops call it every 10-25 ms)
    [ -n "$1" ] && [ -r "/proc/$1/stat" ] || return 1
    state=; read -r state 2>/dev/null <"/proc/$1/stat"  # 2> first: a pid gone mid-check says nothing
    state=${state##*") "}; state=${state%% *}
    [ -n "$state" ] && [ "$state" != Z ]
}

small() { # small FILE MAX: at most MAX bytes of FILE, only when it is a regular file and not a
    # link (a pid file linked to /dev/zero, a fifo or a huge file is read as nothing / cut short)
    if [ -f "$1" ] && [ ! -L "$1" ]; then head -c "$2" -- "$1" 2>/dev/null; fi
}

# -- the runtime dir (issue 49) -------------------------------------------------------------------
# A state dir that takes no new file (its disk remounted read-only) must not keep a service from
# starting (a rollback's restored llama-server): a start then puts the files of that run of the
# service (pidfiles, supervisor state and log, its stdout, its --log-file) on the host's runtime filesystem, as
# /run is there for: /run/pairctl-0/ROOTTAG as root, else /dev/shm/pairctl-UID/ROOTTAG, and that
# only for a user who lingers (never $XDG_RUNTIME_DIR: logind removes it, and that user's /dev/shm
# files, with the login's last session). The host is untrusted: both levels must be directories of
# this user, not links, mode 0700, or the dir is not used at all (never followed, never repaired). While it holds NAME.state, the latest start of NAME was made
# there and every reader of NAME's files looks there (svc_dir); a start in run/ removes them.
# What must persist (links, route record, leases, the boot arguments) is never written there.
rt_uid= rt_path= rt_ok=

rt_init() { # rt_init ROOT: rt_ok when ROOT's runtime dir is there and ours (once per process, before any
    # subshell). First a glob, no fork: where no runtime dir holds a service's state (the normal path)
    # nothing else runs, so a helper call costs what it did before; rt_path only then (or rt_make)
    for f in /run/pairctl-0/*/*.state /dev/shm/pairctl-[0-9]*/*/*.state; do
        if [ -f "$f" ]; then
            rt_where "$1"
            if [ -d "$rt_path" ] && rt_safe && lingers; then rt_ok=1; fi
            return 0
        fi
    done
}

rt_where() { # rt_where ROOT: rt_uid and rt_path (forks: id, sha256sum)
    [ -z "$rt_path" ] || return 0
    rt_uid=$(id -u)
    case "$rt_uid" in 0) rt_path=/run ;; *) rt_path=/dev/shm ;; esac
    rt_path="$rt_path/pairctl-$rt_uid/$(root_tag "$1")"
}

rt_safe() { # rt_safe: both levels of rt_path are this user's directories (not links), 0700
    for d in "${rt_path%/*}" "$rt_path"; do
        [ -d "$d" ] && [ ! -L "$d" ] && [ "$(stat -c %u:%a -- "$d" 2>/dev/null)" = "$rt_uid:700" ] || return 1
    done
}

rt_make() { # rt_make ROOT: the runtime dir made (mode 0700, never over what is there) and checked
    [ -n "$rt_ok" ] && return 0
    rt_where "$1"
    mkdir -m 700 "${rt_path%/*}" 2>/dev/null
    mkdir -m 700 "$rt_path" 2>/dev/null
    lingers && rt_safe && rt_ok=1
}

takes_file() { { true >"$1/.write-probe.$$"; } 2>/dev/null && rm -f "$1/.write-probe.$$"; }  # takes_file DIR

lingers() { # lingers: root, or a user whose runtime files logind keeps after the last session ends
    # (RemoveIPC=yes, the default, clears /dev/shm of a non-system user then: pairctl's disconnect)
    [ "$rt_uid" = 0 ] || [ -e "/var/lib/systemd/linger/$(id -un)" ]
}

read_only() { # read_only DIR: a new file there fails for a read-only filesystem (EROFS), not a full one
    case "$( { true >"$1/.write-probe.$$"; } 2>&1)" in *'Read-only file system'*) return 0 ;; esac
    rm -f "$1/.write-probe.$$"
    return 1
}

svc_dir() { # svc_dir ROOT NAME: svd := the folder of NAME's runtime files (the runtime dir, or ROOT/run)
    if [ -n "$rt_ok" ] && [ -f "$rt_path/$2.state" ]; then svd=$rt_path; else svd=$1/run; fi
}

run_file() { # run_file ROOT FILE: the path of FILE (NAME.out, NAME.log.1 ...) in NAME's folder: never run/'s
    # while NAME runs from the runtime dir (what run/ holds then is an earlier run's)
    svc_dir "$1" "${2%%.*}"
    echo "$svd/$2"
}

pid_of() { # pid_of ROOT NAME: the recorded pid, empty when none (digits only)
    svc_dir "$1" "$2"
    small "$svd/$2.pid" 32 | tr -cd '0-9'
}

is_ours() { # is_ours PID NAME: argv[0] ends in /NAME (guards against a reused pid)
    exe0=$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | head -n 1)
    case "$exe0" in */"$2") return 0 ;; *) return 1 ;; esac
}

link_of() { if [ -L "$1" ]; then readlink "$1"; else echo "-"; fi; }

identity_of() { # identity_of ROOT NAME: proc=NAME:PID:SHA256(exe):BASE64(cmdline), or proc=NAME:-
    # A process that exits between the check and the reads (a server that cannot load its model)
    # is not running: its empty hash and argv are never printed as an identity.
    pid=$(pid_of "$1" "$2")
    if alive "$pid" && is_ours "$pid" "$2" && sha=$(sha256sum "/proc/$pid/exe" 2>/dev/null) &&
        argv=$(base64 -w0 "/proc/$pid/cmdline" 2>/dev/null) && [ -n "$argv" ] && alive "$pid"; then
        echo "proc=$2:$pid:${sha%% *}:$argv"
    else
        echo "proc=$2:-"
    fi
}

# -- systemd (service_manager: systemd) -------------------------------------------------------
# With a `systemd=SCOPE:UNIT` word (start, restart) the supervisor runs as that unit instead of
# under setsid: pairctl renders the unit (orchestrator/hosts/units.py) and stages it as
# run/units/UNIT over SFTP; here the host's own systemd-analyze verifies it (before anything is
# stopped), it is installed by rename, enabled (so it starts at boot) and started, and read back
# (unit=UNIT:SHA256:ENABLED:ACTIVE:NRESTARTS). run/NAME.unit names it, so that a stop in either
# mode stops, disables and removes it: systemd restarts a supervisor that is merely killed.

sd_parse() { # sd_parse WORD: sd_scope and sd_unit from systemd=SCOPE:UNIT (a plain pairctl-*.service name)
    v=${1#systemd=}; sd_scope=${v%%:*}; sd_unit=${v#*:}
    case "$sd_scope" in user | system) ;; *) return 1 ;; esac
    case "$sd_unit" in pairctl-?*.service) ;; *) return 1 ;; esac
    case "$sd_unit" in *[!A-Za-z0-9._-]*) return 1 ;; esac
}

sd_ctl() { # sd_ctl SCOPE ARGS...: that manager's systemctl, bounded (an SSH session has no XDG_RUNTIME_DIR)
    # 30 s: a stop waits for the unit's TimeoutStopSec=20; the callers' exec timeouts cover the sum
    s=$1; shift
    if [ "$s" = user ]; then
        XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/run/user/$(id -u)} timeout 30 systemctl --user "$@"
    else
        timeout 30 systemctl "$@"
    fi
}

root_tag() { printf '%s' "$1" | sha256sum | cut -c1-8; }  # as orchestrator/hosts/units.py root_tag

sd_ours() { # sd_ours ROOT NAME: $sd_unit is this root's unit for NAME (pairctl-PAIR-NAME-ROOTTAG.service)
    case "$sd_unit" in pairctl-?*-"$2-$(root_tag "$1")".service) return 0 ;; *) return 1 ;; esac
}

sd_dir() { if [ "$1" = user ]; then echo "$HOME/.config/systemd/user"; else echo /etc/systemd/system; fi; }

sd_verify() { # sd_verify ROOT: the staged run/units/$sd_unit passes the host's systemd-analyze verify
    f="$1/run/units/$sd_unit"
    [ -f "$f" ] && [ ! -L "$f" ] || CODE=3 die "unit=missing: $f was not staged"
    command -v systemd-analyze >/dev/null 2>&1 || CODE=3 die "unit=unverified: systemd-analyze is not installed on this host"
    if [ "$sd_scope" = user ]; then
        out=$(XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/run/user/$(id -u)} timeout 30 systemd-analyze --user verify "$f" 2>&1)
    else
        out=$(timeout 30 systemd-analyze verify "$f" 2>&1)
    fi || { printf '%s\n' "$out" | sed 's/^/unit_verify=/'; CODE=3 die "unit=invalid: systemd-analyze verify rejected $sd_unit"; }
    # verify exits 0 on a setting it ignores ("Failed to parse ..., ignoring"): any complaint naming the file counts
    if printf '%s\n' "$out" | grep -qF "$f"; then
        printf '%s\n' "$out" | sed 's/^/unit_verify=/'
        CODE=3 die "unit=invalid: systemd-analyze verify complained about $sd_unit"
    fi
}

sd_install() { # sd_install ROOT NAME: the verified staged unit into the manager's directory, enabled
    d=$(sd_dir "$sd_scope")
    mkdir -p "$d" || exit 1
    # a new file of our own (mktemp: O_EXCL, never a link someone left), then renamed over the unit
    tmp=$(mktemp "$d/.pairctl-unit.XXXXXX") || exit 1
    { cat "$1/run/units/$sd_unit" >"$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$d/$sd_unit"; } || { rm -f "$tmp"; exit 1; }
    printf '%s %s\n' "$sd_scope" "$sd_unit" >"$1/run/.$2.unit.tmp.$$" && mv -f "$1/run/.$2.unit.tmp.$$" "$1/run/$2.unit" || exit 1
    sd_ctl "$sd_scope" daemon-reload || die "systemctl daemon-reload failed ($sd_scope manager)"
    sd_ctl "$sd_scope" enable "$sd_unit" 2>/dev/null || die "systemctl enable $sd_unit failed"
}

sd_state() { # sd_state: the installed unit read back: unit=UNIT:SHA256:ENABLED:ACTIVE:NRESTARTS,
    # unit_source=FRAGMENT:DROPINS:RELOAD (ok|other, none|some, no|yes: the unit systemd runs is
    # the file we wrote, nothing overrides it, nothing is pending), linger=USER:yes|no
    f="$(sd_dir "$sd_scope")/$sd_unit"
    sha=-; [ -f "$f" ] && [ ! -L "$f" ] && sha=$(sha256sum <"$f" | cut -d' ' -f1)
    en=$(sd_ctl "$sd_scope" is-enabled "$sd_unit" 2>/dev/null | head -n 1)
    act=$(sd_ctl "$sd_scope" is-active "$sd_unit" 2>/dev/null | head -n 1)
    props=$(sd_ctl "$sd_scope" show -p NRestarts -p FragmentPath -p DropInPaths -p NeedDaemonReload "$sd_unit" 2>/dev/null)
    nr=$(printf '%s\n' "$props" | sed -n 's/^NRestarts=//p' | head -n 1)
    frag=other; [ "$(printf '%s\n' "$props" | sed -n 's/^FragmentPath=//p' | head -n 1)" = "$f" ] && frag=ok
    drop=some; [ -z "$(printf '%s\n' "$props" | sed -n 's/^DropInPaths=//p' | head -n 1)" ] && drop=none
    rel=yes; [ "$(printf '%s\n' "$props" | sed -n 's/^NeedDaemonReload=//p' | head -n 1)" = no ] && rel=no
    echo "unit=$sd_unit:$sha:${en:--}:${act:--}:${nr:--}"
    echo "unit_source=$frag:$drop:$rel"
    if [ "$sd_scope" = user ]; then
        u=$(id -un)
        if [ -e "/var/lib/systemd/linger/$u" ]; then echo "linger=$u:yes"; else echo "linger=$u:no"; fi
    fi
}

sd_recorded() { # sd_recorded ROOT NAME: sd_scope/sd_unit from run/NAME.unit (checked: the host is
    # untrusted, so it may name only this root's unit for NAME, in a scope this helper knows)
    [ -f "$1/run/$2.unit" ] || return 1
    rec=$(head -c 300 "$1/run/$2.unit")
    sd_parse "systemd=${rec%% *}:$(printf '%s' "${rec#* }" | head -n 1)" && sd_ours "$1" "$2"
}

sd_stop() { # sd_stop ROOT NAME: the unit run/NAME.unit names is stopped, disabled and removed. Its
    # record goes only once the unit is known to be down (or no manager answers, so none will
    # restart it): a unit left loaded would start the supervisor again after a stop.
    if [ -f "$1/run/$2.unit" ] && ! sd_recorded "$1" "$2"; then
        CODE=3 die "run/$2.unit does not name this root's unit for $2 (pairctl-PAIR-$2-$(root_tag "$1").service); remove it by hand"
    fi
    [ -f "$1/run/$2.unit" ] || return 0
    if sd_ctl "$sd_scope" show -p Version >/dev/null 2>&1; then
        sd_ctl "$sd_scope" stop "$sd_unit" >/dev/null 2>&1
        act=$(sd_ctl "$sd_scope" is-active "$sd_unit" 2>/dev/null | head -n 1)
        case "$act" in
        inactive | failed | unknown) ;;
        *) CODE=5 die "$sd_unit is still ${act:-in an unknown state} after systemctl stop; nothing removed" ;;
        esac
        sd_ctl "$sd_scope" disable "$sd_unit" >/dev/null 2>&1
    fi
    rm -f "$(sd_dir "$sd_scope")/$sd_unit"
    sd_ctl "$sd_scope" daemon-reload >/dev/null 2>&1
    rm -f "$1/run/$2.unit"
    echo "unit_removed=$sd_unit"
}

start_svc() { # start_svc ROOT NAME [sup.KEY=VALUE...] PROGRAM ARGS...: PROGRAM under its supervisor
    # (setsid, so both outlive the SSH session); returns once PROGRAM has been exec'd.
    # run/NAME.out and run/NAME.log of the run before are kept as *.prev (rotated ones too)
    r=$1; n=$2; shift 2
    sd=""
    case "${1:-}" in systemd=*)
        { sd_parse "$1" && sd_ours "$r" "$n"; } || CODE=2 die "start: $1 is not systemd=user|system:pairctl-PAIR-$n-$(root_tag "$r").service"
        sd=1; shift ;;
    esac
    pid=$(pid_of "$r" "$n")
    if alive "$pid" && is_ours "$pid" "$n"; then CODE=3 die "$n already runs as pid $pid"; fi
    prog=""
    for a in "$@"; do case "$a" in sup.*=*) ;; *) prog=$a; break ;; esac; done
    [ -x "$prog" ] || CODE=3 die "${prog:-PROGRAM} is not an executable file"
    # this run's files: in run/, or in the runtime dir when run/ is on a read-only filesystem (a full
    # one is no reason: such a start fails on run/NAME.boot as it did); decided before any change
    rd=$r/run
    if [ -z "$sd" ] && ! takes_file "$rd" && read_only "$rd"; then
        rt_where "$r"
        lingers || CODE=3 die "$rd takes no new file (read-only), and $(id -un) does not linger (no /var/lib/systemd/linger/$(id -un)): logind would remove $rt_path with the last session; $n not started"
        # run/NAME.boot stays (read-only): one of other arguments would start those at the next boot
        if [ -e "$rd/$n.boot" ] && ! printf '%s\0' "$@" | cmp -s -- - "$rd/$n.boot"; then
            CODE=3 die "$rd takes no new file (read-only), and run/$n.boot holds other arguments than these: a reboot or the watchdog would start those; $n not started, nothing was stopped"
        fi
        rt_make "$r" || CODE=3 die "$rd takes no new file, and $rt_path is not a 0700 folder of this user: $n not started"
        rd=$rt_path
        # its --log-file too (pairctl renders run/NAME.log, which run/ cannot take): every argument
        # exactly equal to that path (wherever it stands, not only after --log-file) is replaced,
        # word for word (no shell text is built), before the supervisor gets them; pairctl's
        # identity expects the same (probes.argv_from)
        for a in "$@"; do
            shift
            if [ "$a" = "$r/run/$n.log" ]; then set -- "$@" "$rd/$n.log"; else set -- "$@" "$a"; fi
        done
    fi
    for a in "$@"; do  # the service user's files made right here, outside any unit's sandbox
        case "$a" in
        sup.user=*) user_prep "$r" "$n" "${a#sup.user=}" >&2 || CODE=3 die "service user ${a#sup.user=}: see above" ;;
        sup.*=*) ;;
        *) break ;;
        esac
    done
    # a unit's start writes run/ (its record, its supervisor's pidfiles and logs: the runtime dir
    # below serves pairctl's own supervisor only), so one that takes no new file is refused here
    [ -z "$sd" ] || takes_file "$r/run" ||
        CODE=3 die "writable=no: $r/run takes no new file (read-only or full?), and $sd_unit writes there; nothing was stopped"
    [ -z "$sd" ] || [ "${sd_verified:-}" = "systemd=$sd_scope:$sd_unit" ] || sd_verify "$r"
    # a unit of an earlier start (either mode) goes first: systemd would restart its supervisor
    (sd_stop "$r" "$n" >/dev/null) || exit $?
    sup_stop "$r" "$n"  # a supervisor left without its service (given up, or waiting) never races this one
    if [ -n "$sd" ]; then
        rm -f "$r/run/$n.boot"  # systemd starts the enabled unit at boot, not the @reboot line
    elif [ "$rd" = "$r/run" ]; then
        # what a boot needs to start it again exactly so (`boot`): these arguments, NUL-separated, 0600;
        # a deliberate stop removes the file, so a stopped service stays stopped after a reboot (a start
        # in the runtime dir is not remembered: run/ takes no file, and that dir is gone after a reboot)
        (umask 077 && printf '%s\0' "$@" >"$r/run/.$n.boot.tmp.$$") && mv -f "$r/run/.$n.boot.tmp.$$" "$r/run/$n.boot" || exit 1
    fi
    for f in "$rd/$n.out" "$rd/$n.log"; do  # keep the previous run's output (a failed start's reason)
        if [ -f "$f" ]; then mv -f "$f" "$f.prev" 2>/dev/null; fi
    done
    if [ "$rd" = "$r/run" ] && [ -n "$rt_ok" ]; then  # readers look in run/ again
        # the previous run was in the runtime dir: its output and log are the ones kept as run/NAME.*.prev
        for f in out log; do
            if [ -f "$rt_path/$n.state" ] && [ -f "$rt_path/$n.$f" ] && [ ! -L "$rt_path/$n.$f" ]; then
                mv -f "$rt_path/$n.$f" "$r/run/$n.$f.prev"
            fi
        done
        rm -f "$rt_path/$n".*
    fi
    rm -f "$rd/$n.pid" "$rd/$n.state"
    if [ -n "$sd" ]; then
        sd_install "$r" "$n"
        true >"$r/run/$n.go"  # this start is the lease holder's: the supervisor's first start does not wait for the lease
        sd_ctl "$sd_scope" start "$sd_unit" || { rm -f "$r/run/$n.go"; CODE=4 die "systemctl start $sd_unit failed; see run/$n.sup.log"; }
        spid=$(sd_ctl "$sd_scope" show -p MainPID --value "$sd_unit")
        [ "${spid:-0}" != 0 ] || { rm -f "$r/run/$n.go"; CODE=4 die "$sd_unit has no main process after its start; see run/$n.sup.log"; }
    else
        rt=0; [ "$rd" = "$r/run" ] || rt=1
        PAIRCTL_SVC_RT=$rt setsid sh "$0" supervise "$r" "$n" "$@" >>"$rd/$n.sup.log" 2>&1 </dev/null &
        spid=$!
        echo "$spid" >"$rd/.$n.sup.pid.tmp.$$" && mv -f "$rd/.$n.sup.pid.tmp.$$" "$rd/$n.sup.pid"
    fi
    if [ "${PAIRCTL_SVC_AT_BOOT:-}" = 1 ]; then  # at boot the supervisor may first wait for a peer or a lease
        echo "supervisor=$spid"
        return 0
    fi
    i=0  # the supervisor writes NAME.pid right after it forks the service
    while [ $i -lt 1000 ]; do
        pid=$(small "$rd/$n.pid" 32 | tr -cd '0-9')
        if [ -n "$pid" ] && { ! alive "$pid" || is_ours "$pid" "$n"; }; then break; fi
        if ! alive "$spid"; then break; fi
        sleep 0.01; i=$((i + 1))
    done
    rm -f "$r/run/$n.go"
    [ -n "$pid" ] || CODE=4 die "$n: its supervisor (pid $spid) started nothing; see ${rd#"$r/"}/$n.sup.log"
    echo "pid=$pid"
    [ -z "$sd" ] || sd_state
}

sup_alive() { # sup_alive ROOT NAME: prints the pid of NAME's supervisor when it runs
    svc_dir "$1" "$2"
    spid=$(small "$svd/$2.sup.pid" 32 | tr -cd '0-9')
    alive "$spid" || return 1
    tr '\0' ' ' <"/proc/$spid/cmdline" 2>/dev/null | grep -qF " supervise $1 $2 " || return 1
    echo "$spid"
}

sup_stop() { # sup_stop ROOT NAME: a deliberate stop: the supervisor goes first, so nothing restarts
    svc_dir "$1" "$2"
    spid=$(sup_alive "$1" "$2") || { rm -f "$svd/$2.sup.pid" 2>/dev/null; return 0; }
    kill -KILL "$spid" 2>/dev/null
    i=0
    while alive "$spid" && [ $i -lt 200 ]; do sleep 0.01; i=$((i + 1)); done
    # a probe or a backoff sleep it had started (its process group) goes with it, the service stays
    for p in $(ps -o pid= -g "$spid" 2>/dev/null); do
        [ "$p" = "$(pid_of "$1" "$2")" ] || kill -KILL "$p" 2>/dev/null
    done
    rm -f "$svd/$2.sup.pid"
    set_state "$svd" "$2" state stopped
}

stop_svc() { # stop_svc ROOT NAME: supervisor first, then TERM, wait up to 10 s, then KILL; only a process whose argv[0] is NAME
    rm -f "$1/run/$2.boot" 2>/dev/null  # deliberately stopped: not started at boot either, so one that stays
    if [ -e "$1/run/$2.boot" ] || [ -L "$1/run/$2.boot" ]; then  # (run/ read-only) stops nothing
        CODE=3 die "run/$2.boot cannot be removed: a reboot or the watchdog would start $2 again; nothing was stopped"
    fi
    pid=$(pid_of "$1" "$2")
    was=""; if alive "$pid" && is_ours "$pid" "$2"; then was=$pid; fi
    sd_stop "$1" "$2"  # its unit (service_manager: systemd) is stopped, disabled and removed
    sup_stop "$1" "$2"
    if alive "$pid" && is_ours "$pid" "$2"; then
        kill -TERM "$pid" 2>/dev/null
        kill -CONT "$pid" 2>/dev/null  # a stopped (hung) process handles TERM only once continued
        i=0
        while alive "$pid" && [ $i -lt 400 ]; do sleep 0.025; i=$((i + 1)); done
        if alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null
            i=0
            while alive "$pid" && [ $i -lt 200 ]; do sleep 0.025; i=$((i + 1)); done
        fi
        if alive "$pid"; then CODE=5 die "$2 (pid $pid) did not exit after KILL"; fi
        echo "stopped=$2:$pid"
    elif [ -n "$was" ]; then
        echo "stopped=$2:$was"  # its unit's stop ended it
    else
        echo "stopped=$2:-"
    fi
    svc_dir "$1" "$2"
    rm -f "$svd/$2.pid" 2>/dev/null || true  # one left in a read-only run/ names a dead pid: read as none
}

# -- supervision -------------------------------------------------------------------------------
# `supervise` is the loop `start` runs under setsid, one per service: it starts PROGRAM with a
# cleared environment, restarts it after a crash (exponential backoff; gives up after a crash
# loop), kills and restarts it when /health stops answering (hung) or, on the native side, when
# its RPC peer went away, and waits (bounded backoff) for the peer's port before every start of
# llama-server. While a lease is held on this host (leases/host.lock: a deploy, rollback or
# acceptance) it acts on nothing. Its state is run/NAME.state (KEY=VALUE lines), read by status.

now_s() { date +%s; }

set_state() { # set_state DIR NAME KEY VALUE [KEY VALUE...]: replace keys in DIR/NAME.state, by rename
    f="$1/$2.state"; shift 2
    tmp="$f.tmp.$$"
    rm -f "$tmp" "$tmp.2" 2>/dev/null  # never write through a link left at these names
    # `true`, never `:`: dash exits on a failed redirection of a special builtin, and a read-only
    # or full root must not kill the supervisor that keeps the service up; the state file is read
    # bounded and only as a regular file, never copied through a link
    small "$f" 65536 >"$tmp" 2>/dev/null || true >"$tmp" 2>/dev/null
    while [ $# -ge 2 ]; do
        grep -v "^$1=" "$tmp" >"$tmp.2"; echo "$1=$2" >>"$tmp.2"; mv -f "$tmp.2" "$tmp"
        shift 2
    done
    mv -f "$tmp" "$f"
}

json_field() { # json_field TEXT KEY: the string or number value of "KEY" in one-line JSON (pairctl's own)
    printf '%s' "$1" | sed -n "s/.*\"$2\": *\"\{0,1\}\([^\",}]*\).*/\1/p"
}

lease_held() { # lease_held ROOT: a live lease holds the host. One that has expired, or whose run's
    # heartbeat is older than the bound it promised (the run is dead), no longer keeps the services
    # unsupervised (issue 33: an expired lease kept llama-server down until it was released). Host
    # time, as pairctl judges leases; a lease being made, or a time this shell cannot read, holds.
    [ -d "$1/leases/host.lock" ] || return 1
    j=$(head -c 4096 "$1/leases/host.lock/lease.json" 2>/dev/null | tr -d '\n')
    [ -n "$j" ] || return 0
    now=$(date +%s)
    exp=$(json_field "$j" expires_at)
    e=$(date -d "$exp" +%s 2>/dev/null) && [ "$now" -ge "$e" ] && return 1
    stale=$(json_field "$j" stale_after_s)
    beat=$(json_field "$j" renewed_at); [ -n "$beat" ] || beat=$(json_field "$j" taken_at)
    case "$stale" in '' | *[!0-9]*) return 0 ;; esac
    b=$(date -d "$beat" +%s 2>/dev/null) && [ $((now - b)) -gt "$stale" ] && return 1
    return 0
}

tcp_probe() { # tcp_probe ADDRESS PORT TIMEOUT_S: something accepts a connection there (and,
    # keyed, takes this root's route key: keyed)
    command -v bash >/dev/null 2>&1 || return 0  # no bash, no /dev/tcp: assume it listens
    keyed "$r" "$1" "$2" timeout "$3" bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

health_probe() { # health_probe ADDRESS PORT TIMEOUT_S: GET /health gets an HTTP status line back
    # (503 while loading counts: the server answers; a stopped or deadlocked one does not)
    command -v bash >/dev/null 2>&1 || return 0
    timeout "$3" bash -c 'exec 3<>"/dev/tcp/$1/$2" || exit 1
        printf "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n" "$1" >&3
        IFS= read -r line <&3 || exit 1
        case "$line" in HTTP/*) exit 0 ;; esac
        exit 1' _ "$1" "$2" 2>/dev/null
}

rpc_client() { # rpc_client PID PORT: PID holds an ESTABLISHED connection on its local PORT (a client
    # is being served; ggml-rpc-server serves one at a time, so a HELLO now would only wait behind it)
    inodes=$(ls -l "/proc/$1/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\].*/\1/p' | tr '\n' ' ')
    [ -n "$inodes" ] || return 1
    want=$(printf ':%04X' "$2")
    # the first match ends the read: the kernel writes the rest of the tables (every socket of the
    # host, ~1,500 lines on a busy one) only for the lines read, and the served case is the usual one
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v want="$want" -v inodes=" $inodes" \
        'NR > 1 && $4 == "01" && substr($2, length($2) - 4) == want && index(inodes, " " $10 " ") { found = 1; exit }
        END { exit !found }'
}

rpc_hello() { # rpc_hello ADDRESS PORT TIMEOUT_S: the ggml RPC HELLO (ggml/src/ggml-rpc/ggml-rpc.cpp:
    # cmd byte 14, u64 LE request size 24, 24 zero capability bytes; the answer is u64 LE 28, then
    # major, minor, patch, padding and 24 capability bytes); prints MAJOR.MINOR.PATCH
    command -v bash >/dev/null 2>&1 || return 2
    timeout "$3" bash -c 'exec 3<>"/dev/tcp/$1/$2" || exit 1
        printf "\016\030\000\000\000\000\000\000\000" >&3 && head -c 24 /dev/zero >&3 || exit 1
        set -- $(head -c 36 <&3 | od -An -v -tu1)
        [ $# -eq 36 ] && [ "$1" = 28 ] || exit 1
        echo "$9.${10}.${11}"' _ "$1" "$2" 2>/dev/null
}

GUARD=pairctl-rpc-guard.so
guard_file_ok() { [ -f "$1/bin/$GUARD" ] && [ ! -L "$1/bin/$GUARD" ]; }
key_ok() { [ -f "$1/secrets/rpc.key" ] && [ ! -L "$1/secrets/rpc.key" ]; }  # the route key (rpc_guard.py)

keyed() { # keyed ROOT ADDRESS PORT CMD...: CMD, its connects to ADDRESS:PORT answering the RPC
    # guard's challenge with ROOT's route key when ROOT has one (rpc_guard.c); CMD as is otherwise
    if key_ok "$1" && guard_file_ok "$1"; then
        (export LD_PRELOAD="$1/bin/$GUARD" PAIRCTL_RPC_DIAL="$2:$3" PAIRCTL_RPC_KEY="$1/secrets/rpc.key"; shift 3; "$@")
    else
        shift 3; "$@"
    fi
}

guard_state() { # guard_state ROOT NAME: guard=NAME:SHA256:ALLOW:KEYID with the guard mapped into
    # the running service and PAIRCTL_RPC_ALLOW from its environment; guard=NAME:- when not loaded
    pid=$(pid_of "$1" "$2")
    if ! alive "$pid" || ! is_ours "$pid" "$2"; then echo "guard=$2:down"; return 0; fi
    # mapped from ROOT/bin/GUARD (or from the file a later deploy replaced: " (deleted)")
    if ! awk -v p=" $1/bin/$GUARD" 'substr($0, length($0) - length(p) + 1) == p ||
        substr($0, length($0) - length(p) - 9) == p " (deleted)" { f = 1 } END { exit !f }' \
        "/proc/$pid/maps" 2>/dev/null; then echo "guard=$2:-"; return 0; fi
    allow=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^PAIRCTL_RPC_ALLOW=//p' | head -n 1)
    sum=-; guard_file_ok "$1" && sum=$(sha256sum <"$1/bin/$GUARD" | cut -c1-64)
    # the route key it checks: its file's sha256, 16 digits (the key itself never leaves the host)
    kf=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^PAIRCTL_RPC_KEY=//p' | head -n 1)
    kid=-; [ -n "$kf" ] && kid=$(sha256sum <"$kf" 2>/dev/null | cut -c1-16)
    echo "guard=$2:$sum:${allow:--}:${kid:--}"
}

rpc_probe() { # rpc_probe ROOT NAME ADDRESS PORT TIMEOUT_S: rpc=NAME:down|stopped|serving|unanswered|hello:M.m.p
    # A stopped process (SIGSTOP: state T) or one that does not answer HELLO is hung although the
    # kernel still accepts connections on its port. While a client (llama-server) is connected the
    # HELLO is not sent (it would wait behind that client): a stopped process still shows.
    pid=$(pid_of "$1" "$2")
    if ! alive "$pid" || ! is_ours "$pid" "$2"; then echo "rpc=$2:down"; return 0; fi
    if alive "$pid" && [ "$state" = T ]; then echo "rpc=$2:stopped"; return 0; fi  # $state: alive's
    if rpc_client "$pid" "$4"; then echo "rpc=$2:serving"; return 0; fi
    addr=$3  # a wildcard bind is reached on loopback
    case "$addr" in 0.0.0.0) addr=127.0.0.1 ;; :: | "[::]") addr=::1 ;; esac
    v=$(keyed "$1" "$addr" "$4" rpc_hello "$addr" "$4" "$5"); rc=$?
    if [ $rc = 2 ]; then echo "rpc=$2:unprobed"
    elif [ $rc = 0 ] && [ -n "$v" ]; then echo "rpc=$2:hello:$v"
    else echo "rpc=$2:unanswered"; fi
}

peer_closed() { # peer_closed PID ADDRESS PORT: PID holds a TCP connection to ADDRESS:PORT that the
    # peer closed (CLOSE_WAIT: ggml-rpc-server died or restarted). llama-server's own short-lived
    # connections (device queries at start) close from its side and never show this state.
    # the peer as /proc/net/tcp writes it, worked out once per peer: the probe loop asks every probe_s
    if [ "${pc_peer:-}" != "$2:$3" ]; then
        pc_want=$(printf '%s\n' "$2" | awk -F. -v port="$3" 'NF == 4 { printf "%02X%02X%02X%02X:%04X", $4, $3, $2, $1, port }')
        pc_peer="$2:$3"
    fi
    want=$pc_want
    inodes=$(ls -l "/proc/$1/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\].*/\1/p' | tr '\n' ' ')
    [ -n "$want" ] && [ -n "$inodes" ] || return 1
    awk -v want="$want" -v inodes=" $inodes" 'NR > 1 && $3 == want && $4 == "08" && index(inodes, " " $10 " ") { found = 1 }
        END { exit !found }' /proc/net/tcp
}

is_num() { case "$1" in '' | *[!0-9.]* | *.*.*) return 1 ;; esac; }

shift_log() { # shift_log FILE KEEP: FILE.1 .. FILE.KEEP-1 move up one (FILE.KEEP is dropped)
    k=$2
    while [ "$k" -gt 1 ]; do
        if [ -f "$1.$((k - 1))" ]; then mv -f "$1.$((k - 1))" "$1.$k"; fi
        k=$((k - 1))
    done
}

rotate_logs() { # rotate_logs MAX_BYTES KEEP FILE...: each FILE past MAX_BYTES is copied to FILE.1
    # (older ones shifted up to FILE.KEEP) and truncated in place. Only for a file the service
    # writes with O_APPEND (run/NAME.out, opened with >>), so it goes on writing at the new end.
    [ "$1" -gt 0 ] 2>/dev/null || return 0
    max=$1; keep=$2; shift 2
    for f in "$@"; do
        size=$(stat -c %s "$f" 2>/dev/null) || continue
        [ "$size" -gt "$max" ] || continue
        shift_log "$f" "$keep"
        cp "$f" "$f.1" && true >"$f"
    done
}

same_mode() { [ -n "$(find "$1" -maxdepth 0 -perm "$2" 2>/dev/null)" ]; }  # same_mode PATH MODE (find -perm)

user_prep() { # user_prep ROOT NAME USER: uid/gid of the service user, and what it needs to run as
    # it: search permission on the root (it lists and writes nothing there), its own HOME under
    # a root-owned run/home, its API key file (0400, its own; secrets/ searchable, not listable).
    # Only what differs is changed, so a sandboxed supervisor (read-only root) passes when start did it.
    uid=$(id -u -- "$3" 2>/dev/null) && gid=$(id -g -- "$3" 2>/dev/null) ||
        { echo "$(date -u +%FT%TZ) $2: service user $3 does not exist on this host: not started"; return 1; }
    [ "$uid" != 0 ] || { echo "$(date -u +%FT%TZ) $2: service user $3 is root: not started"; return 1; }
    command -v setpriv >/dev/null 2>&1 ||
        { echo "$(date -u +%FT%TZ) $2: setpriv (util-linux) is not installed: not started"; return 1; }
    same_mode "$1" -011 || chmod go+x "$1" || return 1
    mkdir -p "$1/run/home/$2" || return 1
    same_mode "$1/run/home" 711 || chmod 711 "$1/run/home" || return 1
    [ "$(stat -c %u:%g "$1/run/home/$2")" = "$uid:$gid" ] || chown "$uid:$gid" "$1/run/home/$2" || return 1
    if [ -d "$1/secrets" ] && [ ! -L "$1/secrets" ]; then
        same_mode "$1/secrets" 711 || chmod 711 "$1/secrets" || return 1
        for f in "$1/secrets"/*; do
            if [ -f "$f" ] && [ ! -L "$f" ] && [ "$(stat -c %u:%a "$f")" != "$uid:400" ]; then
                chown "$uid" "$f" && chmod 400 "$f" || return 1
            fi
        done
    fi
}

supervise() { # supervise ROOT NAME [sup.KEY=VALUE...] PROGRAM ARGS...
    r=$1; n=$2; shift 2
    backoff0=1 backoff_max=30 loop_n=5 loop_s=60 hang_s=0 probe_s=1 health=- peer=- rpc=- log_max=0 log_keep=3 allow=- user=- files=-
    wants="" nl='
'
    while [ $# -gt 0 ]; do
        case "$1" in sup.*=*) ;; *) break ;; esac
        kv=${1#sup.}; k=${kv%%=*}; v=${kv#*=}; shift
        case "$k" in
        backoff | backoff_max | loop_s | hang_s | probe_s)
            is_num "$v" || CODE=2 die "supervise: sup.$k=$v is not a number" ;;
        loop_n | log_max | log_keep)
            case "$v" in '' | *[!0-9]*) CODE=2 die "supervise: sup.$k=$v is not a whole number" ;; esac ;;
        health | peer | rpc)
            case "$v" in - | [0-9]*.[0-9]*.[0-9]*.[0-9]*:[0-9]* | \[*\]:[0-9]*) ;; *) CODE=2 die "supervise: sup.$k=$v is not ADDRESS:PORT" ;; esac ;;
        allow)  # the RPC guard's IPv4 allow list (orchestrator/hosts/rpc_guard.c)
            case "$v" in '' | *[!0-9.,]*) CODE=2 die "supervise: sup.allow=$v is not a list of IPv4 addresses" ;; esac ;;
        files)  # the release's files digest (orchestrator/hosts/supervisor.py release_files_digest)
            case "$v" in *[!0-9a-f]* | '') CODE=2 die "supervise: sup.files=$v is not a sha256" ;; esac
            [ ${#v} -eq 64 ] || CODE=2 die "supervise: sup.files=$v is not a sha256" ;;
        want)  # SHA256:PATH, a file the service reads besides its release (the profile's declared files)
            case "$v" in *"$nl"*) CODE=2 die "supervise: sup.want holds a newline" ;; esac
            case "${v%%:*}" in *[!0-9a-f]* | '') CODE=2 die "supervise: sup.want=$v is not SHA256:/PATH" ;; esac
            case "${v#*:}" in /*) ;; *) CODE=2 die "supervise: sup.want=$v is not SHA256:/PATH" ;; esac ;;
        user)  # the inventory's service_user: the service runs as this user (setpriv), never as root
            case "$v" in [a-z_]*) ;; *) CODE=2 die "supervise: sup.user=$v is not a user name" ;; esac
            case "$v" in *[!a-z0-9_-]*) CODE=2 die "supervise: sup.user=$v is not a user name" ;; esac ;;
        *) CODE=2 die "supervise: unknown option sup.$k" ;;
        esac
        case "$k" in backoff) backoff0=$v ;; want) wants="$wants$v$nl" ;; *) eval "$k=\$v" ;; esac  # $k: a name above
    done
    [ -x "${1:-}" ] || CODE=2 die "supervise: ${1:-PROGRAM} is not an executable file"
    rd=$r/run rt_logs=  # where its files go: start_svc chose the runtime dir (PAIRCTL_SVC_RT=1) or run/
    if [ "${PAIRCTL_SVC_RT:-}" = 1 ]; then
        rt_make "$r" || { echo "$(date -u +%FT%TZ) $n: $rt_path is not a 0700 directory of this user: not started"; exit 1; }
        rd=$rt_path
        # its logs there sit in memory (tmpfs): NAME.out and this supervisor's own log at most 1 MiB, one kept
        if [ "$log_max" = 0 ] || [ "$log_max" -gt 1048576 ]; then log_max=1048576; fi
        log_keep=1 rt_logs=$rd/$n.sup.log
    fi
    home="$r/run/home/$n"  # (only a mode that differs is changed: a read-only run/ keeps a right one)
    mkdir -p "$home" && { same_mode "$home" 700 || chmod 700 "$home"; } || exit 1
    if [ "$user" != - ]; then
        # the service drops to the service user; what it needs is in place (start made it so;
        # under ProtectSystem=strict the root is read-only here, so only what differs changes).
        # Missing user or setpriv: nothing starts (deploy checked both before any change)
        user_prep "$r" "$n" "$user" || exit 1
    fi
    bindir=$(dirname "$1")
    libdir="$bindir"; [ -d "$bindir/../lib" ] && libdir="$bindir:$(cd "$bindir/../lib" && pwd)"
    starts=""; restarts=0; backoff=$backoff0; first=1; reason=-
    set_state "$rd" "$n" supervisor_pid $$ state starting restarts 0 last_exit - given_up 0 started_at - pid -
    at_boot=${PAIRCTL_SVC_AT_BOOT:-}
    if [ "${PAIRCTL_SVC_MANAGED:-}" = systemd ]; then
        echo "$$" >"$rd/.$n.sup.pid.tmp.$$" && mv -f "$rd/.$n.sup.pid.tmp.$$" "$rd/$n.sup.pid"
        # started by the lease holder's `start` (run/NAME.go), or else by systemd itself (at boot,
        # or again after this supervisor died): then, as at boot, a held lease keeps the first start off
        if [ -f "$r/run/$n.go" ]; then rm -f "$r/run/$n.go"; set_state "$rd" "$n" started_by pairctl; else at_boot=systemd; fi
    fi
    if [ -n "$at_boot" ]; then
        # started by `boot` (or systemd): a lease left by a run the reboot cut short keeps even the first start off
        set_state "$rd" "$n" started_by "$( [ "$at_boot" = systemd ] && echo systemd || echo boot)"
        while lease_held "$r"; do set_state "$rd" "$n" state passive-lease; sleep "$probe_s"; done
    fi
    while :; do
        if [ $first = 0 ]; then
            # never race a deploy: while a lease is held nothing starts (the holder starts what it wants)
            while lease_held "$r"; do set_state "$rd" "$n" state passive-lease; sleep "$probe_s"; done
            t=$(now_s); kept=""; count=0
            for s0 in $starts; do
                if [ $((t - s0)) -lt "${loop_s%.*}" ]; then kept="$kept $s0"; count=$((count + 1)); fi
            done
            starts=$kept
            if [ "$count" -ge "$loop_n" ]; then
                set_state "$rd" "$n" state given-up given_up 1 given_up_at "$t"
                echo "$(date -u +%FT%TZ) $n: $count starts in ${loop_s} s: crash loop, giving up"
                exit 0
            fi
            set_state "$rd" "$n" state backoff backoff_s "$backoff"
            sleep "$backoff"
            backoff=$(awk -v b="$backoff" -v m="$backoff_max" 'BEGIN { b *= 2; if (b > m) b = m; print b }')
            lease_held "$r" && continue
        fi
        if [ "$peer" != - ]; then  # the pair as one unit: llama-server starts only once its RPC peer listens
            w=$backoff0
            until tcp_probe "${peer%:*}" "${peer##*:}" 2; do
                set_state "$rd" "$n" state waiting-peer
                sleep "$w"
                w=$(awk -v b="$w" -v m="$backoff_max" 'BEGIN { b *= 2; if (b > m) b = m; print b }')
                while lease_held "$r"; do set_state "$rd" "$n" state passive-lease; sleep "$probe_s"; done
            done
        fi
        # sup.files: every start (the first, each restart, at boot) from a release whose files are
        # still its manifest's; a planted library or a changed binary starts nothing (issue 49)
        if [ "$files" != - ] && ! release_ok "$r" "$bindir/.." "$files"; then
            set_state "$rd" "$n" state refused refused "the files of $(cd "$bindir/.." 2>/dev/null && pwd -P) differ from its manifest" pid -
            echo "$(date -u +%FT%TZ) $n: release $(cd "$bindir/.." 2>/dev/null && pwd -P): files differ from its manifest: not started"
            exit 1
        fi
        if [ -n "$wants" ] && ! changed=$(wants_ok "$r"); then
            set_state "$rd" "$n" state refused refused "file $changed changed since it was deployed" pid -
            echo "$(date -u +%FT%TZ) $n: file $changed changed since it was deployed: not started"
            exit 1
        fi
        rotate_logs "$log_max" "$log_keep" "$rd/$n.out" ${rt_logs:+"$rt_logs"}
        # llama-server opens its --log-file with fopen("w"), truncating it: a restart first moves
        # the ended run's log to .1 (a deliberate start keeps it as .prev)
        if [ $first = 0 ] && [ -f "$rd/$n.log" ]; then shift_log "$rd/$n.log" "$log_keep"; mv -f "$rd/$n.log" "$rd/$n.log.1"; fi
        if [ "$user" != - ] && [ ! -e "$rd/$n.log" ]; then  # llama-server opens its --log-file itself
            (umask 077 && true >"$rd/$n.log") && chown "$uid:$gid" "$rd/$n.log"
        fi
        # a cleared environment (no LLAMA_ARG_* or config of the host user's), its own HOME and cwd;
        # the subshell execs env, which execs PROGRAM: $! is the service's pid
        # sup.allow: the RPC guard is preloaded (only those peers are served); missing or a link, nothing starts
        if [ "$allow" != - ]; then
            guard_file_ok "$r" || { echo "$(date -u +%FT%TZ) $n: $r/bin/$GUARD is missing, a link or not ours: not started"; exit 1; }
            # and, with the route key in secrets/, each allowed peer proves it (rpc_guard.c)
            if key_ok "$r"; then set -- env PAIRCTL_RPC_KEY="$r/secrets/rpc.key" "$@"; fi
            set -- env LD_PRELOAD="$r/bin/$GUARD" PAIRCTL_RPC_ALLOW="$allow" "$@"
        elif [ "$peer" != - ] && key_ok "$r" && guard_file_ok "$r"; then
            # llama-server proves the route key to its RPC peer's guard: the same file preloaded
            set -- env LD_PRELOAD="$r/bin/$GUARD" PAIRCTL_RPC_DIAL="$peer" PAIRCTL_RPC_KEY="$r/secrets/rpc.key" "$@"
        fi
        if [ "$user" != - ]; then  # setpriv execs the service: $! stays its pid; the preload applies after the drop
            set -- setpriv --reuid="$uid" --regid="$gid" --init-groups --inh-caps=-all --no-new-privs -- "$@"
        fi
        (cd "$home" && exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LD_LIBRARY_PATH="$libdir" "$@") \
            >>"$rd/$n.out" 2>&1 </dev/null &
        cpid=$!
        echo "$cpid" >"$rd/.$n.pid.tmp.$$" && mv -f "$rd/.$n.pid.tmp.$$" "$rd/$n.pid"
        t0=$(now_s); starts="$starts $t0"
        if [ $first = 0 ]; then restarts=$((restarts + 1)); fi
        set_state "$rd" "$n" state running pid "$cpid" started_at "$t0" restarts "$restarts"
        [ $first = 0 ] && echo "$(date -u +%FT%TZ) $n: restarted as pid $cpid (restart $restarts, after $reason)"
        first=0; reason=-; unanswered_since=""
        while alive "$cpid"; do
            sleep "$probe_s"
            alive "$cpid" || break
            rotate_logs "$log_max" "$log_keep" "$rd/$n.out" ${rt_logs:+"$rt_logs"}
            if lease_held "$r"; then unanswered_since=""; continue; fi  # passive while leased
            if [ "$rpc" != - ] && [ "${hang_s%.*}" -gt 0 ] 2>/dev/null; then
                # ggml-rpc-server: stopped (SIGSTOP), or no HELLO answer while no client is served
                probe=$(rpc_probe "$r" "$n" "${rpc%:*}" "${rpc##*:}" 2)
                case "$probe" in
                *:stopped | *:unanswered)
                    t=$(now_s)
                    [ -n "$unanswered_since" ] || unanswered_since=$t
                    if [ $((t - unanswered_since)) -ge "${hang_s%.*}" ]; then
                        reason="hung (${probe##*:} for $((t - unanswered_since)) s)"
                        kill -KILL "$cpid" 2>/dev/null
                        break
                    fi ;;
                *) unanswered_since="" ;;
                esac
            fi
            if [ "$health" != - ] && [ "${hang_s%.*}" -gt 0 ] 2>/dev/null; then
                if health_probe "${health%:*}" "${health##*:}" 2; then
                    unanswered_since=""
                else
                    t=$(now_s)
                    [ -n "$unanswered_since" ] || unanswered_since=$t
                    if [ $((t - unanswered_since)) -ge "${hang_s%.*}" ]; then
                        reason="hung (/health unanswered for $((t - unanswered_since)) s)"
                        kill -KILL "$cpid" 2>/dev/null
                        break
                    fi
                fi
            fi
            if [ "$peer" != - ]; then
                if peer_closed "$cpid" "${peer%:*}" "${peer##*:}"; then  # it cannot survive losing its peer
                    reason="peer-lost ($peer)"
                    kill -TERM "$cpid" 2>/dev/null
                    i=0
                    while alive "$cpid" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
                    kill -KILL "$cpid" 2>/dev/null
                    break
                fi
            fi
        done
        wait "$cpid" 2>/dev/null; st=$?
        if [ "$reason" != - ]; then
            last="$reason"
        elif [ $st -gt 128 ]; then
            last="signal $((st - 128))"
        else
            last="exit $st"
        fi
        [ "$reason" = - ] && reason=$last
        t=$(now_s)
        # a process that ran longer than the loop window was healthy: the backoff starts over
        if [ $((t - t0)) -ge "${loop_s%.*}" ]; then backoff=$backoff0; fi
        set_state "$rd" "$n" state exited last_exit "$last" last_exit_at "$t" pid -
        echo "$(date -u +%FT%TZ) $n: pid $cpid ended: $last"
    done
}

release_ok() { # release_ok ROOT DIR DIGEST: DIR's files (list_files, manifest.json aside) hash to
    # DIGEST (supervisor.release_files_digest). Cheap: the full hash runs only when the stat of some
    # entry (path, size, inode, mtime, ctime: a write or a replacement changes the ctime) differs
    # from the last listing that passed, kept in run/release-ok (DIGEST SIG) for the next supervisor
    # too, as model_hash keeps run/model-sha256 (run/ is checked for owner and mode, root_trust.py)
    rl_sig=$(cd "$2" 2>/dev/null && find . ! -type d -printf '%p %s %i %T@ %C@\n' | LC_ALL=C sort | sha256sum) || return 1
    rl_sig=${rl_sig%% *}
    [ "$rl_sig" = "${release_sig:-}" ] && return 0
    if grep -qxF "$3 $rl_sig" "$1/run/release-ok" 2>/dev/null; then release_sig=$rl_sig; return 0; fi
    # (sh has no locals: these names are the supervisor's own, never its n, r or user)
    rl_got=$(list_files "$2") || return 1
    rl_n=$(printf '%s\n' "$rl_got" | sed -n 's/^entries=//p')
    [ "$rl_n" = "$(printf '%s\n' "$rl_got" | grep -vc '^entries=')" ] || return 1  # a link, fifo or odd name
    rl_d=$(printf '%s\n' "$rl_got" | grep -v '^entries=' | grep -v '^[0-9a-f]\{64\}  \./manifest\.json$' | LC_ALL=C sort | sha256sum)
    [ "${rl_d%% *}" = "$3" ] || return 1
    release_sig=$rl_sig
    # one line per release digest; a root that takes no new file only loses the shortcut
    { grep -v "^$3 " "$1/run/release-ok" 2>/dev/null; echo "$3 $rl_sig"; } >"$1/run/.release-ok.$$" 2>/dev/null &&
        mv -f "$1/run/.release-ok.$$" "$1/run/release-ok" 2>/dev/null || rm -f "$1/run/.release-ok.$$" 2>/dev/null
    return 0
}

wants_ok() { # wants_ok ROOT: every sup.want file hashes to its SHA256 (model_hash: cached by stat,
    # so only a changed file is read again); else prints the first path that does not and fails
    while IFS= read -r w; do
        [ -n "$w" ] || continue
        wo=$(model_hash "$1" "${w#*:}" | sed -n 's/^model=\([^:]*\):.*/\1/p')
        [ "$wo" = "${w%%:*}" ] || { printf '%s' "${w#*:}"; return 1; }
    done <<WANTS
$wants
WANTS
}

listens() { # listens ADDRESS PORT: a TCP socket listens on exactly ADDRESS:PORT
    # `ss` (iproute2) where the host has it; otherwise /proc/net/tcp (IPv4), as on minimal images
    if command -v ss >/dev/null 2>&1; then
        ss -Hltn "sport = :$2" 2>/dev/null | awk '{print $4}' | grep -qxF "$1:$2"
        return
    fi
    want=$(printf '%s\n' "$1" | awk -F. -v port="$2" 'NF == 4 { printf "%02X%02X%02X%02X:%04X", $4, $3, $2, $1, port }')
    [ -n "$want" ] || return 1
    awk -v want="$want" 'NR > 1 && $2 == want && $4 == "0A" { found = 1 } END { exit !found }' /proc/net/tcp
}

wait_listen() { # wait_listen ROOT NAME ADDRESS PORT TIMEOUT_S: lives AND ADDRESS:PORT listens
    pid=$(pid_of "$1" "$2")
    deadline=$(($(date +%s) + $5))
    while :; do
        if ! alive "$pid"; then
            echo "died=$2:${pid:--}"
            svc_dir "$1" "$2"
            tail -n 30 "$svd/$2.out" 2>/dev/null
            exit 4
        fi
        if listens "$3" "$4"; then
            echo "listening=$3:$4"
            return 0
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then echo "timeout=$3:$4"; exit 5; fi
        sleep 0.01
    done
}

list_files() { # list_files DIR: sha256sum of every regular file under DIR ("HASH  ./PATH"), then
    # entries=N, the number of everything that is not a directory (links, fifos and names sha256sum
    # cannot print on one line make N differ from the number of lines: the caller refuses that)
    (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum) || return 1
    printf 'entries=%s\n' "$(cd "$1" && find . ! -type d -print0 | tr -dc '\000' | wc -c)"
}

verify_release() { # verify_release ROOT ID: stdin = the manifest as `sha256sum` lines ("HASH  ./PATH");
    # prints list_files of releases/ID, then verify=ok, or verify=mismatch and exit 3 (the caller's
    # step then stops nothing: a present release is checked before it is used). The whole list must
    # be the manifest's: a file missing or changed, one added (a planted lib/ on LD_LIBRARY_PATH)
    # beside manifest.json, or anything not a regular file is a mismatch.
    exp=$(mktemp) && got=$(mktemp) || exit 1
    cat >"$exp"
    list_files "$1/releases/$2" >"$got"
    cat "$got"
    n=$(sed -n 's/^entries=//p' "$got")
    sums=$(grep -vc '^entries=' "$got")
    if grep -vxF -f "$got" "$exp" | grep -q . \
        || grep -v '^entries=' "$got" | grep -vxF -f "$exp" | grep -vq '^[0-9a-f]\{64\}  \./manifest\.json$' \
        || [ "$n" != "$sums" ]; then
        rm -f "$exp" "$got"
        echo "verify=mismatch"
        exit 3
    fi
    rm -f "$exp" "$got"
    echo "verify=ok"
}

model_hash() { # model_hash ROOT PATH...: per PATH, model=SHA256:SIZE:cached|hashed:PATH (or
    # model=-:-:missing:PATH). A model is tens of GB: its sha256 is kept in run/model-sha256 under
    # a key of device, inode, size, mtime and ctime, so an unchanged file is hashed once and any
    # write, replacement or touch (ctime) makes it hashed again.
    cache="$1/run/model-sha256"; shift
    mkdir -p "${cache%/*}" || exit 1
    for p in "$@"; do
        # device:inode_size_mtime_ctime, times to the nanosecond (%y/%z): a same-size rewrite in
        # the second it was hashed still changes the key
        key=$(stat -L -c '%d:%i %s %y %z' -- "$p" 2>/dev/null) || { echo "model=-:-:missing:$p"; continue; }
        [ -f "$p" ] || { echo "model=-:-:notfile:$p"; continue; }  # a directory or device is no model
        di=${key%% *}; size=${key#* }; size=${size%% *}
        key=$(printf '%s' "$key" | tr ' ' '_')
        sha=$(awk -v k="$key" '$1 == k { print $2; exit }' "$cache" 2>/dev/null)
        how=cached
        if [ -z "$sha" ]; then
            sha=$(sha256sum < "$p") || exit 1
            sha=${sha%% *}
            how=hashed
            # one line per file (device:inode): an older key of the same file is replaced
            { grep -v "^${di}_" "$cache" 2>/dev/null; echo "$key $sha"; } >"$cache.tmp.$$" && mv "$cache.tmp.$$" "$cache"
        fi
        echo "model=$sha:$size:$how:$p"
    done
}

switch_links() { # switch_links ROOT CURRENT PREVIOUS: by rename (never rm + ln); "-" removes a link
    for pair in "current:$2" "previous:$3"; do
        link=${pair%%:*}; rel=${pair#*:}
        if [ "$rel" = "-" ]; then rm -f "$1/run/$link"; continue; fi
        [ -d "$1/releases/$rel" ] || CODE=3 die "release $rel is not installed"
        # in run/ (maybe a link to the state_dir: absolute targets), under a temporary name of this
        # process's own: a late step of another run never renames it into place
        ln -sfn "$1/releases/$rel" "$1/run/.$link.tmp.$$" && mv -T "$1/run/.$link.tmp.$$" "$1/run/$link" || { rm -f "$1/run/.$link.tmp.$$"; exit 1; }
    done
    echo "current=$(link_of "$1/run/current")"
    echo "previous=$(link_of "$1/run/previous")"
}

cmd=${1:-}
[ -n "$cmd" ] || CODE=2 die "usage: pairctl-svc COMMAND ROOT ..."
shift
root=${1:-}
[ -n "$root" ] || CODE=2 die "$cmd: missing ROOT"
shift
rt_init "$root"

case "$cmd" in
supervise)
    # supervise ROOT NAME [sup.KEY=VALUE...] PROGRAM ARGS...: the loop `start` runs (never called directly)
    supervise "$root" "$@"
    ;;
supervisor)
    # supervisor ROOT NAME...: per NAME, its state file as sup=NAME:BASE64(state) (or sup=NAME:-)
    for name in "$@"; do
        svc_dir "$root" "$name"
        if [ -r "$svd/$name.state" ]; then
            st=$(small "$svd/$name.state" 65536)
            if sup_alive "$root" "$name" >/dev/null; then st="$st
supervisor_alive=1"; else st="$st
supervisor_alive=0"; fi
            echo "sup=$name:$(printf '%s\n' "$st" | base64 -w0)"
        else
            echo "sup=$name:-"
        fi
    done
    ;;
boot)
    # boot ROOT: what the @reboot crontab line runs (orchestrator/hosts/boot.py). The supervisor of
    # each service whose last deliberate act was a start (run/NAME.boot: the arguments `start` or
    # `restart` got, removed by `stop`) is started again with exactly those arguments; it does
    # not wait for the service (llama-server's supervisor first waits for its RPC peer, and any
    # supervisor for a lease a cut-short run left). Stale pid files of the run before are
    # harmless: a pid counts only while its argv[0] names the service. Logs to run/boot.log.
    [ -d "$root/run" ] || exit 0
    exec >>"$root/run/boot.log" 2>&1
    echo "$(date -u +%FT%TZ) boot $root"
    rc=0
    for f in "$root"/run/*.boot; do
        [ -f "$f" ] || continue
        name=${f##*/}; name=${name%.boot}
        if sup_alive "$root" "$name" >/dev/null; then echo "boot=$name:supervised"; continue; fi
        pid=$(pid_of "$root" "$name")
        if alive "$pid" && is_ours "$pid" "$name"; then echo "boot=$name:running"; continue; fi
        # its last start was in the runtime dir (run/ read-only): run/NAME.boot is not what it runs
        svc_dir "$root" "$name"
        if [ "$svd" != "$root/run" ]; then echo "boot=$name:runtime-dir"; continue; fi
        # the arguments go back as they were written (NUL-separated: any byte but NUL survives)
        if PAIRCTL_SVC_AT_BOOT=1 xargs -0 -x sh "$0" start "$root" "$name" <"$f"; then
            echo "boot=$name:started"
        else
            echo "boot=$name:failed"; rc=1
        fi
    done
    exit $rc
    ;;
watch)
    # watch ROOT: what the per-minute crontab line runs where no service manager supervises the
    # supervisors (orchestrator/hosts/boot.py; issue 49: a killed supervisor, then its service,
    # stayed down). `boot` again when a supervisor that should run does not, unless a live lease
    # holds the host (its holder starts what it wants), the supervisor ended on purpose (gave
    # up on a crash loop, refused changed files: the operator's, as status says) or its service
    # still runs. Silent otherwise.
    [ -d "$root/run" ] || exit 0
    ! lease_held "$root" || exit 0
    for f in "$root"/run/*.boot; do
        [ -f "$f" ] || continue
        name=${f##*/}; name=${name%.boot}
        sup_alive "$root" "$name" >/dev/null && continue
        svc_dir "$root" "$name"
        [ "$svd" = "$root/run" ] || continue  # started in the runtime dir: run/NAME.boot is not its start
        small "$svd/$name.state" 65536 | grep -qx 'state=\(given-up\|refused\)' && continue
        # its service outlives it: `boot` would only log "running" each minute (`start` refuses a
        # live service); the minute after the service ends, it is started again (status names the
        # dead supervisor meanwhile)
        pid=$(pid_of "$root" "$name")
        alive "$pid" && is_ours "$pid" "$name" && continue
        exec sh "$0" boot "$root"
    done
    exit 0
    ;;
start)
    # start ROOT NAME PROGRAM ARGS...: start under setsid, then print its identity.
    name=${1:?name}; shift
    start_svc "$root" "$name" "$@"
    identity_of "$root" "$name"
    ;;
stop)
    # stop ROOT NAME [VERIFY_ID]: with VERIFY_ID, first verify_release (manifest on stdin)
    if [ -n "${2:-}" ]; then verify_release "$root" "$2"; fi
    stop_svc "$root" "${1:?name}"
    ;;
restart)
    # restart ROOT NAME VERIFY_ID|- CURRENT PREVIOUS ADDRESS PORT TIMEOUT_S PROGRAM ARGS...: one
    # exec for a whole host step: (verify_release VERIFY_ID, manifest on stdin), stop NAME, switch
    # the links, start PROGRAM, wait until it lives and listens on ADDRESS:PORT, print its
    # identity. (ggml-rpc-server exits 0 on a failed bind: only the port and the process count.)
    name=${1:?name}; vid=${2:?verify}; cur=${3:?current}; prev=${4:?previous}; addr=${5:?address}; port=${6:?port}
    limit=${7:?timeout}
    shift 7
    if [ "$vid" != "-" ]; then verify_release "$root" "$vid"; fi
    case "${1:-}" in systemd=*)  # the staged unit is verified before anything is stopped
        { sd_parse "$1" && sd_ours "$root" "$name"; } || CODE=2 die "restart: $1 is not systemd=user|system:pairctl-PAIR-$name-$(root_tag "$root").service"
        sd_verify "$root"
        sd_verified=$1 ;;
    esac
    # what follows writes run/ only (links, pidfiles, logs): one that takes no new file (read-only,
    # full) is refused here, before the running service is stopped
    d="$root/run"
    takes_file "$d" || CODE=3 die "writable=no: $d takes no new file (read-only or full?); nothing was stopped"
    stop_svc "$root" "$name"
    switch_links "$root" "$cur" "$prev"
    start_svc "$root" "$name" "$@"
    wait_listen "$root" "$name" "$addr" "$port" "$limit"
    identity_of "$root" "$name"
    ;;
guard)
    # guard ROOT NAME: the RPC guard as the running service has it (see guard_state)
    guard_state "$root" "${1:?name}"
    ;;
rpc-probe)
    # rpc-probe ROOT NAME ADDRESS PORT TIMEOUT_S: is ggml-rpc-server hung? (see rpc_probe)
    rpc_probe "$root" "${1:?name}" "${2:?address}" "${3:?port}" "${4:?timeout}"
    ;;
wait-listen)
    # wait-listen ROOT NAME ADDRESS PORT TIMEOUT_S
    wait_listen "$root" "${1:?name}" "${2:?address}" "${3:?port}" "${4:?timeout}"
    ;;
systemd-check)
    # systemd-check ROOT SCOPE: before any change, the manager a start would use answers and
    # systemd-analyze is there; prints systemd=SCOPE:VERSION (and linger= for a user manager)
    sd_parse "systemd=${1:?scope}:pairctl-check.service" || CODE=2 die "systemd-check: scope is user or system, not $1"
    for tool in systemctl systemd-analyze; do
        command -v "$tool" >/dev/null 2>&1 || CODE=3 die "$tool is not installed on this host"
    done
    v=$(sd_ctl "$sd_scope" show -p Version --value 2>&1) || CODE=3 die "no systemd $sd_scope manager answers here: $(printf '%s' "$v" | head -n 1)"
    if [ "$sd_scope" = system ] && [ "$(id -u)" != 0 ]; then CODE=3 die "system units need root, and this login is $(id -un)"; fi
    d=$(sd_dir "$sd_scope")
    mkdir -p "$d" 2>/dev/null; [ -w "$d" ] || CODE=3 die "$d is not writable by $(id -un)"
    echo "systemd=$sd_scope:$(printf '%s' "$v" | head -n 1)"
    if [ "$sd_scope" = user ]; then
        u=$(id -un)
        if [ -e "/var/lib/systemd/linger/$u" ]; then echo "linger=$u:yes"; else echo "linger=$u:no"; fi
    fi
    ;;
unit-verify)
    # unit-verify ROOT NAME SCOPE:UNIT: the staged run/units/UNIT passes the host's verify (deploy's
    # prepare and rollback's check, before the first change: a unit this host rejects stops nothing)
    name=${1:?name}
    { sd_parse "systemd=${2:?scope:unit}" && sd_ours "$root" "$name"; } || CODE=2 die "unit-verify: $2 is not this root's unit for $name"
    sd_verify "$root"
    echo "unit_verified=$sd_unit"
    ;;
units)
    # units ROOT NAME...: per NAME whose run/NAME.unit names a unit, its state read back (sd_state)
    for name in "$@"; do
        if sd_recorded "$root" "$name"; then echo "service=$name"; sd_state; else echo "service=$name"; echo "unit=-"; fi
    done
    ;;
identity)
    # identity ROOT NAME...: per NAME, pid, sha256 of /proc/PID/exe, argv (base64, NUL-separated).
    for name in "$@"; do identity_of "$root" "$name"; done
    ;;
alive)
    name=${1:?name}
    pid=$(pid_of "$root" "$name")
    svc_dir "$root" "$name"
    if alive "$pid"; then echo "alive=$name:$pid"; else echo "dead=$name:${pid:--}"; tail -n 30 "$svd/$name.out" 2>/dev/null; exit 4; fi
    ;;
log-grep)
    # log-grep ROOT FILE TEXT: 0 when the fixed TEXT occurs in run/FILE.
    # Only a regular file, not a link (one to /dev/zero would never end), and at most 64 MiB.
    f=$(run_file "$root" "${1:?file}")
    [ -f "$f" ] && [ ! -L "$f" ] || exit 1
    head -c 67108864 -- "$f" | grep -qF -- "${2:?text}"
    ;;
log-tail)
    f=$(run_file "$root" "${1:?file}")
    if [ -f "$f" ] && [ ! -L "$f" ]; then tail -c 1048576 -- "$f" 2>/dev/null | tail -n "${2:-40}"; fi
    ;;
switch)
    # switch ROOT CURRENT PREVIOUS
    switch_links "$root" "${1:?current}" "${2:?previous}"
    ;;
unpack)
    # unpack ROOT TMPNAME: a tar stream on stdin into releases/TMPNAME (a fresh directory); prints
    # sha256sum of every file (the caller compares with the manifest before renaming it into place).
    tmp=${1:?tmpname}
    case "$tmp" in .*.tmp-*) ;; *) CODE=2 die "unpack: temporary name must look like .ID.tmp-NONCE" ;; esac
    mkdir "$root/releases/$tmp" || exit 1
    tar -x -C "$root/releases/$tmp" -f - || exit 1
    list_files "$root/releases/$tmp" || exit 1
    ;;
hash)
    # hash ROOT DIRNAME: list_files of releases/DIRNAME (sha256sum lines, "./" prefix, then entries=N).
    list_files "$root/releases/${1:?dir}" || exit 1
    ;;
model-hash)
    # model-hash ROOT PATH...: sha256 of each model file (cached by its stat; see model_hash).
    model_hash "$root" "$@"
    ;;
discard)
    # discard ROOT TMPNAME: remove a failed upload (only temporary names).
    tmp=${1:?tmpname}
    case "$tmp" in .*.tmp-*) rm -rf "$root/releases/$tmp" ;; *) CODE=2 die "discard: not a temporary name" ;; esac
    ;;
*)
    CODE=2 die "unknown command $cmd"
    ;;
esac
