#!/usr/bin/env bash
# Pretraining recipes of the tiny base, several at once on one GPU: a bench for what the 2-core rebuild
# would give, in minutes instead of hours (the same model and tokens per step as configs/tiny.yaml: a variant
# run to 8,000 steps stands for a CPU rebuild of that recipe; five at once ran ~15 steps/s each on an H200,
# so that takes ~9 minutes, and a shorter MINUTES ends each run earlier, annealed; see
# experiments/tiny_base/HISTORY.md, "Recipes measured on a GPU").
#
#   bash scripts/gpu_pretrain_sweep.sh OUT_DIR [MINUTES]       # MINUTES: each run's clock budget (default 6)
#   VARIANTS=spans PROBE=1 DATA_WORKERS=1 bash scripts/gpu_pretrain_sweep.sh OUT_DIR 6   # the span-copy set
#
# Collects the train-split screens once (16 processes), then trains every variant below in its own process
# (train.device=cuda, 2 data workers each), each with the released base's tokenizer so that the figures
# compare with models/tiny-base. OUT_DIR/<variant>.tgz holds the run's log, curve (with the in-training
# probe, next action included) and the saved model; a model too large to come back (> 12 MB) is given the
# release probe there (scripts/probe_tiny_base.py, on the GPU, probe.json) and comes back without weights.
# On a bare GPU image (torch only) the wheels under .whl/ are installed first (scripts/gpu_env.sh).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_pretrain_sweep.sh OUT_DIR [MINUTES]}
MIN=${2:-6}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source scripts/gpu_env.sh
DEV=${DEV:-cuda}
WORK=${WORK:-/tmp/sweep}
STATES=$WORK/states
mkdir -p "$STATES"
t0=$(date +%s)
if [ ! -f "$STATES/train.jsonl.gz" ]; then
  $PY - "$STATES" "${COLLECT_WORKERS:-16}" <<'EOF' || exit 1
import sys
from pathlib import Path
from mobilerl.tinybase.recipe import load_recipe
from mobilerl.tinybase.screens import save_states
from mobilerl.tinybase.train import prepare_states
out, workers = Path(sys.argv[1]), sys.argv[2]
train, test = prepare_states(load_recipe("configs/tiny.yaml", [f"train.threads={workers}"]))
save_states(train, out / "train.jsonl.gz")
save_states(test, out / "test.jsonl.gz")
print(f"{len(train)} train / {len(test)} held-out screens")
EOF
fi
cp models/tiny-base/tokenizer.json "$STATES/tokenizer_4096_split.json"
echo "screens ready in $(( $(date +%s) - t0 ))s"

run() {  # name, then recipe overrides
  local name=$1; shift
  local w=$WORK/$name
  mkdir -p "$w"
  $PY -m mobilerl.tinybase.train configs/tiny.yaml "$w" --states "$STATES" --out "$w/model" \
    --set train.device=$DEV --set train.data_workers=${DATA_WORKERS:-2} --set train.threads=1 \
    --set train.max_minutes=$MIN --set train.save_every_minutes=1000 \
    --set "train.probe_kinds=[ground,read,copy,type,act]" "$@" >"$w/log.txt.out" 2>&1
  # at most 16 MiB a file comes back: a wider model is probed here and comes back without its weights;
  # the released shape comes back whole, to be probed (and fine-tuned) on the CPU machine. PROBE=1 gives
  # every model the release probe here (probe.json, and the scored items in probe_rows.jsonl)
  local big=0
  [ "$(du -m "$w/model/model.safetensors" | cut -f1)" -gt 12 ] && big=1
  if [ "$big" = 1 ] || [ -n "${PROBE:-}" ]; then
    timeout "${PROBE_S:-600}" $PY scripts/probe_tiny_base.py --model "$w/model" --states "$STATES" --device "$DEV" --threads 1 --json \
      --rows "$w/probe_rows.jsonl" >"$w/probe.json" 2>>"$w/log.txt.out"
  fi
  [ "$big" = 1 ] && rm "$w/model/model.safetensors"
  rm -f "$w/last.pt"
  tar czf "$OUT/$name.tgz" -C "$WORK" "$name"
  echo "$name: $(grep -h '"steps"' "$w/log.txt" | tail -1 | cut -c1-400)"
}

VARIANTS=${VARIANTS:-all}
if [ "$VARIANTS" = all ]; then
  run b1 &                                                   # the released recipe (control)
  run b1_x4 --set train.max_steps=32000 --set train.probe_every=1000 &  # 4x the steps (clock-capped)
  run w256_x4 --set model.hidden_size=256 --set model.num_hidden_layers=4 --set model.num_attention_heads=8 \
    --set model.num_key_value_heads=8 --set model.intermediate_size=768 \
    --set train.max_steps=32000 --set train.probe_every=1000 &
elif [ "$VARIANTS" = spans ]; then
  # span copy (issue 4): the released recipe, two seeds, beside more novel spans and a fourth layer
  run ctl0 --set train.seed=0 &
  run ctl1 &
  run nov7 --set data.novel_spans=0.7 &
  run L4 --set model.num_hidden_layers=4 &
else
  # smoke test: VARIANTS=smoke, a few steps of the released recipe
  run smoke --set train.max_steps=${SMOKE_STEPS:-20} --set train.probe_items=5 &
fi
wait
echo "all done in $(( $(date +%s) - t0 ))s"
