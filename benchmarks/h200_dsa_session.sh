#!/usr/bin/env bash
# Long-context DSA on one H200 (tokamax wheels in .whl/ as for h200_moe_session.sh):
#   parts:  the DSA parts (scores, top-k, sparse attention) per variant, at CAPS (default 4K 32K 128K)
#   steps:  the GPU speculative == plain tests past index_topk; the draft step at 4K / 32K / 128K × B = 1 / 8 / 64
#           (bf16 keys), and at 128K with fp8 keys                                            (~6 min)
#   kernel: the fused index-scores kernel beside XLA (parts at 32K / 128K) and in the draft step  (~7 min)
#   finish: the 10 GPU equality cases left; verification at 32K (B = 1 / 8 / 64) and at 4K / 128K, B = 64 (~10 min)
#   long:   the verification forward (2-layer full-width target, k = 3) at 4K / 32K / 128K; a 32K-token
#           prompt through the speculator (chunked prefill) with its peak memory               (~6 min)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
source "$(dirname "$0")/device_env.sh"
stage="${1:-steps}"
if [ "$stage" = parts ]; then
  timeout 300 python3 -m benchmarks.dsa_parts --capacity ${CAPS:-4096 32768 131072} --batch 1 8 64 --tokens 1 4 \
    --iters 10 2>&1 | tee "$OUT/dsa_parts.md"
fi
if [ "$stage" = steps ]; then
  timeout 170 python3 -m pytest -q -p no:cacheprovider -x tests/test_speculative.py -k past_index_topk \
    >"$OUT/speculative_gpu_tests.txt" 2>&1
  grep -E "passed|failed|^FAILED|^E  " "$OUT/speculative_gpu_tests.txt" | head -20
  timeout 240 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 64 --capacity 4096 32768 131072 \
    --iters 10 2>&1 | tee "$OUT/mtp_step_dsa.md"
  timeout 120 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 8 64 --capacity 131072 \
    --index-cache-dtype fp8 --iters 10 2>&1 | tee "$OUT/mtp_step_dsa_fp8.md"
fi
if [ "$stage" = long ]; then
  timeout 200 python3 -m benchmarks.long_prefill --layers 2 --prompt 32768 --max-new 8 -k 3 \
    2>&1 | tee "$OUT/long_prefill.md"
  timeout 170 python3 -m benchmarks.verify_forward --layers 2 --batch 1 8 -k 3 --capacity 4096 131072 \
    --forms absorbed --moe-impls tokamax_gpu --iters 5 2>&1 | tee "$OUT/verify_forward_dsa.md"
  timeout "${TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py \
    -k "past_index_topk and v32-bfloat16" >"$OUT/speculative_gpu_tests_v32.txt" 2>&1
  tail -3 "$OUT/speculative_gpu_tests_v32.txt"
fi
if [ "$stage" = kernel ]; then  # the fused index-scores kernel: parts (it prints beside XLA's rows) and the step
  timeout 250 python3 -m benchmarks.dsa_parts --capacity 131072 32768 --batch 1 8 64 --tokens 1 4 --iters 10 \
    2>&1 | tee "$OUT/dsa_parts_kernel.md"
  timeout 200 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 64 --capacity 4096 131072 \
    --index-scores-impl mosaic_gpu --iters 10 2>&1 | tee "$OUT/mtp_step_dsa_kernel.md"
fi
if [ "$stage" = rest ]; then  # what the long stage left: verification at 128K, B = 8; more GPU equality tests
  timeout 120 python3 -m benchmarks.verify_forward --layers 2 --batch 8 -k 3 --capacity 131072 \
    --forms absorbed --moe-impls tokamax_gpu --iters 5 2>&1 | tee "$OUT/verify_forward_dsa_b8.md"
  timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py \
    -k "past_index_topk and (v32-bfloat16-4 or v32-float32-4 or v3-bfloat16-4 or v3-float32-4 or glm5-bfloat16-4)" \
    >"$OUT/speculative_gpu_tests_rest.txt" 2>&1
  tail -3 "$OUT/speculative_gpu_tests_rest.txt"
fi
if [ "$stage" = finish ]; then  # the 10 equality cases no earlier session reached; verification at 32K and B = 64
  timeout "${TESTS_S:-280}" python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py -k "past_index_topk and \
(glm5-bfloat16-3 or v32-float32-1 or v32-float32-2 or v32-float32-3 or v3-float32-1 or v3-float32-2 or v3-float32-3 \
or v3-bfloat16-1 or v3-bfloat16-2 or v3-bfloat16-3)" >"$OUT/speculative_gpu_tests_finish.txt" 2>&1
  tail -3 "$OUT/speculative_gpu_tests_finish.txt"
  timeout 160 python3 -m benchmarks.verify_forward --layers 2 --batch 1 8 64 -k 3 --capacity 32768 \
    --forms absorbed --moe-impls tokamax_gpu --iters 5 2>&1 | tee "$OUT/verify_forward_dsa_32k.md"
  timeout 120 python3 -m benchmarks.verify_forward --layers 2 --batch 64 -k 3 --capacity 4096 131072 \
    --forms absorbed --moe-impls tokamax_gpu --iters 5 2>&1 | tee "$OUT/verify_forward_dsa_b64.md"
fi
