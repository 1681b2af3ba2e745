# Sourced by the GPU scripts (gpu_check.sh, gpu_pretrain_sweep.sh) from the repository root: on a bare GPU
# image (torch only) installs the wheels under .whl/ into /tmp/site (pydantic, and transformers / tokenizers
# at the versions of constraints.txt; see docs/evaluation.md, "On a GPU") unless NO_WHEELS is set, then
# sets PYTHONPATH, PY (default python3), offline Hugging Face, unbuffered output, and prints the GPU.
if [ -z "${NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
PY=${PY:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/mpl TOKENIZERS_PARALLELISM=false
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
