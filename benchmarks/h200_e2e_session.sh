#!/usr/bin/env bash
# The user's path on one H200 (issue 27), one stage per call (each inside one 600 s call):
#   e2e    the GPU tests of the kernels on the user's path; the index-scores kernel vs XLA at the prefill's and
#          verification's T; benchmarks.e2e at B = 1 (8K, 32K prompts, three prefill chunks) and B = 8, 64
#   e2e2   benchmarks.e2e with the auto prefill chunk after the first run's table, bf16 and FP8
#   spec   speculative vs plain decoding of the embedded default, three runs (issue 29: a median of ≥ 3)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
QUIET="TPU|libtpu|Source Location|InitGoogle|E0000|learning/|Deprecat|return rule"
case "${1:?stage}" in
  e2e)  # retired: its tests named the removed Triton sparse-MLA kernel's test file
    echo "stage $1: it ran tests/test_sparse_mla_kernel.py, removed with the Triton kernel (2026-12-04); see benchmarks/README.md" >&2
    exit 2
    run 120 gpu_tests.txt python3 -m pytest -q -p no:cacheprovider tests/test_user_path_kernels.py \
      tests/test_index_scores_kernel.py tests/test_sparse_mla_kernel.py -k "not tpu"
    run 100 index_scores_t.md python3 -m benchmarks.dsa_parts --capacity 32768 --batch 1 --tokens 4 128 1024 4096 \
      --iters 5
    run 200 e2e_b1.md python3 -m benchmarks.e2e --prompt 8192 32768 --batch 1 --prefill-chunk 0 2048 8192 \
      --iters 5 --out "$OUT/e2e_b1.json"
    run 150 e2e_b8_64.md python3 -m benchmarks.e2e --prompt 1024 8192 --batch 8 64 --max-prefill-tokens 70000 \
      --iters 5 --out "$OUT/e2e_b8_64.json"
    ;;
  e2e2)
    run 280 e2e_bf16.md python3 -m benchmarks.e2e --prompt 1024 8192 32768 --batch 1 8 64 --max-prefill-tokens 70000 \
      --iters 5 --out "$OUT/e2e_bf16.json"
    run 280 e2e_fp8.md python3 -m benchmarks.e2e --weights fp8 --prompt 1024 32768 --batch 1 64 \
      --max-prefill-tokens 70000 --iters 5 --out "$OUT/e2e_fp8.json"
    ;;
  spec)
    for i in 1 2 3; do
      run 150 "spec_vs_plain_$i.md" python3 -m benchmarks.spec_vs_plain --checkpoint jax_mtp/default_model --k 1 3 \
        --prompts 4 --max-new 128 --repeats 2
    done
    ;;
esac
