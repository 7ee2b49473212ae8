#!/bin/sh
# pairctl-svc: the pidfile supervisor and host helper pairctl installs as <root>/bin/pairctl-svc.
#
# Fixed text: pairctl never formats it. Every value (root, names, ports, argv) arrives as a
# positional argument, so nothing a user writes is ever parsed by this shell as code.
# Processes run under setsid with stdio on files under <root>/run/, so they outlive the SSH
# session that started them (no systemd in the lab). Exit codes: 0 ok, 2 usage, 3 refused
# (state differs from what the caller expected), 4 process died, 5 timed out.
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

cmd=${1:-}
[ -n "$cmd" ] || CODE=2 die "usage: pairctl-svc COMMAND ROOT ..."
shift
root=${1:-}
[ -n "$root" ] || CODE=2 die "$cmd: missing ROOT"
shift

case "$cmd" in
facts)
    # Read-only: what is installed and running. One key=value per line.
    echo "root_exists=$([ -d "$root" ] && echo 1 || echo 0)"
    echo "current=$(link_of "$root/current")"
    echo "previous=$(link_of "$root/previous")"
    if [ -d "$root/releases" ]; then
        for d in "$root"/releases/*; do
            [ -d "$d" ] && echo "release=$(basename "$d")"
        done
    fi
    if [ -f "$root/bin/pairctl-svc" ]; then
        echo "svc_sha256=$(sha256sum "$root/bin/pairctl-svc" | cut -d' ' -f1)"
    fi
    for name in "$@"; do
        pid=$(pid_of "$root" "$name")
        if alive "$pid" && is_ours "$pid" "$name"; then echo "running=$name:$pid"; fi
    done
    if [ -f "$root/route.json" ]; then
        echo "route_b64=$(base64 -w0 "$root/route.json")"
    fi
    ;;
prepare)
    # The host layout, and this script installed by rename from stdin.
    umask 022
    mkdir -p "$root/releases" "$root/leases" "$root/run" "$root/bin" "$root/secrets" || exit 1
    chmod 700 "$root/secrets" || exit 1
    if [ "${1:-}" = "--install-self" ]; then
        cat >"$root/bin/.pairctl-svc.tmp" && chmod 755 "$root/bin/.pairctl-svc.tmp" &&
            mv -f "$root/bin/.pairctl-svc.tmp" "$root/bin/pairctl-svc" || exit 1
    fi
    ;;
start)
    # start ROOT NAME PROGRAM ARGS...: setsid, stdio to run/NAME.out, pid to run/NAME.pid.
    name=${1:?name}; shift
    pid=$(pid_of "$root" "$name")
    if alive "$pid" && is_ours "$pid" "$name"; then CODE=3 die "$name already runs as pid $pid"; fi
    [ -x "$1" ] || CODE=3 die "$1 is not an executable file"
    setsid "$@" >"$root/run/$name.out" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$root/run/.$name.pid.tmp" && mv -f "$root/run/.$name.pid.tmp" "$root/run/$name.pid"
    echo "pid=$pid"
    ;;
stop)
    # stop ROOT NAME: TERM, wait up to 10 s, then KILL; only a process whose argv[0] is NAME.
    name=${1:?name}
    pid=$(pid_of "$root" "$name")
    if alive "$pid" && is_ours "$pid" "$name"; then
        kill -TERM "$pid" 2>/dev/null
        i=0
        while alive "$pid" && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
        if alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null
            i=0
            while alive "$pid" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
        fi
        if alive "$pid"; then CODE=5 die "$name (pid $pid) did not exit after KILL"; fi
        echo "stopped=$name:$pid"
    else
        echo "stopped=$name:-"
    fi
    rm -f "$root/run/$name.pid"
    ;;
wait-listen)
    # wait-listen ROOT NAME ADDRESS PORT TIMEOUT_S: the process lives AND ADDRESS:PORT listens.
    name=${1:?name}; addr=${2:?address}; port=${3:?port}; limit=${4:?timeout}
    pid=$(pid_of "$root" "$name")
    deadline=$(($(date +%s) + limit))
    while :; do
        if ! alive "$pid"; then
            echo "died=$name:${pid:--}"
            tail -n 30 "$root/run/$name.out" 2>/dev/null
            exit 4
        fi
        if ss -Hltn "sport = :$port" 2>/dev/null | awk '{print $4}' | grep -qxF "$addr:$port"; then
            echo "listening=$addr:$port"
            exit 0
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then echo "timeout=$addr:$port"; exit 5; fi
        sleep 0.02
    done
    ;;
identity)
    # identity ROOT NAME...: per running NAME, pid, sha256 of /proc/PID/exe, argv (base64, NUL-separated).
    for name in "$@"; do
        pid=$(pid_of "$root" "$name")
        if alive "$pid" && is_ours "$pid" "$name"; then
            echo "proc=$name:$pid:$(sha256sum "/proc/$pid/exe" | cut -d' ' -f1):$(base64 -w0 "/proc/$pid/cmdline")"
        else
            echo "proc=$name:-"
        fi
    done
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
    # switch ROOT CURRENT PREVIOUS: each link replaced by rename (never rm + ln); "-" removes PREVIOUS.
    cur=${1:?current}; prev=${2:?previous}
    if [ "$cur" != "-" ]; then
        [ -d "$root/releases/$cur" ] || CODE=3 die "release $cur is not installed"
        ln -sfn "releases/$cur" "$root/.current.tmp" && mv -T "$root/.current.tmp" "$root/current" || exit 1
    else
        rm -f "$root/current"
    fi
    if [ "$prev" != "-" ]; then
        [ -d "$root/releases/$prev" ] || CODE=3 die "release $prev is not installed"
        ln -sfn "releases/$prev" "$root/.previous.tmp" && mv -T "$root/.previous.tmp" "$root/previous" || exit 1
    else
        rm -f "$root/previous"
    fi
    echo "current=$(link_of "$root/current")"
    echo "previous=$(link_of "$root/previous")"
    ;;
unpack)
    # unpack ROOT TMPNAME: a tar stream on stdin into releases/TMPNAME (a fresh directory).
    tmp=${1:?tmpname}
    case "$tmp" in .*.tmp-*) ;; *) CODE=2 die "unpack: temporary name must look like .ID.tmp-NONCE" ;; esac
    mkdir "$root/releases/$tmp" || exit 1
    tar -x -C "$root/releases/$tmp" -f - || exit 1
    ;;
hash)
    # hash ROOT DIRNAME: sha256sum of every file under releases/DIRNAME (paths relative, "./" prefix).
    cd "$root/releases/${1:?dir}" || exit 1
    find . -type f -print0 | sort -z | xargs -0 -r sha256sum
    ;;
commit)
    # commit ROOT TMPNAME ID: rename a verified upload into releases/ID.
    tmp=${1:?tmpname}; id=${2:?id}
    [ -e "$root/releases/$id" ] && CODE=3 die "releases/$id already exists"
    mv -T "$root/releases/$tmp" "$root/releases/$id"
    ;;
discard)
    # discard ROOT TMPNAME: remove a failed upload (only temporary names).
    tmp=${1:?tmpname}
    case "$tmp" in .*.tmp-*) rm -rf "$root/releases/$tmp" ;; *) CODE=2 die "discard: not a temporary name" ;; esac
    ;;
put-secret)
    # put-secret ROOT NAME: stdin to secrets/NAME, mode 0600, by rename; the value never is an argument.
    name=${1:?name}
    umask 077
    mkdir -p "$root/secrets" && chmod 700 "$root/secrets" || exit 1
    cat >"$root/secrets/.$name.tmp" && chmod 600 "$root/secrets/.$name.tmp" &&
        mv -f "$root/secrets/.$name.tmp" "$root/secrets/$name"
    ;;
cas-write)
    # cas-write ROOT FILE EXPECTED_SHA256|absent: stdin replaces FILE only if FILE still has the
    # expected content hash (under flock); prints the file as written for a byte comparison.
    file=${1:?file}; expect=${2:?expected}
    exec 9>"$root/.$file.lock"
    flock -w 10 9 || CODE=5 die "cas-write: lock busy"
    if [ -f "$root/$file" ]; then have=$(sha256sum "$root/$file" | cut -d' ' -f1); else have=absent; fi
    if [ "$have" != "$expect" ]; then echo "have=$have"; exit 3; fi
    cat >"$root/.$file.tmp" && mv -T "$root/.$file.tmp" "$root/$file" || exit 1
    cat "$root/$file"
    ;;
*)
    CODE=2 die "unknown command $cmd"
    ;;
esac
