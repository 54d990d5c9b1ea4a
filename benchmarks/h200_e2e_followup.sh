#!/usr/bin/env bash
# issue 27's second call: benchmarks.e2e at 32K and 1K (the 4 GiB chunk rule vs 8192), and the embedded default's
# speculative vs plain speed-up.
source benchmarks/device_env.sh
Q="TPU|libtpu|Source Location|InitGoogle|E0000|learning/|Deprecat|return rule|W1203"
timeout 230 python3 -m benchmarks.e2e --prompt 32768 1024 --batch 1 8 --max-prefill-tokens 40000 --prefill-chunk 0 8192 --iters 5 --out $OUT/e2e_32k.json 2>&1 | grep --line-buffered -v -E "$Q" | tee $OUT/e2e_32k.md
timeout 150 python3 -m benchmarks.spec_vs_plain --checkpoint jax_mtp/default_model --k 1 3 --prompts 4 --max-new 128 --repeats 3 2>&1 | grep --line-buffered -v -E "$Q" | tee $OUT/spec_vs_plain.md
