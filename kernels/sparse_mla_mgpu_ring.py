"""The Mosaic GPU sparse MLA's gather warpgroup with a landing ring (`sparse_mla_mgpu.Config.landing_ring`): a step's
selected rows land in a ring of `RING_SLOTS` groups of `GROUP_ROWS` rows, each re-laid into the step's operand set
while the next groups' copies fly, instead of a whole staging set a step.

Why: the step's products cost less a entry the more entries a step has (docs/kernels.md, "The sparse MLA's step":
qk 577 ns at 32 entries, 669-689 at 48), and two sets of 48-entry operands fit a CTA's shared memory only without a
staging copy of each set (309 KB with one, 227 KiB the limit). The ring holds 3 × 8 rows (27 KiB over a bf16 cache).

The order, per step s (operand set s % 2) and group g of its GROUPS = block_entries / GROUP_ROWS:
    wait group g landed (ring slot g % RING_SLOTS); at g = 0 wait for step s − 2's dots to free the set
    re-lay the group's rows into the set's operand rows [8g, 8g + 8); commit (a warpgroup barrier)
    copy group g + RING_SLOTS (this step's, or the next step's first ones) into the ring slot just re-laid
and after the last group the set is ready. GROUPS is a multiple of RING_SLOTS, so a group's ring slot is static.
A step's slot ids are read by the copies of its groups, which run from the previous step's group RING_SLOTS on
to its own group GROUPS − 1 − RING_SLOTS: the ids of step s + 2 are fetched into its buffer after that last copy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jax_mtp.kernels.sparse_mla_mgpu_plan import GATHER_REGISTERS

GROUP_ROWS = 8  # rows a landing group: a tiled operand's row tile, so a group's re-layout is a whole tile's store
RING_SLOTS = 3  # groups in the ring: two in flight while one is re-laid
RING_ENTRIES = 48  # entries a step: two operand sets of 48 beside the ring fit 227 KiB at V3.2's widths (64 do not)


def group_layout(plgpu):
  """The register layout of a group's re-layout ([8, ·] latent pieces and rope key): a warp one [8, 16] tile of each
  64 columns, its lanes 8 rows × 4 pieces of 8 B, so each warp's store fills one 32-byte-swizzled tile (16-B pieces,
  a warp 32 columns, have no store without bank conflicts at this swizzle: the lowering refuses it)."""
  from jax.experimental.mosaic.gpu import fragmented_array as mgpu_fa  # noqa: PLC0415
  return plgpu.Layout.TILED(mgpu_fa.Tiling(((GROUP_ROWS, 64), (GROUP_ROWS, 16), (4,))), warp_dims=(-4,),
                            lane_dims=(-3, -2), vector_dim=-1)


def _issue_group(plan, r, ids, group: int, ring_slot: int):
  """TMA copies of a step's rows [group · 8, group · 8 + 8) into a ring slot, from the gather's first issue_warps
  warps (an invalid slot, −1, reads row 0: the scores mask it)."""
  plgpu, config = plan.plgpu, plan.config
  lat_to, pe_to, landed = r.lat_stage.at[ring_slot], r.pe_stage.at[ring_slot], r.gathered.at[ring_slot]

  def rows(first, stride):
    @pl.loop(first, GROUP_ROWS, step=stride)
    def _(i):
      slot = jnp.maximum(ids[group * GROUP_ROWS + i], 0)
      plgpu.copy_gmem_to_smem(r.lat_gmem.at[r.row, pl.ds(slot, 1)], lat_to.at[pl.ds(i, 1)], landed)
      plgpu.copy_gmem_to_smem(r.pe_gmem.at[r.row, pl.ds(slot, 1)], pe_to.at[pl.ds(i, 1)], landed)

  if config.issue_warps == 1:
    rows(0, 1)
  else:
    plgpu.warp_map(lambda warp: pl.when(warp < config.issue_warps)(lambda: rows(warp, config.issue_warps)))


def _relayout_group(plan, r, ring_slot: int, op_set, group: int):
  """A landed group → registers → the operand set's rows [group · 8, group · 8 + 8)."""
  plgpu = plan.plgpu
  lat_op, pe_op = plan.at(r.lat_op, op_set), plan.at(r.pe_op, op_set)
  rows = pl.ds(group * GROUP_ROWS, GROUP_ROWS)
  landed_lat, landed_pe = r.lat_stage.at[ring_slot], r.pe_stage.at[ring_slot]
  for j in range(plan.pieces):
    lat_op[rows, pl.ds(j * plan.width, plan.width)] = plgpu.load(landed_lat.at[:, j], layout=plan.rows_layout,
                                                                 optimized=False)
  pe_op[rows, :] = plgpu.load(landed_pe, layout=plan.rows_layout, optimized=False)


def ring_gather(plan, r, fetch_ids, ids_of):
  """The gather warpgroup over a landing ring (see the module's docstring). `fetch_ids(step)` copies a step's slot
  ids into buffer step % 2 (arriving on ids_loaded[step % 2]); `ids_of(step)` is that buffer."""
  plgpu, steps = plan.plgpu, plan.steps
  groups = plan.e // GROUP_ROWS
  plgpu.set_max_registers(GATHER_REGISTERS, action="decrease")
  fetch_ids(0)
  pl.when(steps > 1)(lambda: fetch_ids(1))
  plgpu.barrier_wait(r.ids_loaded.at[0])
  for g in range(RING_SLOTS):
    _issue_group(plan, r, ids_of(0), g, g)

  @pl.loop(0, steps)
  def _(step):
    op_set = step % 2
    for g in range(groups):
      ring_slot = g % RING_SLOTS
      with jax.named_scope("gather wait"):
        plgpu.barrier_wait(r.gathered.at[ring_slot])
        if g == 0:  # step − 2's dots done with this operand set
          pl.when(step >= 2)(lambda: plgpu.barrier_wait(plan.at(r.op_free, op_set)))
      with jax.named_scope("relayout"):
        _relayout_group(plan, r, ring_slot, op_set, g)
        plgpu.commit_smem()  # every warp's reads of the slot done before its next copies land
      following = g + RING_SLOTS
      if following < groups:  # this step's group
        _issue_group(plan, r, ids_of(step), following, ring_slot)
        if following == groups - 1:  # this step's ids read for the last time: step + 2's into their buffer
          plgpu.commit_smem()
          pl.when(step + 2 < steps)(lambda: fetch_ids(step + 2))
      else:  # the next step's group
        def issue_next(following=following, ring_slot=ring_slot):
          if following == groups:
            plgpu.barrier_wait(r.ids_loaded.at[(step + 1) % 2])
          _issue_group(plan, r, ids_of(step + 1), following - groups, ring_slot)
        pl.when(step + 1 < steps)(issue_next)
    plgpu.barrier_arrive(plan.at(r.op_ready, op_set))

  for last in range(max(steps - 2, 0), steps):  # the last steps' completions: a waiter observes every one
    plgpu.barrier_wait(plan.at(r.op_free, last % 2))
