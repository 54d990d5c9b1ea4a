"""The Mosaic GPU sparse-MLA kernel's static launch facts (`Plan`, filled by `sparse_mla_mgpu.sparse_mla_mgpu`) and one
CTA's refs (`Refs`), which the warpgroups' phases (`sparse_mla_mgpu_body.py`) read."""

from __future__ import annotations

import dataclasses
from typing import Any

# The gather warpgroup's registers a thread: with the scores' 232 and the values' 160, 496 of the 504 the launch's
# 3 × 128 threads share.
GATHER_REGISTERS = 104


@dataclasses.dataclass(frozen=True)
class Plan:
  """A launch's static facts (`sparse_mla_mgpu.sparse_mla_mgpu` fills them)."""

  plgpu: Any  # jax.experimental.pallas.mosaic_gpu, imported only where a call is built
  config: Any  # sparse_mla_mgpu.Config, completed by config_for
  t: int  # tokens a row: a query's batch row is its index // t
  e: int  # entries a step
  c: int  # latent width
  steps: int  # steps a split
  sets: int  # staging / operand buffer sets
  p_sets: int  # P / rescale buffer sets (the direct gather: one)
  pieces: int  # a latent row's TMA pieces (each ≤ 256 wide)
  width: int  # a piece's width
  hb: int  # heads a block (wgmma's M)
  groups: int  # an fp8 cache's scale groups a row; 0 for a 16-bit cache
  dtype: Any  # the operands' 16-bit dtype
  scale: float
  interpret: bool
  rows_layout: Any  # the row-contiguous re-layout's register layout, or None
  wgmma_rows: Any  # one value per head (row of the [64, ·] accumulators)
  wgmma_cols: Any  # one value per entry (column of the scores)
  ids_width: int  # slot ids a step's fetch copies: e rounded up to 128 bytes (a copy's size under Lane semantics)

  @property
  def half(self) -> int:
    return self.c // 2

  @property
  def scaled(self) -> bool:
    return self.groups > 0

  def at(self, ref, slot):
    """A step's set of a buffer or barrier (one set: the ref itself)."""
    return ref if self.sets == 1 else ref.at[slot]

  def p_slot(self, slot):
    """A step's P set (the rescale row's index too): its operand set's, or 0 where P has one set."""
    return slot if self.p_sets == self.sets else 0

  def p_at(self, ref, slot):
    """A step's set of P or of its barriers (one set: the ref itself)."""
    return ref if self.p_sets == 1 else ref.at[slot]

  @property
  def direct(self) -> bool:
    """The direct gather (cp.async into the operands, no staging: sparse_mla_mgpu_gather.py)."""
    return self.config.direct_gather


@dataclasses.dataclass(frozen=True)
class Refs:
  """One CTA's refs (HBM operands, shared-memory scratch, barriers) and grid indices."""

  q_lat_gmem: Any
  q_pe_gmem: Any
  lat_gmem: Any
  pe_gmem: Any
  slots_gmem: Any
  scale_gmem: Any
  out_gmem: Any
  lse_gmem: Any
  q_lat_smem: Any
  q_pe_smem: Any
  lat_stage: Any
  pe_stage: Any
  lat_op: Any
  pe_op: Any
  p_smem: Any
  small_smem: Any  # rows 0–1: two steps' slot ids; 2 .. 2 + p_sets − 1: a step's rescale (by P set); 2 + p_sets: the
  # sum
  scale_stage: Any  # an fp8 cache's selected scales, or None
  loaded: Any
  ids_loaded: Any
  gathered: Any
  op_ready: Any
  op_free: Any
  p_ready: Any
  done: Any
  written: Any
  hi: Any  # head block
  pi: Any  # split
  qi: Any  # query
  row: Any  # the query's batch row: its cache
  p_free: Any = None  # the values warpgroup done with the one P buffer (where P has fewer sets than the operands)
