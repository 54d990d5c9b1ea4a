"""The Mosaic GPU sparse-MLA kernel's body (`sparse_mla_mgpu.py` builds the launch): one CTA's query, 64-head block and
split of the selected slots, in three warpgroups, each a named phase here:

  gather   (`_gather`) TMA-copies each step's selected rows into a staging set (`_issue`), waits for them, re-lays
           them into wgmma's swizzled operands (`_relayout`, dequantising an fp8 cache's codes) and signals the set
           ready; it copies ahead by the number of buffer sets.
  scores   (`_scores`) q~ · latentᵀ + q_pe · k_peᵀ, the masked online softmax, P and its rescale for the values
           warpgroup, then O[:, :C/2] += P · latent[:, :C/2]; at the end the log-sum-exp and its half of the output.
  values   (`_values`) O[:, C/2:] = O · rescale + P · latent[:, C/2:]; at the end its half of the output.

`Plan` holds the launch's static facts, `Refs` the CTA's refs and grid indices (`sparse_mla_mgpu_plan.py`); the phases
only read them. The
phases' named scopes (`jax.named_scope`: "gather wait", "relayout", "scores wait", "qk", "softmax", "pv", "values
wait", "values pv") are the ranges Mosaic GPU's on-device profiler records when a launch asks for one
(`sparse_mla_mgpu(profile_dir=...)`); otherwise they lower to nothing."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mtp.kernels import sparse_mla_mgpu_gather as gather
from jax_mtp.kernels.sparse_mla_mgpu_plan import GATHER_REGISTERS, Plan, Refs

_NEG_INIT = -1e30  # the running max starts finite: exp(−∞ − (−∞)) would be NaN
_LOG2E = math.log2(math.e)


def body_for(plan: Plan):
  """The kernel body `plgpu.kernel` calls with the operands, the outputs and the scratch (in sparse_mla_mgpu's order)."""

  def body(q_lat_gmem, q_pe_gmem, lat_gmem, pe_gmem, slots_gmem, *refs):
    scale_gmem = refs[0] if plan.scaled else None
    refs = list(refs[plan.scaled:])
    if plan.direct:  # no staging; a p_free barrier last
      refs[4:4] = [None, None]
    p_free = refs.pop() if plan.p_sets < plan.sets else None
    (out_gmem, lse_gmem, q_lat_smem, q_pe_smem, lat_stage, pe_stage, lat_op, pe_op, p_smem, small_smem,
     *scale_stage, loaded, ids_loaded, gathered, op_ready, op_free, p_ready, done, written) = refs
    hi, pi, qi = lax.axis_index("h"), lax.axis_index("p"), lax.axis_index("q")
    wg = lax.axis_index("wg")
    r = Refs(q_lat_gmem, q_pe_gmem, lat_gmem, pe_gmem, slots_gmem, scale_gmem, out_gmem, lse_gmem, q_lat_smem,
             q_pe_smem, lat_stage, pe_stage, lat_op, pe_op, p_smem, small_smem, scale_stage[0] if scale_stage else None,
             loaded, ids_loaded, gathered, op_ready, op_free, p_ready, done, written, hi, pi, qi, qi // plan.t, p_free)
    pl.when(wg == 2)(lambda: (_gather_direct if plan.direct else _gather)(plan, r))
    pl.when(wg == 0)(lambda: _scores(plan, r))
    pl.when(wg == 1)(lambda: _values(plan, r))

  return body


def _ids_smem(plan: Plan, r: Refs):
  """The slot ids of steps s, at s % 2."""
  return r.small_smem.at[pl.ds(0, 2), pl.ds(0, plan.e)]


def _put_row(plan: Plan, r: Refs, i, x):
  """An f32 [64] row vector for the other warpgroup, as int32 bits (i: a P set's rescale, or p_sets: the sum)."""
  r.small_smem.at[2 + i, pl.ds(0, plan.hb)][...] = lax.bitcast_convert_type(x, jnp.int32)


def _get_row(plan: Plan, r: Refs, i):
  return lax.bitcast_convert_type(plan.plgpu.load(r.small_smem.at[2 + i, pl.ds(0, plan.hb)], layout=plan.wgmma_rows),
                                  jnp.float32)


def _accumulate(plan: Plan, acc, a, b_ref):
  """acc + a · b on the tensor cores, accumulated in place."""
  plgpu = plan.plgpu
  if plan.interpret:  # Pallas's GPU interpreter does not run pl.run_state (jax 0.12): a fresh product, added
    return acc + pl.run_scoped(lambda ref: (plgpu.wgmma(ref, a, b_ref), ref[...])[1], plgpu.ACC(acc.shape))
  return pl.run_state(lambda ref: plgpu.wgmma(ref, a, b_ref))(plgpu.ACC.init(acc))


def _write(plan: Plan, r: Refs, acc, l, col):
  """This warpgroup's half of the normalised partial output."""
  plgpu, hb, half = plan.plgpu, plan.hb, plan.half
  norm = jnp.where(l > 0, l, 1.0)
  out = (acc / lax.broadcast_in_dim(norm, acc.shape, [0])).astype(r.out_gmem.dtype)
  if jnp.dtype(r.out_gmem.dtype).itemsize == 4:  # straight from registers: a quad's 4 × 8 B are whole sectors
    r.out_gmem.at[r.qi, r.pi, pl.ds(r.hi * hb, hb), pl.ds(col, half)][...] = out
    return
  # 16-bit: both halves into q~'s buffer (free once the last step's scores are done: the values half waits for
  # them), then one TMA copy by the scores warpgroup, since a quad's 4 × 4 B would store half sectors
  r.q_lat_smem[:, pl.ds(col, half)] = out
  plgpu.commit_smem()
  if col:
    plgpu.barrier_arrive(r.written)
    return
  plgpu.barrier_wait(r.written)
  plgpu.copy_smem_to_gmem(r.q_lat_smem, r.out_gmem.at[r.qi, r.pi, pl.ds(r.hi * hb, hb)])
  plgpu.wait_smem_to_gmem(0)


def _fetch_ids(plan: Plan, r: Refs, step):
  """A step's slot ids into shared memory, two steps' worth in flight (ids_width of them: past the step's e, the
  next step's or the launch's padding)."""
  e, width = plan.e, plan.ids_width
  plan.plgpu.copy_gmem_to_smem(r.slots_gmem.at[r.qi, r.pi, pl.ds(step * e, width)],
                               r.small_smem.at[step % 2, pl.ds(0, width)], r.ids_loaded.at[step % 2])


def _issue_rows(plan: Plan, r: Refs, ids, first, stride, lat_to, pe_to, landed):
  """TMA copies of rows first, first + stride, ... of a step (an invalid slot, −1, reads row 0: the scores mask it)."""
  plgpu, pieces, width = plan.plgpu, plan.pieces, plan.width

  @pl.loop(first, plan.e, step=stride)
  def _(i):
    slot = jnp.maximum(ids[i], 0)
    if plan.config.whole_rows:  # one [1, pieces, width] box: each dimension within TMA's 256
      plgpu.copy_gmem_to_smem(r.lat_gmem.at[r.row, pl.ds(slot, 1)], lat_to.at[pl.ds(i, 1)], landed)
    else:  # one copy a piece: a TMA box is at most 256 wide
      for j in range(pieces):
        plgpu.copy_gmem_to_smem(r.lat_gmem.at[r.row, pl.ds(slot, 1), j],
                                lat_to.at[pl.ds(i, 1), j, pl.ds(0, width)], landed)
    plgpu.copy_gmem_to_smem(r.pe_gmem.at[r.row, pl.ds(slot, 1)], pe_to.at[pl.ds(i, 1)], landed)


def _issue(plan: Plan, r: Refs, step):
  """One TMA a selected row (or piece of one) into the step's staging set, once its ids have landed."""
  plgpu, config, sets, e = plan.plgpu, plan.config, plan.sets, plan.e
  plgpu.barrier_wait(r.ids_loaded.at[step % 2])
  ids = _ids_smem(plan, r).at[step % 2]
  to = (plan.at(r.lat_stage, step % sets), plan.at(r.pe_stage, step % sets), plan.at(r.gathered, step % sets))
  if config.issue_warps == 1:
    _issue_rows(plan, r, ids, 0, 1, *to)
  else:  # each of the first issue_warps warps a share of the rows, from its own elected thread
    plgpu.warp_map(lambda warp: pl.when(warp < config.issue_warps)(
        lambda: _issue_rows(plan, r, ids, warp, config.issue_warps, *to)))
  if plan.scaled:
    plgpu.copy_gmem_to_smem(r.scale_gmem.at[r.qi, r.pi, :, pl.ds(step * e, e)], plan.at(r.scale_stage, step % sets),
                            plan.at(r.gathered, step % sets))


def _relayout(plan: Plan, r: Refs, slot):
  """A landed staging set → registers → its operand set (tiled, swizzled), an fp8 cache's codes dequantised.

  With two sets: a TMA piece's columns a load, or a scale group's over an fp8 cache."""
  plgpu, c, e, width, pieces, dtype, rows_layout = (plan.plgpu, plan.c, plan.e, plan.width, plan.pieces, plan.dtype,
                                                    plan.rows_layout)
  lat_stage_s, pe_stage_s, lat_op_s, pe_op_s = (plan.at(ref, slot) for ref in (r.lat_stage, r.pe_stage, r.lat_op,
                                                                                r.pe_op))
  if plan.sets == 2:  # rows_layout: a warp 8 rows × 4 lanes' 16-B pieces (see sparse_mla_mgpu)
    group_width = c // plan.groups if plan.scaled else width
    for col in range(0, c, group_width):
      src = lat_stage_s.at[:, col // width, pl.ds(col % width, group_width)]
      if plan.scaled:  # codes times their rows' group scale, in fp32 (exact for e4m3), rounded once to the operand's
        codes = plgpu.load(src, layout=rows_layout, optimized=False)  # dtype; 8 B a lane from rows 512 B apart:
        # conflicts no plan avoids
        group_scale = plgpu.load(plan.at(r.scale_stage, slot).at[col // group_width], layout=rows_layout.reduce(1),
                                 optimized=False)
        row_scale = plgpu.layout_cast(lax.broadcast_in_dim(group_scale, codes.shape, [0]), rows_layout)
        lat_op_s[:, pl.ds(col, group_width)] = (codes.astype(jnp.float32) * row_scale).astype(dtype)
      else:  # each warp reads 512 contiguous bytes of one row's piece: no conflicts
        lat_op_s[:, pl.ds(col, group_width)] = plgpu.load(src, layout=rows_layout)
    pe_op_s[...] = plgpu.load(pe_stage_s, layout=rows_layout, optimized=False)
    return
  if rows_layout is not None and not plan.scaled:  # each warp reads 512 contiguous bytes of one row: no conflicts
    for rb in range(0, e, 32):
      for j in range(pieces):
        lat_op_s[pl.ds(rb, 32), pl.ds(j * width, width)] = plgpu.load(lat_stage_s.at[pl.ds(rb, 32), j],
                                                                      layout=rows_layout)
  else:  # 64-column pieces in WGMMA's layout
    for col in range(0, c, 64):
      piece = plgpu.load(lat_stage_s.at[:, col // width, pl.ds(col % width, 64)], layout=plgpu.Layout.WGMMA,
                         optimized=False)
      if plan.scaled:  # codes · their group's scale, in fp32 (exact for e4m3), rounded once to the operand's dtype
        group_scale = plgpu.load(r.scale_stage.at[col // (c // plan.groups)], layout=plan.wgmma_rows)
        piece = (piece.astype(jnp.float32) * lax.broadcast_in_dim(group_scale, piece.shape, [0])).astype(dtype)
      lat_op_s[:, pl.ds(col, 64)] = piece
  pe_op_s[...] = plgpu.load(pe_stage_s, layout=plgpu.Layout.WGMMA, optimized=False)


def _gather(plan: Plan, r: Refs):
  """The gather warpgroup: copies `sets` steps ahead, re-lays each landed step into its operand set."""
  plgpu, sets, steps = plan.plgpu, plan.sets, plan.steps
  plgpu.set_max_registers(GATHER_REGISTERS, action="decrease")
  _fetch_ids(plan, r, 0)
  pl.when(steps > 1)(lambda: _fetch_ids(plan, r, 1))
  for first in range(min(sets, steps)):  # the first `sets` steps' copies, each into its own staging set
    _issue(plan, r, first)
  # the warps that issued those copies read their ids from the buffers the loop's first two steps fetch into: a
  # warpgroup barrier first (later steps pass one in each re-layout's commit; the interpreter's race detector caught
  # step 2's ids landing over step 0's while a warp could still be reading them)
  plgpu.commit_smem()

  @pl.loop(0, steps)
  def _(step):
    slot = step % sets
    if sets == 2:  # step + 2's ids into the buffer _issue(step) read, ahead of its copies below
      pl.when(step + 2 < steps)(lambda: _fetch_ids(plan, r, step + 2))
    with jax.named_scope("gather wait"):  # the step's copies landed, and step − sets' dots done with its operand set
      plgpu.barrier_wait(plan.at(r.gathered, slot))
      pl.when(step >= sets)(lambda: plgpu.barrier_wait(plan.at(r.op_free, slot)))
    with jax.named_scope("relayout"):
      _relayout(plan, r, slot)
      plgpu.commit_smem()
    plgpu.barrier_arrive(plan.at(r.op_ready, slot))
    if sets == 2:  # this staging set is free again: step + 2's copies into it
      pl.when(step + 2 < steps)(lambda: _issue(plan, r, step + 2))
    else:
      @pl.when(step + 1 < steps)
      def _():
        _issue(plan, r, step + 1)
        pl.when(step + 2 < steps)(lambda: _fetch_ids(plan, r, step + 2))  # into the buffer _issue(step) read

  for last in range(max(steps - sets, 0), steps):  # the last steps' completions: a waiter observes every one
    plgpu.barrier_wait(plan.at(r.op_free, last % sets))  # (the interpreter checks)


def _copy_direct(plan: Plan, r: Refs, step):
  """Step `step`'s rows straight into its operand set: cp.async by every thread (compiled), or the interpreter's TMA
  stand-in on the set's `gathered` barrier."""
  plgpu, slot = plan.plgpu, step % 2
  lat_row, pe_row = r.lat_gmem.at[r.row], r.pe_gmem.at[r.row]
  if plan.interpret:
    gather.copy_rows_by_tma(plgpu, _ids_smem(plan, r).at[slot], lat_row, pe_row, r.lat_op.at[slot], r.pe_op.at[slot],
                            plan.pieces, plan.width, r.gathered.at[slot])
    return
  for parity in range(2):  # the set (and ids buffer) static inside the copies: step % 2
    pl.when(slot == parity)(functools.partial(gather.issue_rows_cp_async, plgpu, r.small_smem, parity, lat_row,
                                              pe_row, r.lat_op, r.pe_op))


def _land_direct(plan: Plan, r: Refs, step):
  """Step `step`'s rows landed (every thread's copies, fenced for wgmma), its operand set ready."""
  plgpu = plan.plgpu
  with jax.named_scope("landing"):
    if plan.interpret:
      plgpu.barrier_wait(r.gathered.at[step % 2])
    else:
      gather.wait_cp_async(plgpu)
    plgpu.commit_smem()
  plgpu.barrier_arrive(r.op_ready.at[step % 2])


def _gather_direct(plan: Plan, r: Refs):
  """The gather warpgroup of the direct form: step s's rows copied while the other warpgroups multiply step s − 1;
  step s − 1 signalled ready as soon as its rows landed, before step s's copies wait for step s − 2's set."""
  plgpu, steps = plan.plgpu, plan.steps
  plgpu.set_max_registers(GATHER_REGISTERS, action="decrease")
  _fetch_ids(plan, r, 0)
  pl.when(steps > 1)(lambda: _fetch_ids(plan, r, 1))

  @pl.loop(0, steps)
  def _(step):
    slot = step % 2
    pl.when(step > 0)(lambda: _land_direct(plan, r, step - 1))
    with jax.named_scope("gather wait"):  # step − 2's dots done with this set; this step's ids landed
      pl.when(step >= 2)(lambda: plgpu.barrier_wait(r.op_free.at[slot]))
      plgpu.barrier_wait(r.ids_loaded.at[slot])
    with jax.named_scope("copies"):
      _copy_direct(plan, r, step)
    plgpu.commit_smem()  # every thread has read this step's ids before step + 2's land over them
    pl.when(step + 2 < steps)(lambda: _fetch_ids(plan, r, step + 2))

  _land_direct(plan, r, steps - 1)
  for last in range(max(steps - 2, 0), steps):  # the last steps' completions: a waiter observes every one
    plgpu.barrier_wait(r.op_free.at[last % 2])


def _qk(plan: Plan, r: Refs, slot):
  """S = q~ · latentᵀ + q_pe · k_peᵀ over a step's operand set, [64, E] f32 on the tensor cores."""
  def dots(acc_ref):
    _issue_qk(plan, r, acc_ref, slot)
    return acc_ref[...]

  return pl.run_scoped(dots, plan.plgpu.ACC((plan.hb, plan.e), jnp.float32))


def _issue_qk(plan: Plan, r: Refs, acc_ref, slot):
  """S += q~ · latentᵀ + q_pe · k_peᵀ over a step's operand set, issued (not waited for)."""
  plan.plgpu.wgmma(acc_ref, r.q_lat_smem, plan.at(r.lat_op, slot).transpose((1, 0)))
  plan.plgpu.wgmma(acc_ref, r.q_pe_smem, plan.at(r.pe_op, slot).transpose((1, 0)))


def _online_softmax(plan: Plan, s, ids, m, l):
  """The masked online softmax of a step's scores in log2 units: (P, the new running max, sum, the rescale)."""
  valid = lax.broadcast_in_dim(ids >= 0, s.shape, [1])
  s = jnp.where(valid, s * (plan.scale * _LOG2E), -jnp.inf)  # log2 units: exp2 below
  m_new = jnp.maximum(m, s.max(axis=1))
  alpha = jnp.exp2(m - m_new)
  p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
  return p, m_new, l * alpha + p.sum(axis=1), alpha


def _load_ids(plan: Plan, r: Refs, step):
  """A step's slot ids, for the mask, from HBM (e × 4 B; jax 0.11.2 optimises transfers from SMEM only)."""
  e = plan.e
  return plan.plgpu.load(r.slots_gmem.at[r.qi, r.pi, pl.ds(step * e, e)], layout=plan.wgmma_cols, optimized=False)


def _softmax_out(plan: Plan, r: Refs, step, s, ids, m, l):
  """The online softmax of a step's scores; P and its rescale out to the values warpgroup: (m, l, the rescale)."""
  plgpu, p_slot = plan.plgpu, plan.p_slot(step % plan.sets)
  with jax.named_scope("softmax"):
    p, m, l, alpha = _online_softmax(plan, s, ids, m, l)
    if r.p_free is not None:  # one P buffer: the values warpgroup done with the step before's P and rescale
      pl.when(step > 0)(lambda: plgpu.barrier_wait(r.p_free))
    plan.p_at(r.p_smem, p_slot)[...] = p.astype(plan.dtype)
    _put_row(plan, r, p_slot, alpha)
    plgpu.commit_smem()
    plgpu.barrier_arrive(plan.p_at(r.p_ready, p_slot))
  return m, l, alpha


def _values_half(plan: Plan, r: Refs, slot, cols):
  """The step's latent operand, columns `cols` (a half): P · V's right-hand side."""
  return plan.at(r.lat_op, slot).at[:, pl.ds(cols, plan.half)]


def _scores_step(plan: Plan, r: Refs, step, carry):
  """One step of the scores warpgroup: S, the online softmax, P and its rescale out, O[:, :C/2] updated."""
  plgpu = plan.plgpu
  acc, m, l = carry
  slot = step % plan.sets
  early = plan.config.ids_before_dots
  ids = _load_ids(plan, r, step) if early else None  # its latency overlapping the operand wait and the dots
  with jax.named_scope("scores wait"):
    plgpu.barrier_wait(plan.at(r.op_ready, slot))
  with jax.named_scope("qk"):
    s = _qk(plan, r, slot)
  m, l, alpha = _softmax_out(plan, r, step, s, ids if early else _load_ids(plan, r, step), m, l)
  return _pv(plan, r, acc, alpha, slot), m, l


def _pv(plan: Plan, r: Refs, acc, alpha, slot):
  """O[:, :C/2] rescaled and += P · V over set `slot` (P from shared memory, as the other half takes it), then the
  set freed for the gather."""
  with jax.named_scope("pv"):
    acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
    acc = _accumulate(plan, acc, plan.p_at(r.p_smem, plan.p_slot(slot)), _values_half(plan, r, slot, 0))
    plan.plgpu.barrier_arrive(plan.at(r.op_free, slot))
  return acc


def _scores_loop(plan: Plan, r: Refs, init):
  """The scores warpgroup's steps: (O's half, m, l)."""
  return lax.fori_loop(0, plan.steps, lambda step, carry: _scores_step(plan, r, step, carry), init)


def _scores(plan: Plan, r: Refs):
  """The scores warpgroup: q~ and q_pe in, the steps, the final sum for the values warpgroup, lse and its half out."""
  plgpu, hb = plan.plgpu, plan.hb
  plgpu.set_max_registers(232, action="increase")
  heads = pl.ds(r.hi * hb, hb)
  plgpu.copy_gmem_to_smem(r.q_lat_gmem.at[r.qi, heads], r.q_lat_smem, r.loaded)
  plgpu.copy_gmem_to_smem(r.q_pe_gmem.at[r.qi, heads], r.q_pe_smem, r.loaded)
  plgpu.barrier_wait(r.loaded)
  init = (plgpu.layout_cast(jnp.zeros((hb, plan.half), jnp.float32), plgpu.Layout.WGMMA),
          plgpu.layout_cast(jnp.full((hb,), _NEG_INIT, jnp.float32), plan.wgmma_rows),
          plgpu.layout_cast(jnp.zeros((hb,), jnp.float32), plan.wgmma_rows))
  acc, m, l = _scores_loop(plan, r, init)
  if r.p_free is not None:  # the last step's release (a waiter observes every completion: the interpreter checks)
    plgpu.barrier_wait(r.p_free)
  _put_row(plan, r, plan.p_sets, l)
  plgpu.commit_smem()
  plgpu.barrier_arrive(r.done)
  _write(plan, r, acc, l, 0)
  seen = l > 0
  lse = jnp.where(seen, (m + jnp.log2(jnp.where(seen, l, 1.0))) / _LOG2E, -jnp.inf)
  r.lse_gmem.at[r.qi, r.pi, heads][...] = lse


def _values(plan: Plan, r: Refs):
  """The values warpgroup: O[:, C/2:] rescaled and updated each step, then its half out."""
  plgpu, half, sets, steps = plan.plgpu, plan.half, plan.sets, plan.steps
  plgpu.set_max_registers(160, action="decrease")

  def step_fn(step, acc):
    slot = step % sets
    p_slot = plan.p_slot(slot)
    with jax.named_scope("values wait"):
      plgpu.barrier_wait(plan.p_at(r.p_ready, p_slot))
    with jax.named_scope("values pv"):
      alpha = _get_row(plan, r, p_slot)
      acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
      acc = _accumulate(plan, acc, plan.p_at(r.p_smem, p_slot), _values_half(plan, r, slot, half))
      plgpu.barrier_arrive(plan.at(r.op_free, slot))
      if r.p_free is not None:
        plgpu.barrier_arrive(r.p_free)
    return acc

  acc = lax.fori_loop(0, steps, step_fn, plgpu.layout_cast(jnp.zeros((plan.hb, half), jnp.float32),
                                                           plgpu.Layout.WGMMA))
  plgpu.barrier_wait(r.done)
  _write(plan, r, acc, _get_row(plan, r, plan.p_sets), half)
