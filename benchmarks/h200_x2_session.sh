#!/usr/bin/env bash
# One call on a lent 2×H200 machine (jax 0.11.2 + CUDA plugin there): Opt-1 at tp = 2 (GPU tests,
# the kernel's protocols vs XLA, a per-kernel breakdown) and the decode CLI with the kernel; ≤ 560 s.
# Tables land in $OUT. Repo root:
# `bash benchmarks/h200_x2_session.sh`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
T="tests/test_fused_allreduce_rmsnorm_gpu.py::TestOnGpu"
# The bulk-copy (TMA) push first, alone: if it fails or hangs, the rest runs the per-thread push only.
timeout 120 python3 -m pytest -q -x -p no:cacheprovider "$T" -k "tma-False-2-" 2>&1 | tail -8 | tee "$OUT/tma_smoke.txt"
if [ "${PIPESTATUS[0]}" = 0 ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider "$T" 2>&1 | tail -8 | tee "$OUT/gpu_tests.txt"
  timeout 120 python3 -m benchmarks.fused_allreduce_rmsnorm --iters 200 --variants st+entry tma+entry st 2>&1 \
    | tee "$OUT/fused_allreduce_rmsnorm.md"
  timeout 60 python3 -m benchmarks.fused_allreduce_rmsnorm --tokens 1 64 256 --iters 100 --variants st+entry \
    --breakdown 2>&1 | tee "$OUT/breakdown.md"
  timeout 60 python3 -m jax_mtp.decode --tp 2 --impl pallas_gpu --check --json 2>&1 | tail -3 | tee "$OUT/decode.txt"
else
  timeout 200 python3 -m pytest -q -p no:cacheprovider "$T" -k "st-" 2>&1 | tail -8 | tee "$OUT/gpu_tests_st.txt"
fi
