"""What the grouped matmuls on Mosaic GPU share (`fp8_grouped_matmul_mgpu.py` over e4m3 codes,
`grouped_matmul_mgpu.py` over 16-bit weights): the transposed product's row tiles, the grid over the groups that
can hold rows, the launch sizes, and the store of a tile's rows.

Both multiply transposed, productᵀ [128 columns, tile rows] = wᵀ · xᵀ, so a group of a few rows (a decode step's
expert holds ~1–8) fills wgmma's M with the weight's 128 columns and costs only an N of 8–56 rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

BLOCK = 128  # the output columns a CTA owns, and the K depth of one pipelined step
# Rows a product (wgmma's N). Not 32 or 64: the total's [128, tile] fp32 staging rows would lie a multiple of 128 B
# apart, every row on the same banks, and Mosaic GPU refuses such a store ("avoids bank conflicts", jax 0.12)
ROW_TILES = (8, 16, 24, 40, 48, 56)
MAX_ROW_TILE = ROW_TILES[-1]  # the product and the total: 2 × 56 fp32 registers a thread
BUSY_CTAS = 264  # two CTAs per core of an H200 (132 SMs): the K loop is split until about this many have work


def active_groups(group_sizes_E: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
  """(expert ids [slots], their group sizes [slots]) of the non-empty groups in expert order, then slots of size 0
  (expert 0): at most A groups can hold rows, so `slots` = min(A, E) covers every non-empty one."""
  ids = jnp.nonzero(group_sizes_E > 0, size=slots, fill_value=0)[0].astype(jnp.int32)
  sizes = jnp.where(jnp.arange(slots) < jnp.count_nonzero(group_sizes_E), group_sizes_E[ids], 0)
  return ids, sizes.astype(jnp.int32)


def row_tile_for(rows: int, experts: int, subtiles: int) -> int:
  """The smallest of ROW_TILES ≥ twice a group's mean rows, plus the 7 rows a group's 8-aligned first tile may
  start before it (groups of one row need none); for one group (a dense linear) its rows over `subtiles`; else
  the largest."""
  mean = -(-rows // experts)
  want = -(-mean // subtiles) if experts == 1 else 2 * mean + (7 if mean > 1 else 0)
  return next((t for t in ROW_TILES if t >= want), MAX_ROW_TILE)


def split_k_for(rows: int, experts: int, k: int, n: int, row_programs: int, busy: int = BUSY_CTAS) -> int:
  """The fewest K parts (dividing K / 128) that give ≥ `busy` CTAs with rows (at most 16)."""
  blocks, ctas = k // BLOCK, min(rows, experts) * (n // BLOCK) * row_programs
  return next((s for s in range(1, blocks + 1) if blocks % s == 0 and (ctas * s >= busy or s >= 16)), 1)


def copy_step(x_gmem, w_gmem, x_slot, w_slot, barrier, *, expert, first, rows: int, kb, column, plgpu):
  """K step `kb`'s operands into one pipeline slot by TMA, both arriving on `barrier`: the activations [rows, 128]
  from row `first`, and `expert`'s weight block [128, 128] of the CTA's column block (codes or 16-bit values)."""
  plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(first, rows), pl.ds(kb * BLOCK, BLOCK)], x_slot, barrier)
  plgpu.copy_gmem_to_smem(w_gmem.at[expert, pl.ds(kb * BLOCK, BLOCK), pl.ds(column * BLOCK, BLOCK)], w_slot, barrier)


def store_rows(total, first, *, start, end, tile: int, part, column, total_smem, rows_smem, out_gmem, plgpu):
  """A tile's fp32 total [128 columns, tile rows] (wgmma's layout) out to rows `first` … of `out_gmem[part]`'s
  column block, only the rows in the group [start, end). wgmma's layout cannot be stored transposed (its column
  pairs would be rows 512 B apart), so through an untiled [128, tile] buffer read back transposed, one element a
  lane, then by TMA in power-of-two row counts (a TMA box is static): rows past the group (another group's,
  another CTA's) are never written."""
  total_smem[...] = total
  plgpu.commit_smem()
  rows_smem[...] = plgpu.load(total_smem.T, layout=plgpu.Layout.WG_STRIDED((tile, BLOCK), vec_size=1),
                              optimized=False)
  plgpu.commit_smem()
  skip = jnp.maximum(start - first, 0)  # the tile's rows before the group (its first tile only)
  valid = jnp.maximum(jnp.minimum(end - first, tile) - skip, 0)  # none: a subtile past the group
  offset, count = skip, 1 << (tile.bit_length() - 1)
  while count:
    @pl.when((valid & count) != 0)
    def _(count=count, offset=offset):
      plgpu.copy_smem_to_gmem(rows_smem.at[pl.ds(offset, count)],
                              out_gmem.at[part, pl.ds(first + offset, count), pl.ds(column * BLOCK, BLOCK)],
                              commit_group=False)
    offset, count = offset + (valid & count), count // 2
  plgpu.commit_smem_to_gmem_group()
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # rows_smem is rewritten by the next tile


def tiles_of_group(start, size, span: int):
  """(the 8-aligned first row, the number of `span`-row tiles) of a group: tiles start at a multiple of 8 rows, as
  a TMA copy into the tiled x buffer from a row that is not drops the rows past the next multiple of 8 (on the H200,
  2026-12-03; the interpreter copies them); the rows before the group are multiplied and not stored."""
  aligned = lax.div(start, 8) * 8
  return aligned, jnp.where(size > 0, lax.div(start + size - aligned + span - 1, span), 0)
