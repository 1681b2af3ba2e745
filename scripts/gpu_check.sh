#!/usr/bin/env bash
# The checks that need a GPU: the HF backend (lean prefill, batched decoding, logprobs) and the `evaluate`
# stage's policy on CUDA, against the same code on the CPU.
#
#   bash scripts/gpu_check.sh OUT_DIR [CHECKPOINT]      # CHECKPOINT default: data/checkpoints/sft_reasoning_free
#
# 1. 256 world/test contexts (oracle rollouts of every 10th task) answered greedily by the checkpoint on
#    cpu:fp32, cuda:fp32 and cuda:bf16: speed, share of answers equal to the CPU's, and the gap between the
#    logprobs of equal greedy tokens (what an RL ratio would see) -> OUT_DIR/dtypes.json
# 2. The `evaluate` stage's policy `sft_reasoning_free` (params.yaml) over every 4th world/test task, n = 1,
#    greedy, on CUDA (the profile's dtype, fp32) -> OUT_DIR/full_cuda.json; compare `success` and `steps`
#    with the same command on the CPU (`CUDA_VISIBLE_DEVICES= bash scripts/gpu_check.sh ...` runs both on
#    the CPU).
# 3. The same as 2 with the backend's prefix reuse and tail speculation off and the simulator in threads
#    (the decoding path before 2026-11-26) -> OUT_DIR/full_cuda_plain.json: the same `steps` and `success`
#    as 2 says the new path decodes as the old one did on CUDA too.
#
# 4. The RL rollout engines (scripts/engine_check.py): serve_openai --weight-sync with the HF backend and with
#    vLLM on GPU 0, the trainer on GPU 1 (or 0): weight sync by checkpoint reload and by broadcast (NCCL with two
#    GPUs, gloo with one), the rollout-trainer logprob gap after each sync, a refused bad push, completion
#    tokens/s -> OUT_DIR/engines.json. Without a GPU it prints "no GPU: skipped"; without vLLM it says so and
#    checks the HF engine only.
#
# 5. The screenshot-profile RL path (scripts/vl_check.py): VL_PROFILE (default vl_smoke; a tree without it falls
#    back to the tiny profile in screenshot+xml) served by serve_openai --engine vllm --weight-sync, its prompts
#    carrying screenshots: weight sync by reload and by broadcast, the logprob gap after each, then an
#    asynchronous `rl` run (max_staleness 1) over that engine and two env servers rendering screenshots
#    -> OUT_DIR/vl.json. Without a GPU it prints "no GPU: skipped". DRY=1 resolves and prints the plan only
#    (profile, checkpoint, engine command, rl config), on any machine.
#
#   CHECKS=engines bash scripts/gpu_check.sh OUT_DIR     # only step 4 (CHECKS: comma list of dtypes,full,plain,engines,vl)
#   CHECKS=vl DRY=1 bash scripts/gpu_check.sh OUT_DIR    # step 5's plan, nothing started
#
# A machine without the project's virtual environment (a bare GPU image with torch) installs the wheels
# under .whl/ first when there are any (pydantic, and transformers / tokenizers at the versions of
# constraints.txt): see docs/evaluation.md, "On a GPU".
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR [CHECKPOINT]}
CKPT=${2:-data/checkpoints/sft_reasoning_free}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
source scripts/gpu_env.sh
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
devices="cpu:fp32"
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" && devices="cpu:fp32,cuda:fp32,cuda:bf16"
CHECKS=${CHECKS:-dtypes,full,plain,engines,vl}
want() { [[ ",$CHECKS," == *",$1,"* ]]; }
has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; }
status=0
if want dtypes; then
  timeout 240 $PY scripts/bench_eval.py --ckpt "$CKPT" --every 10 --requests 256 --dtypes "$devices" \
    --out "$OUT/dtypes.json" 2>&1 | grep -v "Loading weights" || status=1
fi
if want full; then
  timeout 270 $PY scripts/bench_eval.py --full sft_reasoning_free --full-every 4 --out "$OUT/full_cuda.json" 2>&1 \
    | grep -v "Loading weights\|eval:" || status=1
fi
if want plain; then
  timeout 270 $PY scripts/bench_eval.py --full sft_reasoning_free --full-every 4 --env-threads \
    --backend speculate_tokens=0 --backend prefix_cache_tokens=0 --out "$OUT/full_cuda_plain.json" 2>&1 \
    | grep -v "Loading weights\|eval:" || status=1
fi
if want engines; then
  if has_gpu; then
    timeout 420 $PY scripts/engine_check.py --out "$OUT/engines.json" 2>&1 | grep -v "Loading weights" \
      ; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  else
    echo "engine checks (vLLM weight sync, logprob gap, throughput): no GPU: skipped"
  fi
fi
if want vl; then
  vl_args=(--out "$OUT/vl.json" --profile "${VL_PROFILE:-vl_smoke}")
  if [ -n "${DRY:-}" ]; then
    timeout 120 $PY scripts/vl_check.py "${vl_args[@]}" --dry || status=1
  elif has_gpu; then
    timeout 540 $PY scripts/vl_check.py "${vl_args[@]}" 2>&1 | grep -v "Loading weights" \
      ; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  else
    echo "VLM path checks (vLLM weight sync with screenshots, async round): no GPU: skipped"
  fi
fi
exit $status
