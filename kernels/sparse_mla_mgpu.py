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
           buffer is refused (docs/mosaic_gpu_notes.md, "Writing Mosaic GPU kernels here"): the staging is the price.
  scores   S = q~ · latentᵀ + q_pe · k_peᵀ (wgmma, fp32 [64, E]), the masked online softmax, P (bf16) and the
           step's rescale to shared memory for the other half, then O[:, :C/2] += P · latent[:, :C/2].
  values   O[:, C/2:] = O · rescale + P · latent[:, C/2:], P read from shared memory.
Registers per thread: 232 scores (S [64, E] and half of O), 160 values (the other half), 104 gather: 496 of the
512 × 128 an SM has for 384 threads (a sum above what the launch gave would block `setmaxnreg` forever).
At a 512-wide latent (V3.2's) and two or more queries a call the operands are double-buffered
(`Config.double_buffered`: two sets, 32 entries a step) so that a step's re-layout overlaps the previous step's
dots; otherwise one set of 64 entries, where a step's gather overlaps the dots only in its TMA copies.
Splits (few queries: B = 1 would fill 2 of 132 SMs) write normalised partials and their log-sum-exp, merged by
`sparse_mla.combine_splits`. Heads are padded to `BLOCK_HEADS` (zero queries, dropped). The lowering is Lane
semantics (explicit layouts): the default Warpgroup semantics cannot infer layouts for the row gather. This module
holds the launch (`Config`, `config_for`, `check_operands`, `smem_bytes`, the buffers and barriers);
`sparse_mla_mgpu_body.py` the three warpgroups' phases.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_mtp.kernels import sparse_mla_mgpu_gather as gather
from jax_mtp.kernels.mosaic_gpu_common import interpret_params, lowered_once_per_launch, operand_transforms
from jax_mtp.kernels.sparse_mla import check_shapes, combine_splits
from jax_mtp.kernels.sparse_mla_mgpu_body import body_for
from jax_mtp.kernels.sparse_mla_mgpu_plan import Plan

KERNEL_NAME = "dsa_sparse_mla_mgpu"  # what tests and benchmarks look for in a compiled program
# a launch's name: KERNEL_NAME + its form's suffix (`form_of`)
FORM_SUFFIXES = {"one set": "_one_set", "two sets": "_two_sets", "direct": "_direct"}
BLOCK_HEADS = 64  # wgmma's M
# An H200's (and H100 SXM's) cores: a CTA of either form takes most of a core's 227 KiB of shared memory, so one runs
# a core, and `config_for` splits a query's slots until one wave of this many CTAs is as full as it gets
ONE_WAVE_CTAS = 132
MAX_SPLITS = 16
CONTIGUOUS_MIN_QUERIES = 32  # queries (B · T) from which `config_for` re-lays the latent row-contiguously (and at 1)
TMA_BOX = 256  # a TMA copy's box: at most 256 elements along each dimension
DOUBLE_BUFFERED_ENTRIES = 32  # entries a step with two staged buffer sets: two sets of 64 do not fit shared memory
DIRECT_ENTRIES = gather.ROWS  # entries a step of the direct gather (its copies' thread map): no staging, so two sets fit
SMEM_BYTES = 232_448  # the shared memory a Hopper CTA may use (227 KiB), which the Mosaic GPU lowering checks


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
  # CTAs per (query, head block), each over K / splits of its selected slots. 0: `config_for`'s one-wave rule. On the
  # H200 (2026-12-04 18:31, benchmarks/RESULTS.md, "The sparse MLA's splits by one wave") the most splits that keep
  # to one wave were the fastest in 10 of 12 (B, T, cache) groups and within 10 % in the others: B = 64, T = 1: 145
  # µs at 1 split (128 CTAs) against 169 at 4; B = 8, T = 4: 82 at 2 against 109 at 8; B = 8, T = 1: 44.5 at 8
  # against 56 at 16 (over an fp8 cache there the old rule's 16 was 9 % faster, the noisiest row)
  splits: int = 0
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
  # warpgroups multiply step s, where one set chains the re-layout and the dots (docs/mosaic_gpu_notes.md, "The Mosaic sparse
  # MLA's remaining gap"). A 512-wide latent only (a 16-bit or an fp8 cache, whose codes are dequantised a scale
  # group at a time in the re-layout). None: `config_for` takes it at a 512-wide latent from 2 queries a call. On
  # the H200 (2026-12-04 12:27 and 12:57, benchmarks/RESULTS.md) it was the fastest form at B = 64, T = 4 (505 µs
  # against 518 for one set; 655 against 869 over an fp8 cache), B = 8, T = 4 (115 against 132; fp8 138 against
  # 186), and within a few µs of one set's best variant at B = 64, T = 1, B = 8, T = 1 and B = 1, T = 4 (34 µs
  # against 47, 31.5 with the contiguous re-layout). At one query a call one set was faster (B = 1, T = 1: 31-36
  # against 41 µs), and over an fp8 cache at B = 8, T = 1 (77 against 88 µs); rows below B = 8 vary up to 2x
  # between runs.
  double_buffered: bool | None = None
  # The scores warpgroup's load of a step's slot ids (its mask, from HBM) issued before it waits for the step's
  # operand and runs its dots, so that the load's latency (a global load's, hundreds of ns, each step) overlaps
  # them instead of following them on the step's critical path. Off: on the H200 (2026-12-04 15:29, RESULTS "Where
  # the Mosaic sparse MLA's step goes") 517.9 against 504.5 µs at B = 64, T = 4 (fp8 cache 663 against 648), and
  # 480 against 485 in the profile run: within the rows' spread, not faster.
  ids_before_dots: bool = False
  # The direct gather (`sparse_mla_mgpu_gather.py`): the gather warpgroup's threads copy each selected row by
  # cp.async straight into its row of the swizzled operand, no staging and no re-layout; two operand sets of 64
  # entries (128-byte swizzles, as one set's), one P buffer. A 16-bit cache at a 512-wide latent and a 64-wide rope
  # only (an fp8 cache's codes need their dequantisation on the way). Off until timed against the two staged sets
  # (built 2026-12-07 night on a CPU; the swizzled addresses are checked only compiled, on a GPU).
  direct_gather: bool = False


def buffer_sets(config: Config) -> int:
  """Operand buffer sets: two with `double_buffered` or `direct_gather`, else one."""
  return 2 if config.double_buffered or config.direct_gather else 1


def p_sets(config: Config) -> int:
  """P / rescale buffer sets: one a step set, except the direct gather's one (two sets of 64 leave no room for a
  second P)."""
  return 1 if config.direct_gather else buffer_sets(config)


def form_of(config: Config) -> str:
  """A completed config's form, as FORM_SUFFIXES names it."""
  return "direct" if config.direct_gather else "two sets" if config.double_buffered else "one set"


def config_for(queries: int, heads: int, entries: int, latent_width: int, config: Config | None = None,
               wave: int = ONE_WAVE_CTAS) -> Config:
  """The call's launch: two buffer sets at a 512-wide latent from two queries; `splits` the most (a power of two,
  dividing the steps, at most MAX_SPLITS; at least 1) that keep queries × head blocks × splits ≤ `wave` CTAs, one
  wave of one CTA a core: a second wave costs more than the shorter loops save (each split also pays a pipeline's
  prologue and a share of the combine); the contiguous re-layout at one query and from CONTIGUOUS_MIN_QUERIES
  queries."""
  config = config or Config()
  if config.double_buffered is None:
    config = dataclasses.replace(config, double_buffered=(latent_width == 2 * TMA_BOX and queries > 1
                                                          and not config.direct_gather))
  block_entries = min(DOUBLE_BUFFERED_ENTRIES if config.double_buffered
                      else DIRECT_ENTRIES if config.direct_gather else config.block_entries, entries)
  splits = config.splits
  if not splits:
    steps, blocks = max(entries // block_entries, 1), queries * -(-heads // BLOCK_HEADS)
    splits = 1
    while blocks * splits * 2 <= wave and splits < MAX_SPLITS and steps % (2 * splits) == 0:
      splits *= 2
  contiguous = (queries == 1 or queries >= CONTIGUOUS_MIN_QUERIES if config.contiguous_relayout is None
                else config.contiguous_relayout)
  return dataclasses.replace(config, block_entries=block_entries, splits=splits, contiguous_relayout=contiguous)


def whole_step(queries: int, heads: int, entries: int, latent_width: int) -> int:
  """Entries a step of the form `config_for` picks for this call takes: a whole step, even where `entries` is
  fewer (config_for's own `block_entries` is then `entries`)."""
  form = config_for(queries, heads, entries, latent_width)
  return DOUBLE_BUFFERED_ENTRIES if form.double_buffered else DIRECT_ENTRIES if form.direct_gather \
      else Config().block_entries


def padded_entries(queries: int, heads: int, entries: int, latent_width: int, wave: int = ONE_WAVE_CTAS) -> int:
  """The selection width a call of `entries` selected slots is padded to (−1 ids, not attended): of the widths a
  step × 1, 2, 4 … MAX_SPLITS divides, at least `entries`, the one whose `config_for` leaves a CTA the fewest
  steps (ties: the fewest entries). Why: the splits must divide the steps, so an odd step count runs one split,
  and where the CTAs do not fill a wave a few padded steps buy many splits: index_share's reused selection of
  2,050 entries is 33 steps of 64 (at B = 1, T = 1 two CTAs on 132 cores, each 33 steps) where 3,072 run 16 splits
  of 3 steps; a 1,059-slot request attended over every slot at B = 8, T = 1 gets 8 splits of 5 steps of 32 at
  1,280, against 2 of 17 at 1,088. Where the CTAs fill the wave (more than 66 head blocks × queries) it is the
  step's multiple. Timed against the step's multiple on an H100 (2026-12-07 15:15, RESULTS,
  `benchmarks.sparse_mla_padding`): 3.1–3.7× faster at B = 1 and 8 over 2,050 entries, 8.5× over 1,059."""
  step = whole_step(queries, heads, entries, latent_width)
  widths = [-(-entries // (step * m)) * step * m for m in (2**i for i in range(MAX_SPLITS.bit_length()))]

  def steps_a_cta(width: int) -> int:
    config = config_for(queries, heads, width, latent_width, wave=wave)
    return width // (config.block_entries * config.splits)

  return min(widths, key=lambda width: (steps_a_cta(width), width))


def check_operands(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, config: Config,
                   latent_scale_BSG=None) -> None:
  """A ValueError naming the offending value where the kernel cannot take these operands."""
  check_shapes(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK)
  b, t, n, c = q_lat_BTNC.shape
  r, s, k = q_pe_BTNR.shape[-1], latent_BSC.shape[1], slots_BTK.shape[-1]
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
  if config.direct_gather and (config.double_buffered or e != DIRECT_ENTRIES or c != gather.LATENT
                               or r != gather.ROPE or latent_scale_BSG is not None):
    raise ValueError(f"direct_gather takes a 16-bit cache of a {gather.LATENT}-wide latent and a {gather.ROPE}-wide "
                     f"rope, {DIRECT_ENTRIES} entries a step and not double_buffered; got latent {c} "
                     f"{latent_BSC.dtype}, rope {r}, block_entries={e}, double_buffered={config.double_buffered}")
  if (e % 64 and not config.double_buffered) or e > 256 or splits < 1 or k % (splits * e):
    raise ValueError(f"{k} selected slots are not a multiple of splits={splits} × block_entries={e} "
                     f"(block_entries a multiple of 64, at most 256)")
  need = launch_smem_bytes(config, latent_BSC, k_pe_BSR, latent_scale_BSG)
  if need > SMEM_BYTES:  # the lowering's own check comes only on a GPU (the interpreter has none)
    raise ValueError(f"block_entries={e} at latent width {c} and rope width {r} needs {need:,} bytes of shared "
                     f"memory, more than an H200's {SMEM_BYTES:,} (fewer entries a step)")


def launch_smem_bytes(config: Config, latent_BSC, k_pe_BSR, latent_scale_BSG=None) -> int:
  """`smem_bytes` of a completed `config`'s launch over these cache operands."""
  scales = 0 if latent_scale_BSG is None else latent_scale_BSG.shape[-1]
  return smem_bytes(latent_BSC.shape[-1], k_pe_BSR.shape[-1], config.block_entries,
                    jnp.dtype(latent_BSC.dtype).itemsize, scales, buffer_sets(config),
                    staged=not config.direct_gather, p_sets=p_sets(config))


def profile_ranges(used_smem: int) -> int:
  """Ranges a warpgroup's trace holds in the shared memory a launch of `used_smem` bytes leaves (Mosaic GPU's
  profiler: 4 int32 entries a range, 3 warpgroups, from an 8-byte boundary); the trace keeps its first ones
  (bounds-checked), so a profile sees the first steps. A ValueError where fewer than 8 fit."""
  ranges = (SMEM_BYTES - (-(-used_smem // 8) * 8)) // (3 * 4 * 4)
  if ranges < 8:
    raise ValueError(f"{used_smem:,} of {SMEM_BYTES:,} bytes of shared memory leave room for {ranges} profiled "
                     f"ranges a warpgroup (at least 8 wanted)")
  return ranges


def smem_bytes(c: int, r: int, e: int, latent_itemsize: int, scale_groups: int = 0, sets: int = 1, *,
               staged: bool = True, p_sets: int | None = None) -> int:
  """The kernel's shared memory (its scratch buffers, each from a 1 KiB boundary, and its barriers): q~, q_pe, the
  untiled staging (`staged`), the operands (`sets` of each), P (`p_sets`, default `sets`), the packed ids
  buffer, an fp8 cache's scales."""
  p_sets = sets if p_sets is None else p_sets
  kib = lambda n: -(-n // 1024) * 1024  # noqa: E731
  staging = [sets * e * c * latent_itemsize, sets * e * r * 2] if staged else []
  buffers = [BLOCK_HEADS * c * 2, BLOCK_HEADS * r * 2, *staging, sets * e * c * 2, sets * e * r * 2,
             p_sets * BLOCK_HEADS * e * 2, (3 + p_sets) * max(e, BLOCK_HEADS) * 4] + (
                 [sets * scale_groups * e * 4] if scale_groups else [])
  # barriers of 8 bytes: q's, two ids; a set's copies, op_ready and op_free; a P set's p_ready; done, written;
  # p_free where P has fewer sets
  return sum(map(kib, buffers)) + 8 * (5 + 3 * sets + p_sets + (p_sets < sets))


@lowered_once_per_launch("scale", "config", "out_dtype", "interpret", "profile_dir")
def sparse_mla_mgpu(q_lat_BTNC: jax.Array, q_pe_BTNR: jax.Array, latent_BSC: jax.Array, k_pe_BSR: jax.Array,
                    slots_BTK: jax.Array, scale: float, *, latent_scale_BSG: jax.Array | None = None,
                    config: Config | None = None, out_dtype=jnp.float32, interpret=False,
                    profile_dir: str | None = None) -> jax.Array:
  """[B, T, N, C] in `out_dtype`: each query's heads attending over its selected slots (`slots_BTK` int32, −1 =
  not attended), the operands as `sparse_mla.reference` takes them. `latent_scale_BSG`: an fp8 MLA cache's
  scales (`latent_BSC` then holds its e4m3 codes, `sparse_mla.dequantize_latent`'s format): the gather warpgroup
  dequantises each copied row in registers on its way into the bf16 operand; the selected rows' scales are
  gathered by XLA first (16 B an entry beside its 512 B of codes). `interpret`: Pallas's GPU interpreter (any host:
  the tests); True for its defaults, or a `plgpu.InterpretGPUParams` (the tests' race detection). `profile_dir`:
  Mosaic GPU's on-device profiler on, each call writing a trace of the warpgroups' named phases
  (`sparse_mla_mgpu_body`) there, in the shared memory the launch leaves free (`profile_ranges`); for
  `benchmarks.sparse_mla_profile`, compiled only."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  b, t, n, c = q_lat_BTNC.shape
  r, k = q_pe_BTNR.shape[-1], slots_BTK.shape[-1]
  config = config_for(b * t, n, k, c, config)
  check_operands(q_lat_BTNC, q_pe_BTNR, latent_BSC, k_pe_BSR, slots_BTK, config, latent_scale_BSG)
  e, splits = config.block_entries, config.splits
  profile = {}
  if profile_dir is not None:
    if interpret:
      raise ValueError("profile_dir: Mosaic GPU's profiler runs compiled only, not in the interpreter")
    ranges = profile_ranges(launch_smem_bytes(config, latent_BSC, k_pe_BSR, latent_scale_BSG))
    profile = dict(profile_space=ranges, profile_dir=profile_dir, profile_bounds_check=True)
  dtype, hb = q_lat_BTNC.dtype, BLOCK_HEADS
  padded = -(-n // hb) * hb
  pieces = -(-c // TMA_BOX)  # a latent row is copied as [pieces, c / pieces]: a TMA box is ≤ 256 wide
  width = c // pieces
  row_copies = 1 if config.whole_rows else pieces  # TMA copies a latent row takes (+ one for its rope key)
  pad_heads = [(0, 0), (0, padded - n), (0, 0)]
  q_lat = jnp.pad(q_lat_BTNC.reshape(b * t, n, c), pad_heads)
  q_pe = jnp.pad(q_pe_BTNR.reshape(b * t, n, r), pad_heads)
  ids_width = -(-e // 32) * 32  # a step's ids fetch moves a multiple of 128 bytes: the splits' ends padded to it
  slots = jnp.pad(slots_BTK.astype(jnp.int32).reshape(b * t, splits, k // splits),
                  [(0, 0), (0, 0), (0, ids_width - e)], constant_values=-1)
  steps = k // splits // e
  sets, psets, direct = buffer_sets(config), p_sets(config), config.direct_gather

  def buf(shape, n=sets):  # a buffer of `n` sets (one set: the shape itself)
    return shape if n == 1 else (n, *shape)

  scaled = latent_scale_BSG is not None
  scale_inputs, scale_scratch = [], []
  if scaled:  # the selected rows' scales, [B·T, splits, G, K / splits]: a step's are one [G, E] TMA box
    g = latent_scale_BSG.shape[-1]
    rows_B1 = jnp.arange(b)[:, None, None]
    picked = latent_scale_BSG[rows_B1, jnp.maximum(slots_BTK, 0)].astype(jnp.float32)  # [B, T, K, G]
    scale_inputs = [picked.reshape(b * t, splits, k // splits, g).transpose(0, 1, 3, 2)]
    scale_scratch = [plgpu.SMEM(buf((g, e)), jnp.float32)]

  from jax.experimental.mosaic.gpu import fragmented_array as mgpu_fa  # noqa: PLC0415
  if direct:  # the layout the direct gather's copies write (128-byte swizzles, as one set's at these widths)
    lat_t = pe_t = p_t = gather.operand_transforms(plgpu)
  elif config.double_buffered:  # every operand at a 64-byte swizzle: K = 32 entries (64 B of bf16) must be a multiple
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
  plan = Plan(plgpu=plgpu, config=config, t=t, e=e, c=c, steps=steps, sets=sets, p_sets=psets, pieces=pieces,
              width=width, hb=hb,
              groups=g if scaled else 0, dtype=dtype, scale=scale, interpret=bool(interpret), rows_layout=rows_layout,
              wgmma_rows=plgpu.Layout.WGMMA.reduce(1), wgmma_cols=plgpu.Layout.WGMMA.reduce(0), ids_width=ids_width)
  out_dt = out_dtype if splits == 1 else jnp.float32
  kernel = plgpu.kernel(
      body_for(plan),
      out_type=(jax.ShapeDtypeStruct((b * t, splits, padded, c), out_dt),
                jax.ShapeDtypeStruct((b * t, splits, padded), jnp.float32)),
      scratch_types=[
          plgpu.SMEM((hb, c), dtype, transforms=lat_t), plgpu.SMEM((hb, r), dtype, transforms=pe_t),
          # untiled, rows 128-byte aligned as a TMA destination must be (so a warp's re-layout load meets 8-way bank
          # conflicts: padding the rows apart misaligned the copies on the H200, 2026-12-03); none for the direct gather
          *([] if direct else [plgpu.SMEM(buf((e, pieces, width)), latent_BSC.dtype), plgpu.SMEM(buf((e, r)), dtype)]),
          # destinations
          plgpu.SMEM(buf((e, c)), dtype, transforms=lat_t), plgpu.SMEM(buf((e, r)), dtype, transforms=pe_t),
          plgpu.SMEM(buf((hb, e), psets), dtype, transforms=p_t),
          # two steps' slot ids, a step's rescale (a row a P set), the final sum (f32 bits): one buffer, as buffers
          # align to 1 KiB
          plgpu.SMEM((3 + psets, max(e, hb)), jnp.int32),
          *scale_scratch,
          plgpu.Barrier(num_arrivals=2),  # q~ and q_pe
          plgpu.Barrier(num_arrivals=1, num_barriers=2),  # a step's slot ids
          # a step's one-row copies (and its scales), a set each (the direct gather's: the interpreter's stand-in,
          # a TMA copy a piece and one for the rope; compiled it waits for its cp.async groups instead)
          plgpu.Barrier(num_arrivals=(pieces + 1) * e if direct else (row_copies + 1) * e + scaled,
                        num_barriers=sets),
          # op_ready, op_free (both halves): a set each; p_ready: a P set each; done, written
          plgpu.Barrier(num_arrivals=1, num_barriers=sets),
          plgpu.Barrier(num_arrivals=2, num_barriers=sets),
          plgpu.Barrier(num_arrivals=1, num_barriers=psets), plgpu.Barrier(num_arrivals=1), plgpu.Barrier(num_arrivals=1),
          # p_free: the values warpgroup done with the one P buffer (the direct gather's two operand sets let the
          # scores warpgroup reach the next step's P while the values warpgroup still reads this one)
          *([plgpu.Barrier(num_arrivals=1)] if psets < sets else []),
      ],
      grid=(padded // hb, splits, b * t),  # head blocks fastest: a query's CTAs read its rows through L2 once
      grid_names=("h", "p", "q"),
      num_threads=3,
      thread_name="wg",
      # no cross-warp reduction scratch: the row max / sum stay within a quad, and V3.2 widths need all but 3 KiB
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane, reduction_scratch_bytes=0,
                                           **profile),
      kernel_name=KERNEL_NAME + FORM_SUFFIXES[form_of(config)],  # which form ran, readable from a compiled program
      interpret=interpret_params(plgpu, interpret),
  )
  out, lse = kernel(q_lat, q_pe, latent_BSC.reshape(b, -1, pieces, width), k_pe_BSR, slots, *scale_inputs)
  return combine_splits(out[:, :, :n], lse[:, :, :n]).astype(out_dtype).reshape(b, t, n, c)

