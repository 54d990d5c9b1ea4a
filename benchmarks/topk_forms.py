"""The top-k's k-th key kernel (kernels/topk_mgpu.py) by its launch forms, at the shapes the CLI's programs give it:
verification's B · 4 queries over 4K- and 32K-prompt caches (the CLI's capacities and round ones), and a 32K prompt's
2,048-query prefill chunks.

    python -m benchmarks.topk_forms [--iters 50]

Each form's k-th keys and tie cutoffs are checked against `topk_mgpu.reference` / `reference_tie_cutoff` (a sort)
before it is timed; µs a call inside one compiled loop (`timing.time_in_loop`). The floor beside each row is the
scores' bytes (read once from HBM) over the copy bandwidth measured in the same run; the kernel's 16 or 32 passes
read shared memory, not HBM, so it is a floor on reading the scores, not a bound the passes can reach. (With
MOSAIC_GPU_DUMP_SASS=1 on jax 0.11.2 the SASS went to stdout, not to MOSAIC_GPU_DUMP_TO's folder: 2026-12-06, the
table was lost in it; dump in a run of its own.)
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import copy_bandwidth, time_in_loop
from jax_mtp.kernels.topk_mgpu import CHUNKS, Config, kth_key_and_tie_cutoff_mgpu, reference, reference_tie_cutoff

K_TOP = 2048  # V3.2's index_topk
# (label, B, T, S, first position): verification rows see nearly all of their cache; a prefill chunk's queries
# follow one another from its first position
# (4,352 and 33,024 slots: the CLI's capacities for 4K and 32K prompts at its default --max-new-tokens 32; 4,608 and
# 33,280 at benchmarks.e2e's 256)
SHAPES = (("verification, B = 64", 64, 4, 4352, 4130), ("verification, B = 64", 64, 4, 4608, 4096),
          ("verification, B = 64", 64, 4, 32768, 32000), ("verification, B = 64", 64, 4, 33024, 32800),
          ("prefill chunk at 16,384", 1, 2048, 33280, 16384))


def dividing(slots: int) -> int:
  """The chunk rule before 2026-12-06: the widest chunk dividing the row (33,280 slots: 512)."""
  return next(c for c in CHUNKS if slots % c == 0)


def forms(slots: int):
  """(name, Config): the default (since 2026-12-07 its passes a loop, which lowers in a tenth of a second), the
  passes unrolled (the default timed before, 11 s to lower), the untimed packed_lazy, and the dividing chunk the
  default replaced, in the same run."""
  return (("default: packed sums, widest chunk + padding, passes a loop", Config()),
          ("passes unrolled (the default until 2026-12-07)", Config(passes="unrolled")),
          ("packed sums, the third summed only where it can decide", Config(counts="packed_lazy")),
          (f"packed sums, dividing chunk {dividing(slots)}", Config(chunk=dividing(slots))))


def operands(b: int, t: int, s: int, first: int, seed: int = 0):
  scores = jax.random.normal(jax.random.key(seed), (b, t, s), jnp.float32)
  positions = jnp.broadcast_to(first + jnp.arange(t, dtype=jnp.int32), (b, t))
  return scores, jnp.minimum(positions, s - 1)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--iters", type=int, default=50)
  args = parser.parse_args(argv)
  bandwidth = copy_bandwidth()
  print(f"top-k's k-th key kernel forms on {jax.devices()[0].device_kind}, jax {jax.__version__}; "
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; k = {K_TOP}")
  print("| shape | B | T | S | form | µs | scores floor µs | floor / time |\n|---|---:|---:|---:|---|---:|---:|---:|")
  for label, b, t, s, first in SHAPES:
    scores, positions = operands(b, t, s, first)
    want_kth, want_cut = reference(scores, positions, K_TOP), reference_tie_cutoff(scores, positions, K_TOP)
    floor = scores.nbytes / bandwidth
    for name, config in forms(s):
      fn = jax.jit(lambda x, p, config=config: kth_key_and_tie_cutoff_mgpu(x, p, K_TOP, config=config))
      kth, cut = fn(scores, positions)
      if not (np.array_equal(kth, want_kth) and np.array_equal(cut, want_cut)):
        print(f"| {label} | {b} | {t} | {s} | {name} | WRONG | | |", flush=True)
        continue
      seconds = time_in_loop(fn, (scores, positions), args.iters)
      print(f"| {label} | {b} | {t} | {s} | {name} | {seconds * 1e6:,.1f} | {floor * 1e6:,.1f} | "
            f"{floor / seconds:.2f} |", flush=True)


if __name__ == "__main__":
  main()
