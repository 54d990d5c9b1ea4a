"""The fused sparse-MLA kernel (kernels/sparse_mla_mgpu.py on Pallas Mosaic GPU) against XLA's sparse attention
(kernels/sparse_mla.reference) at DeepSeek-V3.2's widths (128 heads, latent 512 + rope 64, top-2048), each beside its
floor:

    python -m benchmarks.sparse_mla --batch 1 8 64 --tokens 1 4 --fp8

Floor: the larger of the bytes floor (the selected entries, the queries and the output, over the copy
bandwidth measured in this run) and the matmul floor (the score and output dots' FLOPs over a bf16
GEMM's rate measured in this run). Each row's output is checked against XLA's bf16 path. Beside `config_for`'s
launch (auto: two buffer sets at this width) each row times the direct gather (`Config.direct_gather`), its splits
halved and doubled, one buffer set and that form's gather variants (`--first`: auto and the direct gather only). (The
Pallas Triton kernel's rows went with that kernel on 2026-12-04, the forms that were off with their removal on
2026-12-05: qk_ahead, values_relayout, values_warpgroups; their last numbers are in RESULTS.md.)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import jax
import jax.numpy as jnp

from benchmarks.timing import measured_ceilings, time_in_loop
from jax_mtp.indexer import Selection
from jax_mtp.mla import quantize_latent
from jax_mtp.kernels import sparse_mla_mgpu as mgpu
from jax_mtp.kernels.sparse_mla import reference as sparse_mla_reference

N, C, R, K_TOP = 128, 512, 64, 2048
SCALE = 192**-0.5


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_sweep_arguments(parser, batch=[1, 8, 64], tokens=[1, 4])
  parser.add_argument("--fp8", action="store_true", help="also the fp8 MLA cache (656 B an entry): XLA and Mosaic")
  parser.add_argument("--first", action="store_true",
                      help="only auto and the direct gather (a short device session's rows), not the other forms")
  args = parser.parse_args(argv)
  bandwidth, flops = measured_ceilings(f"sparse MLA at V3.2 widths, S = {args.capacity},")
  print("| B | T | path | config | µs | floor µs | floor / time | rel err vs XLA |")
  print("|---:|---:|---|---|---:|---:|---:|---:|")
  for b in args.batch:
    for t in args.tokens:
      problem = _problem(b, t, args.capacity)
      floor = floor_us(b, t, bandwidth, flops)
      xla = jax.jit(lambda ql, qp, lat, kp, sel: sparse_mla_reference(ql, qp, lat, kp, *sel, SCALE,
                                                                      dot_dtype=jnp.bfloat16))
      selection = Selection(problem[4], problem[4] >= 0)
      xla_args = (*problem[:4], selection)
      base = xla(*xla_args)
      seconds = time_in_loop(xla, xla_args, args.iters)
      print(f"| {b} | {t} | XLA (bf16 dots) | | {seconds * 1e6:,.1f} | {floor:,.1f} | {floor / seconds / 1e6:.2f} | |")
      if args.fp8:
        _fp8_rows(problem, b, t, bandwidth, flops, args.iters, args.backend)
      auto = mgpu.config_for(b * t, N, K_TOP, C)  # two buffer sets (32 entries a step) at V3.2's width
      # auto's splits, half and twice (past MAX_SPLITS too, where the steps allow: whether B = 1 wants more CTAs)
      variants = [dataclasses.replace(auto, splits=splits) for splits in
                  sorted({auto.splits, max(1, auto.splits // 2), auto.splits * 2})
                  if K_TOP % (splits * auto.block_entries) == 0]
      # one buffer set (64 entries a step) at config_for's splits for it, and its gather's other forms
      single = mgpu.config_for(b * t, N, K_TOP, C, mgpu.Config(double_buffered=False))
      gathers = [dict(contiguous_relayout=not single.contiguous_relayout), dict(whole_rows=False, issue_warps=1),
                 dict(issue_warps=2)]
      early = [dataclasses.replace(auto, ids_before_dots=True)]  # the mask's ids loaded ahead of the dots
      # the direct gather (cp.async straight into two 64-entry operand sets, no staging) at config_for's splits for it
      direct = mgpu.config_for(b * t, N, K_TOP, C, mgpu.Config(direct_gather=True))
      configs = [auto, direct] + [config for config in variants if config != auto] + early + [single] + [
          dataclasses.replace(single, **gather) for gather in gathers]  # auto and the direct gather first
      configs = configs[:2] if args.first else configs
      for config in configs:
        timed = _time_mosaic(problem, base, config, args.iters, args.backend)
        print(f"| {b} | {t} | Mosaic GPU kernel | {_name(config)}{' (auto)' if config == auto else ''} | "
              f"{_cells(timed, floor)} |", flush=True)
  return 0


def floor_us(b: int, t: int, bandwidth: float, flops: float, fp8: bool = False, k: int = K_TOP) -> float:
  """`k` selected entries a query (padding, where a kernel adds it, is work the floor does not count)."""
  queries = b * t
  entry = C + C // 128 * 4 + R * 2 if fp8 else (C + R) * 2  # fp8: codes, 4 fp32 scales, bf16 rope (656 B)
  nbytes = queries * (k * entry + N * (C + R) * 2 + N * C * 2)  # entries, queries, bf16 output
  work = queries * N * k * (C + R + C) * 2
  return max(nbytes / bandwidth, work / flops) * 1e6


def add_sweep_arguments(parser, batch: list[int], tokens: list[int]) -> None:
  """The problems a sweep times as flags (--batch and --tokens lists, --capacity, --iters, --backend): this
  module's and `sparse_mla_splits`' shared arguments."""
  parser.add_argument("--batch", type=int, nargs="+", default=batch)
  parser.add_argument("--tokens", type=int, nargs="+", default=tokens)
  parser.add_argument("--capacity", type=int, default=4096)
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--backend", default="gpu", choices=["gpu", "interpret"], help="interpret: a CPU smoke run")


def add_problem_arguments(parser) -> None:
  """One kernel call's problem as flags (--batch, --tokens, --capacity, --fp8): the per-call tools'
  (`sparse_mla_profile`, `sparse_mla_ablate`) shared arguments, read back by `kernel_operands`."""
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--tokens", type=int, default=4)
  parser.add_argument("--capacity", type=int, default=4096)
  parser.add_argument("--fp8", action="store_true", help="an fp8 MLA cache (its codes and scales)")


def kernel_operands(args):
  """(the bf16 problem `_problem` makes for `args`, the kernel's operands: q~, q_pe, the latent or with --fp8 its
  codes, k_pe, slots, and the fp8 cache's scales or None)."""
  problem = _problem(args.batch, args.tokens, args.capacity)
  ql, qp, latent, kp, slots = problem
  latent, scales = quantize_latent(latent, 128) if args.fp8 else (latent, None)
  return problem, (ql, qp, latent, kp, slots, scales)


def _problem(b: int, t: int, s: int, k: int = K_TOP):
  keys = iter(jax.random.split(jax.random.key(b * 10 + t), 6))
  normal = lambda shape, scale=1.0: (jax.random.normal(next(keys), shape) * scale).astype(jnp.bfloat16)  # noqa: E731
  slots = jnp.argsort(jax.random.uniform(next(keys), (b, t, s)), axis=-1)[..., :k].astype(jnp.int32)
  return normal((b, t, N, C), 0.05), normal((b, t, N, R), 0.05), normal((b, s, C)), normal((b, s, R)), slots


def _time_against(fn, args, base, iters):
  """(seconds a call, max error relative to `base`'s largest value) of the jitted `fn` on `args`."""
  out = fn(*args).astype(jnp.float32)
  err = float(jnp.max(jnp.abs(out - base)) / jnp.max(jnp.abs(base)))
  return time_in_loop(fn, args, iters), err


def _time_mosaic(problem, base, config, iters, backend, latent_scale_BSG=None):
  """The Mosaic GPU kernel on `problem` (with `latent_scale_BSG`: problem's latent is an fp8 cache's codes): (seconds,
  error), or the compiler's message where it refused the config (its row says so; the rows after it run)."""
  fn = jax.jit(lambda ql, qp, lat, kp, sl, sc: mgpu.sparse_mla_mgpu(ql, qp, lat, kp, sl, SCALE, latent_scale_BSG=sc,
                                                                    config=config, out_dtype=jnp.bfloat16,
                                                                    interpret=backend == "interpret"))
  try:
    return _time_against(fn, (*problem, latent_scale_BSG), base, iters)
  except jax.errors.JaxRuntimeError as e:
    print(e, file=sys.stderr)
    return str(e).splitlines()[0][:120].replace("|", "/")


def _fp8_rows(problem, b, t, bandwidth, flops, iters, backend):
  """The fp8 cache (the latent quantised by the model's writer): XLA's fp8 path and the Mosaic kernel, each against
  XLA's fp8 output."""
  codes, scales = quantize_latent(problem[2], 128)
  fp8 = (problem[0], problem[1], codes, problem[3], problem[4])
  floor = floor_us(b, t, bandwidth, flops, fp8=True)
  xla = jax.jit(lambda ql, qp, lat, kp, sl, sc: sparse_mla_reference(ql, qp, lat, kp, jnp.maximum(sl, 0), sl >= 0,
                                                                     SCALE, dot_dtype=jnp.bfloat16,
                                                                     latent_scale_BSG=sc))
  base = xla(*fp8, scales)
  seconds = time_in_loop(xla, (*fp8, scales), iters)
  print(f"| {b} | {t} | XLA, fp8 cache | | {seconds * 1e6:,.1f} | {floor:,.1f} | {floor / seconds / 1e6:.2f} | |")
  rows = [("auto (double-buffered)", None), ("one buffer set", mgpu.Config(double_buffered=False)),
          ("one buffer set, a copy a piece from one thread",
           mgpu.Config(double_buffered=False, whole_rows=False, issue_warps=1)),
          ("auto, ids before the dots", mgpu.Config(ids_before_dots=True))]
  for name, config in rows:
    timed = _time_mosaic(fp8, base, config, iters, backend, latent_scale_BSG=scales)
    print(f"| {b} | {t} | Mosaic GPU kernel, fp8 cache | {name} | {_cells(timed, floor)} |", flush=True)


def _cells(timed, floor: float) -> str:
  """A kernel row's µs, floor, floor / time and error cells, or its compile failure's first line in them."""
  if isinstance(timed, str):
    return f"failed: {timed} | {floor:,.1f} | | "
  seconds, err = timed
  return f"{seconds * 1e6:,.1f} | {floor:,.1f} | {floor / seconds / 1e6:.2f} | {err:.1e}"


def _name(config) -> str:
  return " ".join(f"{k.replace('block_', '').replace('num_', '')} {v}" for k, v in dataclasses.asdict(config).items()
                  if v is not None)


if __name__ == "__main__":
  raise SystemExit(main())
