"""Opt-1 timing on GPU: the fused all-reduce + residual + RMSNorm Mosaic GPU kernel (`pallas_gpu`)
vs the XLA path (`xla`: psum, then the fused jnp norm), D = 7168 bf16, tp = every GPU present.

Each call runs inside `jax.shard_map` over a 1-D `tp` mesh exactly as in the model. Per (T, impl):

    device µs   CUPTI kernel time per call (`jax.experimental.mosaic.gpu.profiler.measure`): the sum
                of the call's kernels, mean over devices, median over iterations; launch gaps
                between kernels are not included
    wall µs     host clock per call, `block_until_ready` after `--iters` back-to-back calls
                (includes dispatch; pipelined, so a throughput number)
    GB/s        minimal HBM bytes per device / device time (wall time where CUPTI gives none): read
                x, residual, weight; write normed and new_residual; plus the (tp−1) received
                partials when tp > 1

beside the copy bandwidth of the same GPU measured in the same run (`x + 1` over `--copy-mib` MiB,
read + write), and the xla / pallas_gpu ratio (on the xla row; on a variant's row, xla / that
variant). Prints a markdown table. `pallas_gpu` is the kernel's default protocol (push="tma", no
entry barrier); each `--variants` entry PUSH[+entry] adds a row `pallas_gpu[PUSH+entry]` with the
kernel's experiment hook `with_protocol(push=PUSH, entry_barrier="+entry" given)` — by default
`st+entry`, the original protocol, so one run compares old and new. `--variants chained` adds
`pallas_gpu[chained]`: `fused_allreduce_rmsnorm_gpu_chained`, which skips XLA's per-kernel device
barrier through a persistent workspace (tp ≥ 2 GPUs). `--chain N` puts N calls in one program, each
call's (normed, new_residual) the next one's (partial, residual), as a decoder's layers or the draft
steps of a round (every psum is then distinct: XLA computes a repeated psum of the same x once);
every time is then per call (the program's total / N), so the chained variant's workspace set-up
(one sync kernel behind one XLA barrier) is spread over the N calls. The inputs are the same on
every iteration, so at T = 256 (14.7 MB) they stay in the 50 MB L2 and GB/s can pass the HBM copy.

On CPU it only smoke-tests the plumbing: the kernel in GPU interpret mode for two small T,
a few iterations, wall clock; those numbers say nothing about a GPU. Usage (repo root):

    python -m benchmarks.fused_allreduce_rmsnorm [--tokens 1 8 64 256] [--iters 200] [--variants st+entry chained]
                                                 [--chain 8] [--breakdown]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.sharding import PartitionSpec as P

from jax_mtp.kernels.fused_allreduce_rmsnorm import fused_allreduce_rmsnorm
from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu import PUSH_MODES, with_protocol
from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_chained import fused_allreduce_rmsnorm_gpu_chained, gpu_workspace
from jax_mtp.sharding import TP_AXIS, make_mesh

IMPLS = ("pallas_gpu", "xla")
EPS = 1e-6
CHAINED = "chained"


def parse_variant(spec: str) -> tuple[str, bool] | None:
  """"st+entry" → (push="st", entry_barrier=True); "tma" → ("tma", False); "chained" → None (the
  workspace protocol without XLA's barrier, `fused_allreduce_rmsnorm_gpu_chained`; tp ≥ 2)."""
  if spec == CHAINED:
    return None
  push, _, entry = spec.partition("+")
  if push not in PUSH_MODES or entry not in ("", "entry"):
    raise argparse.ArgumentTypeError(f"variant {spec!r} is not {CHAINED!r}, PUSH or PUSH+entry with PUSH in "
                                     f"{PUSH_MODES}")
  return push, entry == "entry"


def _call(impl: str, axis, interpret, workspace):
  """One fused call (x, residual, weight) → (normed, new_residual) for `impl` (see `_program`)."""
  variant = impl[len("pallas_gpu["):-1] if impl.startswith("pallas_gpu[") else None
  if variant == CHAINED:
    return functools.partial(fused_allreduce_rmsnorm_gpu_chained, eps=EPS, axis_name=axis, workspace=workspace)
  if variant is not None:
    push, entry_barrier = parse_variant(variant)
    return functools.partial(with_protocol, eps=EPS, axis_name=axis, interpret=interpret, push=push,
                             entry_barrier=entry_barrier)
  return functools.partial(fused_allreduce_rmsnorm, eps=EPS, axis_name=axis, impl=impl,
                           interpret=interpret if impl == "pallas_gpu" else None)


def _program(tp: int, impl: str, interpret, chain: int = 1):
  """impl: "xla", "pallas_gpu" (the public wrapper) or "pallas_gpu[VARIANT]" (the kernel directly).
  `chain` calls in one program, each feeding (normed, new_residual) to the next as (partial,
  residual); "pallas_gpu[chained]" first builds its workspace (sync kernel + XLA barrier)."""
  axis = TP_AXIS if tp > 1 else None

  def per_device(x_1TD, residual_TD, weight_D):
    t, d = residual_TD.shape
    workspace = gpu_workspace(axis, t, d, residual_TD.dtype) if impl == f"pallas_gpu[{CHAINED}]" else None
    fused = _call(impl, axis, interpret, workspace)
    x_TD = x_1TD[0]
    for _ in range(chain):  # x ← normed: each call's psum is new (XLA would compute a repeated one once)
      x_TD, residual_TD = fused(x_TD, residual_TD, weight_D)
    return x_TD, residual_TD

  return jax.jit(jax.shard_map(per_device, mesh=make_mesh(tp), in_specs=(P(TP_AXIS), P(), P()),
                               out_specs=P(), check_vma=False))


def _inputs(tp: int, t: int, d: int, dtype):
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.standard_normal((tp, t, d)), dtype), jnp.asarray(rng.standard_normal((t, d)), dtype),
          jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype))


def wall_us(fn, args, iters: int) -> float:
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(iters):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / iters * 1e6


def device_us(fn, args, iters: int, tp: int) -> float | None:
  """Median over iterations of Σ kernels per call (CUPTI), averaged over the tp devices."""
  from jax.experimental.mosaic.gpu import profiler

  jax.block_until_ready(fn(*args))
  _, per_iter = profiler.measure(fn, aggregate=False, iterations=iters)(*args)
  if not per_iter:
    return None
  return statistics.median(sum(ms for _, ms in kernels) / tp * 1e3 for kernels in per_iter)


def kernel_breakdown(fn, args, iters: int, tp: int) -> dict[str, float]:
  """Mean µs per call of each kernel the call launches (CUPTI), per device: where the time goes."""
  from jax.experimental.mosaic.gpu import profiler

  jax.block_until_ready(fn(*args))
  _, per_iter = profiler.measure(fn, aggregate=False, iterations=iters)(*args)
  totals: dict[str, float] = {}
  for kernels in per_iter or []:
    for name, ms in kernels:
      totals[name] = totals.get(name, 0.0) + ms * 1e3 / tp / len(per_iter)
  return totals


def copy_gbps(mib: int, iters: int) -> float:
  """Read + write bandwidth of `x + 1` over a large bf16 array on one device."""
  x = jnp.zeros((mib * 2**19,), jnp.bfloat16)
  us = wall_us(jax.jit(lambda a: a + 1), (x,), iters)
  return 2 * x.nbytes / (us * 1e-6) / 1e9


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
  p.add_argument("--hidden", type=int, default=7168)
  p.add_argument("--iters", type=int, default=200)
  p.add_argument("--copy-mib", type=int, default=2048)
  p.add_argument("--breakdown", action="store_true", help="also list each kernel's µs per call (GPU)")
  p.add_argument("--variants", nargs="*", default=["st+entry"], metavar="PUSH[+entry]",
                 help=f"extra pallas_gpu rows: push in {PUSH_MODES}, '+entry' adds the in-kernel entry barrier "
                      "(default: st+entry, the original protocol; none: --variants)")
  p.add_argument("--chain", type=int, default=1,
                 help="calls per program, each feeding its outputs to the next; times are per call")
  args = p.parse_args(argv)
  for spec in args.variants:
    try:
      parse_variant(spec)
    except argparse.ArgumentTypeError as e:
      p.error(str(e))
  if args.chain < 1:
    p.error(f"--chain {args.chain} must be ≥ 1")
  on_gpu = jax.devices()[0].platform == "gpu"
  tp, dtype, d = (jax.device_count() if on_gpu else 1), jnp.dtype(jnp.bfloat16), args.hidden
  variants = args.variants
  if CHAINED in variants and tp < 2:
    print(f"NOTE: variant {CHAINED!r} needs tp ≥ 2 GPUs; left out here.\n")
    variants = [v for v in variants if v != CHAINED]
  impls = (IMPLS[0], *(f"pallas_gpu[{v}]" for v in variants), *IMPLS[1:])
  interpret = None if on_gpu else plgpu.InterpretGPUParams()
  tokens, iters = (args.tokens, args.iters) if on_gpu else ([t for t in args.tokens if t <= 8][:2] or [1], 3)
  if not on_gpu:
    print(f"NOTE: no GPU ({jax.devices()[0].platform}); smoke test only: pallas_gpu in GPU interpret mode,"
          f" T={tokens}, {iters} iterations, wall clock. These numbers say nothing about a GPU.\n")
  copy = copy_gbps(args.copy_mib if on_gpu else 16, 20 if on_gpu else 2)
  print(f"device: {jax.devices()[0].device_kind} × {tp}, jax {jax.__version__}; D={d} {dtype.name}, "
        f"tp={tp}; copy bandwidth (x + 1, read + write): {copy:.0f} GB/s; µs per call, "
        f"{args.chain} chained call(s) per program\n")
  print("| T | impl | device µs | wall µs | bytes/device | GB/s (device) | % of copy | xla / pallas_gpu |")
  print("|---|---|---|---|---|---|---|---|")
  for t in tokens:
    data = _inputs(tp, t, d, dtype)
    nbytes = (4 * t * d + d + (tp - 1) * t * d) * dtype.itemsize
    times, rows = {}, {}
    for impl in impls:  # every impl is timed before any row is printed: the ratios need xla
      fn = _program(tp, impl, interpret, args.chain)
      wall = wall_us(fn, data, iters) / args.chain
      dev = device_us(fn, data, iters, tp) if on_gpu else None
      dev = None if dev is None else dev / args.chain
      times[impl] = dev if dev is not None else wall
      rows[impl] = (dev, wall, nbytes / (times[impl] * 1e-6) / 1e9)
    for impl, (dev, wall, gbps) in rows.items():
      other = "pallas_gpu" if impl == "xla" else impl
      ratio = f"{times['xla'] / times[other]:.2f}×" if impl != "pallas_gpu" else ""
      print(f"| {t} | {impl} | {'–' if dev is None else f'{dev:.1f}'} | {wall:.1f} | {nbytes:,} | {gbps:.1f} | "
            f"{100 * gbps / copy:.1f}% | {ratio} |", flush=True)
  if args.breakdown and on_gpu:
    print("\n| T | impl | kernel | µs per call |\n|---|---|---|---|")
    for t in tokens:
      for impl in impls:
        fn = _program(tp, impl, interpret, args.chain)
        for name, us in kernel_breakdown(fn, _inputs(tp, t, d, dtype), iters, tp).items():
          print(f"| {t} | {impl} | {name[:60]} | {us / args.chain:.1f} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
