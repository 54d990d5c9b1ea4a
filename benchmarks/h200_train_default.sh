#!/usr/bin/env bash
# Trains the embedded default on one H200 and measures it (python -m jax_mtp.train; benchmarks/README.md "The
# embedded default"):
#   the demo preset, joint objective, on the image's Python stdlib sources, for at most TRAIN_S seconds (the run
#   saves every 250 steps; a cut run is exported from its latest save); the HF export comes back in
#   $OUT/default_model, with the run's training_corpus.json (the stdlib files it trained on and held out); then
#   speculative vs plain tokens/s of the export on the files it held out, B = 1, k = 1..5, fp32 on the GPU.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
ARGS=(--preset demo --steps "${STEPS:-3000}" --batch 64 --seq-len 256 --lr 3e-3 --warmup 200 --log-every 100
      --eval-every 500 --save-every 250 --out /tmp/run --export-dtype bfloat16)
rm -rf /tmp/run
python3 -c "import platform, sys; print('python', platform.python_version())" | tee "$OUT/train.log"
start=$(date +%s)
timeout "${TRAIN_S:-330}" python3 -m jax_mtp.train "${ARGS[@]}" 2>&1 | grep -v -E "TPU|libtpu|Source Location|InitGoogle|E0000" \
  | tee -a "$OUT/train.log"
echo "training wall time $(( $(date +%s) - start )) s" | tee -a "$OUT/train.log"
python3 -m jax_mtp.train "${ARGS[@]}" --export-only --export "$OUT/default_model" 2>&1 | tail -2 | tee -a "$OUT/train.log"
cp /tmp/run/log.jsonl "$OUT/train_log.jsonl"
timeout "${BENCH_S:-150}" python3 -m benchmarks.spec_vs_plain --checkpoint "$OUT/default_model" --k 1 2 3 4 5 \
  --prompts 4 --max-new 128 --repeats 2 2>&1 | grep -v -E "TPU|libtpu|Source Location|InitGoogle|E0000" \
  | tee "$OUT/spec_vs_plain_h200.md"
