#!/usr/bin/env bash
# One call on a lent 2×H200 machine (jax 0.11.2 + CUDA plugin there): the chained Opt-1 kernel
# (persistent workspace, no XLA device barrier) at tp = 2 — its GPU tests first (a hang is cut by
# `timeout`), the decode CLI with chained draft steps, then per-call times in chains of 8 and 1
# against the default kernel and XLA, and a per-kernel breakdown; ≤ 520 s. Tables land in $OUT. Repo root: `bash benchmarks/h200_x2_chained.sh`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_fused_allreduce_rmsnorm_gpu_chained.py 2>&1 \
  | tail -15 | tee "$OUT/chained_tests.txt"
if [ "${PIPESTATUS[0]}" = 0 ]; then
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_fused_allreduce_rmsnorm_gpu.py::TestOnGpu \
    -k "tma-False-2-" 2>&1 | tail -3 | tee "$OUT/default_tests.txt"
  # end to end: k = 4 chains the draft steps (CHAIN_MIN_CALLS = 3)
  timeout 90 python3 -m jax_mtp.decode --tp 2 --impl pallas_gpu --num-speculative-tokens 4 --check --json 2>&1 \
    | tail -3 | tee "$OUT/decode_k4.txt"
  for chain in 8 1; do
    timeout 90 python3 -m benchmarks.fused_allreduce_rmsnorm --iters 100 --chain $chain --variants chained 2>&1 \
      | tee "$OUT/chain$chain.md"
  done
  timeout 60 python3 -m benchmarks.fused_allreduce_rmsnorm --tokens 1 256 --iters 50 --chain 8 --variants chained \
    --breakdown 2>&1 | tail -40 | tee "$OUT/breakdown_chain8.md"
fi
