#!/usr/bin/env bash
# One command on a GPU (or TPU) host: the roofline report
# (`python -m benchmarks.roofline`: bytes and FLOPs per pass, the fraction
# of the device's measured bandwidth roofline that `generate` and
# `speculative_generate` reach, cache copies per round) at GPT-2 124M and
# Llama-3.2-1B shapes in bfloat16, written to results/roofline/<device>/;
# then the sharded-decoding table
# (`python -m benchmarks.decode --mesh=...`: per-device memory, tokens/s and the
# collectives of generate and speculative_generate) for every mesh shape
# this host's devices allow, float32 and bfloat16, greedy and sampled, with
# a byte-85m-llama target and a byte-3m-llama draft (random weights; the
# vocabulary set to 256 so that it divides `model`).
#
#   bash benchmarks/gpu_run.sh            # from anywhere in the repository
#
# Needs `pip install -e . "jax[cuda12]"` (or "jax[tpu]"). Prints markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
KIND=$(python -c "import jax; print(jax.devices()[0].device_kind.replace(' ', '_'))")
for target in gpt2-124m llama-3.2-1b; do
  echo "## roofline, $target, bfloat16, batch 1"
  python -m benchmarks.roofline --target=$target --draft=self:2 \
      --dtype=bfloat16 --batch=1 --gamma=4 --prompt_len=64 \
      --max_new_tokens=256 --results_dir="results/roofline/$KIND" 2>/dev/null
  echo
done
N=$(python -c "import jax; print(jax.device_count())")
MESHES=(--mesh=data:1,model:1)
for m in 2 4 8; do
  if (( N >= m && N % m == 0 )); then MESHES+=(--mesh=data:$((N / m)),model:$m); fi
done
if (( N > 1 )); then MESHES+=(--mesh=data:$N,model:1); fi
COMMON=(--target=byte-85m-llama --vocab_size=256 --draft=byte-3m-llama
        --batch=16 --gamma=4 --max_new_tokens=256 --prompt_len=64 --repeats=5
        "${MESHES[@]}")
for dtype in float32 bfloat16; do
  for temperature in 0 1; do
    echo "## $dtype, temperature $temperature"
    python -m benchmarks.decode "${COMMON[@]}" --dtype=$dtype \
        --param_dtype=$dtype --temperature=$temperature 2>/dev/null
    echo
  done
done
