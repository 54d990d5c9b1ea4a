"""DSA's sparse MLA decode attention on Pallas's Mosaic GPU backend (Hopper: TMA, wgmma, warpgroup roles): the
op of `kernels/sparse_mla.py` without Pallas's deprecated Triton backend (issue 28), laid out as FlashMLA's sparse
decode kernel is (64-head blocks, the [64, C] output split over two warpgroups, a third gathering the entries).

    s[h, k]  = scale · (q~[h] · latent[slot_k] + q_pe[h] · k_pe[slot_k])     (slot_k ≥ 0, else −∞)
    out[h]   = Σ_k softmax_k(s[h]) · latent[slot_k]                          fp32 [B, T, N, C]

A CTA takes one query, `BLOCK_HEADS` of its heads and one split of its K selected slots, `block_entries` a step,
with three warpgroups:
  gather   TMA-copies each selected row (latent [1, C], k_pe [1, R]: one copy a row, the slot ids read from
           shared memory) into an untiled staging buffer, then re-lays the step's rows through registers into
           the tiled, swizzled operands wgmma reads. Hopper has no TMA gather, and a one-row copy into a tiled
           buffer is refused (docs/kernels.md, "Writing Mosaic GPU kernels here"): the staging is the price.
  scores   S = q~ · latentᵀ + q_pe · k_peᵀ (wgmma, fp32 [64, E]), the masked online softmax, P (bf16) and the
           step's rescale to shared memory for the other half, then O[:, :C/2] += P · latent[:, :C/2].
  values   O[:, C/2:] = O · rescale + P · latent[:, C/2:], P read from shared memory.
Registers per thread: 232 scores (S [64, E] and half of O), 160 values (the other half), 104 gather: 496 of the
512 × 128 an SM has for 384 threads (a sum above what the launch gave would block `setmaxnreg` forever).
The operands are single-buffered: a step's gather overlaps the previous step's dots only in its TMA copies.
Splits (few queries: B = 1 would fill 2 of 132 SMs) write normalised partials and their log-sum-exp, merged by
`sparse_mla.combine_splits`, as the Triton kernel does. Heads are padded to `BLOCK_HEADS` (zero queries, dropped).
The lowering is Lane semantics (explicit layouts): the default Warpgroup semantics cannot infer layouts for the
row gather.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mtp.kernels.mosaic_gpu_common import operand_transforms
from jax_mtp.kernels.sparse_mla import combine_splits

KERNEL_NAME = "dsa_sparse_mla_mgpu"  # not containing the Triton kernel's name: a test can tell them apart
BLOCK_HEADS = 64  # wgmma's M
BUSY_CTAS = 264  # two CTAs per core of an H200 (132 SMs): split a query's slots until about this many run
MAX_SPLITS = 16
CONTIGUOUS_MIN_QUERIES = 32  # queries (B · T) from which `config_for` re-lays the latent row-contiguously (and at 1)
TMA_BOX = 256  # a TMA copy's box: at most 256 elements along each dimension
DOUBLE_BUFFERED_ENTRIES = 32  # entries a step with two buffer sets: two sets of 64 do not fit shared memory
SMEM_BYTES = 232_448  # the shared memory a Hopper CTA may use (227 KiB), which the Mosaic GPU lowering checks
_NEG_INIT = -1e30  # the running max starts finite: exp(−∞ − (−∞)) would be NaN
_LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class Config:
  """Launch parameters. `splits` = 0: `config_for` picks it."""

  block_entries: int = 64  # selected entries a step: the scores' wgmma N and the values' K
  # The bf16 latent's re-layout through registers in row-contiguous pieces (a warp reads 512 bytes of one row, no
  # bank conflicts) instead of WGMMA's layout (a warp reads 8 rows 1 KiB apart: 8-way conflicts); at 256-wide pieces
  # (a 512-wide latent) only. None: `config_for` picks it from CONTIGUOUS_MIN_QUERIES queries up, where it measured
  # faster on the H200 (2026-12-03 15:50, benchmarks/RESULTS.md: 1,178 vs 1,431 µs at B = 64, T = 4; 367 vs 403 at
  # B = 64, T = 1; 198 vs 231 at B = 8, T = 4; slower at B = 8, T = 1 and B = 1, T = 4), and at one query a call
  # (B = 1, T = 1: the plain step and a draft step at B = 1), where it was faster and steadier in all three runs
  # (64 / 35 / 43 µs against 263 / 42 / 106; 2026-12-03 15:50 and 21:58, 2026-12-04 07:12)
  contiguous_relayout: bool | None = None
  splits: int = 0  # CTAs per (query, head block), each over K / splits of its selected slots
  # The gather's copies. whole_rows: a latent row in one TMA copy (a [1, pieces, 256] box) instead of one a 256-wide
  # piece: 2 copies an entry instead of 3 at V3.2's widths. issue_warps: the copies issued by this many warps of the
  # gather warpgroup (plgpu.warp_map, each warp a share of the rows) instead of one thread, which issued a step's
  # 192 copies one after another. Both on by default: on the H200 (2026-12-03 21:40, benchmarks/RESULTS.md) whole
  # rows from 4 warps took 533 µs at B = 64, T = 4 against 1,239 µs for 3 copies an entry from one thread (0.38 of
  # the floor against 0.16), and were the fastest of the four forms at every B and T timed.
  whole_rows: bool = True
  issue_warps: int = 4
  # Two sets of staging and operand buffers (32 entries a step, all operands at a 64-byte swizzle so that a K = 32
  # product and its 32-row re-layout lower): the gather copies step s + 2 and re-lays step s + 1 while the other two
  # warpgroups multiply step s, where one set chains the re-layout and the dots (docs/kernels.md, "The Mosaic sparse
  # MLA's remaining gap"). A 512-wide latent only (a 16-bit or an fp8 cache, whose codes are dequantised a scale
  # group at a time in the re-layout). Built 2026-12-04, checked in the interpreter and by the CUDA lowering;
  # untimed, so off by default.
  double_buffered: bool = False


def config_for(queries: int, heads: int, entries: int, config: Config | None = None, busy: int = BUSY_CTAS) -> Config:
  """The call's launch: `splits` the fewest (a power of two, dividing the steps, at most MAX_SPLITS) that give
  queries × head blocks × splits ≥ `busy` CTAs; the contiguous re-layout at one query and from
  CONTIGUOUS_MIN_QUERIES queries."""
  config = config or Config()
  block_entries = min(DOUBLE_BUFFERED_ENTRIES if config.double_buffered else config.block_entries, entries)
  splits = config.splits
  if not splits:
    steps, blocks = max(entries // block_entries, 1), queries * -(-heads // BLOCK_HEADS)
    splits = 1
    while blocks * splits < busy and splits < MAX_SPLITS and steps % (2 * splits) == 0:
      splits *= 2
  contiguous = (queries == 1 or queries >= CONTIGUOUS_MIN_QUERIES if config.contiguous_relayout is None
                else config.contiguous_relayout)
  return dataclasses.replace(config, block_entries=block_entries, splits=splits, contiguous_relayout=contiguous)


def check_operands(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, config: Config,
                   latent_scale_BSG=None) -> None:
  """A ValueError naming the offending value where the kernel cannot take these operands."""
  b, t, n, c = q_lat_BTNC.shape
  r, s, k = q_pe_BTNR.shape[-1], latent_BSC.shape[1], slots_BTK.shape[-1]
  if q_pe_BTNR.shape != (b, t, n, r) or latent_BSC.shape != (b, s, c) or k_pe_BSR.shape != (b, s, r) \
      or slots_BTK.shape != (b, t, k):
    raise ValueError(f"shapes q~ {q_lat_BTNC.shape}, q_pe {q_pe_BTNR.shape}, latent {latent_BSC.shape}, "
                     f"k_pe {k_pe_BSR.shape}, slots {slots_BTK.shape} do not agree")
  dtypes = {q_lat_BTNC.dtype, q_pe_BTNR.dtype, k_pe_BSR.dtype} | ({latent_BSC.dtype} if latent_scale_BSG is None else set())
  if len(dtypes) != 1 or next(iter(dtypes)) not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f"the kernel takes one 16-bit float dtype for queries and cache, got {sorted(map(str, dtypes))}")
  if latent_scale_BSG is not None:  # an fp8 MLA cache: e4m3 codes, one fp32 scale per group of c / G values
    g = latent_scale_BSG.shape[-1]
    if latent_BSC.dtype != jnp.float8_e4m3fn or latent_scale_BSG.shape != (b, s, g) or c % g or (c // g) % 64:
      raise ValueError(f"an fp8 latent cache is float8_e4m3fn codes {(b, s, c)} with scales {(b, s, 'G')} of groups "
                       f"a multiple of 64 wide; got {latent_BSC.dtype} {latent_BSC.shape}, scales "
                       f"{latent_scale_BSG.shape}")
  if c % 128 or c > 512 or r % 64 or (c > TMA_BOX and c % TMA_BOX):
    raise ValueError(f"latent width {c} (a multiple of 128, at most 512: two wgmma halves) or rope width {r} (a "
                     f"multiple of 64: a row's TMA copy moves a multiple of 128 bytes) does not fit the kernel")
  e, splits = config.block_entries, config.splits
  if config.issue_warps not in (1, 2, 4):
    raise ValueError(f"issue_warps={config.issue_warps}: the gather warpgroup's 1, 2 or 4 warps issue its copies")
  if config.double_buffered and (e != DOUBLE_BUFFERED_ENTRIES or c != 2 * TMA_BOX):
    raise ValueError(f"double_buffered takes block_entries={DOUBLE_BUFFERED_ENTRIES} and a {2 * TMA_BOX}-wide "
                     f"latent; got block_entries={e}, a latent of width {c}")
  if (e % 64 and not config.double_buffered) or e > 256 or splits < 1 or k % (splits * e):
    raise ValueError(f"{k} selected slots are not a multiple of splits={splits} × block_entries={e} "
                     f"(block_entries a multiple of 64, at most 256)")
  scales = 0 if latent_scale_BSG is None else latent_scale_BSG.shape[-1]
  need = smem_bytes(c, r, e, jnp.dtype(latent_BSC.dtype).itemsize, scales, 2 if config.double_buffered else 1)
  if need > SMEM_BYTES:  # the lowering's own check comes only on a GPU (the interpreter has none)
    raise ValueError(f"block_entries={e} at latent width {c} and rope width {r} needs {need:,} bytes of shared "
                     f"memory, more than an H200's {SMEM_BYTES:,} (fewer entries a step)")


def smem_bytes(c: int, r: int, e: int, latent_itemsize: int, scale_groups: int = 0, sets: int = 1) -> int:
  """The kernel's shared memory (its scratch buffers, each from a 1 KiB boundary, and its barriers): q~, q_pe, the
  untiled staging, the operands and P (`sets` of each), the packed ids buffer, an fp8 cache's scales."""
  kib = lambda n: -(-n // 1024) * 1024  # noqa: E731
  buffers = [BLOCK_HEADS * c * 2, BLOCK_HEADS * r * 2, sets * e * c * latent_itemsize, sets * e * r * 2,
             sets * e * c * 2, sets * e * r * 2, sets * BLOCK_HEADS * e * 2, (3 + sets) * max(e, BLOCK_HEADS) * 4] + (
                 [sets * scale_groups * e * 4] if scale_groups else [])
  return sum(map(kib, buffers)) + 8 * (5 + 4 * sets)  # barriers of 8 bytes


def sparse_mla_mgpu(q_lat_BTNC: jax.Array, q_pe_BTNR: jax.Array, latent_BSC: jax.Array, k_pe_BSR: jax.Array,
                    slots_BTK: jax.Array, scale: float, *, latent_scale_BSG: jax.Array | None = None,
                    config: Config | None = None, out_dtype=jnp.float32, interpret: bool = False) -> jax.Array:
  """[B, T, N, C] in `out_dtype`: each query's heads attending over its selected slots (`slots_BTK` int32, −1 =
  not attended), the operands as `sparse_mla.sparse_mla` takes them. `latent_scale_BSG`: an fp8 MLA cache's
  scales (`latent_BSC` then holds its e4m3 codes, `sparse_mla.dequantize_latent`'s format): the gather warpgroup
  dequantises each copied row in registers on its way into the bf16 operand; the selected rows' scales are
  gathered by XLA first (16 B an entry beside its 512 B of codes). `interpret`: Pallas's GPU interpreter (any host:
  the tests)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  b, t, n, c = q_lat_BTNC.shape
  r, k = q_pe_BTNR.shape[-1], slots_BTK.shape[-1]
  config = config_for(b * t, n, k, config)
  check_operands(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, config, latent_scale_BSG)
  e, splits = config.block_entries, config.splits
  dtype, hb, half = q_lat_BTNC.dtype, BLOCK_HEADS, c // 2
  padded = -(-n // hb) * hb
  pieces = -(-c // TMA_BOX)  # a latent row is copied as [pieces, c / pieces]: a TMA box is ≤ 256 wide
  width = c // pieces
  row_copies = 1 if config.whole_rows else pieces  # TMA copies a latent row takes (+ one for its rope key)
  pad_heads = [(0, 0), (0, padded - n), (0, 0)]
  q_lat = jnp.pad(q_lat_BTNC.reshape(b * t, n, c), pad_heads)
  q_pe = jnp.pad(q_pe_BTNR.reshape(b * t, n, r), pad_heads)
  slots = slots_BTK.astype(jnp.int32).reshape(b * t, splits, k // splits)
  steps = k // splits // e
  scaled = latent_scale_BSG is not None
  scale_inputs, scale_scratch = [], []
  if scaled:  # the selected rows' scales, [B·T, splits, G, K / splits]: a step's are one [G, E] TMA box
    g = latent_scale_BSG.shape[-1]
    rows_B1 = jnp.arange(b)[:, None, None]
    picked = latent_scale_BSG[rows_B1, jnp.maximum(slots_BTK, 0)].astype(jnp.float32)  # [B, T, K, G]
    scale_inputs = [picked.reshape(b * t, splits, k // splits, g).transpose(0, 1, 3, 2)]
    scale_scratch = [plgpu.SMEM((g, e) if not config.double_buffered else (2, g, e), jnp.float32)]
  sets = 2 if config.double_buffered else 1  # staging / operand / P buffer sets

  def buf(shape):  # a buffer of `sets` sets (one set: the shape itself)
    return shape if sets == 1 else (sets, *shape)

  def at(ref, slot):  # a step's set of a buffer or barrier
    return ref if sets == 1 else ref.at[slot]

  from jax.experimental.mosaic.gpu import fragmented_array as mgpu_fa  # noqa: PLC0415
  if config.double_buffered:  # every operand at a 64-byte swizzle: K = 32 entries (64 B of bf16) must be a multiple
    narrow = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))  # of it, and a product's two swizzles agree
    lat_t = pe_t = p_t = narrow
  else:
    lat_t, pe_t = operand_transforms(plgpu, dtype, c), operand_transforms(plgpu, dtype, r)
    p_t = operand_transforms(plgpu, dtype, e)
  rows_layout = None
  if config.double_buffered:  # [32 rows, ·]: a warp 8 rows, its lanes 8 rows × 4 pieces of 16 B: a 64-B-swizzled
    # tile's 512 B written conflict-free by one warp (a warp a row, as below, is refused at this swizzle)
    rows_layout = plgpu.Layout.TILED(mgpu_fa.Tiling(((e, 32), (8, 32), (8,))), warp_dims=(-5,), lane_dims=(-3, -2),
                                     vector_dim=-1)
  elif config.contiguous_relayout and width == 256:  # [rows, 256]: a warp a row, a lane 8 contiguous values (16 B)
    rows_layout = plgpu.Layout.TILED(mgpu_fa.Tiling(((4, 256), (8,))), warp_dims=(-3,), lane_dims=(-2,),
                                     vector_dim=-1)
  wgmma_rows = plgpu.Layout.WGMMA.reduce(1)  # one value per head (row of the [64, ·] accumulators)
  wgmma_cols = plgpu.Layout.WGMMA.reduce(0)  # one value per entry (column of the scores)

  def body(q_lat_gmem, q_pe_gmem, lat_gmem, pe_gmem, slots_gmem, *refs):
    scale_gmem = refs[0] if scaled else None
    (out_gmem, lse_gmem, q_lat_smem, q_pe_smem, lat_stage, pe_stage, lat_op, pe_op, p_smem, small_smem,
     *scale_stage, loaded, ids_loaded, gathered, op_ready, op_free, p_ready, done, written) = refs[scaled:]
    hi, pi, qi = lax.axis_index("h"), lax.axis_index("p"), lax.axis_index("q")
    wg = lax.axis_index("wg")
    row = qi // t  # the query's batch row: its cache
    ids_smem = small_smem.at[pl.ds(0, 2), pl.ds(0, e)]  # slot ids of steps s (s % 2)
    # rows 2 .. 2 + sets − 1: a step's rescale (by the step's set), row 2 + sets: the final sum

    def put_row(i, x):  # an f32 [64] row vector for the other warpgroup, as int32 bits
      small_smem.at[2 + i, pl.ds(0, hb)][...] = lax.bitcast_convert_type(x, jnp.int32)

    def get_row(i):
      return lax.bitcast_convert_type(plgpu.load(small_smem.at[2 + i, pl.ds(0, hb)], layout=wgmma_rows), jnp.float32)

    def accumulate(acc, a, b_ref):  # acc + a · b on the tensor cores, accumulated in place
      if interpret:  # Pallas's GPU interpreter does not run pl.run_state (jax 0.12): a fresh product, added
        return acc + pl.run_scoped(lambda ref: (plgpu.wgmma(ref, a, b_ref), ref[...])[1], plgpu.ACC(acc.shape))
      return pl.run_state(lambda ref: plgpu.wgmma(ref, a, b_ref))(plgpu.ACC.init(acc))

    def _write(acc, l, col):  # this half of the normalised partial output
      norm = jnp.where(l > 0, l, 1.0)
      out = (acc / lax.broadcast_in_dim(norm, acc.shape, [0])).astype(out_gmem.dtype)
      if jnp.dtype(out_gmem.dtype).itemsize == 4:  # straight from registers: a quad's 4 × 8 B are whole sectors
        out_gmem.at[qi, pi, pl.ds(hi * hb, hb), pl.ds(col, half)][...] = out
        return
      # 16-bit: both halves into q~'s buffer (free once the last step's scores are done: the values half waits
      # for them), then one TMA copy by the scores warpgroup, since a quad's 4 × 4 B would store half sectors
      q_lat_smem[:, pl.ds(col, half)] = out
      plgpu.commit_smem()
      if col:
        plgpu.barrier_arrive(written)
        return
      plgpu.barrier_wait(written)
      plgpu.copy_smem_to_gmem(q_lat_smem, out_gmem.at[qi, pi, pl.ds(hi * hb, hb)])
      plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _gather():
      plgpu.set_max_registers(104, action="decrease")
      def fetch_ids(step):  # a step's slot ids, two steps' worth in flight
        plgpu.copy_gmem_to_smem(slots_gmem.at[qi, pi, pl.ds(step * e, e)], ids_smem.at[step % 2], ids_loaded.at[step % 2])

      def issue_rows(ids, first, stride, lat_to, pe_to, landed):  # rows first, first + stride, ...: an invalid
        @pl.loop(first, e, step=stride)                             # slot (−1) reads row 0, masked by the scores
        def _(i):
          slot = jnp.maximum(ids[i], 0)
          if config.whole_rows:  # one [1, pieces, width] box: each dimension within TMA's 256
            plgpu.copy_gmem_to_smem(lat_gmem.at[row, pl.ds(slot, 1)], lat_to.at[pl.ds(i, 1)], landed)
          else:  # one copy a piece: a TMA box is at most 256 wide
            for j in range(pieces):
              plgpu.copy_gmem_to_smem(lat_gmem.at[row, pl.ds(slot, 1), j],
                                      lat_to.at[pl.ds(i, 1), j, pl.ds(0, width)], landed)
          plgpu.copy_gmem_to_smem(pe_gmem.at[row, pl.ds(slot, 1)], pe_to.at[pl.ds(i, 1)], landed)

      def issue(step):  # one TMA a selected row (or piece of one), into the step's staging set
        plgpu.barrier_wait(ids_loaded.at[step % 2])
        ids = ids_smem.at[step % 2]
        to = (at(lat_stage, step % sets), at(pe_stage, step % sets), at(gathered, step % sets))
        if config.issue_warps == 1:
          issue_rows(ids, 0, 1, *to)
        else:  # each of the first issue_warps warps a share of the rows, from its own elected thread
          plgpu.warp_map(lambda warp: pl.when(warp < config.issue_warps)(
              lambda: issue_rows(ids, warp, config.issue_warps, *to)))

        if scaled:
          plgpu.copy_gmem_to_smem(scale_gmem.at[qi, pi, :, pl.ds(step * e, e)], at(scale_stage[0], step % sets),
                                  at(gathered, step % sets))

      fetch_ids(0)
      pl.when(steps > 1)(lambda: fetch_ids(1))
      for first in range(min(sets, steps)):  # the first `sets` steps' copies, each into its own staging set
        issue(first)

      @pl.loop(0, steps)
      def _(step):
        slot = step % sets
        if sets == 2:  # step + 2's ids into the buffer issue(step) read, ahead of its copies below
          pl.when(step + 2 < steps)(lambda: fetch_ids(step + 2))
        lat_stage_s, pe_stage_s, lat_op_s, pe_op_s = (at(ref, slot) for ref in (lat_stage, pe_stage, lat_op, pe_op))
        plgpu.barrier_wait(at(gathered, slot))
        pl.when(step >= sets)(lambda: plgpu.barrier_wait(at(op_free, slot)))  # step − sets' dots are done with it
        if sets == 2 and scaled:  # a scale group of codes at a time, times its rows' scales, in fp32 (exact for
          group_width = c // g    # e4m3), rounded once to the operand's dtype
          for col in range(0, c, group_width):
            codes = plgpu.load(lat_stage_s.at[:, col // width, pl.ds(col % width, group_width)], layout=rows_layout,
                               optimized=False)  # 8 B a lane from rows 512 B apart: conflicts no plan avoids
            group_scale = plgpu.load(at(scale_stage[0], slot).at[col // group_width], layout=rows_layout.reduce(1),
                                     optimized=False)
            row_scale = plgpu.layout_cast(lax.broadcast_in_dim(group_scale, codes.shape, [0]), rows_layout)
            lat_op_s[:, pl.ds(col, group_width)] = (codes.astype(jnp.float32) * row_scale).astype(dtype)
        elif rows_layout is not None and not scaled:  # each warp reads 512 contiguous bytes of one row: no conflicts
          for rb in range(0, e, 32):
            for j in range(pieces):
              lat_op_s[pl.ds(rb, 32), pl.ds(j * width, width)] = plgpu.load(lat_stage_s.at[pl.ds(rb, 32), j],
                                                                            layout=rows_layout)
        for col in range(0, c if (rows_layout is None or scaled) and sets == 1 else 0, 64):  # staging → registers
          piece = plgpu.load(lat_stage_s.at[:, col // width, pl.ds(col % width, 64)], layout=plgpu.Layout.WGMMA,
                             optimized=False)
          if scaled:  # codes · their group's scale, in fp32 (exact for e4m3), rounded once to the operand's dtype
            group_scale = plgpu.load(scale_stage[0].at[col // (c // g)], layout=wgmma_rows)
            piece = (piece.astype(jnp.float32) * lax.broadcast_in_dim(group_scale, piece.shape, [0])).astype(dtype)
          lat_op_s[:, pl.ds(col, 64)] = piece
        pe_op_s[...] = plgpu.load(pe_stage_s, layout=rows_layout if sets == 2 else plgpu.Layout.WGMMA,
                                  optimized=False)
        plgpu.commit_smem()
        plgpu.barrier_arrive(at(op_ready, slot))

        if sets == 2:  # this staging set is free again: step + 2's copies into it
          pl.when(step + 2 < steps)(lambda: issue(step + 2))
        else:
          @pl.when(step + 1 < steps)
          def _():
            issue(step + 1)
            pl.when(step + 2 < steps)(lambda: fetch_ids(step + 2))  # into the buffer issue(step) read

      for last in range(max(steps - sets, 0), steps):  # the last steps' completions: a waiter observes every one
        plgpu.barrier_wait(at(op_free, last % sets))  # (the interpreter checks)

    @pl.when(wg == 0)
    def _scores():
      plgpu.set_max_registers(232, action="increase")
      heads = pl.ds(hi * hb, hb)
      plgpu.copy_gmem_to_smem(q_lat_gmem.at[qi, heads], q_lat_smem, loaded)
      plgpu.copy_gmem_to_smem(q_pe_gmem.at[qi, heads], q_pe_smem, loaded)
      plgpu.barrier_wait(loaded)

      def step_fn(step, carry):
        acc, m, l = carry
        slot = step % sets
        lat_op_s, p_smem_s = at(lat_op, slot), at(p_smem, slot)
        plgpu.barrier_wait(at(op_ready, slot))

        def dots(acc_ref):
          plgpu.wgmma(acc_ref, q_lat_smem, lat_op_s.transpose((1, 0)))
          plgpu.wgmma(acc_ref, q_pe_smem, at(pe_op, slot).transpose((1, 0)))
          return acc_ref[...]

        s = pl.run_scoped(dots, plgpu.ACC((hb, e), jnp.float32))
        ids = plgpu.load(slots_gmem.at[qi, pi, pl.ds(step * e, e)], layout=wgmma_cols,
                         optimized=False)  # from HBM, 256 B (jax 0.11.2 optimises transfers from SMEM only)
        valid = lax.broadcast_in_dim(ids >= 0, (hb, e), [1])
        s = jnp.where(valid, s * (scale * _LOG2E), -jnp.inf)  # log2 units: exp2 below
        m_new = jnp.maximum(m, s.max(axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
        l = l * alpha + p.sum(axis=1)
        p_smem_s[...] = p.astype(dtype)
        put_row(slot, alpha)
        plgpu.commit_smem()
        plgpu.barrier_arrive(at(p_ready, slot))
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])

        acc = accumulate(acc, p_smem_s, lat_op_s.at[:, pl.ds(0, half)])  # P from shared memory, as the other half
        plgpu.barrier_arrive(at(op_free, slot))
        return acc, m_new, l

      init = (plgpu.layout_cast(jnp.zeros((hb, half), jnp.float32), plgpu.Layout.WGMMA),
              plgpu.layout_cast(jnp.full((hb,), _NEG_INIT, jnp.float32), wgmma_rows),
              plgpu.layout_cast(jnp.zeros((hb,), jnp.float32), wgmma_rows))
      acc, m, l = lax.fori_loop(0, steps, step_fn, init)
      put_row(sets, l)
      plgpu.commit_smem()
      plgpu.barrier_arrive(done)
      _write(acc, l, 0)
      seen = l > 0
      lse = jnp.where(seen, (m + jnp.log2(jnp.where(seen, l, 1.0))) / _LOG2E, -jnp.inf)
      lse_gmem.at[qi, pi, heads][...] = lse

    @pl.when(wg == 1)
    def _values():
      plgpu.set_max_registers(160, action="decrease")

      def step_fn(step, acc):
        slot = step % sets
        plgpu.barrier_wait(at(p_ready, slot))
        alpha = get_row(slot)
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])

        acc = accumulate(acc, at(p_smem, slot), at(lat_op, slot).at[:, pl.ds(half, half)])
        plgpu.barrier_arrive(at(op_free, slot))
        return acc

      acc = lax.fori_loop(0, steps, step_fn, plgpu.layout_cast(jnp.zeros((hb, half), jnp.float32),
                                                               plgpu.Layout.WGMMA))
      plgpu.barrier_wait(done)
      _write(acc, get_row(sets), half)

  out_dt = out_dtype if splits == 1 else jnp.float32
  kernel = plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((b * t, splits, padded, c), out_dt),
                jax.ShapeDtypeStruct((b * t, splits, padded), jnp.float32)),
      scratch_types=[
          plgpu.SMEM((hb, c), dtype, transforms=lat_t), plgpu.SMEM((hb, r), dtype, transforms=pe_t),
          # untiled, rows 128-byte aligned as a TMA destination must be (so a warp's re-layout load meets 8-way bank
          # conflicts: padding the rows apart misaligned the copies on the H200, 2026-12-03)
          plgpu.SMEM(buf((e, pieces, width)), latent_BSC.dtype),
          plgpu.SMEM(buf((e, r)), dtype),
          # destinations
          plgpu.SMEM(buf((e, c)), dtype, transforms=lat_t), plgpu.SMEM(buf((e, r)), dtype, transforms=pe_t),
          plgpu.SMEM(buf((hb, e)), dtype, transforms=p_t),
          # two steps' slot ids, a step's rescale (a row a set), the final sum (f32 bits): one buffer, as buffers
          # align to 1 KiB
          plgpu.SMEM((3 + sets, max(e, hb)), jnp.int32),
          *scale_scratch,
          plgpu.Barrier(num_arrivals=2),  # q~ and q_pe
          plgpu.Barrier(num_arrivals=1, num_barriers=2),  # a step's slot ids
          # a step's one-row copies (and its scales), a set each
          plgpu.Barrier(num_arrivals=(row_copies + 1) * e + scaled, num_barriers=sets),
          # op_ready, op_free (both halves), p_ready: a set each; done, written
          plgpu.Barrier(num_arrivals=1, num_barriers=sets), plgpu.Barrier(num_arrivals=2, num_barriers=sets),
          plgpu.Barrier(num_arrivals=1, num_barriers=sets), plgpu.Barrier(num_arrivals=1), plgpu.Barrier(num_arrivals=1),
      ],
      grid=(padded // hb, splits, b * t),  # head blocks fastest: a query's CTAs read its rows through L2 once
      grid_names=("h", "p", "q"),
      num_threads=3,
      thread_name="wg",
      # no cross-warp reduction scratch: the row max / sum stay within a quad, and V3.2 widths need all but 3 KiB
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane, reduction_scratch_bytes=0),
      kernel_name=KERNEL_NAME,
      interpret=plgpu.InterpretGPUParams() if interpret else None,
  )
  out, lse = kernel(q_lat, q_pe, latent_BSC.reshape(b, -1, pieces, width), k_pe_BSR, slots, *scale_inputs)
  return combine_splits(out[:, :, :n], lse[:, :, :n]).astype(out_dtype).reshape(b, t, n, c)

