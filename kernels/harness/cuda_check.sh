#!/bin/sh
# cuda_check.sh SDIST_TARBALL OUT_DIR CUDA_ARCH [HARNESS ARGS...]
#
# A GPU-machine check of a kernel patch, outside the lab: extract the pinned llama.cpp tree,
# apply kernels/mmvf-warp-per-row/patch.diff, build ggml (CUDA for CUDA_ARCH, RPC, static) plus
# ggml-kernel-cases linked to it by CMake, and run the cases (CUDA device vs the CPU backend):
#   OUT/devices.jsonl          what the harness sees
#   OUT/patched.jsonl          the cases on the patched build (the patch's guard as written)
#   OUT/perturbed.jsonl        the same with every CPU reference perturbed: must fail
#   OUT/forced.jsonl           the guard's compute-capability bound dropped (FORCE_ANY_CC=1 only):
#                              the warp-per-row path itself, on a GPU that is not a Volta
#   OUT/sm75.log               a compile-only check of the patched mmvf.cu for sm_75 (nvcc)
# Fixed text; every value arrives as an argument. Exit status: that of the patched run.
set -eu
tarball=$1; out=$2; arch=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=${WORK:-/tmp/pairctl-kcheck}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
rm -rf "$work"; mkdir -p "$work"
tar -xzf "$tarball" -C "$work"
src=$(find "$work" -maxdepth 2 -type d -name llama.cpp | head -n 1)
[ -n "$src" ] || { echo "no llama.cpp folder in $tarball" >&2; exit 2; }
(cd "$src" && { git apply --verbose "$repo/kernels/mmvf-warp-per-row/patch.diff" || patch -p1 <"$repo/kernels/mmvf-warp-per-row/patch.diff"; }) >"$out/apply.log" 2>&1

# The harness as one more executable of the throw-away tree, linked to ggml the way CMake links it.
printf '\nadd_executable(ggml-kernel-cases %s)\ntarget_link_libraries(ggml-kernel-cases PRIVATE ggml)\ntarget_compile_features(ggml-kernel-cases PRIVATE cxx_std_17)\n' \
    "$here/kernel_cases.cpp" >>"$src/tools/rpc/CMakeLists.txt"

inc="-I$src/ggml/include -I$src/ggml/src -I$src/ggml/src/ggml-cuda"
( nvcc -std=c++17 -arch=sm_75 -O2 -c "$src/ggml/src/ggml-cuda/mmvf.cu" -o "$work/mmvf.sm75.o" $inc \
      -DGGML_USE_CUDA --expt-relaxed-constexpr -use_fast_math -Xcompiler -fPIC; echo "rc=$?" ) >"$out/sm75.log" 2>&1 &
sm75=$!

b="$work/build"
cmake -S "$src" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DGGML_RPC=ON -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF >"$out/configure.log" 2>&1
start=$(date +%s)
ninja -C "$b" -j "$jobs" ggml-kernel-cases ggml-rpc-server >"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 2; }
echo "build_s=$(( $(date +%s) - start ))" >>"$out/build.log"

h="$b/bin/ggml-kernel-cases"
"$h" --list-devices >"$out/devices.jsonl" 2>&1 || true
set +e
"$h" "$@" >"$out/patched.jsonl" 2>"$out/patched.err"; rc=$?
"$h" "$@" --perturb all >"$out/perturbed.jsonl" 2>&1
if [ "${FORCE_ANY_CC:-0}" = 1 ]; then
    sed -i 's/cc >= GGML_CUDA_CC_VOLTA \&\& cc < GGML_CUDA_CC_TURING/cc >= GGML_CUDA_CC_VOLTA/' "$src/ggml/src/ggml-cuda/mmvf.cu"
    grep -c 'cc >= GGML_CUDA_CC_VOLTA) {' "$src/ggml/src/ggml-cuda/mmvf.cu" >"$out/forced.sed" 2>&1
    ninja -C "$b" -j "$jobs" ggml-kernel-cases >>"$out/build.log" 2>&1 && "$h" "$@" >"$out/forced.jsonl" 2>&1
fi
wait "$sm75"
echo "patched rc=$rc"
exit "$rc"
