#!/usr/bin/env bash
# Packs what benchmarks/device_run.sh needs on a machine with no network into .device/ (git-ignored through
# .git/info/exclude): llama.cpp's 0.3.36 sources without the parts no build here uses (models, docs, tests,
# other backends) and the pure-Python packages the extension's build and the benchmarks import that such a
# machine lacks (llama-cpp-python's Python files, nanobind, diskcache, gguf), taken from this checkout's .venv.
#     benchmarks/device_bundle.sh        # then: device run, carry .device, command benchmarks/device_run.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."
SP=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SRC=build/sdist/llama_cpp_python-0.3.36/vendor
[ -d "$SRC/llama.cpp" ] || { echo "run make build/reference/bin/llama-quantize first (it unpacks the sdist)" >&2; exit 1; }
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
rm -rf .device && mkdir -p .device/site
others=$(for b in sycl vulkan opencl cann musa hip metal webgpu zdnn zendnn blas rpc openvino virtgpu hexagon et; do
  echo "--exclude=llama.cpp/ggml/src/ggml-$b"; done)
# shellcheck disable=SC2086
tar -C "$SRC" -cJf .device/llama-src.tar.xz $others --exclude=llama.cpp/models --exclude=llama.cpp/docs \
    --exclude=llama.cpp/tests --exclude=llama.cpp/benches --exclude=llama.cpp/media --exclude=llama.cpp/gguf-py \
    --exclude='llama.cpp/tools/server/public*' --exclude=llama.cpp/tools/ui llama.cpp
for p in llama_cpp nanobind diskcache gguf; do cp -r "$SP/$p" .device/site/; done
rm -rf .device/site/llama_cpp/lib .device/site/llama_cpp/server
find .device/site -name __pycache__ -prune -exec rm -rf {} +
du -sh .device
