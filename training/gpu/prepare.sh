#!/bin/bash
# Fills .gpu/ (ignored by git) with what training/gpu/*.sh need on a lent GPU machine, which has torch but not
# transformers 5.23 and cannot download: the token streams, the tracked checkpoint's greedy continuations (for
# --continuations) and transformers 5.23 pruned to what the trunk and the
# heads import (the tracked checkpoint leaves ~12 MB of the 64 MiB a call may carry).  Run from the repository root.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
mkdir -p .gpu
PY=${PYTHON:-.venv/bin/python}
[ -f .gpu/tokens.npz ] || "$PY" -m training.trunk --prepare --data .gpu/tokens.npz
# the tracked checkpoint's own greedy continuations (llama.cpp, which the GPU machine lacks) for --continuations;
# made again when the checkpoint changed
ck=training/checkpoints/trunk-v2.safetensors
if [ ! -f .gpu/continuations.npz ] || [ "$ck" -nt .gpu/continuations.npz ]; then
  "$PY" -m training.trunk --make-continuations .gpu/continuations.npz --checkpoint "$ck" --data .gpu/tokens.npz
fi
if [ ! -d .gpu/site/transformers ]; then
  version=$(grep -o '"transformers==[^"]*"' pyproject.toml | head -1 | tr -d '"' | cut -d= -f3)
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 -d "$tmp" "transformers==$version"
  mkdir -p .gpu/site && (cd .gpu/site && unzip -q "$tmp"/transformers-*.whl)
  rm -rf "$tmp"
  (cd .gpu/site/transformers/models && for d in *; do
     case "$d" in __init__.py|auto|qwen3_5|qwen2_vl) ;; *) rm -rf "$d" ;; esac; done)
  (cd .gpu/site/transformers && rm -rf pipelines exporters cli trainer.py trainer_*.py training_args*.py testing_utils.py)
fi
tracked=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
carried=$(du -sb .gpu | cut -f1)
echo "tracked $((tracked / 1048576)) MiB + .gpu $((carried / 1048576)) MiB = $(((tracked + carried) / 1048576)) MiB (a call carries 64 MiB)"
[ $((tracked + carried)) -lt $((64 * 1048576)) ]
