#!/bin/bash
# On a lent GPU machine (after training/gpu/prepare.sh here; the call carries .gpu): trunk stretches in parallel
# from the tracked checkpoint, one per setting, each keeping its lowest held-out stdlib CE (--best).  The two best
# come back in parts ($OUT/best-NAME.part-*: cat them), with every log in $OUT/logs.tgz; /tmp/s2 stays for next.sh.
#   bash training/gpu/stretch.sh MINUTES "A:--lr 3e-4" "B:--lr 5e-4 --dropout 0.2 --ul-weight 1.0" ...
# Three settings share an H100 at 0.25-0.28 s a step each (32 x 512 tokens), against 0.21 s for one alone on an H200.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
minutes=$1; shift
nvidia-smi --query-gpu=name,memory.used --format=csv
mkdir -p /tmp/s2; : > /tmp/s2/configs.txt
for setting in "$@"; do
  c=${setting%%:*}; flags=${setting#*:}
  cp training/checkpoints/trunk-v2.safetensors /tmp/s2/ck-$c.safetensors
  echo "$c $flags" >> /tmp/s2/configs.txt
  # a setting with the sequence-level unlikelihood (--continuations .gpu/continuations.npz) trades held-out CE for
  # fewer loops, so its lowest-CE weights predate its gain: it comes back with its last weights instead
  best="--best /tmp/s2/best-$c.safetensors"
  case "$flags" in *--continuations*) best="" ;; esac
  timeout -s INT $(awk "BEGIN{print int($minutes * 60 + 30)}") python3 -m training.trunk --device cuda \
     --max-minutes "$minutes" --data .gpu/tokens.npz --checkpoint /tmp/s2/ck-$c.safetensors \
     $best --log /tmp/s2/trunk-$c.jsonl --eval-every 100 $flags \
     > /tmp/s2/stdout-$c.txt 2>&1 &
done
sleep 60; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
wait
python3 - <<'PY' > /tmp/s2/ranking.txt
import glob, json, os
best = {}
for f in glob.glob("/tmp/s2/trunk-*.jsonl"):
    c = os.path.basename(f)[len("trunk-"):-len(".jsonl")]
    rows = [json.loads(line) for line in open(f)]
    kept = [r for r in rows if r.get("event") == "best"]
    evals = [r for r in rows if r.get("event") == "eval"]
    if kept:
        best[c] = (kept[-1]["heldout_stdlib_ce"], kept[-1]["step"], f"/tmp/s2/best-{c}.safetensors")
    elif len(evals) > 1 and os.path.exists(f"/tmp/s2/ck-{c}.safetensors"):  # the last weights (no --best)
        best[c] = (evals[-1]["heldout_stdlib"]["ce"], evals[-1]["step"], f"/tmp/s2/ck-{c}.safetensors")
for c, (ce, step, path) in sorted(best.items(), key=lambda kv: kv[1]):
    print(c, ce, step, path)
PY
cat /tmp/s2/ranking.txt
head -2 /tmp/s2/ranking.txt | while read -r c ce step path; do split -b 12M "$path" $OUT/best-$c.part-; done
tar czf $OUT/logs.tgz -C /tmp/s2 configs.txt ranking.txt $(cd /tmp/s2 && ls trunk-*.jsonl stdout-*.txt)
ls -la $OUT
