"""The sparse-MLA kernel's direct gather (`Config.direct_gather`): each selected row copied by the gather warpgroup's
128 threads, 16 bytes a `cp.async` each, straight from HBM into its row of wgmma's tiled, 128-byte-swizzled operand,
where the other forms land a row by TMA in an untiled staging buffer and re-lay it through registers.

Why: a one-row TMA copy cannot land in a tiled operand (Hopper has no TMA gather; Mosaic GPU refuses a copy whose
rows are not whole tiles), so those forms spend 72 KiB of shared memory on staging and a register round trip on every
step (the re-layout, about half of the gather's chain: docs/mosaic_gpu_notes.md). A per-thread copy computes its own
swizzled address, as FlashMLA's gather does with its warps' loads, so the staging goes and its shared memory holds a
second 64-entry operand set: two steps of 64 in flight where the re-laid form fits two of 32.

Layout written here (Mosaic GPU's tiled, swizzled memref of a [E, W] 16-bit buffer with `TilingTransform((8, 64))`
and `SwizzleTransform(128)`): tiles of 8 rows × 64 values (1,024 bytes), row-major over [E / 8, W / 64]; inside a
tile, row i's 16-byte chunk j at byte i · 128 + ((j ⊕ i) · 16) — the hardware's 128-byte swizzle, which Mosaic's
own transfers compute as the offset's bits 4–6 XOR its bits 7–9 (`fragmented_array`). The GPU test
`test_the_direct_gathers_rows_land_where_wgmma_reads_them` checks it against the rows read back by TMA.

Thread map: warp w copies rows 16w … 16w + 15 of the step; for each row its 32 lanes copy the 64 chunks of the
512-value latent (lane l: chunks l and l + 32, so a warp writes four whole 128-byte tile rows at once, no bank
conflicts), and the rope's 16 rows × 8 chunks are a lane's four chunks. 36 copies a thread a step.

Compiled only: Pallas's GPU interpreter does not run `inline_mgpu`, so there the body lands each row by TMA copies
into the same tiled operand (`copy_rows_by_tma`), the same hand-offs around it."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 64  # a step's entries: 4 warps × 16 rows
LATENT = 512  # values a latent row: 64 chunks of 16 bytes, two a lane
ROPE = 64  # values a rope row: 8 chunks of 16 bytes
OPERAND_TILE = (8, 64)  # 8 rows × 128 bytes of 16-bit values, 128-byte swizzle
SWIZZLE = 128


def operand_transforms(plgpu):
  """The tiled, 128-byte-swizzled layout the copies write (both operands: a 16-bit latent and rope)."""
  return plgpu.TilingTransform(OPERAND_TILE), plgpu.SwizzleTransform(SWIZZLE)


def _ref_type(plgpu, transforms=(), write=True):
  """inline_mgpu's ref type; a read-only HBM input says so where this jax lets it (jax ≥ 0.12 records a write effect
  on every ref argument otherwise, which a kernel's input refs refuse)."""
  if not write and "write" in {f.name for f in dataclasses.fields(plgpu.RefType)}:
    return plgpu.RefType(transforms, write=False)
  return plgpu.RefType(transforms)


def issue_rows_cp_async(plgpu, ids_smem, parity: int, lat_gmem_row, pe_gmem_row, lat_op, pe_op, dtype_bytes: int = 2):
  """cp.async of the 64 rows whose slot ids are `ids_smem[parity]` (−1: row 0, masked by the scores) from
  `lat_gmem_row` [S, …] / `pe_gmem_row` [S, ROPE] (one batch row's cache, row-major) into set `parity` of `lat_op`
  [2, ROWS, LATENT] / `pe_op` [2, ROWS, ROPE] (tiled and swizzled as `operand_transforms`), committed as one cp.async
  group. Every thread of the calling warpgroup calls it."""
  from jax._src.lib.mlir import ir  # noqa: PLC0415 (a GPU backend's lowering, imported only where a call is built)
  from jax._src.lib.mlir.dialects import arith, llvm, memref, nvvm  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import utils as mgpu_utils  # noqa: PLC0415

  transforms = operand_transforms(plgpu)
  tiles_a_row = LATENT * dtype_bytes // SWIZZLE  # 128-byte chunks of 8 · 16 bytes across a latent row: 8

  @plgpu.inline_mgpu(arg_types=(_ref_type(plgpu, write=False), _ref_type(plgpu, write=False),
                                _ref_type(plgpu, write=False), _ref_type(plgpu, transforms),
                                _ref_type(plgpu, transforms)))
  def issue(ctx, ids, lat, pe, op, pe_dst):
    del ctx
    i8, i32, i64 = (ir.IntegerType.get_signless(bits) for bits in (8, 32, 64))
    index = ir.IndexType.get()

    def c32(value):
      return arith.constant(i32, value)

    def load_slot(row):  # a row's slot id, −1 read as 0
      slot = memref.load(ids, [arith.constant(index, parity), arith.index_cast(index, row)])
      return arith.extui(i64, arith.maxsi(slot, c32(0)))

    def copy(dst_base, dst_offset, src_base, src_offset):
      nvvm.cp_async_shared_global(mgpu_utils.getelementptr(dst_base, [dst_offset], i8),
                                  mgpu_utils.getelementptr(src_base, [src_offset], i8), 16,
                                  nvvm.LoadCacheModifierKind.CG)

    thread = arith.remui(mgpu_utils.thread_idx(), c32(128))
    warp, lane = arith.shrui(thread, c32(5)), arith.andi(thread, c32(31))
    lane_tile, lane_chunk = arith.shrui(lane, c32(3)), arith.andi(lane, c32(7))
    global_space = llvm.PointerType.get(address_space=1)
    lat_src = llvm.addrspacecast(global_space, mgpu_utils.memref_ptr(lat))
    pe_src = llvm.addrspacecast(global_space, mgpu_utils.memref_ptr(pe))
    lat_dst, pe_dst_base = mgpu_utils.memref_ptr(op), mgpu_utils.memref_ptr(pe_dst)
    lat_set = parity * ROWS * LATENT * dtype_bytes
    pe_set = parity * ROWS * ROPE * dtype_bytes
    tile_bytes = OPERAND_TILE[0] * SWIZZLE
    for j in range(16):  # the warp's rows: row % 8 = j % 8 is static, so each lane's swizzled chunk is one XOR
      row = arith.addi(arith.muli(warp, c32(16)), c32(j))
      src_row = arith.muli(load_slot(row), arith.constant(i64, LATENT * dtype_bytes))
      tile_row = arith.addi(arith.muli(warp, c32(2)), c32(j // 8))  # the row's tile row, row // 8
      row_base = arith.addi(arith.muli(tile_row, c32(tiles_a_row * tile_bytes)), c32(lat_set + (j % 8) * SWIZZLE))
      chunk_in_tile = arith.shli(arith.xori(lane_chunk, c32(j % 8)), c32(4))
      for half in range(2):  # chunk lane + 32 · half of the row: tile lane // 8 + 4 · half, position lane % 8
        dst = arith.addi(row_base, arith.addi(arith.muli(arith.addi(lane_tile, c32(4 * half)), c32(tile_bytes)),
                                              chunk_in_tile))
        src = arith.addi(src_row, arith.extui(i64, arith.shli(arith.addi(lane, c32(32 * half)), c32(4))))
        copy(lat_dst, dst, lat_src, src)
    for q in range(4):  # the rope: rows 16w + 4q + lane // 8, chunk lane % 8
      row = arith.addi(arith.muli(warp, c32(16)), arith.addi(c32(4 * q), lane_tile))
      row_in_tile = arith.andi(row, c32(7))
      dst = arith.addi(arith.addi(c32(pe_set), arith.muli(arith.shrui(row, c32(3)), c32(tile_bytes))),
                       arith.addi(arith.shli(row_in_tile, c32(7)), arith.shli(arith.xori(lane_chunk, row_in_tile),
                                                                              c32(4))))
      src = arith.addi(arith.muli(load_slot(row), arith.constant(i64, ROPE * dtype_bytes)),
                       arith.extui(i64, arith.shli(lane_chunk, c32(4))))
      copy(pe_dst_base, dst, pe_src, src)
    nvvm.cp_async_commit_group()

  issue(ids_smem, lat_gmem_row, pe_gmem_row, lat_op, pe_op)


def wait_cp_async(plgpu):
  """Wait until this thread's cp.async groups have all landed (then a proxy fence and a warpgroup barrier,
  `commit_smem`, make every thread's rows visible to wgmma)."""
  from jax._src.lib.mlir.dialects import nvvm  # noqa: PLC0415

  @plgpu.inline_mgpu()
  def wait(ctx):
    del ctx
    nvvm.cp_async_wait_group(0)

  wait()


def copy_rows_by_tma(plgpu, ids, lat_gmem_row, pe_gmem_row, lat_op_set, pe_op_set, pieces: int, width: int,
                     landed):
  """The interpreter's stand-in for `issue_rows_cp_async`: each row's latent pieces and rope by TMA into the same
  operand rows (the interpreter takes a one-row copy into a tiled buffer; the CUDA lowering does not), all on
  `landed` (ROWS · (pieces + 1) arrivals)."""
  @pl.loop(0, ROWS)
  def _(i):
    slot_id = jnp.maximum(ids[i], 0)
    for j in range(pieces):
      plgpu.copy_gmem_to_smem(lat_gmem_row.at[pl.ds(slot_id, 1), j],
                              lat_op_set.at[pl.ds(i, 1), pl.ds(j * width, width)], landed)
    plgpu.copy_gmem_to_smem(pe_gmem_row.at[pl.ds(slot_id, 1)], pe_op_set.at[pl.ds(i, 1)], landed)
