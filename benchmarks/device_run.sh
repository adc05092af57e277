#!/usr/bin/env bash
# On a machine with no network (the device tool's GPU machine), from benchmarks/device_bundle.sh's .device/:
# builds llama.cpp's libraries, llama-speculative-simple and llama-quantize with LLAMA_CMAKE_ARGS (default CUDA
# for sm_90, without the FlashAttention kernels, which take most of a CUDA build's minutes), lays them out as llama-cpp-python lays out its lib/, builds the extension against them, then runs
# engine.py once for each argument (a whole argument string), with the reference beside it, while DEVICE_DEADLINE
# (seconds from the start, default 570) leaves time. Logs and JSON go to $OUT (default /tmp/device-out).
#     benchmarks/device_run.sh "--scale --only drafters --drafter-n-max 3" "--only drafters" ...
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/device-out}; mkdir -p "$OUT"
WORK=${DEVICE_WORK:-/tmp/device-work}; mkdir -p "$WORK"
PY=${PYTHON:-python3}
JOBS=$(nproc)
# the system's compilers where there are: the device machines' default CXX (/opt/gcc) links libstdc++ statically into
# every shared library, and libllama's, ggml's and the extension's copies in one process crashed llama.cpp's model load
[ -x /usr/bin/g++ ] && export CC=${DEVICE_CC:-/usr/bin/gcc} CXX=${DEVICE_CXX:-/usr/bin/g++}
ARGS=${LLAMA_CMAKE_ARGS--DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF}
DEADLINE=${DEVICE_DEADLINE:-570}
stamp() { echo ">> $(date +%T) $*" | tee -a "$OUT/build.log"; }

stamp "unpack"
[ -d "$WORK/llama.cpp" ] || tar -C "$WORK" -xJf "$REPO/.device/llama-src.tar.xz"
stamp "configure llama.cpp: $ARGS"
# shellcheck disable=SC2086
cmake -S "$WORK/llama.cpp" -B "$WORK/lb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF $ARGS >>"$OUT/build.log" 2>&1
stamp "build llama.cpp"
cmake --build "$WORK/lb" --target llama-speculative-simple llama-quantize -j"$JOBS" >>"$OUT/build.log" 2>&1
BIN="$WORK/lb/bin"
"${CXX:-g++}" -shared -fPIC -O2 -o "$BIN/libflush-common-log.so" "$REPO/mtp_explorer/devtools/flush_common_log.cpp" \
    -L"$BIN" -lllama-common -Wl,-rpath,'$ORIGIN'
stamp "site packages"
SITE="$WORK/site"; rm -rf "$SITE"; cp -r "$REPO/.device/site" "$SITE"; mkdir -p "$SITE/llama_cpp/lib"
cp -a "$BIN"/lib*.so* "$SITE/llama_cpp/lib/"
PKG="$WORK/pkg"; rm -rf "$PKG"; mkdir -p "$PKG"; cp -r "$REPO/mtp_explorer" "$PKG/"
export PYTHONPATH="$PKG:$SITE"
stamp "build the extension"
cmake -S "$REPO" -B "$WORK/eb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v "$PY")" \
    -DLLAMA_CPP_HEADERS="$WORK/llama.cpp" >>"$OUT/build.log" 2>&1
cmake --build "$WORK/eb" -j"$JOBS" >>"$OUT/build.log" 2>&1
cp "$WORK"/eb/_native*.so "$PKG/mtp_explorer/"
(cd "$WORK" && "$PY" -c 'from mtp_explorer import _native as n; print(list(n.backend_devices()), n.supports_gpu_offload())') \
    | tee -a "$OUT/build.log"
stamp "ready"
[ $# -eq 0 ] && exit 0
export MTP_EXPLORER_QUANTIZE="$BIN/llama-quantize" LLAMA_SPECULATIVE_SIMPLE="$BIN/llama-speculative-simple"
cd "$REPO/benchmarks"
i=0
for run in "$@"; do  # one engine.py run each, while the deadline leaves time; each writes its own JSON
  i=$((i + 1)); left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 30 ]; then stamp "skipped (deadline): engine.py $run"; continue; fi
  stamp "engine.py $run (at most ${left} s)"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout "$left" "$PY" engine.py $run >"$OUT/engine-$i.json" 2>"$OUT/engine-$i.err" \
      || stamp "engine.py $run: exit $?"
done
stamp "done"
