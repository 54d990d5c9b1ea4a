"""What a speculative round costs against a plain decoding step, per target depth, B = 1, in one run.

    python -m benchmarks.round_cost --layers 4 8 12 --k 1 2 3

Random weights of the `demo` preset at each depth (round and step costs do not depend on the weights:
shapes are static). For each depth: the plain step (µs per token, `TargetDecoder.generate`), the
speculative round at each k (µs per round, `Speculator.generate`, rounds queued ahead), the same
round with a host read of every round's tokens (what streaming does), and the acceptance length a
trained drafter needs for a 1.5× speed-up: 1.5 · round / step. Each time is the best of `--repeats`
calls after a compiling one; compile seconds are printed too. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from jax_mtp import config as config_lib
from jax_mtp.generate import TargetDecoder
from jax_mtp.model import init_target_params
from jax_mtp.mtp import init_params
from jax_mtp.request import required_capacity
from jax_mtp.sharding import make_mesh
from jax_mtp.speculative import Speculator


def best_of(fn, repeats: int) -> tuple[float, float, object]:
  """(compile-and-run seconds of the first call, best seconds of the next `repeats`, last result)."""
  start = time.perf_counter()
  out = fn()
  first = time.perf_counter() - start
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - start)
  return first, best, out


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--preset", default="demo", choices=sorted(config_lib.PRESETS))
  p.add_argument("--layers", type=int, nargs="+", default=[4, 8, 12])
  p.add_argument("--k", type=int, nargs="+", default=[1, 2, 3])
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--max-new", type=int, default=128)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--dtype", default="float32")
  args = p.parse_args()
  mesh = make_mesh(1)
  prompt = [int(i) for i in np.random.default_rng(0).integers(1, 4096, args.prompt_len)]
  print(f"{args.preset} preset, random weights, {args.dtype}, on {jax.devices()[0].device_kind}; B = 1, a "
        f"{args.prompt_len}-token prompt, {args.max_new} new tokens\n")
  print("| layers | plain µs/token | k | round µs (queued ahead) | round µs (read every round) | rounds | "
        "acceptance length for 1.5× | compile s (plain / spec) |")
  print("|---:|---:|---:|---:|---:|---:|---:|---|")
  for layers in args.layers:
    cfg = config_lib.PRESETS[args.preset](num_hidden_layers=layers, dtype=args.dtype, param_dtype=args.dtype)
    key = jax.random.key(0)
    target, mtp = init_target_params(cfg, key), init_params(cfg, jax.random.fold_in(key, 1))
    capacity = required_capacity(cfg, [prompt], args.max_new, max(args.k))
    plain = TargetDecoder(cfg, mesh)
    plain_params = plain.shard(target)
    compile_plain, plain_s, _ = best_of(
        lambda: plain.generate(plain_params, [prompt], args.max_new, capacity=capacity), args.repeats)
    step_us = plain_s / (args.max_new - 1) * 1e6  # the prefill emits the first token
    for k in args.k:
      spec = Speculator(cfg, mesh, k)
      params = spec.shard(target, mtp)
      compile_spec, spec_s, result = best_of(
          lambda: spec.generate(params, [prompt], args.max_new, capacity=capacity), args.repeats)
      _, read_s, _ = best_of(lambda: spec.generate(params, [prompt], args.max_new, capacity=capacity,
                                                   on_tokens=lambda tokens: None), args.repeats)
      rounds = result.metrics.rounds
      round_us, read_us = spec_s / rounds * 1e6, read_s / rounds * 1e6
      print(f"| {layers} | {step_us:,.0f} | {k} | {round_us:,.0f} | {read_us:,.0f} | {rounds} | "
            f"{1.5 * round_us / step_us:.2f} | {compile_plain:.1f} / {compile_spec:.1f} |", flush=True)


if __name__ == "__main__":
  main()
