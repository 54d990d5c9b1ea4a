"""Seconds to lower the CLI's two programs (the speculator's prefill and its greedy round) for a CUDA GPU, and which
Mosaic GPU kernels those seconds went to: the part of a first request's wait that runs in Python before XLA
compiles anything. Runs on any host (a CPU too): the programs are traced for an abstract H200 with abstract weights;
`--compile` lowers and compiles them for this process's own device instead, so on a GPU XLA's part is timed too.

    python -m benchmarks.lowering_time --layers 2 --batch 64 --prompt 4096
    python -m benchmarks.lowering_time --layers 61 --batch 8 --prompt 4096      # V3.2's full depth
    python -m benchmarks.lowering_time --layers 61 --batch 8 --moe-impl auto --compile   # on a GPU: XLA's part too

Why it exists: on 2026-12-07 the CLI's round at B = 64 over 4K prompts took 225 s to lower on an H100's host, most of
it Mosaic GPU's layout inference for the top-k kernel (11 s per layer and program); the kernel now lowers in
0.15-0.3 s (kernels/topk_mgpu.py). A kernel whose lowering grows with its body's size shows here before a user waits.

Per program: the lowering's seconds (trace + lowering to MLIR: `jax.export`'s, or with `--compile` the `.lower()`
the CLI runs), XLA's compile seconds (`--compile` only), then per kernel name the Mosaic GPU lowerings' count, total
and slowest seconds. Kernel times come from
wrapping `jax._src.pallas.mosaic_gpu.lowering.lower_jaxpr_to_module` (a private function: where a jax lacks it the
table says so rather than showing zeros).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, AxisType

import jax_mtp
from jax_mtp import fp8
from jax_mtp.model import init_target_params
from jax_mtp.request import pack_prompts, required_capacity, stop_id_array
from jax_mtp.sharding import SHARED_WITH_TARGET
from jax_mtp.speculative import SpecParams

H200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")


class KernelClock:
  """Seconds each Mosaic GPU kernel's lowering took, by kernel name, while installed."""

  def __init__(self):
    self.seconds: dict[str, list[float]] = collections.defaultdict(list)
    try:
      from jax._src.pallas.mosaic_gpu import lowering  # noqa: PLC0415 (private: see the module's docstring)
    except ImportError:
      lowering = None
    self._module = lowering if lowering is not None and hasattr(lowering, "lower_jaxpr_to_module") else None

  @property
  def available(self) -> bool:
    return self._module is not None

  def __enter__(self):
    if self.available:
      original = self._original = self._module.lower_jaxpr_to_module

      def timed(*args, **kwargs):
        start = time.perf_counter()
        result = original(*args, **kwargs)
        jaxpr = args[7] if len(args) > 7 else kwargs["jaxpr"]
        name = jaxpr.debug_info.func_name if jaxpr.debug_info else "?"
        self.seconds[name].append(time.perf_counter() - start)
        return result
      self._module.lower_jaxpr_to_module = timed
    return self

  def __exit__(self, *exc):
    if self.available:
      self._module.lower_jaxpr_to_module = self._original


def _abstract(x):
  return x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


def _program_args(cfg: jax_mtp.MtpConfig, prompts, weights: str = "bf16"):
  """(params, the prefill's arguments, greedy, stop ids): abstract, as `Speculator.generate` passes them; `weights`
  "fp8": the tree `--weights fp8` loads (codes + block scales)."""
  mtp = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(1))
  target = jax.eval_shape(lambda key: init_target_params(cfg, key), jax.random.key(0))
  drafter = {name: x for name, x in mtp.items() if name not in SHARED_WITH_TARGET}
  if weights == "fp8":
    target, drafter = (fp8.as_checkpoint_fp8(tree, cfg.fp8_block, fp8.abstract_fp8) for tree in (target, drafter))
  params = SpecParams(target, drafter)
  prompt_BT, lengths_B = pack_prompts(prompts)
  greedy, stop_N = np.float32(0), stop_id_array(cfg, [])
  args = jax.tree.map(_abstract, (*params, prompt_BT, lengths_B, jax.eval_shape(lambda: jax.random.key(0)), greedy,
                                  stop_N))
  return params, args, greedy, stop_N


def _round_args(params, state, max_new: int, greedy, stop_N):
  return jax.tree.map(_abstract, (*params, state, np.int32(max_new), greedy, stop_N))


def export_programs(cfg: jax_mtp.MtpConfig, prompts, max_new: int, k: int, weights: str = "bf16"):
  """(capacity, [(name, exported, seconds, {kernel: [seconds]} or None where this jax has no hook to time them)]) for
  the CLI's prefill and greedy round, exported for an abstract H200 at the capacity the CLI's request rule gives
  `prompts` (`request.required_capacity`). `cfg.moe_impl` must be explicit: tokamax's Mosaic GPU kernel (GPU `auto`)
  reads the local GPU when traced. `weights`: as `_program_args`. (tests/lowered_step.py reads the same programs'
  MLIR.)"""
  mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
  spec = jax_mtp.Speculator(cfg, mesh, k)
  capacity = required_capacity(cfg, prompts, max_new, k)
  params, args, greedy, stop_N = _program_args(cfg, prompts, weights)
  checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  rows = []
  with jax.sharding.use_abstract_mesh(mesh):
    for name in ("prefill", "round"):
      with KernelClock() as clock:
        start = time.perf_counter()
        exported = jax.export.export(spec.program(name, capacity, False, args), platforms=["cuda"],
                                     disabled_checks=checks)(*args)
        rows.append((name, exported, time.perf_counter() - start, dict(clock.seconds) if clock.available else None))
      if name == "prefill":
        args = _round_args(params, jax.tree.unflatten(exported.out_tree, exported.out_avals), max_new, greedy, stop_N)
  return capacity, rows


def compile_programs(cfg: jax_mtp.MtpConfig, prompts, max_new: int, k: int, weights: str = "bf16"):
  """(capacity, [(name, lowering seconds, XLA's compile seconds, {kernel: [seconds]} or None)]) for the same two
  programs on this process's first device, as `Speculator.generate` compiles them (`cfg.moe_impl` may be `auto`
  here); the arguments stay abstract, so no weights are allocated (a 61-layer V3.2 compiles on one GPU). The
  prefill's chunk follows the fixed byte budget: with no weights placed, the memory-sized one would be the same."""
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), k)
  capacity = required_capacity(cfg, prompts, max_new, k)
  params, args, greedy, stop_N = _program_args(cfg, prompts, weights)
  rows = []
  for name in ("prefill", "round"):
    with KernelClock() as clock:
      start = time.perf_counter()
      lowered = spec.program(name, capacity, False, args).lower(*args)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    rows.append((name, lowered_at - start, time.perf_counter() - lowered_at,
                 dict(clock.seconds) if clock.available else None))
    if name == "prefill":
      args = _round_args(params, compiled.out_info, max_new, greedy, stop_N)
  return capacity, rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=2, help="target layers (the first dense, the rest MoE)")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt", type=int, default=4096, help="prompt tokens per row")
  parser.add_argument("--max-new", type=int, default=512)
  parser.add_argument("-k", type=int, default=3)
  parser.add_argument("--moe-impl", default="mosaic_gpu", choices=jax_mtp.config.MOE_IMPLS,
                      help="routed experts (GPU `auto` reads the local GPU when traced: name one here)")
  parser.add_argument("--weights", default="bf16", choices=("bf16", "fp8"),
                      help="fp8: the weights `--weights fp8` keeps (codes + block scales; experts `auto` = the FP8 "
                           "kernel on a Hopper)")
  parser.add_argument("--compile", action="store_true",
                      help="lower and compile for this process's first device (a GPU: XLA's compile time too; "
                           "`--moe-impl auto` allowed) instead of exporting for an abstract H200")
  args = parser.parse_args(argv)
  cfg = jax_mtp.deepseek_v32().replace(num_hidden_layers=args.layers, first_k_dense_replace=min(1, args.layers - 1),
                                       moe_impl=args.moe_impl)
  prompts = [[5] * args.prompt] * args.batch
  if args.compile:
    capacity, rows = compile_programs(cfg, prompts, args.max_new, args.k, args.weights)
    target = f"compiled for {jax.devices()[0].device_kind}"
  else:
    capacity, exported = export_programs(cfg, prompts, args.max_new, args.k, args.weights)
    rows = [(name, seconds, None, kernels) for name, _, seconds, kernels in exported]
    target = f"exported for an abstract H200 on {jax.devices()[0].device_kind}"
  print(f"the CLI's programs {target}, jax {jax.__version__}: V3.2 width, {args.layers} target layers + the MTP layer, "
        f"B = {args.batch}, prompt {args.prompt}, capacity {capacity}, k = {args.k}, {args.weights} weights, experts "
        f"{args.moe_impl}\n")
  print("| program | lowering s | XLA compile s | Mosaic GPU kernel | lowerings | total s | slowest s |\n"
        "|---|---:|---:|---|---:|---:|---:|")
  for name, seconds, xla, kernels in rows:
    head = f"| {name} | {seconds:.1f} | {'—' if xla is None else f'{xla:.1f}'} |"
    if kernels is None:
      print(f"{head} (this jax has no lower_jaxpr_to_module to time) | | | |")
    for kernel, times in sorted((kernels or {}).items(), key=lambda item: -sum(item[1])):
      print(f"{head} {kernel} | {len(times)} | {sum(times):.2f} | {max(times):.2f} |")
    if kernels == {}:
      print(f"{head} none | | | |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
