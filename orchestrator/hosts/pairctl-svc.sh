#!/bin/sh
# pairctl-svc: the pidfile supervisor and host helper pairctl installs as <root>/bin/pairctl-svc.
#
# Fixed text: pairctl never formats it. Every value (root, names, ports, argv) arrives as a
# positional argument, so nothing a user writes is ever parsed by this shell as code.
# Processes run under setsid with stdio on files under <root>/run/, so they outlive the SSH
# session that started them (no systemd in the lab). Exit codes: 0 ok, 2 usage, 3 refused
# (state differs from what the caller expected), 4 process died, 5 timed out.
#
# Each call is one SSH exec, and an exec is the expensive thing (a login shell per call), so
# the subcommands a deploy uses do a whole host step each: `restart` stops, switches, starts,
# waits for the port and prints the identity in one call. Reads and renames that need no
# process (links, route.json, leases) go over SFTP instead.
set -u

die() { echo "pairctl-svc: $*" >&2; exit "${CODE:-1}"; }

alive() { # alive PID: the process exists and is not a zombie
    [ -n "$1" ] && [ -r "/proc/$1/stat" ] || return 1
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$state" ] && [ "$state" != Z ]
}

pid_of() { # pid_of ROOT NAME: the recorded pid, empty when none
    if [ -r "$1/run/$2.pid" ]; then cat "$1/run/$2.pid"; fi
}

is_ours() { # is_ours PID NAME: argv[0] ends in /NAME (guards against a reused pid)
    exe0=$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | head -n 1)
    case "$exe0" in */"$2") return 0 ;; *) return 1 ;; esac
}

link_of() { if [ -L "$1" ]; then readlink "$1"; else echo "-"; fi; }

identity_of() { # identity_of ROOT NAME: proc=NAME:PID:SHA256(exe):BASE64(cmdline), or proc=NAME:-
    pid=$(pid_of "$1" "$2")
    if alive "$pid" && is_ours "$pid" "$2"; then
        echo "proc=$2:$pid:$(sha256sum "/proc/$pid/exe" | cut -d' ' -f1):$(base64 -w0 "/proc/$pid/cmdline")"
    else
        echo "proc=$2:-"
    fi
}

start_svc() { # start_svc ROOT NAME PROGRAM ARGS...: setsid; returns once PROGRAM has been exec'd;
    # run/NAME.out and run/NAME.log of the run before are kept as *.prev
    r=$1; n=$2; shift 2
    pid=$(pid_of "$r" "$n")
    if alive "$pid" && is_ours "$pid" "$n"; then CODE=3 die "$n already runs as pid $pid"; fi
    [ -x "$1" ] || CODE=3 die "$1 is not an executable file"
    for f in "$r/run/$n.out" "$r/run/$n.log"; do  # keep the previous run's output (a failed start's reason)
        if [ -f "$f" ]; then mv -f "$f" "$f.prev"; fi
    done
    setsid "$@" >"$r/run/$n.out" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$r/run/.$n.pid.tmp" && mv -f "$r/run/.$n.pid.tmp" "$r/run/$n.pid"
    i=0
    while alive "$pid" && ! is_ours "$pid" "$n" && [ $i -lt 100 ]; do sleep 0.01; i=$((i + 1)); done
    echo "pid=$pid"
}

stop_svc() { # stop_svc ROOT NAME: TERM, wait up to 10 s, then KILL; only a process whose argv[0] is NAME
    pid=$(pid_of "$1" "$2")
    if alive "$pid" && is_ours "$pid" "$2"; then
        kill -TERM "$pid" 2>/dev/null
        i=0
        while alive "$pid" && [ $i -lt 400 ]; do sleep 0.025; i=$((i + 1)); done
        if alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null
            i=0
            while alive "$pid" && [ $i -lt 200 ]; do sleep 0.025; i=$((i + 1)); done
        fi
        if alive "$pid"; then CODE=5 die "$2 (pid $pid) did not exit after KILL"; fi
        echo "stopped=$2:$pid"
    else
        echo "stopped=$2:-"
    fi
    rm -f "$1/run/$2.pid"
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
            tail -n 30 "$1/run/$2.out" 2>/dev/null
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

verify_release() { # verify_release ROOT ID: stdin = the manifest as `sha256sum` lines ("HASH  ./PATH");
    # prints sha256sum of every file in releases/ID, then verify=ok, or verify=mismatch and exit 3
    # (the caller's step then stops nothing: a present release is checked before it is used)
    exp=$(mktemp) && got=$(mktemp) || exit 1
    cat >"$exp"
    (cd "$1/releases/$2" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum) >"$got"
    cat "$got"
    if grep -vxF -f "$got" "$exp" | grep -q .; then
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
        if [ "$rel" = "-" ]; then rm -f "$1/$link"; continue; fi
        [ -d "$1/releases/$rel" ] || CODE=3 die "release $rel is not installed"
        ln -sfn "releases/$rel" "$1/.$link.tmp" && mv -T "$1/.$link.tmp" "$1/$link" || exit 1
    done
    echo "current=$(link_of "$1/current")"
    echo "previous=$(link_of "$1/previous")"
}

cmd=${1:-}
[ -n "$cmd" ] || CODE=2 die "usage: pairctl-svc COMMAND ROOT ..."
shift
root=${1:-}
[ -n "$root" ] || CODE=2 die "$cmd: missing ROOT"
shift

case "$cmd" in
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
    stop_svc "$root" "$name"
    switch_links "$root" "$cur" "$prev"
    start_svc "$root" "$name" "$@"
    wait_listen "$root" "$name" "$addr" "$port" "$limit"
    identity_of "$root" "$name"
    ;;
wait-listen)
    # wait-listen ROOT NAME ADDRESS PORT TIMEOUT_S
    wait_listen "$root" "${1:?name}" "${2:?address}" "${3:?port}" "${4:?timeout}"
    ;;
identity)
    # identity ROOT NAME...: per NAME, pid, sha256 of /proc/PID/exe, argv (base64, NUL-separated).
    for name in "$@"; do identity_of "$root" "$name"; done
    ;;
alive)
    name=${1:?name}
    pid=$(pid_of "$root" "$name")
    if alive "$pid"; then echo "alive=$name:$pid"; else echo "dead=$name:${pid:--}"; tail -n 30 "$root/run/$name.out" 2>/dev/null; exit 4; fi
    ;;
log-grep)
    # log-grep ROOT FILE TEXT: 0 when the fixed TEXT occurs in run/FILE.
    grep -qF -- "${2:?text}" "$root/run/${1:?file}"
    ;;
log-tail)
    tail -n "${2:-40}" "$root/run/${1:?file}" 2>/dev/null || true
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
    cd "$root/releases/$tmp" || exit 1
    find . -type f -print0 | sort -z | xargs -0 -r sha256sum
    ;;
hash)
    # hash ROOT DIRNAME: sha256sum of every file under releases/DIRNAME (paths relative, "./" prefix).
    cd "$root/releases/${1:?dir}" || exit 1
    find . -type f -print0 | sort -z | xargs -0 -r sha256sum
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
