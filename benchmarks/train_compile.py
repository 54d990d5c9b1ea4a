"""Seconds to compile the joint training step (sparse and dense-warm-up forms) and the held-out eval of
the demo preset at a given depth: what a short training window on a GPU spends before its first step.

    python -m benchmarks.train_compile --layers 12 --moe-intermediate 64
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from jax_mtp import training
from jax_mtp.config import demo
from jax_mtp.model import init_target_params
from jax_mtp.mtp import init_params
from jax_mtp.sharding import make_data_mesh


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--layers", type=int, default=12)
  p.add_argument("--moe-intermediate", type=int, default=128)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--seq-len", type=int, default=256)
  args = p.parse_args()
  cfg = demo(num_hidden_layers=args.layers, moe_intermediate_size=args.moe_intermediate)
  key = jax.random.key(0)
  params = training.split_params(init_target_params(cfg, key), init_params(cfg, jax.random.fold_in(key, 1)))
  mesh, opt = make_data_mesh(), training.optimizer(1e-3, 100, 10)
  opt_state = opt.init(params)
  tokens = jnp.zeros((args.batch, args.seq_len), jnp.int32)
  for name, fn, fn_args in (
      ("sparse step", training.make_train_step(cfg, training.Objective("joint"), opt, args.seq_len, mesh),
       (params, opt_state, tokens)),
      ("dense step", training.make_train_step(cfg, training.Objective("joint", dense=True), opt, args.seq_len, mesh),
       (params, opt_state, tokens)),
      ("eval", training.make_eval(cfg, args.seq_len, mesh), (params, tokens))):
    start = time.perf_counter()
    compiled = fn.lower(*fn_args).compile()
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(compiled(*jax.tree.map(jnp.copy, fn_args)))
    print(f"layers {args.layers}: {name} compiled in {seconds:.1f} s, ran in {time.perf_counter() - start:.3f} s",
          flush=True)


if __name__ == "__main__":
  main()
