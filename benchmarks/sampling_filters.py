"""What a round's acceptance costs at the user's sampling settings, beside greedy's, over V3.2's vocabulary:

    python -m benchmarks.sampling_filters --batch 1 8 64 256

Why: a real checkpoint's generation_config.json sets the sampling `decode` runs by default (DeepSeek-V3.2-Exp's:
temperature 0.6, top-p 0.95; DeepSeek suggests 1.0 / 0.95 for V3.2), and a top-p filter is applied at every verified
position (B × (k + 1) rows of 129,280 fp32 logits a round). Until 2026-12-07 it sorted each row; now it finds the
threshold by a radix search (`jax_mtp.threshold_search`). Timed here: the round's acceptance as the speculator runs
it (`acceptance.accept_greedy` / `accept_sampled`), the sort alone, and the filter by the search beside the sort's
form (`acceptance.sampling_logits_reference`). Each row: µs a call (inside one compiled loop) and the floor (the fp32
logits read once, over the copy bandwidth measured in this run)."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import measured_ceilings, time_in_loop
from jax_mtp.acceptance import Sampling, accept_greedy, accept_sampled, sampling_logits, sampling_logits_reference

VOCAB = 129_280  # DeepSeek-V3 / V3.2

SETTINGS = {  # name: (temperature, top_k, top_p); top_k 0 and top_p 1 are off, as the CLI's flags
    "temperature 0.6": (0.6, 0, 1.0),
    "temperature 0.6, top-p 0.95 (V3.2-Exp's generation_config)": (0.6, 0, 0.95),
    "temperature 0.6, top-k 50, top-p 0.95": (0.6, 50, 0.95),
}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
  parser.add_argument("-k", type=int, default=3, help="draft tokens a round (k + 1 verified positions a row)")
  parser.add_argument("--vocab", type=int, default=VOCAB)
  parser.add_argument("--iters", type=int, default=20)
  args = parser.parse_args(argv)
  bandwidth, _ = measured_ceilings(f"A round's acceptance over a {args.vocab:,}-token vocabulary, k = {args.k}")
  print("| B | acceptance | µs | floor µs (logits read once) | floor / time |")
  print("|---:|---|---:|---:|---:|")
  for b in args.batch:
    keys = jax.random.split(jax.random.key(b), 3)
    logits_BWV = jax.random.normal(keys[0], (b, args.k + 1, args.vocab), jnp.float32) * 3
    drafts_BM = jax.random.randint(keys[1], (b, args.k), 0, args.vocab)
    floor = logits_BWV.nbytes / bandwidth
    # a [B, k + 1, V] output (the sort's, a filter's) ends in a max over the vocabulary, as the round's softmax reads
    # the filtered logits once: a loop carrying the whole output would time its copy
    rows = [("greedy (argmax)", lambda logits, drafts: accept_greedy(drafts, jnp.argmax(logits, -1))),
            ("the sort alone (descending)", lambda logits, _: jnp.max(-jnp.sort(-logits, axis=-1), axis=-1))]
    for name, (temperature, top_k, top_p) in SETTINGS.items():
      sampling = Sampling.of(temperature, top_k, top_p, args.vocab)
      rows.append((name, lambda logits, drafts, s=sampling: accept_sampled(drafts, logits, s, keys[2])))
      if sampling.top_k is not None or sampling.top_p is not None:  # the filter alone, searched and sorted
        rows.append((f"{name}: the filter (radix search)",
                     lambda logits, _, s=sampling: jnp.max(sampling_logits(logits, s), axis=-1)))
        rows.append((f"{name}: the filter (sort, the reference)",
                     lambda logits, _, s=sampling: jnp.max(sampling_logits_reference(logits, s), axis=-1)))
    for name, fn in rows:
      seconds = time_in_loop(fn, (logits_BWV, drafts_BM), args.iters, whole_output=True)
      print(f"| {b} | {name} | {seconds * 1e6:,.1f} | {floor * 1e6:,.1f} | {floor / seconds:.2f} |", flush=True)
    del logits_BWV
  print(f"\n(jax {jax.__version__}; numpy {np.__version__})")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
