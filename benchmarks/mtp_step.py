"""Time one MTP draft step (tp = 1) on the local accelerator, per Opt-1 impl, against a weight-read roofline.

    python -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 64 --impls xla pallas_gpu

A decode step of the MTP layer is memory-bound: it reads the attention and indexer weights, the
routed experts the batch picked, the shared expert, eh_proj and the head. The table prints the
measured time beside two rooflines at the measured copy bandwidth: "active" (the experts that a
batch of B tokens can touch at most: min(E, 8·B)) and "all" (every weight of the layer + head).
It also checks that the impls agree: identical draft tokens, hidden within the bf16 tolerance.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp

PRESETS = {"tiny": jax_mtp.tiny, "deepseek_v32": jax_mtp.deepseek_v32, "glm5": jax_mtp.glm5}


def copy_bandwidth(nbytes: int = 2 * 2**30, iters: int = 20) -> float:
  """Device-to-device copy bandwidth in bytes/s (read + write)."""
  x = jnp.ones((nbytes // 4,), jnp.float32)
  copy = jax.jit(lambda a: a + 1)
  copy(x).block_until_ready()
  start = time.perf_counter()
  for _ in range(iters):
    x = copy(x)
  x.block_until_ready()
  return 2 * nbytes * iters / (time.perf_counter() - start)


def weight_bytes(params, cfg: jax_mtp.MtpConfig, batch: int) -> tuple[int, int]:
  """(active, all) bytes a step reads: experts scaled by the most a batch can touch."""
  total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)) - params["embed_tokens"].nbytes
  mlp = params["layers_0"]["mtp_block"]["mlp"]
  experts = sum(mlp[k].nbytes for k in ("w_gate_EDF", "w_up_EDF", "w_down_EFD"))
  touched = min(cfg.n_routed_experts, cfg.num_experts_per_tok * batch) / cfg.n_routed_experts
  return int(total - experts + experts * touched), total


def time_step(step, args, iters: int) -> float:
  out = step(*args)
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(iters):
    out = step(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / iters


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
  parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
  parser.add_argument("--capacity", type=int, default=4096)
  parser.add_argument("--impls", nargs="+", default=["xla"])
  parser.add_argument("--iters", type=int, default=50)
  args = parser.parse_args(argv)
  cfg = PRESETS[args.preset]()
  params = jax_mtp.init_params(cfg, jax.random.key(0))
  bandwidth = copy_bandwidth(2 * 2**30 if jax.devices()[0].platform == "gpu" else 2**26)
  print(f"{args.preset} MTP draft step on {jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s, cache {args.capacity}\n")
  print("| B | impl | µs / step | roofline active µs | roofline all µs | active / measured | tokens match xla |")
  print("|---:|---|---:|---:|---:|---:|---|")
  for batch in args.batch:
    rng = np.random.default_rng(batch)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, 1), dtype=np.int32))
    positions = jnp.full((batch, 1), args.capacity // 2, jnp.int32)
    hidden = jnp.asarray(rng.standard_normal((batch, 1, cfg.hidden_size)), cfg.dtype)
    caches = jax_mtp.init_caches(cfg, batch, args.capacity)
    active, total = weight_bytes(params, cfg, batch)
    reference = None
    for impl in args.impls:
      model = jax_mtp.MtpPredictor(cfg, norm_impl=impl)

      def step(p, i, pos, h, c, model=model):
        out = model.apply({"params": p}, i, pos, h, c)
        return out.hidden_BTD, model.apply({"params": p}, out.hidden_BTD, method=model.get_top_tokens)

      step = jax.jit(step)
      seconds = time_step(step, (params, ids, positions, hidden, caches), args.iters)
      hidden_out, tokens = step(params, ids, positions, hidden, caches)
      reference = reference or (hidden_out, tokens)
      same = bool(jnp.all(tokens == reference[1]))
      print(f"| {batch} | {impl} | {seconds * 1e6:,.0f} | {active / bandwidth * 1e6:,.0f} | "
            f"{total / bandwidth * 1e6:,.0f} | {active / bandwidth / seconds:.2f} | {same} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
