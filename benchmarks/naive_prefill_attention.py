"""MLA's naive prefill attention (the model's `MLAttention._naive`) over a dense cache: whole and in blocks of slots,
and beside tokamax's `dot_product_attention` forms, at the shapes of a prefill chunk:

    python -m benchmarks.naive_prefill_attention --batch 1 --chunk 128 2048 --capacity 32768

Why: over a dense cache (V3 models; V3.2 prompts within index_topk) the whole naive form holds N × S fp32 scores and
probabilities a query and expands the whole cache by kv_b_proj once a chunk, so a 32K prompt got chunks of 128
tokens and paid 256 expansions (2026-12-07: by count, ~3× the attention's own multiply-adds). Since 2026-12-07 past
2,048 slots the model runs the form a block of slots at a time (`jax_mtp.mla_blocked`: chunks of 2,048 at 32K). The
first table times, with the expansion included as the model runs it, the whole form beside the blocks; the second
asks which of tokamax's flash forms (`mosaic`, `triton`, `cudnn`, `xla_chunked`: no scores kept) take MLA's shapes
(192-wide q and k, 128-wide v, a mask of slots ≤ each query's position, the chunk at the end of the cache), whether
they equal the naive form, how long they take and how much temporary memory their compiled program asks for (XLA's
memory analysis) — a fused attention would also spare the blocks' fp32 scores their trips through memory.

Each row: the chunk (T queries at positions S − T … S − 1, every slot ≤ its position visible), the form, µs, the
FLOPs floor (the bf16 GEMM rate measured in this run; the masked half included, as the naive form computes it; in
the first table the expansion of every slot included), the compiled program's temporary bytes, and the relative error
against the first row's output. A form tokamax does not run here says why in its row."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from benchmarks.timing import measured_ceilings, time_in_loop
from jax_mtp.cache import LayerCache
from jax_mtp.mla import naive_attention
from jax_mtp.mla_blocked import KEY_BLOCK, blocked_naive_attention

N, P, R, V = 128, 128, 64, 128  # V3 / V3.2's heads, q·k widths (nope, rope: 192 in all) and value width
LATENT = 512  # kv_lora_rank: the latent kv_b_proj expands
QK = P + R
FORMS = ("mosaic", "triton", "cudnn", "xla_chunked", "xla")


def naive(q_nope_BTNP, q_pe_BTNR, k_nope_BSNP, k_pe_BSR, v_BSNH, visible_BTS, scale):
  """The model's naive form (`mla.naive_attention`, which `MLAttention._naive` runs after the expansion)."""
  return naive_attention(q_nope_BTNP, q_pe_BTNR, k_nope_BSNP, k_pe_BSR, v_BSNH, visible_BTS, scale)[0]


def tokamax_form(form: str):
  """tokamax's attention through one named implementation: q and k as [nope; rope] (the rope key broadcast over
  the heads, inside the timed call), the mask [B, 1, T, S] shared by the heads."""
  import tokamax  # noqa: PLC0415 (the benchmark's only use)

  def attend(q_nope_BTNP, q_pe_BTNR, k_nope_BSNP, k_pe_BSR, v_BSNH, visible_BTS, scale):
    k_pe_BSNR = jnp.broadcast_to(k_pe_BSR[:, :, None], (*k_nope_BSNP.shape[:3], R))
    return tokamax.dot_product_attention(jnp.concatenate([q_nope_BTNP, q_pe_BTNR], -1),
                                         jnp.concatenate([k_nope_BSNP, k_pe_BSNR], -1), v_BSNH,
                                         mask=visible_BTS[:, None], scale=scale, implementation=form
                                         ).astype(jnp.float32)
  return attend


def problem(batch: int, chunk: int, capacity: int, seed: int = 0):
  keys = iter(jax.random.split(jax.random.key(seed), 5))
  normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32).astype(jnp.bfloat16)  # noqa: E731
  positions = capacity - chunk + jnp.arange(chunk)
  visible = jnp.broadcast_to(jnp.arange(capacity)[None, :] <= positions[:, None], (batch, chunk, capacity))
  return (normal(batch, chunk, N, P), normal(batch, chunk, N, R), normal(batch, capacity, N, P),
          normal(batch, capacity, R), normal(batch, capacity, N, V), visible)


def expanding_forms(batch: int, chunk: int, capacity: int, seed: int = 0):
  """(operands, forms) of the naive form with kv_b_proj's expansion in the call: the latent cache, the rope keys,
  the expansion's weight [C, N, P + H] (V3's widths: C = 512), the chunk's queries and mask."""
  keys = iter(jax.random.split(jax.random.key(seed), 5))
  normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32).astype(jnp.bfloat16)  # noqa: E731
  positions = capacity - chunk + jnp.arange(chunk)
  visible = jnp.broadcast_to(jnp.arange(capacity)[None, :] <= positions[:, None], (batch, chunk, capacity))
  operands = (normal(batch, chunk, N, P), normal(batch, chunk, N, R), normal(batch, capacity, LATENT),
              normal(batch, capacity, R), normal(LATENT, N, P + V) * LATENT**-0.5, visible)

  def whole(q_nope, q_pe, latent, k_pe, w, visible, scale):
    kv = jnp.einsum("bsc,cnx->bsnx", latent, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    return naive_attention(q_nope, q_pe, kv[..., :P], k_pe, kv[..., P:], visible, scale)[0]

  def blocks(q_nope, q_pe, latent, k_pe, w, visible, scale):
    return blocked_naive_attention(q_nope, q_pe, LayerCache(latent, k_pe, None), w, visible, scale, jnp.bfloat16)

  forms = [("naive, whole (the model's up to 2,048 slots)", whole)]
  if capacity > KEY_BLOCK:
    forms.append((f"naive, blocks of {KEY_BLOCK:,} (the model's past them)", blocks))
  return operands, forms


def _time_rows(prefix: str, operands, forms, floor: float, iters: int, scale: float) -> None:
  """One row a form: µs, the floor, temporary GiB, the relative error against the first form's output."""
  want = None
  for name, fn in forms:
    row = f"{prefix} {name} |"
    try:
      jitted = jax.jit(lambda *xs, fn=fn: fn(*xs, scale))
      compiled = jitted.lower(*operands).compile()
      temp = compiled.memory_analysis().temp_size_in_bytes / 2**30
      out = jitted(*operands)
      seconds = time_in_loop(jitted, operands, iters)
    except Exception as e:  # noqa: BLE001 (a form tokamax cannot run here is a row saying why)
      print(f"{row} not run: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''} | | | | |",
            flush=True)
      continue
    want = out if want is None else want
    err = float(jnp.max(jnp.abs(out - want)) / jnp.max(jnp.abs(want)))
    print(f"{row} {seconds * 1e6:,.1f} | {floor * 1e6:,.1f} | {floor / seconds:.2f} | {temp:.2f} | {err:.1e} |",
          flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, nargs="+", default=[1])
  parser.add_argument("--chunk", type=int, nargs="+", default=[128, 2048])
  parser.add_argument("--capacity", type=int, nargs="+", default=[32768])
  parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
  parser.add_argument("--iters", type=int, default=10)
  args = parser.parse_args(argv)
  _, peak = measured_ceilings("MLA's naive prefill attention, whole and in blocks, beside tokamax's forms")
  header = ("| B | T | S | form | µs | FLOPs floor µs | floor / time | temp GiB | rel err vs the first row |\n"
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|")
  scale = QK**-0.5
  print("The naive form with kv_b_proj's expansion of the cache in the call, as the model runs it:\n\n" + header)
  for s in args.capacity:
    for b in args.batch:
      for t in args.chunk:
        operands, forms = expanding_forms(b, t, s)
        floor = 2 * b * s * (LATENT * N * (P + V) + t * N * (QK + V)) / peak
        _time_rows(f"| {b} | {t} | {s} |", operands, forms, floor, args.iters, scale)
        del operands
  print("\nThe attention alone (the keys and values expanded ahead) beside tokamax's forms:\n\n" + header)
  for s in args.capacity:
    for b in args.batch:
      for t in args.chunk:
        operands = problem(b, t, s)
        floor = 2 * b * t * s * N * (QK + V) / peak
        _time_rows(f"| {b} | {t} | {s} |", operands, [("naive, whole", naive)] + [
            (f"tokamax {f}", tokamax_form(f)) for f in args.forms], floor, args.iters, scale)
        del operands
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
