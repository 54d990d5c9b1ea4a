#!/usr/bin/env bash
# The routed experts on one H200 (jax 0.11.2 image + tokamax carried as wheels in .whl/, see
# benchmarks/README.md "Device sessions"): `bash benchmarks/h200_moe_session.sh [experts|verify|all]`.
#   experts: GPU tests of the tokamax path, benchmarks.moe_experts (with the block-config sweep),
#            benchmarks.mtp_step per experts impl   (~6 min)
#   verify:  the GPU tests again, benchmarks.verify_forward (4-layer full-width V3.2 target, k = 3)   (~8 min)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
source "$(dirname "$0")/device_env.sh"
stage="${1:-all}"
if [ "$stage" = experts ] || [ "$stage" = all ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_experts_gpu.py >"$OUT/experts_gpu_tests.txt" 2>&1
  grep -E "passed|failed|^FAILED|^E  " "$OUT/experts_gpu_tests.txt" | head -30
  timeout 200 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 64 256 --capacity 4096 \
    --moe-impls tokamax_gpu gather ragged_dot --iters 10 2>&1 | tee "$OUT/mtp_step.md"
  # one run: every impl, the block-config sweep and the dense linears (RESULTS.md "Routed experts")
  timeout 240 python3 -m benchmarks.moe_experts --batch 1 8 64 256 --impls gather ragged_dot tokamax_gpu --sweep \
    2>&1 | tee "$OUT/moe_experts_sweep.md"
fi
if [ "$stage" = verify ] || [ "$stage" = all ]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_experts_gpu.py >"$OUT/experts_gpu_tests.txt" 2>&1
  grep -E "passed|failed|^FAILED|^E  " "$OUT/experts_gpu_tests.txt" | head -30
  timeout 250 python3 -m benchmarks.verify_forward --layers 4 --batch 1 8 64 256 -k 3 --capacity 1024 \
    --forms absorbed --moe-impls tokamax_gpu ragged_dot --iters 5 2>&1 | tee "$OUT/verify_forward.md"
  timeout 150 python3 -m benchmarks.verify_forward --layers 4 --batch 1 8 64 256 -k 3 --capacity 1024 \
    --forms naive --moe-impls tokamax_gpu --iters 5 2>&1 | tee "$OUT/verify_forward_naive.md"
fi
