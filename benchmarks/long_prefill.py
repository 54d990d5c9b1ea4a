"""A long prompt through the speculator on one device: a reduced-depth, full-width DeepSeek-V3.2
target plus its full MTP layer, chunked prefill (jax_mtp.prefill), then a few speculative rounds.
Reports the prefill chunk, the time and the device's peak memory beside the weights' bytes.

    python -m benchmarks.long_prefill --layers 2 --prompt 32768 --max-new 8 -k 3

Random bf16 weights (the first target layer dense, the rest MoE); the prompt is random token ids.
"Peak" is the device's peak_bytes_in_use after the run (weights, caches and every temporary);
`--small` runs the tiny preset's widths to check the script on a CPU.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import jax_mtp
from jax_mtp.prefill import prefill_budget, prefill_chunk


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--prompt", type=int, nargs="+", default=[32768], help="prompt lengths to run, in order")
  parser.add_argument("--max-new", type=int, default=8)
  parser.add_argument("-k", type=int, default=3)
  parser.add_argument("--small", action="store_true")
  args = parser.parse_args(argv)
  base = jax_mtp.tiny() if args.small else jax_mtp.deepseek_v32()
  cfg = base.replace(num_hidden_layers=args.layers, first_k_dense_replace=1)
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(1))
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), args.k)
  params = spec.shard(target_params, mtp_params)
  del target_params, mtp_params
  weights = sum(x.nbytes for x in jax.tree.leaves(params))
  device = jax.devices()[0]
  width = "tiny-width" if args.small else "full-width V3.2"
  print(f"long prefill: {args.layers}-layer {width} target + MTP layer, bf16, k = {args.k}, on "
        f"{device.device_kind}, jax {jax.__version__}; weights {weights / 2**30:.1f} GiB\n")
  print("| prompt | capacity | prefill chunk | s (prefill + rounds) | new tokens | peak before GiB | peak after GiB "
        "| peak after − weights GiB |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|")
  rng = np.random.default_rng(0)
  for length in args.prompt:
    prompt = [int(t) for t in rng.integers(0, cfg.vocab_size, length)]
    capacity = length + args.max_new + args.k
    before = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)  # the weights' init may set it
    budget = prefill_budget(cfg, 1, capacity, [device])  # as generate sizes its chunk: before its caches exist
    start = time.perf_counter()
    result = spec.generate(params, [prompt], args.max_new)
    seconds = time.perf_counter() - start  # includes compilation: the Speculator compiles per shape
    stats = device.memory_stats() or {}
    peak = stats.get("peak_bytes_in_use", 0)
    print(f"| {length} | {capacity} | {prefill_chunk(cfg, 1, capacity, cfg.num_attention_heads, budget)} | "
          f"{result.metrics.seconds:.2f} (wall with compile {seconds:.1f}) | {len(result.tokens[0])} | "
          f"{before / 2**30:.1f} | {peak / 2**30:.1f} | {(peak - weights) / 2**30:.1f} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
