"""What one hand-off and one wgmma cost inside a Pallas Mosaic GPU kernel on this GPU: the latencies the sparse MLA's
step is built from (kernels/sparse_mla_mgpu_body.py), each timed alone in a one-CTA kernel that repeats it `--reps`
times:

    python -m benchmarks.mgpu_handoff --reps 2000

Rows (ns a repetition):
  ping-pong            two warpgroups pass two mbarriers back and forth: one round trip = two hand-offs
  ping-pong + commit   the same with `commit_smem` (a shared-memory fence and a warpgroup barrier) before each arrive,
                       as each of the kernel's hand-offs of shared-memory data has
  qk wgmma, E entries  one warpgroup: [64, 576] · [576, E] from shared memory, issued and waited for (the scores'
                       product of a step of E entries, bf16)
  pv wgmma, E entries  one warpgroup: [64, E] · [E, 256] (a values warpgroup's half of P · V)
Why: the ablation (RESULTS 2026-12-04 15:48) left ~0.8 µs a 32-entry step with every phase but P · V removed, and
whether that is hand-off latency (fewer, larger steps would pay) or the products' issue-to-completion latency decides
the kernel's next form. The step's chain has three hand-offs (operand ready, P ready, operand free) and two
products; at 1.98 GHz a [64, 576] · [576, 32] product is ~150 ns of tensor-core work at peak.
"""

from __future__ import annotations

import argparse
import itertools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from benchmarks.timing import time_in_loop
from jax_mtp.kernels.mosaic_gpu_common import interpret_params

HEADS, WIDTH, VALUES = 64, 576, 256  # a head block, the latent + rope width, a values warpgroup's output half


def ping_pong(reps: int, commit: bool, interpret=False):
  """A kernel of `reps` round trips between two warpgroups; returns f(x) -> x + 1 (x: f32 [1])."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  def body(x_gmem, o_gmem, ping, pong):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      @pl.loop(0, reps)
      def _(i):
        if commit:
          plgpu.commit_smem()
        plgpu.barrier_arrive(ping)
        plgpu.barrier_wait(pong)
      o_gmem[0] = x_gmem[0] + 1.0

    @pl.when(wg == 1)
    def _():
      @pl.loop(0, reps)
      def _(i):
        plgpu.barrier_wait(ping)
        if commit:
          plgpu.commit_smem()
        plgpu.barrier_arrive(pong)

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((1,), jnp.float32),
                        scratch_types=[plgpu.Barrier(num_arrivals=1), plgpu.Barrier(num_arrivals=1)],
                        num_threads=2, thread_name="wg",
                        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
                        kernel_name="handoff_ping_pong", interpret=interpret_params(plgpu, interpret))
  return kernel


def product(reps: int, form: str, entries: int, swizzle: int = 64, interpret=False):
  """A kernel of `reps` products of `form` ("qk" or "pv"), each issued and waited for; returns f(a, b) -> [1].
  Both operands at one `swizzle` (bytes): wgmma on jax 0.11.2 takes no two (the H200 refused a [64, 32] P at 64 B
  beside [32, 256] values at 128 B, 2026-12-04 21:20); 64, as the double-buffered sparse MLA lays out every operand."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  m, k, n = (HEADS, WIDTH, entries) if form == "qk" else (HEADS, entries, VALUES)

  def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, loaded):
    plgpu.copy_gmem_to_smem(a_gmem, a_smem, loaded)
    plgpu.copy_gmem_to_smem(b_gmem, b_smem, loaded)
    plgpu.barrier_wait(loaded)
    b_op = b_smem.transpose((1, 0)) if form == "qk" else b_smem

    def one(i, total):
      def dot(acc_ref):
        plgpu.wgmma(acc_ref, a_smem, b_op)
        return acc_ref[...]
      out = pl.run_scoped(dot, plgpu.ACC((m, n), jnp.float32))
      return total + out

    init = plgpu.layout_cast(jnp.zeros((m, n), jnp.float32), plgpu.Layout.WGMMA)
    total = lax.fori_loop(0, reps, one, init)
    o_gmem[...] = total.sum(axis=1)

  b_shape = (n, k) if form == "qk" else (k, n)  # qk: the operand's rows are entries (transposed in the product)
  transforms = (plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle))  # bf16: 2 bytes a value
  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((m,), jnp.float32),
                        scratch_types=[plgpu.SMEM((m, k), jnp.bfloat16, transforms=transforms),
                                       plgpu.SMEM(b_shape, jnp.bfloat16, transforms=transforms),
                                       plgpu.Barrier(num_arrivals=2)],
                        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
                        kernel_name=f"handoff_{form}", interpret=interpret_params(plgpu, interpret))
  return kernel, (m, k), b_shape


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=2000)
  parser.add_argument("--entries", type=int, nargs="+", default=[32, 64])
  parser.add_argument("--iters", type=int, default=5)
  parser.add_argument("--swizzle", type=int, nargs="+", default=[64], choices=[32, 64, 128],
                      help="the products' operand swizzle(s) in bytes (each entry count a multiple of it / 2)")
  parser.add_argument("--forms", nargs="+", default=["ping-pong", "qk", "pv"], choices=["ping-pong", "qk", "pv"])
  parser.add_argument("--backend", default="gpu", choices=["gpu", "interpret"], help="interpret: a CPU smoke run")
  args = parser.parse_args(argv)
  interpret = args.backend == "interpret"
  print(f"Mosaic GPU latencies on {jax.devices()[0].device_kind}, jax {jax.__version__}; one CTA, {args.reps} "
        "repetitions a call\n")
  print("| what | ns a repetition | check |")
  print("|---|---:|---|")
  x = jnp.zeros((1,), jnp.float32)
  for commit in (False, True) if "ping-pong" in args.forms else ():
    fn = jax.jit(ping_pong(args.reps, commit, interpret))
    ok = float(fn(x)[0]) == 1.0
    seconds = time_in_loop(fn, (x,), args.iters)
    print(f"| ping-pong{' + commit' if commit else ''} (a round trip: two hand-offs) | "
          f"{seconds / args.reps * 1e9:,.0f} | output {'ok' if ok else 'WRONG'} |", flush=True)
  keys = iter(jax.random.split(jax.random.key(0), 64))
  for form, entries, swizzle in itertools.product([f for f in args.forms if f != "ping-pong"], args.entries,
                                                   args.swizzle):
    if form == "pv" and entries % (swizzle // 2):  # P's rows (entries) must fill whole swizzle tiles
      print(f"| {form} wgmma, {entries} entries, {swizzle} B swizzle | — | a row of {entries} bf16 values is not a "
            f"multiple of the {swizzle} B swizzle |", flush=True)
      continue
    kernel, a_shape, b_shape = product(args.reps, form, entries, swizzle, interpret)
    a = (jax.random.normal(next(keys), a_shape) * 0.1).astype(jnp.bfloat16)
    b = (jax.random.normal(next(keys), b_shape) * 0.1).astype(jnp.bfloat16)
    fn = jax.jit(kernel)
    b_mat = b.T if form == "qk" else b
    want = args.reps * jnp.dot(a.astype(jnp.float32), b_mat.astype(jnp.float32)).sum(axis=1)
    err = float(jnp.max(jnp.abs(fn(a, b) - want)) / jnp.max(jnp.abs(want)))
    seconds = time_in_loop(fn, (a, b), args.iters)
    print(f"| {form} wgmma, {entries} entries ([{a_shape[0]}, {a_shape[1]}] · [{b_mat.shape[0]}, {b_mat.shape[1]}], "
          f"{swizzle} B swizzle) | "
          f"{seconds / args.reps * 1e9:,.0f} | rel err {err:.1e} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
