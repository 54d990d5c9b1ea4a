"""MLA's per-call projections around the sparse attention at verification's token counts, in the model's form
(jax_mtp/mla.py: q_b_proj's output split into q_nope and q_pe; kv_b_proj's kernel sliced into W_UK / W_UV every
call) beside weights laid out once ahead (as vLLM's `process_weights_after_loading` does for MLA):

    python -m benchmarks.mla_projections --tokens 256 1024

Why: the verification forward's profile at B = 64 (RESULTS 2026-12-04 12:35) showed q_b_proj at 80 µs a call (its
roofline ~24 µs), kv_b_proj's slice at 16 µs a call and the query absorption at 26 µs (roofline ~5 µs). Each row is
µs a call inside one compiled loop, beside its roofline (bytes / copy bandwidth vs FLOPs / bf16 peak, both measured
in this run); every variant's outputs are checked equal to the model form's. "copies" counts the copy and transpose
instructions in the row's compiled program (`layout_copies`): where XLA moved data around the dots rather than
multiplying; `--hlo-dir` writes each row's compiled HLO there.
"""

from __future__ import annotations

import argparse
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import measured_ceilings, time_in_loop

N, P, R, C, H, Q = 128, 128, 64, 512, 128, 1536  # V3.2: heads, nope, rope, latent, value, q_lora_rank
HIGHEST = jax.lax.Precision.HIGHEST


def q_model(x_MQ, w_qb, w_kvb):
  """mla.py's form: one q_b_proj product, split; W_UK sliced from kv_b_proj's kernel."""
  q = (x_MQ @ w_qb).reshape(x_MQ.shape[0], N, P + R)
  w_uk = w_kvb.reshape(C, N, P + H)[..., :P]
  q_lat = jnp.einsum("mnp,cnp->mnc", q[..., :P], w_uk, precision=HIGHEST, preferred_element_type=jnp.float32)
  return q_lat, q[..., P:]


def q_prelaid(x_MQ, w_qb_nope, w_qb_pe, w_uk_NPC):
  """q_b_proj as two products (nope, pe) and W_UK laid out [N, P, C] ahead."""
  nope = (x_MQ @ w_qb_nope).reshape(x_MQ.shape[0], N, P)
  q_lat = jnp.einsum("mnp,npc->mnc", nope, w_uk_NPC, precision=HIGHEST, preferred_element_type=jnp.float32)
  return q_lat, (x_MQ @ w_qb_pe).reshape(x_MQ.shape[0], N, R)


def q_uk_prelaid(x_MQ, w_qb, w_uk_NPC):
  """One q_b_proj product as the model, only W_UK laid out ahead."""
  q = (x_MQ @ w_qb).reshape(x_MQ.shape[0], N, P + R)
  q_lat = jnp.einsum("mnp,npc->mnc", q[..., :P], w_uk_NPC, precision=HIGHEST, preferred_element_type=jnp.float32)
  return q_lat, q[..., P:]


def v_model(o_MNC, w_kvb):
  w_uv = w_kvb.reshape(C, N, P + H)[..., P:]
  return jnp.einsum("mnc,cnh->mnh", o_MNC, w_uv, preferred_element_type=jnp.float32).astype(o_MNC.dtype)


def v_prelaid(o_MNC, w_uv_NCH):
  return jnp.einsum("mnc,nch->mnh", o_MNC, w_uv_NCH, preferred_element_type=jnp.float32).astype(o_MNC.dtype)


_COPY = re.compile(r" = [^ ]+ (?:copy|transpose)\(")


def layout_copies(hlo: str) -> int:
  """Copy and transpose instructions in a compiled program's HLO text (fused ones included)."""
  return len(_COPY.findall(hlo))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
  parser.add_argument("--iters", type=int, default=50)
  parser.add_argument("--hlo-dir", help="write each row's compiled HLO text here")
  parser.add_argument("--dtype", default="bfloat16", help="the weights' and activations' (float32: a CPU smoke run)")
  args = parser.parse_args(argv)
  bandwidth, flops = measured_ceilings("MLA projections")
  print("| tokens | part | form | µs | roofline µs | roofline / time | copies | max abs diff vs model |")
  print("|---:|---|---|---:|---:|---:|---:|---:|")
  keys = iter(jax.random.split(jax.random.key(0), 8))
  normal = lambda shape: (jax.random.normal(next(keys), shape) * 0.02).astype(args.dtype)  # noqa: E731
  w_qb, w_kvb = normal((Q, N * (P + R))), normal((C, N * (P + H)))
  w_qb_NK = w_qb.reshape(Q, N, P + R)
  w_qb_nope, w_qb_pe = w_qb_NK[..., :P].reshape(Q, -1), w_qb_NK[..., P:].reshape(Q, -1)
  w_kvb_CNK = w_kvb.reshape(C, N, P + H)
  w_uk_NPC, w_uv_NCH = w_kvb_CNK[..., :P].transpose(1, 2, 0), w_kvb_CNK[..., P:].transpose(1, 0, 2)
  for m in args.tokens:
    x, o = normal((m, Q)), normal((m, N, C))
    q_bytes = 2 * (m * Q + Q * N * (P + R) + C * N * P + m * N * R) + 4 * m * N * C
    q_flops = 2 * m * (Q * N * (P + R) + N * P * C)
    v_bytes, v_flops = 2 * (m * N * C + C * N * H + m * N * H), 2 * m * N * C * H
    rows = [("q: q_b_proj + absorption", "model (slice every call)", q_model, (x, w_qb, w_kvb), q_bytes, q_flops),
            ("q: q_b_proj + absorption", "W_UK [N, P, C] ahead", q_uk_prelaid, (x, w_qb, w_uk_NPC), q_bytes, q_flops),
            ("q: q_b_proj + absorption", "q_b split + W_UK ahead", q_prelaid, (x, w_qb_nope, w_qb_pe, w_uk_NPC),
             q_bytes, q_flops),
            ("values: W_UV", "model (slice every call)", v_model, (o, w_kvb), v_bytes, v_flops),
            ("values: W_UV", "W_UV [N, C, H] ahead", v_prelaid, (o, w_uv_NCH), v_bytes, v_flops)]
    reference = {}
    for part, form, fn, fn_args, nbytes, work in rows:
      jitted = jax.jit(fn)
      compiled = jitted.lower(*fn_args).compile()  # one compile: its output checked here, its HLO's copies counted
      out = jax.tree.map(np.asarray, compiled(*fn_args))
      reference.setdefault(part, out)
      diff = max(float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32))))
                 for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(reference[part]), strict=True))
      seconds = time_in_loop(jitted, fn_args, args.iters, whole_output=True)
      roof = max(nbytes / bandwidth, work / flops)
      hlo = compiled.as_text()
      if args.hlo_dir:
        os.makedirs(args.hlo_dir, exist_ok=True)
        name = re.sub(r"\W+", "_", f"{m} {part} {form}").strip("_")
        with open(os.path.join(args.hlo_dir, name + ".txt"), "w") as f:
          f.write(hlo)
      print(f"| {m} | {part} | {form} | {seconds * 1e6:,.1f} | {roof * 1e6:,.1f} | {roof / seconds:.2f} | "
            f"{layout_copies(hlo)} | {diff:.1e} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
