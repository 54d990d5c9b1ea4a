"""MLA's dense absorbed attention (`mla.dense_latent_attention`, what every V3 model and a V3.2 model under
index_topk cached positions runs) in its two forms, timed on the CLI's shapes:

    python -m benchmarks.dense_attention --batch 64 --tokens 1 4 --capacity 1283

V3.2's widths (128 heads, a 512-wide latent, a 64-wide rope key); capacity 1,283 is a 1K prompt's (1,024 + 256
new + k = 3, `request.required_capacity`). Forms: "fp32" (the latent read in fp32: fp32 HIGHEST dots, the only form
before 2026-12-05) and "bf16 split" (the latent in bf16, q~ and the probabilities as two bf16 parts: what a bf16
model runs now); on a GPU also "sparse kernel" (the sparse-MLA kernel over every visible slot: what a V3.2 model
under index_topk runs on a Hopper since 2026-12-05, `mla.attends_every_slot_by_kernel`). Each row: µs a call, its floor (the larger of the latent's and rope keys' bytes over the copy
bandwidth and the dots' FLOPs over the bf16 GEMM rate, both measured in the run), the dots' operand dtypes read
from the compiled program, and the largest difference from the fp32 form relative to its largest value."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from jax_mtp.ran_kernels import describe, dot_operand_types
from benchmarks.timing import measured_ceilings, time_in_loop
from jax_mtp.kernels.sparse_mla_mgpu import KERNEL_NAME
from jax_mtp.mla import attend_selected_by_kernel, dense_latent_attention, every_visible_slot

N, C, R = 128, 512, 64  # V3.2's heads, latent and rope widths
SCALE = (128 + 64) ** -0.5


def operands(b: int, t: int, s: int):
  """q~ fp32, q_pe / latent / k_pe bf16, the causal mask of rows at the cache's end."""
  keys = iter(jax.random.split(jax.random.key(b * 7 + t), 4))
  q_lat = jax.random.normal(next(keys), (b, t, N, C), jnp.float32)
  q_pe = jax.random.normal(next(keys), (b, t, N, R), jnp.float32).astype(jnp.bfloat16)
  latent = jax.random.normal(next(keys), (b, s, C), jnp.float32).astype(jnp.bfloat16)
  k_pe = jax.random.normal(next(keys), (b, s, R), jnp.float32).astype(jnp.bfloat16)
  positions = s - t + jnp.arange(t)
  visible = jnp.broadcast_to(jnp.arange(s)[None, None] <= positions[None, :, None], (b, t, s))
  return q_lat, q_pe, latent, k_pe, visible


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, nargs="+", default=[64])
  parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
  parser.add_argument("--capacity", type=int, nargs="+", default=[1283])
  parser.add_argument("--iters", type=int, default=20)
  args = parser.parse_args(argv)
  bandwidth, peak = measured_ceilings("dense absorbed attention")
  print("| B | T | S | form | µs | floor µs | floor / time | fp32 form / this | rel. diff vs fp32 form | operands |")
  print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
  dense = jax.jit(lambda q, qp, lat, kp, vis: dense_latent_attention(q, qp, lat, kp, vis, SCALE))
  kernel = jax.jit(lambda q, qp, lat, kp, vis: attend_selected_by_kernel(q, qp, lat, kp, every_visible_slot(vis),
                                                                         SCALE).astype(jnp.float32))
  forms = [("fp32", dense, jnp.float32), ("bf16 split", dense, jnp.bfloat16)]
  if jax.default_backend() == "gpu":
    forms.append(("sparse kernel", kernel, jnp.bfloat16))
  for s in args.capacity:
    for b in args.batch:
      for t in args.tokens:
        q_lat, q_pe, latent, k_pe, visible = operands(b, t, s)
        nbytes = latent.nbytes + k_pe.nbytes
        flops = 2 * b * t * N * s * (C + R + C)
        floor = max(nbytes / bandwidth, flops / peak) * 1e6
        exact, fp32_seconds = None, None
        for name, fn, dtype in forms:
          args_ = (q_lat, q_pe, latent.astype(dtype), k_pe, visible)
          out = fn(*args_)
          exact = out if exact is None else exact
          diff = float(jnp.max(jnp.abs(out - exact)) / jnp.max(jnp.abs(exact)))
          seconds = time_in_loop(fn, args_, args.iters)
          fp32_seconds = fp32_seconds or seconds
          compiled = fn.lower(*args_).compile().as_text()
          dtypes = "the kernel" if KERNEL_NAME in compiled else describe(dot_operand_types(compiled))
          print(f"| {b} | {t} | {s} | {name} | {seconds * 1e6:,.1f} | {floor:,.1f} | {floor / seconds / 1e6:.2f} | "
                f"{fp32_seconds / seconds:.2f} | {diff:.1e} | {dtypes} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
