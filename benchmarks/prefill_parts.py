"""The indexer's two per-query parts of a long prompt's prefill chunk at DeepSeek-V3.2 widths, each variant timed
and its kernels listed from a device trace: the index scores over the cache (the Mosaic GPU kernel scoring every
step, or only those up to the chunk's positions) and the top-k over those scores (XLA's sort, the library's radix
select, and radix selects with other digit widths whose candidate counts are written as separate reductions).

    python -m benchmarks.prefill_parts --capacity 33280 --chunk 2048 --position 16384

The chunk's queries sit at positions [position, position + chunk) of a `capacity`-slot cache. Floors at the copy
bandwidth measured in the same run: scores = the visible keys read + the scores written; top-k = the scores read
once. Every top-k variant's selected set is checked against `lax.top_k`'s.
"""

from __future__ import annotations

import argparse
import collections
import functools
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.step_profile import UNGRAPHED, device_events, op_names
from benchmarks.timing import copy_bandwidth, time_in_loop
from jax_mtp.cache import causal_mask
from jax_mtp.topk import (kth_key_histograms, kth_key_one_reduction, kth_key_sibling_reductions, order_keys,
                          select_from_kth, topk_selection, topk_selection_kernel, topk_selection_radix)
from jax_mtp.kernels.index_scores import reference
from jax_mtp.kernels.index_scores_mgpu import Config as MgpuConfig
from jax_mtp.kernels.index_scores_mgpu import index_scores_mgpu

I, J, K_TOP = 64, 128, 2048  # V3.2's indexer heads, head dim, index_topk


def radix_select(kth_key, **options):
  """A radix select whose k-th key comes from `kth_key(keys, k, **options)` (jax_mtp.indexer's two forms), then the
  library's compaction: one form of the library's select, whatever the number of queries."""
  def select(scores_BTS, visible_BTS, topk):
    k = min(topk, scores_BTS.shape[-1])
    keys_BTS = order_keys(scores_BTS, visible_BTS)
    return select_from_kth(keys_BTS, visible_BTS, kth_key(keys_BTS, k, **options), k)
  return select


def radix_siblings(digit_bits: int):
  """A radix select with `digit_bits` per pass whose 2^bits − 1 candidate counts are separate reductions of the
  same keys (XLA may fuse siblings into one pass over the keys)."""
  return radix_select(kth_key_sibling_reductions, digit_bits=digit_bits)


def radix_histograms(digit_bits: int):
  """A radix select with `digit_bits` per pass counted by one histogram (scatter-add) a pass
  (jax_mtp.topk.kth_key_histograms): 2 passes at 16 bits."""
  return radix_select(kth_key_histograms, digit_bits=digit_bits)


# 4 bits a pass, the 15 candidate counts as one reduction over a [B, T, 15, S] comparison (the library's only form
# before issue 27's prefill work; its form for few queries now)
radix_one_reduction = radix_select(kth_key_one_reduction)


def kernel_select(scores_BTS, visible_BTS, topk, tie_cutoff: bool = False):
  """The model's top-k with `topk_impl="mosaic_gpu"` (`topk.topk_selection_kernel`), for causal masks as this
  benchmark's are: a query's position is its visible slots − 1. `tie_cutoff`: the kernel also gives the tie cutoff,
  the compaction one scan."""
  positions_BT = jnp.sum(visible_BTS, axis=-1, dtype=jnp.int32) - 1
  return topk_selection_kernel(scores_BTS, positions_BT, topk, interpret=jax.default_backend() != "gpu",
                               tie_cutoff=tie_cutoff)


TOPK_VARIANTS = {"lax.top_k": topk_selection, "radix (library)": topk_selection_radix,
                 "radix 4-bit, one reduction": radix_one_reduction, "radix 1-bit siblings": radix_siblings(1),
                 "radix 2-bit siblings": radix_siblings(2), "radix 4-bit siblings": radix_siblings(4),
                 "radix 16-bit histograms": radix_histograms(16), "k-th key: Mosaic GPU kernel": kernel_select,
                 "k-th key and tie cutoff: Mosaic GPU kernel": functools.partial(kernel_select, tie_cutoff=True)}


def kernels_of(fn, args, calls: int = 3, top: int = 6) -> str:
  """The `top` kernels of `calls` traced calls of jitted `fn`: "name µs/call; …", from a device trace (of `fn`
  compiled without command buffers, where each kernel names its instruction: step_profile.UNGRAPHED)."""
  compiled = fn.lower(*args).compile(compiler_options=UNGRAPHED)
  names = op_names(compiled.as_text())
  jax.block_until_ready(compiled(*args))
  trace_dir = tempfile.mkdtemp(prefix="prefill_parts_")
  with jax.profiler.trace(trace_dir):
    for _ in range(calls):
      out = compiled(*args)
    jax.block_until_ready(out)
  per_op = collections.Counter()
  for _, op, us in device_events(trace_dir):
    per_op[(names.get(op, op).split("/")[-1] + f" [{op}]")[-70:]] += us / calls
  return "; ".join(f"{op} {us:,.0f}" for op, us in per_op.most_common(top))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--capacity", type=int, default=33280)
  parser.add_argument("--chunk", type=int, nargs="+", default=[2048])
  parser.add_argument("--position", type=int, default=16384, help="the chunk's first position")
  parser.add_argument("--topk", nargs="+", choices=list(TOPK_VARIANTS),
                      default=[name for name in TOPK_VARIANTS if jax.default_backend() == "gpu" or "Mosaic" not in name],
                      help="top-k forms (default: all; off a GPU, all but the Mosaic kernel, which would run in the "
                           "interpreter)")
  parser.add_argument("--iters", type=int, default=5)
  parser.add_argument("--trace", action="store_true", help="list each variant's top kernels from a device trace")
  args = parser.parse_args(argv)
  bandwidth = copy_bandwidth()
  print(f"prefill parts at V3.2 widths on {jax.devices()[0].device_kind}, jax {jax.__version__}, copy bandwidth "
        f"{bandwidth / 1e12:.2f} TB/s; S = {args.capacity}, chunk at position {args.position}\n")
  print("| T | part | variant | µs | floor µs | floor / time | check | kernels (µs / call) |")
  print("|---:|---|---|---:|---:|---:|---|---|")
  for t in args.chunk:
    for row in _rows(args, t, bandwidth):
      print("| " + " | ".join(str(x) for x in (t, *row)) + " |", flush=True)
  return 0


def _rows(args, t: int, bandwidth: float):
  s, p0 = args.capacity, args.position
  keys = jax.random.split(jax.random.key(0), 3)
  k_BSJ = jax.random.normal(keys[0], (1, s, J), jnp.bfloat16)
  q_BTIJ = jax.random.normal(keys[1], (1, t, I, J), jnp.bfloat16)
  w_BTI = jax.random.normal(keys[2], (1, t, I), jnp.float32)
  positions = jnp.arange(p0, p0 + t, dtype=jnp.int32)[None]
  visible = causal_mask(positions, s)
  floor_us = lambda nbytes: nbytes / bandwidth * 1e6  # noqa: E731
  backend = "gpu" if jax.default_backend() == "gpu" else "interpret"
  # XLA's scores (bf16 dots, in 4,096-slot chunks): what every kernel row is checked against, and the top-k's input
  full = jax.jit(lambda q, k, w: reference(q, k, w, J**-0.5, chunk=4096, dot_dtype=jnp.bfloat16))(q_BTIJ, k_BSJ,
                                                                                                w_BTI)
  # the Mosaic GPU kernel (the Triton one it replaced is gone, issue 28): every step, the causal steps' dots, the causal steps' dots and reads
  for bounded, reads in [(False, False), (True, False), (True, True)]:
    fn = jax.jit(lambda q, k, w, pos, bounded=bounded, reads=reads: index_scores_mgpu(
        q, k, w, J**-0.5, positions_BT=pos if bounded else None, config=MgpuConfig(bound_reads=reads),
        interpret=backend == "interpret"))
    call = (q_BTIJ, k_BSJ, w_BTI, positions)
    seconds = time_in_loop(fn, call, args.iters)
    out = fn(*call)
    err = float(jnp.max(jnp.where(visible, jnp.abs(out - full), 0.0)) / jnp.max(jnp.abs(full)))
    read = min(s, p0 + t) if reads else s
    nbytes = read * J * 2 + t * s * 4
    form = "causal steps, bounded reads" if reads else "causal steps" if bounded else "every step"
    yield ("scores", f"Mosaic GPU kernel, {form}", f"{seconds * 1e6:,.0f}",
           f"{floor_us(nbytes):,.0f}", f"{floor_us(nbytes) / seconds / 1e6:.2f}", f"visible rel err {err:.1e}",
           kernels_of(fn, call) if args.trace else "")
  scores = full
  want = None
  for name in args.topk:
    fn = jax.jit(lambda x, v, select=TOPK_VARIANTS[name]: select(x, v, K_TOP))
    seconds = time_in_loop(fn, (scores, visible), args.iters)
    chosen = np.sort(np.asarray(fn(scores, visible).slots_BTK), axis=-1)
    want = chosen if want is None else want
    yield ("top-k", name, f"{seconds * 1e6:,.0f}", f"{floor_us(scores.nbytes):,.0f}",
           f"{floor_us(scores.nbytes) / seconds / 1e6:.2f}", f"same set: {bool((chosen == want).all())}",
           kernels_of(fn, (scores, visible)) if args.trace else "")


if __name__ == "__main__":
  raise SystemExit(main())
