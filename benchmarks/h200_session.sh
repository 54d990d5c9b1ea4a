#!/usr/bin/env bash
# One call on the lent H200 machine (jax 0.11.2 + CUDA plugin there): the GPU-only tests and the
# GPU benchmarks, each table written to $OUT. Run from the repo root: `bash benchmarks/h200_session.sh`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fused_allreduce_rmsnorm_gpu.py 2>&1 \
  | tail -4 | tee "$OUT/gpu_tests.txt"
timeout 120 python3 -m benchmarks.fused_allreduce_rmsnorm 2>&1 | tee "$OUT/fused_allreduce_rmsnorm.md"
timeout 240 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 64 --capacity 4096 \
  --impls xla pallas_gpu --iters 30 2>&1 | tee "$OUT/mtp_step.md"
timeout 60 python3 -m jax_mtp.decode --json 2>&1 | tail -3 | tee "$OUT/decode.txt"
