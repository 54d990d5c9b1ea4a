"""A grouped matmul over 16-bit weights (the routed experts' bf16 / fp16 projections) on Pallas's Mosaic GPU backend
(Hopper: TMA, wgmma), in the FP8 kernel's transposed layout without its widening and scale steps:

    y[a, n] = Σ_k x[a, k] · w[e_a, k, n]        fp32 [A, N]

rows a sorted by expert, group e holding `group_sizes[e]` consecutive rows; rows past Σ group_sizes unwritten (the
contract of `jax_mtp.experts.grouped_experts`, as tokamax's and lax's ragged_dot have it).

Why beside tokamax's grouped matmul: tokamax multiplies [block_m = 64 rows, 128 columns] tiles, so a group of a few
rows (a decode step's expert holds 1–8, the verification forward's at B = 64 about 8) pays for 64, and its pipeline
ran near the sum of its bytes and its dots, not their max, at 1,024 tokens (benchmarks/RESULTS.md, "The experts at
verification's 1,024 tokens"). Here productᵀ [128 columns, tile rows] = wᵀ · xᵀ fills wgmma's M with the weight's
128 columns and costs an N of only 8–56 rows (`grouped_rows_mgpu`), and one accumulator lives across the whole K
loop: each step's wgmma is issued asynchronously and the step waits only for the previous step's, whose slot the
next TMA copy then refills, so `stages` − 1 copies stay in flight behind the tensor cores.

A CTA owns one group slot (the grid runs over min(A, E) of them, `active_groups`), 128 output columns and one part
of the K loop (`Config.split_k`, parts summed after in a fixed order). Which impl the model runs is
`jax_mtp.experts`' choice; this kernel runs only where it is named (`moe_impl="mosaic_gpu"`) until timed on a GPU.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mtp.kernels.grouped_rows_mgpu import (BLOCK, BUSY_CTAS, ROW_TILES, active_groups, copy_step, row_tile_for,
                                               split_k_for, store_rows, tiles_of_group)
from jax_mtp.kernels.mosaic_gpu_common import interpret_params, lowered_once_per_launch, operand_transforms

KERNEL_NAME = "gmm16_mgpu"  # bf16 or fp16
DTYPES = (jnp.bfloat16, jnp.float16)
CORE_SMEM = 227 * 1024  # the shared memory a core gives its CTAs (H100, H200; Mosaic GPU's max_smem_bytes)
MAX_STAGES = 4


@dataclasses.dataclass(frozen=True)
class Config:
  """Launch parameters; 0: `config_for` picks it."""

  row_tile: int = 0  # rows a product (wgmma's N): one of ROW_TILES
  stages: int = 0  # K steps whose operands are in shared memory at once (stages − 1 copies in flight)
  split_k: int = 0  # parts of the K loop, run by separate CTAs and summed after (in a fixed order)
  row_programs: int = 0  # CTAs sharing one group's row tiles (1 for experts, whose groups are small)


def smem_bytes(row_tile: int, stages: int, itemsize: int = 2) -> int:
  """A CTA's shared memory: `stages` × (a [128, 128] weight block + a [row_tile, 128] x block), and the output's
  two fp32 staging tiles; Mosaic GPU's own count is this plus the barriers' 8 bytes each (its lowering refuses a
  kernel over 232,448 bytes: 245,792 for 56-row tiles at 4 stages, 2026-12-06)."""
  return stages * (BLOCK * BLOCK + row_tile * BLOCK) * itemsize + 2 * row_tile * BLOCK * 4


def config_for(rows: int, experts: int, k: int, n: int, config: Config | None = None,
               busy: int = BUSY_CTAS) -> Config:
  """`config` (None: `Config()`) with what it leaves open chosen for `rows` over `experts` groups of [K, N] weights:
  the FP8 kernel's row tile, row programs and K parts (`grouped_rows_mgpu`), and the stages (2 … MAX_STAGES, at
  most the K steps) that keep the most weight copies in flight on a core: (stages − 1) a CTA times the CTAs (≤ 2)
  whose shared memory fits it, fewer stages on a tie (a second CTA's epilogue overlaps the first's copies)."""
  config = config or Config()
  tile = config.row_tile or row_tile_for(rows, experts, 1)
  row_programs = config.row_programs or (-(-rows // tile) if experts == 1 else 1)
  split_k = config.split_k or split_k_for(rows, experts, k, n, row_programs, busy)
  stages = config.stages or max(range(2, MAX_STAGES + 1),
                                 key=lambda s: (min(2, CORE_SMEM // smem_bytes(tile, s)) * (s - 1), -s))
  return Config(row_tile=tile, stages=min(stages, max(k // BLOCK // split_k, 1)), split_k=split_k,
                row_programs=row_programs)


def reference(x_AK, w_EKN, group_sizes_E) -> jax.Array:
  """The kernel's formula in jnp (fp32 products and sums); rows past Σ group_sizes are zero here."""
  a = x_AK.shape[0]
  ids_A = jnp.repeat(jnp.arange(w_EKN.shape[0]), group_sizes_E, total_repeat_length=a)
  valid_A = jnp.arange(a) < jnp.sum(group_sizes_E)
  y = jnp.einsum("ak,akn->an", x_AK.astype(jnp.float32), w_EKN[ids_A].astype(jnp.float32),
                 precision=lax.Precision.HIGHEST)
  return jnp.where(valid_A[:, None], y, 0.0)


def takes(w_EKN) -> bool:
  """Whether the kernel takes these weights: 16-bit, K and N multiples of 128."""
  _, k, n = w_EKN.shape
  return w_EKN.dtype in DTYPES and k % BLOCK == 0 and n % BLOCK == 0


def check_operands(x_AK, w_EKN, group_sizes_E, config: Config) -> None:
  """One ValueError naming the operand or launch value the kernel cannot take."""
  a, k = x_AK.shape
  e, k2, n = w_EKN.shape
  if w_EKN.dtype not in DTYPES or x_AK.dtype != w_EKN.dtype:
    raise ValueError(f"x {x_AK.dtype} and weights {w_EKN.dtype} must be one 16-bit dtype (bfloat16 or float16)")
  if k2 != k or k % BLOCK or n % BLOCK:
    raise ValueError(f"x {x_AK.shape} and weights {w_EKN.shape}: need the same K, K and N multiples of {BLOCK}")
  if group_sizes_E.shape != (e,):
    raise ValueError(f"group_sizes {group_sizes_E.shape} must give one size per expert of weights {w_EKN.shape}")
  if config.row_tile not in ROW_TILES:
    raise ValueError(f"row_tile={config.row_tile} is not one of {ROW_TILES}")
  if config.split_k < 1 or (k // BLOCK) % config.split_k:
    raise ValueError(f"split_k={config.split_k} must divide the {k // BLOCK} blocks of K = {k}")
  if config.stages < 1 or config.row_programs < 1:
    raise ValueError(f"stages={config.stages} and row_programs={config.row_programs} must be ≥ 1")


@lowered_once_per_launch("config", "interpret")
def grouped_matmul_mgpu(x_AK: jax.Array, w_EKN: jax.Array, group_sizes_E: jax.Array, *, config: Config | None = None,
                        interpret=False) -> jax.Array:
  """fp32 [A, N]: the rows of group e (sorted, consecutive) times expert e's weight [K, N] (x and w one 16-bit
  dtype). `interpret`: Pallas's GPU interpreter (any host; True, or a `plgpu.InterpretGPUParams`: the tests' race
  detection)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  a, k = x_AK.shape
  e, _, n = w_EKN.shape
  config = config_for(a, e, k, n, config)
  check_operands(x_AK, w_EKN, group_sizes_E, config)
  tile, stages, split_k, row_programs = config.row_tile, config.stages, config.split_k, config.row_programs
  blocks = k // BLOCK // split_k  # K steps a CTA multiplies
  stages = min(stages, blocks)
  experts, sizes = active_groups(group_sizes_E.astype(jnp.int32), min(a, e))
  starts = (jnp.cumsum(group_sizes_E) - group_sizes_E).astype(jnp.int32)[experts]
  # whole 8-row tiles (TMA's), and `tile` spare rows: a tile starting at the last group's last row reads in bounds
  padded = -(-a // 8) * 8 + tile
  x = jnp.pad(x_AK, ((0, padded - a), (0, 0)))
  layout = operand_transforms(plgpu, w_EKN.dtype, BLOCK)

  def body(experts_gmem, starts_gmem, sizes_gmem, x_gmem, w_gmem, out_gmem, x_smem, w_smem, total_smem, rows_smem,
           loaded):
    group, column, program = lax.axis_index("g"), lax.axis_index("n"), lax.axis_index("p")
    part, row_program = lax.div(program, row_programs), lax.rem(program, row_programs)
    expert, start, size = experts_gmem[group], starts_gmem[group], sizes_gmem[group]
    aligned, tiles = tiles_of_group(start, size, tile)

    @pl.loop(row_program, tiles, step=row_programs)
    def _(t):
      first = aligned + t * tile

      def fetch(step, slot):
        copy_step(x_gmem, w_gmem, x_smem.at[slot], w_smem.at[slot], loaded.at[slot], expert=expert, first=first,
                  rows=tile, kb=part * blocks + step, column=column, plgpu=plgpu)

      for slot in range(stages):
        fetch(slot, slot)

      # the step whose product a step waits for: the one before (one wgmma stays in flight), or with one stage
      # the step itself (its slot holds the next step's copy)
      lag = 1 if stages > 1 else 0

      def products(acc):
        def k_step(step, carry):
          slot = lax.rem(step, stages)
          plgpu.barrier_wait(loaded.at[slot])
          plgpu.wgmma(acc, w_smem.at[slot].T, x_smem.at[slot].T)
          plgpu.wgmma_wait(lag)  # that step's product is done: its slot is free for the copy `stages` after it
          done = step - lag
          pl.when((done >= 0) & (done + stages < blocks))(lambda: fetch(done + stages, lax.rem(done, stages)))
          return carry

        lax.fori_loop(0, blocks, k_step, 0)
        plgpu.wgmma_wait(0)
        return acc[...]

      total = pl.run_scoped(products, plgpu.ACC((BLOCK, tile), jnp.float32))  # [128 columns, tile rows]
      store_rows(total, first, start=start, end=start + size, tile=tile, part=part, column=column,
                 total_smem=total_smem, rows_smem=rows_smem, out_gmem=out_gmem, plgpu=plgpu)

  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((split_k, padded, n), jnp.float32),
      scratch_types=[
          plgpu.SMEM((stages, tile, BLOCK), x.dtype, transforms=layout),
          plgpu.SMEM((stages, BLOCK, BLOCK), w_EKN.dtype, transforms=layout),
          plgpu.SMEM((BLOCK, tile), jnp.float32),
          plgpu.SMEM((tile, BLOCK), jnp.float32),
          plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      ],
      grid=(experts.shape[0], n // BLOCK, split_k * row_programs),
      grid_names=("g", "n", "p"),
      kernel_name=KERNEL_NAME,
      # Lane semantics, as the FP8 kernel (the default Warpgroup semantics found no layouts for its body, jax 0.12)
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
      interpret=interpret_params(plgpu, interpret),
  )
  out = kernel(experts, starts, sizes, x, w_EKN)
  return jnp.sum(out[:, :a], axis=0)  # the K parts (a fixed order: deterministic)
