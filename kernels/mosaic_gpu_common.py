"""What the Mosaic GPU kernels share (`index_scores_mgpu.py`, `sparse_mla_mgpu.py`, `fp8_grouped_matmul_mgpu.py`,
`grouped_matmul_mgpu.py`, `topk_mgpu.py`): the shared-memory layout of a wgmma operand, their `interpret=` argument,
and their entry points jitted to lower once per launch."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def lowered_once_per_launch(*static_argnames: str):
  """A kernel's entry point jitted with its launch arguments (`static_argnames`) static. jit's trace cache gives
  every call with the same shapes, dtypes and launch arguments one jaxpr, which jax lowers once and calls from each
  site: a deep model's identical layers lower each kernel once, not once a layer (Mosaic GPU lowers a kernel in
  Python, ~0.1-0.2 s each; V3.2's 61 layers made that most of the CLI's lowering, benchmarks.lowering_time)."""
  return functools.partial(jax.jit, static_argnames=static_argnames)


def operand_transforms(plgpu, dtype, minor: int):
  """Tiling + the widest swizzle a [rows, minor] operand of `dtype` takes (wgmma reads it from shared memory).
  `plgpu`: `jax.experimental.pallas.mosaic_gpu`, which the kernels import only when they build a call."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(minor * bits)
  return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def interpret_params(plgpu, interpret):
  """A kernel's `interpret=` as `plgpu.kernel` takes it: True → Pallas's GPU interpreter with its defaults, a
  `plgpu.InterpretGPUParams` as given (the tests' race detection), False / None → compiled (None)."""
  return (plgpu.InterpretGPUParams() if interpret is True else interpret) or None
