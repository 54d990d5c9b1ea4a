"""Time the parts of one DSA decode-time attention call at DeepSeek-V3.2 widths, each against its
floor: the indexer's scores over every visible key, the top-k over those scores, and the sparse
latent attention over the selected entries.

    python -m benchmarks.dsa_parts --capacity 4096 131072 --batch 1 8 64 --tokens 1 4

Rows sit at position S − 1 (every slot visible). Floors at the copy bandwidth measured in the same
run: scores = the keys (+ fp8 scales) read; top-k = the fp32 scores read; attention = the selected
latent + rope entries read (bf16). Variants: the dot's input dtype (`dot_dtype`: float32 exact, or
bfloat16 with fp32 accumulation), the key cache dtype, and the top-k algorithm (`lax.top_k`, which
sorts, or `threshold`: a radix select of the k-th score, then the slots above it in slot order). Each
variant's output is checked against the first of its kind.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.prefill_parts import kernels_of, radix_histograms, radix_one_reduction, radix_siblings
from benchmarks.timing import copy_bandwidth, time_in_loop
from jax_mtp.cache import causal_mask
from jax_mtp.indexer import SCORE_BLOCK_SLOTS, Selection, quantize_keys, score_chunk
from jax_mtp.kernels.topk_mgpu import Config as TopkConfig
from jax_mtp.kernels.topk_mgpu import config_for as topk_config_for
from jax_mtp.kernels.topk_mgpu import kth_key_mgpu
from jax_mtp.topk import topk_selection, topk_selection_kernel, topk_selection_radix
from jax_mtp.kernels.index_scores import index_scores_pallas
from jax_mtp.kernels.index_scores import reference as index_scores
from jax_mtp.kernels.index_scores_mgpu import index_scores_mgpu
from jax_mtp.kernels.sparse_mla import reference as sparse_mla_reference

I, J, K_TOP, N, C, R = 64, 128, 2048, 128, 512, 64  # indexer heads / dim, index_topk, MLA heads, latent, rope
PARTS = ("scores", "top-k", "attention")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--capacity", type=int, nargs="+", default=[4096, 131072])
  parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
  parser.add_argument("--tokens", type=int, nargs="+", default=[1], help="queries per row (k + 1 in verification)")
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="which parts to time")
  parser.add_argument("--topk-forms", default="all", choices=["all", "library-kernel"],
                      help="library-kernel: lax.top_k, the library's radix select and the Mosaic kernel only")
  args = parser.parse_args(argv)
  bandwidth = copy_bandwidth()
  print(f"DSA parts at V3.2 widths on {jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s\n")
  print("| S | B | T | part | variant | µs | floor µs | floor / time | check |")
  print("|---:|---:|---:|---|---|---:|---:|---:|---|")
  for s in args.capacity:
    for b in args.batch:
      for t in args.tokens:
        for row in _rows(s, b, t, args.iters, bandwidth, args.parts, args.topk_forms):
          print("| " + " | ".join(str(x) for x in (s, b, t, *row)) + " |", flush=True)
  return 0


def _rows(s: int, b: int, t: int, iters: int, bandwidth: float, parts=PARTS, topk_forms="all"):
  normal = _normal_on_device(iter(jax.random.split(jax.random.key(0), 8)))
  keys32, q, w = normal((b, s, J)), normal((b, t, I, J)), normal((b, t, I))
  positions = jnp.broadcast_to(jnp.arange(s - t, s, dtype=jnp.int32), (b, t))
  chunk = score_chunk(b, t, I, s)

  def floor_us(nbytes):
    return nbytes / bandwidth * 1e6

  reference = None
  keys8, scale = quantize_keys(keys32, jnp.float8_e4m3fn)
  for name, keys, k_scale, dot in [("fp32 keys, fp32 dot", keys32, None, jnp.float32),
                                   ("bf16 keys, fp32 dot", keys32.astype(jnp.bfloat16), None, jnp.float32),
                                   ("bf16 keys, bf16 dot", keys32.astype(jnp.bfloat16), None, jnp.bfloat16),
                                   ("fp8 keys, bf16 dot", keys8, scale, jnp.bfloat16)]:
    fn = jax.jit(lambda q, k, w, ks, dot=dot: index_scores(q, k, w, J**-0.5, chunk=chunk, k_scale_BS=ks,
                                                            dot_dtype=dot))
    seconds = time_in_loop(fn, (q, keys, w, k_scale), iters)
    out = fn(q, keys, w, k_scale)
    reference = out if reference is None else reference
    err = float(jnp.max(jnp.abs(out - reference)) / jnp.max(jnp.abs(reference)))
    nbytes = keys.nbytes + (0 if k_scale is None else k_scale.nbytes)
    if "scores" not in parts:  # the first variant's scores feed the top-k
      break
    yield ("scores", name, f"{seconds * 1e6:,.0f}", f"{floor_us(nbytes):,.1f}", f"{floor_us(nbytes) / seconds / 1e6:.2f}",
           f"rel err {err:.1e}")
  backend = jax.default_backend()
  kernels = []  # (name, the call): the fused kernels this backend runs at this capacity
  if backend == "tpu" and s % SCORE_BLOCK_SLOTS == 0:
    kernels.append(("TPU kernel", lambda q, k, w, ks: index_scores_pallas(
        q.astype(jnp.bfloat16), k, w, J**-0.5, k_scale_BS=ks, backend=backend)))
  if backend == "gpu" and s % 128 == 0:  # Mosaic GPU (the Triton kernel it replaced is gone, issue 28)
    kernels.append(("Mosaic GPU kernel", lambda q, k, w, ks: index_scores_mgpu(
        q.astype(jnp.bfloat16), k, w, J**-0.5, k_scale_BS=ks)))
  for kernel, call in kernels if "scores" in parts else []:
    for keys_name, keys, k_scale in [("bf16 keys", keys32.astype(jnp.bfloat16), None), ("fp8 keys", keys8, scale)]:
      fn = jax.jit(call)
      seconds = time_in_loop(fn, (q, keys, w, k_scale), iters)
      out = fn(q, keys, w, k_scale)
      xla = index_scores(q, keys, w, J**-0.5, k_scale_BS=k_scale, dot_dtype=jnp.bfloat16)
      err = float(jnp.max(jnp.abs(out - xla)) / jnp.max(jnp.abs(xla)))
      nbytes = keys.nbytes + (0 if k_scale is None else k_scale.nbytes)
      yield ("scores", f"{keys_name}, {kernel}", f"{seconds * 1e6:,.0f}", f"{floor_us(nbytes):,.1f}",
             f"{floor_us(nbytes) / seconds / 1e6:.2f}", f"rel err vs XLA same keys {err:.1e}")

  scores = reference
  visible = causal_mask(positions, s)
  first = None
  forms = [] if "top-k" not in parts else [("lax.top_k", topk_selection), ("radix select (library)", topk_selection_radix),
                       ("radix 4-bit, one reduction a pass", radix_one_reduction),
                       ("radix 2-bit, sibling reductions", radix_siblings(2)),
                       ("radix 16-bit, a histogram a pass", radix_histograms(16)),
                       ("radix 8-bit, a histogram a pass", radix_histograms(8)),
                       *([("k-th key: Mosaic GPU kernel; compaction: XLA",
                           lambda x, v, k: topk_selection_kernel(x, positions, k)),
                          ("k-th key and tie cutoff: Mosaic GPU kernel; compaction: XLA, one scan",
                           lambda x, v, k: topk_selection_kernel(x, positions, k, tie_cutoff=True))]
                         if jax.devices()[0].platform == "gpu" else [])]
  if topk_forms == "library-kernel":  # lax.top_k (the set each form is checked against), the library, the kernel
    forms = [form for form in forms if form[0].startswith(("lax", "radix select (library)", "k-th key"))]
  for name, select in forms:
    fn = jax.jit(lambda x, v, select=select: select(x, v, K_TOP))
    seconds = time_in_loop(fn, (scores, visible), iters)
    chosen = np.sort(np.asarray(fn(scores, visible).slots_BTK), axis=-1)
    first = chosen if first is None else first
    kernels = f"; kernels: {kernels_of(fn, (scores, visible), top=10)}" if name == "radix select (library)" else ""
    yield ("top-k", name, f"{seconds * 1e6:,.0f}", f"{floor_us(scores.nbytes):,.1f}",
           f"{floor_us(scores.nbytes) / seconds / 1e6:.2f}", f"same set: {bool((chosen == first).all())}{kernels}")

  chunks = {topk_config_for(s, TopkConfig(chunk=c)).chunk for c in (0, 1024, 2048) if s % max(c, 128) == 0}
  configs = [TopkConfig(chunk=c) for c in sorted(chunks)]
  for config in configs if "top-k" in parts and jax.devices()[0].platform == "gpu" else ():  # the k-th key alone
    fn = jax.jit(lambda x, p, config=config: kth_key_mgpu(x, p, K_TOP, config=config))
    seconds = time_in_loop(fn, (scores, positions), iters)
    yield ("top-k", f"k-th key alone: Mosaic GPU kernel, chunk {topk_config_for(s, config).chunk}",
           f"{seconds * 1e6:,.0f}", f"{floor_us(scores.nbytes):,.1f}", f"{floor_us(scores.nbytes) / seconds / 1e6:.2f}",
           f"kernels: {kernels_of(fn, (scores, positions))}")

  if "attention" not in parts:
    return
  selection = topk_selection(scores, visible, K_TOP)
  latent, k_pe = normal((b, s, C), jnp.bfloat16), normal((b, s, R), jnp.bfloat16)
  q_lat, q_pe = normal((b, t, N, C), scale=0.05), normal((b, t, N, R), jnp.bfloat16, 0.05)
  nbytes = b * t * min(K_TOP, s) * (C + R) * 2
  base = None
  for dot in (jnp.float32, jnp.bfloat16):
    fn = jax.jit(lambda ql, qp, lat, kp, sel, dot=dot: sparse_mla_reference(ql, qp, lat, kp, *sel, 0.1,
                                                                           dot_dtype=dot))
    args = (q_lat, q_pe, latent, k_pe, Selection(*selection))
    seconds = time_in_loop(fn, args, iters)
    out = fn(*args)
    base = out if base is None else base
    err = float(jnp.max(jnp.abs(out - base)) / jnp.max(jnp.abs(base)))
    yield ("sparse attention", f"{jnp.dtype(dot).name} dot", f"{seconds * 1e6:,.0f}", f"{floor_us(nbytes):,.1f}",
           f"{floor_us(nbytes) / seconds / 1e6:.2f}", f"rel err {err:.1e}")


def _normal_on_device(keys):
  """normal(shape, dtype, scale): standard-normal arrays drawn on the device (a 128K-slot key cache
  at B = 64 is 4 GB: drawn on the host it would take longer than the timing)."""
  def normal(shape, dtype=jnp.float32, scale=1.0):
    return (jax.random.normal(next(keys), shape, jnp.float32) * scale).astype(dtype)
  return normal


if __name__ == "__main__":
  raise SystemExit(main())
