"""The router's logits at DeepSeek-V3.2's widths (x [T, 7168] bf16 · W_gate [256, 7168] fp32) as the model computes
them (`moe.router_logits`) beside its two forms at every T: one fp32 dot at HIGHEST precision (`moe.fp32_logits`), and
three bf16 dots over the weight's exact three-part split (`moe.split_logits`), which `router_logits` takes from
ROUTER_SPLIT_MIN_TOKENS tokens:

    python -m benchmarks.router --tokens 1 8 32 64 128 256 1024 4096

µs a call inside one compiled loop; floor = the larger of the fp32 weight's bytes over the copy bandwidth and the
dot's FLOPs over the bf16 GEMM peak, both measured in the same run. Each form's logits are checked against a float64
dot on the first rows.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import measured_ceilings, time_in_loop
from jax_mtp.moe import ROUTER_SPLIT_MIN_TOKENS, fp32_logits, router_logits, split_logits

HIDDEN, EXPERTS = 7168, 256


def worst_error(got, x, w, rows: int = 8) -> float:
  want = np.asarray(x[:rows], np.float64) @ np.asarray(w, np.float64).T
  return float(np.max(np.abs(np.asarray(got[:rows], np.float64) - want)) / np.max(np.abs(want)))


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 1024, 4096])
  p.add_argument("--iters", type=int, default=50)
  args = p.parse_args()
  bandwidth, peak = measured_ceilings(f"router logits [T, {HIDDEN}] · [{EXPERTS}, {HIDDEN}]ᵀ (split from "
                                      f"{ROUTER_SPLIT_MIN_TOKENS} tokens)")
  w = jax.random.normal(jax.random.key(0), (EXPERTS, HIDDEN), jnp.float32) * 0.02
  print("| T | fp32 dot µs | three bf16 dots µs | model (router_logits) µs | floor µs | model floor / time | "
        "max rel err fp32 / split |")
  print("|---:|---:|---:|---:|---:|---:|---|")
  for t in args.tokens:
    x = jax.random.normal(jax.random.key(t), (t, HIDDEN), jnp.float32).astype(jnp.bfloat16)
    floor = max(EXPERTS * HIDDEN * 4 / bandwidth, 2 * t * HIDDEN * EXPERTS / peak)
    times = [time_in_loop(jax.jit(form), (x, w), args.iters) for form in (fp32_logits, split_logits, router_logits)]
    errors = [worst_error(jax.jit(form)(x, w), x, w) for form in (fp32_logits, split_logits)]
    print(f"| {t} | {times[0] * 1e6:,.1f} | {times[1] * 1e6:,.1f} | {times[2] * 1e6:,.1f} | {floor * 1e6:,.1f} | "
          f"{floor / times[2]:.2f} | {errors[0]:.1e} / {errors[1]:.1e} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
