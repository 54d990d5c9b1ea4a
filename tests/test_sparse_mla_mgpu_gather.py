"""The sparse-MLA kernel's direct gather (kernels/sparse_mla_mgpu_gather.py): its per-thread cp.async copies put each
selected row where wgmma reads it — the tiled, 128-byte-swizzled operand, as Mosaic GPU's own TMA copy reads it back
— for both buffer sets, −1 ids reading row 0. Compiled on a GPU (the interpreter does not run `inline_mgpu`); on a
CPU the kernel is lowered for CUDA on this jax, and the copies are in its Mosaic GPU module."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp.kernels import sparse_mla_mgpu_gather as gather

ON_GPU = jax.devices()[0].platform == "gpu"
SLOTS = 1000  # cache rows


def _gather_kernel(parity: int):
  """A one-warpgroup kernel: the step's ids into shared memory, the rows copied into set `parity` of both operands
  by `issue_rows_cp_async`, then that set copied out by TMA (which reads the tiled, swizzled layout)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  def body(lat_gmem, pe_gmem, ids_gmem, lat_out, pe_out, ids_smem, lat_op, pe_op, bar):
    plgpu.copy_gmem_to_smem(ids_gmem, ids_smem, bar)
    plgpu.barrier_wait(bar)
    gather.issue_rows_cp_async(plgpu, ids_smem, parity, lat_gmem, pe_gmem, lat_op, pe_op)
    gather.wait_cp_async(plgpu)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(lat_op.at[parity], lat_out)
    plgpu.copy_smem_to_gmem(pe_op.at[parity], pe_out)
    plgpu.wait_smem_to_gmem(0)

  transforms = gather.operand_transforms(plgpu)
  rows = gather.ROWS
  return plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((rows, gather.LATENT), jnp.bfloat16),
                jax.ShapeDtypeStruct((rows, gather.ROPE), jnp.bfloat16)),
      scratch_types=[plgpu.SMEM((2, rows), jnp.int32),
                     plgpu.SMEM((2, rows, gather.LATENT), jnp.bfloat16, transforms=transforms),
                     plgpu.SMEM((2, rows, gather.ROPE), jnp.bfloat16, transforms=transforms),
                     plgpu.Barrier(num_arrivals=1)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
  )


def _operands(parity: int):
  latent = jax.random.normal(jax.random.key(0), (SLOTS, gather.LATENT), jnp.bfloat16)
  rope = jax.random.normal(jax.random.key(1), (SLOTS, gather.ROPE), jnp.bfloat16)
  ids = jax.random.randint(jax.random.key(2 + parity), (gather.ROWS,), -1, SLOTS).at[5].set(-1).at[6].set(SLOTS - 1)
  other = jnp.full((gather.ROWS,), SLOTS + 7, jnp.int32)  # the other buffer's ids: out of range, never read
  return latent, rope, (jnp.stack([ids, other]) if parity == 0 else jnp.stack([other, ids])), ids


@pytest.mark.parametrize("parity", [0, 1])
def test_the_direct_gathers_copies_lower_for_cuda(parity):
  """The copies lower through Mosaic GPU for CUDA on this jax (a jax whose inline_mgpu records a write on every ref
  takes the read-only HBM inputs), and the program holds cp.async."""
  latent, rope, ids, _ = _operands(parity)
  text = jax.jit(_gather_kernel(parity)).trace(latent, rope, ids).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text and ("cp.async" in text or "cp_async" in text)


@pytest.mark.skipif(not ON_GPU, reason="compiled only: the interpreter does not run inline_mgpu")
@pytest.mark.parametrize("parity", [0, 1])
def test_the_direct_gathers_rows_land_where_wgmma_reads_them(parity):
  """Each of the 64 rows (latent and rope) read back from the swizzled operand equals its cache row: the copies'
  addresses are Mosaic GPU's tiled, swizzled layout of that set."""
  latent, rope, ids, want = _operands(parity)
  lat_out, pe_out = jax.jit(_gather_kernel(parity))(latent, rope, ids)
  rows = np.maximum(np.asarray(want), 0)
  for got, cache, name in ((lat_out, latent, "latent"), (pe_out, rope, "rope")):
    expected = np.asarray(cache)[rows]
    assert np.array_equal(np.asarray(got), expected), f"{name}: {_misplaced(np.asarray(got), expected)}"


def _misplaced(got: np.ndarray, want: np.ndarray, show: int = 6) -> str:
  """Where the first wrong 16-byte chunks of `got` came from in `want` ((row, chunk) → (row, chunk) or 'nowhere'):
  a wrong swizzle or tile stride shows as a pattern here."""
  chunks = lambda x: x.reshape(x.shape[0], -1, 8)  # noqa: E731  (8 bf16 values: one 16-byte copy)
  g, w = chunks(got), chunks(want)
  where = {w[i, j].tobytes(): (i, j) for i in range(w.shape[0]) for j in range(w.shape[1])}
  wrong = [(i, j) for i in range(g.shape[0]) for j in range(g.shape[1]) if not np.array_equal(g[i, j], w[i, j])]
  return f"{len(wrong)} of {g.shape[0] * g.shape[1]} chunks wrong; " + ", ".join(
      f"{ij} holds {where.get(g[ij].tobytes(), 'nowhere')}" for ij in wrong[:show])
