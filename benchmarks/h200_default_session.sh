#!/usr/bin/env bash
# The embedded default's speed on one H200 (issue 13), one stage per call (each inside one 600 s call):
#   cost   what a speculative round costs against a plain step per target depth (random weights), and how
#          long a deeper preset's training programs take to compile (XLA's autotuning on and off)
#   kernel the FP8 grouped matmul's tests on the GPU, then its correctness and time at V3.2's expert shapes
#   fp8    the kernel's formula tests on the GPU; FP8 weights kept on the device vs the same weights in bf16:
#          V3.2's MTP layer memory and draft step; per row the bf16 top-1 gap beside the FP8 logit difference
#   profile where the V3.2 draft step's time goes (B = 64 and 8, FP8 and bf16): kernel time per model part
#   dense  the FP8 kernel's launch configs on V3.2's dense FP8 linears (one group) beside XLA and a bf16 dot
#   step   the FP8 vs bf16 draft step at B = 1, 8, 64, the FP8 step's profile at B = 64, and the GPU
#          speculative == plain tests in bf16 (after a change to the attention)
#   verify the FP8 kernel's tests (formula, dense linears, the vLLM fixtures re-quantised) and the experts' GPU tests
#   agree  per row: the bf16 path's top-1 gap beside the FP8 path's logit difference (why tokens may differ)
#   mla    the sparse-MLA kernel's tests on the GPU (Triton at V3.2 widths, the model's tokens), then its launch
#          configs and its time against XLA's sparse attention at V3.2 widths, B = 1, 8, 64, T = 1 and 4
#   mla2   the sparse-MLA and dense-FP8-layout tests on the GPU, the dense FP8 linears' two layouts
#   mlastep the FP8 and bf16 draft steps at B = 1, 8, 64 with XLA's sparse attention and with the kernel
#   bench  speculative vs plain tokens/s of the embedded default, k = 1..5, and `decode --check` on the GPU
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
QUIET="TPU|libtpu|Source Location|InitGoogle|E0000|learning/"
case "${1:?stage}" in
  cost)
    timeout 330 python3 -m benchmarks.round_cost --layers 4 8 12 --k 1 2 3 --repeats 2 2>&1 | grep --line-buffered -v -E "$QUIET" \
      | tee "$OUT/round_cost.md"
    timeout 110 python3 -m benchmarks.train_compile --layers 12 --moe-intermediate 64 2>&1 | grep --line-buffered -v -E "$QUIET" \
      | tee "$OUT/train_compile.txt"
    XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 110 python3 -m benchmarks.train_compile --layers 12 \
      --moe-intermediate 64 2>&1 | grep --line-buffered -v -E "$QUIET" | sed 's/^/autotune 0: /' | tee -a "$OUT/train_compile.txt"
    ;;
  bench)
    timeout 300 python3 -m benchmarks.spec_vs_plain --checkpoint jax_mtp/default_model --k 1 2 3 4 5 --prompts 4 \
      --max-new 128 --repeats 2 2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/spec_vs_plain_h200.md"
    timeout 120 python3 -m jax_mtp.decode --check 2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/decode_check.txt"
    ;;
  kernel)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_weights.py -k "grouped or bit_identical" 2>&1 \
      | grep --line-buffered -v -E "$QUIET" | tail -15 | tee "$OUT/fp8_tests.txt"
    timeout 300 python3 -m benchmarks.fp8_mgpu --assignments 8 64 512 --rows 1 2>&1 | grep --line-buffered -v -E "$QUIET" \
      | tee "$OUT/fp8_grouped.md"
    ;;
  fp8)
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_weights.py -k "grouped_matmul_equals or dense" \
      2>&1 | grep --line-buffered -v -E "$QUIET" | tail -4 | tee "$OUT/fp8_tests.txt"
    timeout 300 python3 -m benchmarks.fp8_step --preset deepseek_v32 --batch 1 8 64 2>&1 | grep --line-buffered -v -E "$QUIET" \
      | tee "$OUT/fp8_step.md"
    timeout 170 python3 -m benchmarks.fp8_agreement --batch 8 2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/fp8_agreement.md"
    ;;
  profile)
    timeout 330 python3 -W ignore::DeprecationWarning -m benchmarks.step_profile --preset deepseek_v32 \
      --batch ${PROFILE_BATCH:-64 8} --weights fp8 bf16 --out "$OUT" 2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/step_profile.md"
    ;;
  dense)
    timeout 420 python3 -m benchmarks.fp8_mgpu --assignments 8 --rows 64 8 2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/fp8_dense.md"
    ;;
  step)
    timeout 280 python3 -m benchmarks.fp8_step --preset deepseek_v32 --batch 1 8 64 2>&1 | grep --line-buffered -v -E "$QUIET" \
      | tee "$OUT/fp8_step.md"
    timeout 150 python3 -W ignore::DeprecationWarning -m benchmarks.step_profile --preset deepseek_v32 --batch 64 \
      --weights fp8 --out "$OUT" 2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/step_profile.md"
    timeout 130 python3 -m pytest -q -p no:cacheprovider -x tests/test_speculative.py -k "past_index_topk and bfloat16" \
      >"$OUT/speculative_gpu_tests.txt" 2>&1
    tail -3 "$OUT/speculative_gpu_tests.txt"
    ;;
  verify)
    timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_weights.py tests/test_experts_gpu.py \
      -k "grouped or dense or bit_identical or vllm_fixture or gpu" 2>&1 | grep --line-buffered -v -E "$QUIET" | tail -15 \
      | tee "$OUT/fp8_gpu_tests.txt"
    ;;
  agree)
    timeout 200 python3 -m benchmarks.fp8_agreement --batch 8 2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/fp8_agreement.md"
    ;;
  mla)  # retired: it ran the Triton sparse-MLA kernel's tests (removed 2026-12-04) and sparse_mla --sweep (gone)
    echo "stage $1: it ran tests/test_sparse_mla_kernel.py and benchmarks.sparse_mla --sweep, both removed; see benchmarks/README.md" >&2
    exit 2
    timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_sparse_mla_kernel.py 2>&1 \
      | grep --line-buffered -v -E "$QUIET" > "$OUT/sparse_mla_tests.txt"
    tail -60 "$OUT/sparse_mla_tests.txt"
    timeout 380 python3 -W ignore::DeprecationWarning -m benchmarks.sparse_mla --batch 1 8 64 --tokens 1 4 --sweep \
      2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/sparse_mla.md"
    ;;
  mla2)  # retired: its first command ran the removed Triton sparse-MLA kernel's tests
    echo "stage $1: it ran tests/test_sparse_mla_kernel.py, removed with the Triton kernel (2026-12-04); see benchmarks/README.md" >&2
    exit 2
    timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_sparse_mla_kernel.py 2>&1 | grep --line-buffered -v -E "$QUIET" > "$OUT/gpu_tests.txt"
    tail -12 "$OUT/gpu_tests.txt"
    timeout 300 python3 -m benchmarks.fp8_mgpu --assignments 8 --rows 64 8 2>&1 \
      | grep --line-buffered -v -E "$QUIET" | tee "$OUT/fp8_dense.md"
    ;;
  mlastep)
    timeout 470 python3 -W ignore::DeprecationWarning -m benchmarks.fp8_step --preset deepseek_v32 \
      --batch ${STEP_BATCH:-64 8 1} --attention xla auto 2>&1 | grep --line-buffered -v -E "$QUIET" | tee "$OUT/fp8_step.md"
    ;;
  *) echo "unknown stage $1"; exit 2 ;;
esac
