"""Whether Pallas Mosaic GPU expresses FlashMLA's crossover, the sparse MLA's candidate for its gather's chain
(docs/mosaic_gpu_notes.md, "The Mosaic sparse MLA's remaining gap"): the two CTAs of a cluster (a query's two
64-head blocks) each re-lay half of a step's gathered rows through registers into their own swizzled wgmma operand
and, with `plgpu.async_store_smem` (PTX `st.async` into the peer's shared memory, completing bytes on the peer's
barrier), into the peer's; each then waits for the peer's half. Each CTA writes its whole operand out, so both must
equal the input.

    python tools/crossover_probe.py       # on a Hopper GPU: runs it and checks both operands; elsewhere: lowers it

What it established on a CPU (2026-12-05, jax 0.11.2 and 0.12.0.1): it lowers for CUDA; `async_store_smem` under Lane
semantics wants a tiled, swizzled destination and whole 128-byte transfers, and every thread of the storing warpgroup
arrives on the peer's barrier with its share of the bytes (so a barrier takes 128 arrivals a store); Pallas's GPU
interpreter refuses the cluster's scratch ("run_scoped interpret rule does not support collective axes"), so such a
kernel is testable only compiled. What a kernel would also need, not probed: a cluster barrier saying the peer's
consumers are done with an operand set before this CTA overwrites its half there.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

ROWS, WIDTH, HALF, PIECE = 32, 256, 16, 32  # a step's entries, a TMA box's width, a CTA's share, a store's columns


def rows_layout():
  """[16 rows, 32 columns]: a warp 4 rows, its lanes 4 rows x 8 pieces of 4 values."""
  from jax.experimental.mosaic.gpu import fragmented_array as mgpu_fa  # noqa: PLC0415
  return plgpu.Layout.TILED(mgpu_fa.Tiling(((HALF, PIECE), (4, PIECE), (4,))), warp_dims=(-5,), lane_dims=(-3, -2),
                            vector_dim=-1)


def cluster_kernel(body, x, barrier, interpret=False):
  """A 2-CTA cluster's kernel over `x` [ROWS, WIDTH]: `body(x_gmem, out_gmem, stage, operand, loaded, barrier)` with
  a [HALF, WIDTH] staging buffer, a swizzled [ROWS, WIDTH] operand (the double-buffered kernel's transforms), a TMA
  barrier and `barrier` (the exchange's); out [2, ROWS, WIDTH], each CTA's operand."""
  swizzled = (plgpu.TilingTransform((8, PIECE)), plgpu.SwizzleTransform(64))
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((2, ROWS, WIDTH), x.dtype),
      scratch_types=[plgpu.SMEM((HALF, WIDTH), x.dtype), plgpu.SMEM((ROWS, WIDTH), x.dtype, transforms=swizzled),
                     plgpu.Barrier(num_arrivals=1), barrier],
      grid=(1,), grid_names=("g",), cluster=(2,), cluster_names=("c",), num_threads=1, thread_name="wg",
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
      **({"interpret": True} if interpret else {}))(x)


def _body(x_gmem, out_gmem, stage, operand, loaded, landed):
  me = jax.lax.axis_index("c")
  plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(me * HALF, HALF)], stage, loaded)  # this CTA's half of the rows
  plgpu.barrier_wait(loaded)
  for col in range(0, WIDTH, PIECE):
    piece = plgpu.load(stage.at[:, pl.ds(col, PIECE)], layout=rows_layout(), optimized=False)
    mine = operand.at[pl.ds(me * HALF, HALF), pl.ds(col, PIECE)]
    mine[...] = piece
    plgpu.async_store_smem(piece, mine, landed, cluster_idx=1 - me, cluster_dim="c")  # the same rows, in the peer
  plgpu.commit_smem()
  plgpu.barrier_wait(landed)  # the peer's half has landed here
  plgpu.copy_smem_to_gmem(operand, out_gmem.at[me])
  plgpu.wait_smem_to_gmem(0)


def crossover(x, interpret=False):
  """[2, ROWS, WIDTH]: each CTA's operand after the exchange."""
  return cluster_kernel(_body, x, plgpu.Barrier(num_arrivals=128 * (WIDTH // PIECE)), interpret)


def main() -> int:
  x = jnp.asarray(np.arange(ROWS * WIDTH).reshape(ROWS, WIDTH) % 251, jnp.bfloat16)
  if jax.devices()[0].platform == "gpu":
    out = np.asarray(jax.jit(crossover)(x))
    ok = all(np.array_equal(out[i], np.asarray(x)) for i in (0, 1))
    print(f"crossover on {jax.devices()[0].device_kind}, jax {jax.__version__}: both operands "
          f"{'equal' if ok else 'DIFFER FROM'} the input")
    return 0 if ok else 1
  from jax.sharding import AbstractDevice, AbstractMesh, AxisType  # noqa: PLC0415
  h200 = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
  with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=h200)):
    text = jax.jit(crossover).trace(jax.ShapeDtypeStruct(x.shape, x.dtype)).lower(lowering_platforms=("cuda",)).as_text()
  print(f"crossover lowered for CUDA on jax {jax.__version__}: {'mosaic_gpu' in text}")
  try:
    crossover(x, interpret=True)
    print("Pallas's GPU interpreter ran it")
  except NotImplementedError as e:
    print(f"Pallas's GPU interpreter: {str(e).splitlines()[0]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
