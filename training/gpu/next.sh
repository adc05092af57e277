#!/bin/bash
# Right after stretch.sh, on the same warm machine (it gives a machine back after 30 s idle):
#   bash training/gpu/next.sh MINUTES [CE_BAR]
# If the best stretch's held-out stdlib CE (PyTorch, 512-token windows) is at most CE_BAR (default 2.555: about
# 2.65 in training.evaluate's 256-token windows, where stretches 1 and 3 measured +0.093 and +0.097 more), train the
# EAGLE-3 (2 x MINUTES), DFlash and then DSpark (MINUTES each) heads on it; otherwise continue that trunk alone for
# 2 x MINUTES at a peak learning rate of 2e-4.  What was trained comes back in parts, the logs in $OUT/next-logs.tgz.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
minutes=$1; bar=${2:-2.555}
read c ce step path < /tmp/s2/ranking.txt || true
[ -n "$c" ] || { echo "no stretch of stretch.sh improved on its start: nothing to go on from"; exit 1; }
echo "best: $c, held-out stdlib CE $ce at step $step"
mkdir -p /tmp/h
if awk "BEGIN{exit !($ce > $bar)}"; then
  flags=$(grep "^$c " /tmp/s2/configs.txt | cut -d' ' -f2-)
  cp "$path" /tmp/h/ck.safetensors
  python3 -m training.trunk --device cuda --max-minutes $(awk "BEGIN{print 2 * $minutes}") --data .gpu/tokens.npz \
     --checkpoint /tmp/h/ck.safetensors --best /tmp/h/best.safetensors --log /tmp/h/trunk-$c-more.jsonl \
     --eval-every 100 $flags --lr 2e-4 > /tmp/h/trunk-more.txt 2>&1
  [ -f /tmp/h/best.safetensors ] && split -b 12M /tmp/h/best.safetensors $OUT/best-$c-more.part-
else
  T="--target $path --tokens .gpu/tokens.npz --device cuda --no-export"
  python3 -m training.eagle3 $T --max-minutes $(awk "BEGIN{print 2 * $minutes}") --layer-ids 2,6,12 \
     --out /tmp/h/eagle3 --log /tmp/h/eagle3-v2.jsonl > /tmp/h/eagle3.txt 2>&1 &
  ( python3 -m training.dflash $T --max-minutes $minutes --layer-ids 1,5,10 --out /tmp/h/dflash \
       --log /tmp/h/dflash-v2.jsonl > /tmp/h/dflash.txt 2>&1
    python3 -m training.dspark $T --max-minutes $minutes --init-from /tmp/h/dflash/last.pt --out /tmp/h/dspark \
       --log /tmp/h/dspark-v2.jsonl > /tmp/h/dspark.txt 2>&1 ) &
  wait
  for h in eagle3 dflash dspark; do [ -f /tmp/h/$h/last.pt ] && split -b 12M /tmp/h/$h/last.pt $OUT/$h.part-; done
fi
tar czf $OUT/next-logs.tgz -C /tmp/h $(cd /tmp/h && ls *.jsonl *.txt)
ls -la $OUT
