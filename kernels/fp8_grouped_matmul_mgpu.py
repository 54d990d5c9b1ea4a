"""The FP8 grouped matmul of `kernels/fp8_grouped_matmul.py` (its op: formula, checks, dispatch) on Pallas's Mosaic
GPU backend (Hopper: TMA, wgmma). The contract and formula:

    y[a, n] = Σ_kb  scale[e_a, kb, n // 128] · Σ_{k in block kb} x[a, k] · code[e_a, k, n]        fp32 [A, N]

rows a sorted by expert, group e holding `group_sizes[e]` consecutive rows; rows past Σ group_sizes unwritten.

A CTA owns one group with rows, 128 output columns (one scale block) and one part of the K loop (`Config.split_k`).
The grid runs over min(A, E) group slots, not E experts: a decode step's A = 8 × tokens assignments touch few of
V3.2's 256 experts, and a CTA for each empty one would still be launched, set up and retired (`active_groups`). It
walks
its group's rows in spans of `subtiles` × `row_tile` rows from the 8-row boundary at or before the group's first row
(a dense linear's one group: `row_programs` CTAs share the spans). Per span a software pipeline over the 128-deep K
blocks keeps `stages` blocks of codes and activations in flight (TMA), and for each block:
  widen    the [128, 128] e4m3 codes → bf16 in shared memory, through fp32 (exact: e4m3 ⊂ bf16); wgmma has no
           bf16 × fp8 form, and the codes are stored [K, N] (N minor), which a register operand cannot take;
  multiply transposed, M = the block's 128 columns, N = a tile's rows: productᵀ = codeᵀ · xᵀ, so a few rows (a
           decode step's group holds ~8) still fill the tensor cores' M and cost an N of 8–56 (a wgmma a subtile);
  scale    total += scale[kb] · product in fp32 registers, as the formula has it (the codes stay exact).
Each tile's [128, rows] total goes through shared memory to a row-major tile and out by TMA in power-of-two row
counts, so rows past the group (another group's, another CTA's) are never written. Measured on the H200:
benchmarks/RESULTS.md, "The FP8 grouped matmul on Mosaic GPU".
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mtp.kernels.fp8_grouped_matmul import BLOCK, check_shapes
from jax_mtp.kernels.grouped_rows_mgpu import (BUSY_CTAS, MAX_ROW_TILE, ROW_TILES, active_groups, copy_step,
                                               row_tile_for, split_k_for, store_rows, tiles_of_group)
from jax_mtp.kernels.mosaic_gpu_common import interpret_params, lowered_once_per_launch, operand_transforms

KERNEL_NAME = "fp8_codes_gmm_mgpu"


@dataclasses.dataclass(frozen=True)
class Config:
  """Launch parameters; 0: `config_for` picks it."""

  row_tile: int = 0  # rows a product (wgmma's N): one of ROW_TILES
  # K blocks in flight. 2: on the H200 (2026-12-03 16:56, benchmarks/RESULTS.md) 3 was as fast or slower at most
  # shapes and 1.4× slower with 24-row tiles (two CTAs no longer fit a core's shared memory)
  stages: int = 2
  split_k: int = 0  # parts of the K loop, run by separate CTAs and summed after (in a fixed order)
  row_programs: int = 0  # CTAs sharing one group's row tiles (1 for experts, whose groups are small)
  # True: the output's two staging buffers share the widened weights' shared memory (free once a tile's last wgmma
  # is done), 8 KiB less a CTA at 8-row tiles: three CTAs fit a core instead of two. Not yet timed on a GPU
  share_output_smem: bool = False
  # Row tiles a CTA multiplies per widened block (a wgmma each, one accumulator each): a dense linear's 64 rows as
  # 2 × 40 in one CTA widen each block once, where 2 row programs of 56 widen it twice. Not yet timed on a GPU
  subtiles: int = 1
  # True: the grid's first axis runs over the min(A, E) groups that can have rows (the non-empty ones first,
  # `active_groups`); False: over all E experts, the empty ones' CTAs exiting at once (the form before 2026-12-05,
  # kept to time against: 1.19–1.26× slower at B = 1's 8 assignments on an H100, equal from 64; RESULTS)
  compact_groups: bool = True


def default_config(rows: int, experts: int) -> Config:
  """The launch a call without a `Config` starts from: for one group (a dense linear) of MAX_ROW_TILE < rows ≤
  2 · MAX_ROW_TILE (decode's 64 rows at B = 64) two subtiles a widened block in one CTA with the output staged in
  the weights' shared memory, where two row programs would each widen every block: on the H200 (2026-12-04 07:17,
  benchmarks/RESULTS.md, "The Mosaic FP8 grouped matmul's two untimed variants") 1.24–1.76× the two row programs at
  64 rows on o_proj, q_b_proj and q_a_proj, within 0.91–1.05× of the then Triton kernel; else `Config()`."""
  if experts == 1 and MAX_ROW_TILE < rows <= 2 * MAX_ROW_TILE:
    return Config(subtiles=2, share_output_smem=True)
  return Config()


def config_for(rows: int, experts: int, k: int, n: int, config: Config | None = None,
               busy: int = BUSY_CTAS) -> Config:
  """`config` (None: `default_config`) with what it leaves open chosen for `rows` over `experts` groups of [K, N]
  codes: the row tile the smallest of ROW_TILES ≥ twice a group's mean rows, plus the 7 rows a group's 8-aligned
  first tile may start before it (groups of one row need none); else the largest. For one group (a dense linear) as
  many row programs as tiles; then the fewest K parts (dividing K / 128) that give ≥ `busy` CTAs with rows."""
  config = config or default_config(rows, experts)
  tile = config.row_tile or row_tile_for(rows, experts, config.subtiles)
  row_programs = config.row_programs or (-(-rows // (tile * config.subtiles)) if experts == 1 else 1)
  split_k = config.split_k or split_k_for(rows, experts, k, n, row_programs, busy)
  return dataclasses.replace(config, row_tile=tile, row_programs=row_programs, split_k=split_k)


def check_operands(x_AK, codes_EKN, scale_EkN, group_sizes_E, config: Config) -> None:
  """A ValueError naming the operand (the op's `check_shapes`) or launch value the kernel cannot take."""
  check_shapes(x_AK, codes_EKN, scale_EkN, group_sizes_E)
  k = x_AK.shape[1]
  if config.row_tile not in ROW_TILES:
    raise ValueError(f"row_tile={config.row_tile} is not one of {ROW_TILES}")
  if config.split_k < 1 or (k // BLOCK) % config.split_k:
    raise ValueError(f"split_k={config.split_k} must divide the {k // BLOCK} blocks of K = {k}")
  if config.stages < 1 or config.row_programs < 1:
    raise ValueError(f"stages={config.stages} and row_programs={config.row_programs} must be ≥ 1")
  if config.subtiles < 1:
    raise ValueError(f"subtiles={config.subtiles} must be ≥ 1")


@lowered_once_per_launch("config", "interpret")
def fp8_grouped_matmul_mgpu(x_AK: jax.Array, codes_EKN: jax.Array, scale_EkN: jax.Array, group_sizes_E: jax.Array,
                            *, config: Config | None = None, interpret=False) -> jax.Array:
  """fp32 [A, N]: the rows of group e (sorted, consecutive) times expert e's FP8 weight (e4m3 codes [E, K, N],
  block scales [E, K/128, N/128]); x is taken in bf16. `interpret`: Pallas's GPU interpreter (any host; True, or
  a `plgpu.InterpretGPUParams`: the tests' race detection)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  a, k = x_AK.shape
  e, _, n = codes_EKN.shape
  config = config_for(a, e, k, n, config)
  check_operands(x_AK, codes_EKN, scale_EkN, group_sizes_E, config)
  tile, stages, split_k, row_programs = config.row_tile, config.stages, config.split_k, config.row_programs
  subtiles = config.subtiles
  span = tile * subtiles  # rows a CTA's x buffer holds: `subtiles` products of `tile` rows per widened block
  blocks = k // BLOCK // split_k  # K blocks a CTA multiplies
  stages = min(stages, blocks)
  sizes = group_sizes_E.astype(jnp.int32)
  starts = jnp.cumsum(sizes) - sizes
  if config.compact_groups:
    experts, sizes = active_groups(sizes, min(a, e))
    starts = starts[experts]
  else:
    experts = jnp.arange(e, dtype=jnp.int32)
  # whole 8-row tiles (TMA's), and `tile` spare rows: a tile starting at the last group's last row reads in bounds
  padded = -(-a // 8) * 8 + span
  x = jnp.pad(x_AK.astype(jnp.bfloat16), ((0, padded - a), (0, 0)))
  bf16 = operand_transforms(plgpu, jnp.bfloat16, BLOCK)

  def body(experts_gmem, starts_gmem, sizes_gmem, x_gmem, codes_gmem, scale_gmem, out_gmem,
           x_smem, codes_smem, staging, loaded):
    (weight_smem,), (total_smem, rows_smem) = staging
    group, column, program = lax.axis_index("g"), lax.axis_index("n"), lax.axis_index("p")
    part, row_program = lax.div(program, row_programs), lax.rem(program, row_programs)
    expert, start, size = experts_gmem[group], starts_gmem[group], sizes_gmem[group]
    aligned, tiles = tiles_of_group(start, size, span)
    end = start + size

    def write_rows(total, first):
      store_rows(total, first, start=start, end=end, tile=tile, part=part, column=column, total_smem=total_smem,
                 rows_smem=rows_smem, out_gmem=out_gmem, plgpu=plgpu)

    @pl.loop(row_program, tiles, step=row_programs)
    def _(t):
      first = aligned + t * span

      def fetch(step, slot):  # the step's activations [span, 128] and codes [128, 128]
        copy_step(x_gmem, codes_gmem, x_smem.at[slot], codes_smem.at[slot], loaded.at[slot], expert=expert,
                  first=first, rows=span, kb=part * blocks + step, column=column, plgpu=plgpu)

      for slot in range(stages):
        fetch(slot, slot)

      def products(slot):  # one wgmma a subtile; reading the accumulators waits for them: the slot is free after
        def run(*accs):
          for s, acc in enumerate(accs):
            plgpu.wgmma(acc, weight_smem.T, x_smem.at[slot, pl.ds(s * tile, tile)].T)
          return tuple(acc[...] for acc in accs)
        return pl.run_scoped(run, *[plgpu.ACC((BLOCK, tile), jnp.float32)] * subtiles)

      def k_step(step, totals):
        slot = lax.rem(step, stages)
        # a global load issued before the widening and the wgmma it waits behind
        scale = scale_gmem[expert, part * blocks + step, column]
        plgpu.barrier_wait(loaded.at[slot])
        weight_smem[...] = codes_smem.at[slot][...].astype(jnp.float32).astype(jnp.bfloat16)
        plgpu.commit_smem()
        block_products = products(slot)
        plgpu.commit_smem()  # the slot's generic reads before the next TMA write into it
        pl.when(step + stages < blocks)(lambda: fetch(step + stages, slot))
        return tuple(total + scale * product for total, product in zip(totals, block_products))

      zeros = plgpu.layout_cast(jnp.zeros((BLOCK, tile), jnp.float32), plgpu.Layout.WGMMA)
      totals = lax.fori_loop(0, blocks, k_step, (zeros,) * subtiles)  # each [128 columns, tile rows]
      for s, total in enumerate(totals):
        write_rows(total, first + s * tile)

  weight = plgpu.SMEM((BLOCK, BLOCK), jnp.bfloat16, transforms=bf16)
  total, rows = plgpu.SMEM((BLOCK, tile), jnp.float32), plgpu.SMEM((tile, BLOCK), jnp.float32)
  # after a tile's K loop the weights are dead (its last wgmma waited for) until the next tile's first widening,
  # which follows the rows' copies out (`wait_smem_to_gmem` ends in a warpgroup barrier)
  staging = plgpu.RefUnion((weight,), (total, rows)) if config.share_output_smem else ((weight,), (total, rows))
  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((split_k, padded, n), jnp.float32),
      scratch_types=[
          plgpu.SMEM((stages, span, BLOCK), jnp.bfloat16, transforms=bf16),
          plgpu.SMEM((stages, BLOCK, BLOCK), codes_EKN.dtype, transforms=operand_transforms(plgpu, codes_EKN.dtype,
                                                                                             BLOCK)),
          staging,
          plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      ],
      grid=(experts.shape[0], n // BLOCK, split_k * row_programs),
      grid_names=("g", "n", "p"),
      kernel_name=KERNEL_NAME,
      # Lane semantics: the default Warpgroup semantics finds no layouts for this body (jax 0.12)
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
      interpret=interpret_params(plgpu, interpret),
  )
  out = kernel(experts, starts, sizes, x, codes_EKN, scale_EkN.astype(jnp.float32))
  return jnp.sum(out[:, :a], axis=0)  # the K parts (a fixed order: deterministic)
