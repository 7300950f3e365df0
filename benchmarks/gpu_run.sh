#!/usr/bin/env bash
# One command on a GPU (or TPU) host: the sharded-decoding table for every
# mesh shape this host's devices allow, float32 and bfloat16, speculative
# (byte-85m-llama target, byte-3m-llama draft) and autoregressive.
#
#   bash benchmarks/gpu_run.sh            # from the repository root
#
# Needs `pip install -e . "jax[cuda12]"` (or "jax[tpu]"). Prints markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
N=$(python -c "import jax; print(jax.device_count())")
MESHES=(--mesh=data:1,model:1)
for m in 2 4 8; do
  if (( N >= m && N % m == 0 )); then MESHES+=(--mesh=data:$((N / m)),model:$m); fi
done
if (( N > 1 )); then MESHES+=(--mesh=data:$N,model:1); fi
COMMON=(--target=byte-85m-llama --vocab_size=256 --batch=16 --gamma=4
        --max_new_tokens=256 --prompt_len=64 --repeats=5 "${MESHES[@]}")
for dtype in float32 bfloat16; do
  echo "## speculative, $dtype"
  python benchmarks/sharded.py "${COMMON[@]}" --draft=byte-3m-llama \
      --dtype=$dtype --param_dtype=$dtype 2>/dev/null | grep -v "program all-gathers"
  echo "## autoregressive, $dtype"
  python benchmarks/sharded.py "${COMMON[@]}" --draft=none \
      --dtype=$dtype --param_dtype=$dtype 2>/dev/null | grep -v "program all-gathers"
done
