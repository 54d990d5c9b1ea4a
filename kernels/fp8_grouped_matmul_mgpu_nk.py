"""The FP8 grouped matmul on Pallas Mosaic GPU over codes stored [E, N, K] (K minor: the checkpoint's own [out, in]
order), widened in registers and multiplied as wgmma's register operand, with no bf16 copy of a block in shared
memory. The op's formula, with the codes and scales indexed [e, n, k]:

    y[a, n] = Σ_kb  scale[e_a, n // 128, kb] · Σ_{k in block kb} x[a, k] · code[e_a, n, k]        fp32 [A, N]

rows a sorted by expert, group e holding `group_sizes[e]` consecutive rows; rows past Σ group_sizes unwritten.

Why a second kernel beside `fp8_grouped_matmul_mgpu` (codes [E, K, N]): wgmma has no bf16 × fp8 form, so a block of
codes must be widened to bf16 first. Stored [K, N] (N minor) a block cannot be loaded into wgmma's register operand
(each thread holds pairs along K), so that kernel widens it through 32 KiB of swizzled shared memory a block (16 KiB
read, 32 KiB written, 32 KiB read again by the wgmma) in series with its products; stored [N, K] a [128, 128] block
loads from shared memory straight into the operand's layout (16 KiB read), is widened there (e4m3 → f32 → bf16:
exact, and the only conversion every ptxas of CUDA 12/13 takes) and multiplied transposed, as the other kernel does:
productᵀ = code · xᵀ, M = the block's 128 columns, N = a tile's rows. The next block's codes are loaded and widened
while this block's wgmma runs (both in registers, 64 a thread each).

Everything else is the [K, N] kernel's: its `Config` and `config_for`, the CTA's (expert, column block, K part and
row program), the 8-row aligned spans, the per-block scale in fp32 registers and the rows written out by
`write_rows`. Pallas's GPU interpreter takes wgmma's A operand only from shared memory, so with `interpret` the
widened block goes through a shared-memory buffer (the one path the interpreter cannot run as compiled).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mtp.kernels.fp8_grouped_matmul import BLOCK
from jax_mtp.kernels.fp8_grouped_matmul_mgpu import Config, check_operands, config_for, write_rows
from jax_mtp.kernels.mosaic_gpu_common import interpret_params, operand_transforms

KERNEL_NAME = "fp8_codes_gmm_mgpu_nk"


def as_nk(codes_EKN: jax.Array, scale_EkN: jax.Array) -> tuple[jax.Array, jax.Array]:
  """[E, K, N] codes and [E, K/128, N/128] scales in this kernel's order ([E, N, K], [E, N/128, K/128])."""
  return jnp.swapaxes(codes_EKN, 1, 2), jnp.swapaxes(scale_EkN, 1, 2)


def fp8_grouped_matmul_mgpu_nk(x_AK: jax.Array, codes_ENK: jax.Array, scale_EnK: jax.Array,
                               group_sizes_E: jax.Array, *, config: Config | None = None,
                               interpret=False) -> jax.Array:
  """fp32 [A, N]: the rows of group e (sorted, consecutive) times expert e's FP8 weight (e4m3 codes [E, N, K],
  block scales [E, N/128, K/128]); x is taken in bf16. `interpret`: Pallas's GPU interpreter (any host; True, or
  a `plgpu.InterpretGPUParams`: the tests' race detection)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  a, k = x_AK.shape
  e, n, k2 = codes_ENK.shape
  if scale_EnK.shape != (e, n // BLOCK, k2 // BLOCK):
    raise ValueError(f"scales {scale_EnK.shape} are not the {BLOCK} × {BLOCK} blocks of codes {codes_ENK.shape} "
                     f"[E, N, K]")
  config = config_for(a, e, k, n, config)
  # the op's checks on the [E, K, N] view's shapes (no data moves: only shapes are read)
  check_operands(x_AK, jax.ShapeDtypeStruct((e, k2, n), codes_ENK.dtype),
                 jax.ShapeDtypeStruct((e, k2 // BLOCK, n // BLOCK), scale_EnK.dtype), group_sizes_E, config)
  if config.share_output_smem:
    raise ValueError("share_output_smem: this kernel keeps no widened weights in shared memory to share")
  tile, stages, split_k, row_programs, subtiles = (config.row_tile, config.stages, config.split_k,
                                                   config.row_programs, config.subtiles)
  span = tile * subtiles
  blocks = k // BLOCK // split_k  # K blocks a CTA multiplies
  if stages < 2 and blocks > 1:  # the next block's codes are read during this block's products: a second slot
    raise ValueError(f"stages={stages}: this kernel reads block b + 1 while block b multiplies (needs ≥ 2)")
  stages = min(stages, blocks)
  in_registers = not interpret  # the interpreter's wgmma takes A from shared memory only
  sizes = group_sizes_E.astype(jnp.int32)
  starts = jnp.cumsum(sizes) - sizes
  padded = -(-a // 8) * 8 + span  # whole 8-row tiles (TMA's); a span from the last row reads in bounds
  x = jnp.pad(x_AK.astype(jnp.bfloat16), ((0, padded - a), (0, 0)))
  bf16 = operand_transforms(plgpu, jnp.bfloat16, BLOCK)

  def body(starts_gmem, sizes_gmem, x_gmem, codes_gmem, scale_gmem, out_gmem, x_smem, codes_smem, total_smem,
           rows_smem, loaded, *operand_smem):
    expert, column, program = lax.axis_index("e"), lax.axis_index("n"), lax.axis_index("p")
    part, row_program = lax.div(program, row_programs), lax.rem(program, row_programs)
    start, size = starts_gmem[expert], sizes_gmem[expert]
    aligned = lax.div(start, 8) * 8  # TMA copies into the tiled x buffer from 8-row boundaries (the [K, N] kernel's)
    end = start + size

    @pl.loop(row_program, jnp.where(size > 0, lax.div(end - aligned + span - 1, span), 0), step=row_programs)
    def _(t):
      first = aligned + t * span

      def fetch(step, slot):  # the step's activations [span, 128] and codes [128 columns, 128 K]
        kb = part * blocks + step
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(first, span), pl.ds(kb * BLOCK, BLOCK)], x_smem.at[slot],
                                loaded.at[slot])
        plgpu.copy_gmem_to_smem(codes_gmem.at[expert, pl.ds(column * BLOCK, BLOCK), pl.ds(kb * BLOCK, BLOCK)],
                                codes_smem.at[slot], loaded.at[slot])

      for slot in range(stages):
        fetch(slot, slot)

      def widened(slot):  # the slot's codes in wgmma's register-operand layout, as bf16 (exact)
        plgpu.barrier_wait(loaded.at[slot])
        codes = plgpu.load(codes_smem.at[slot], layout=plgpu.Layout.WGMMA, optimized=True)
        return codes.astype(jnp.float32).astype(jnp.bfloat16)

      def products(weight, slot, next_slot):
        """The block's products (one wgmma a subtile) and, loaded while they run, the next block's widened codes
        (None at the last block). Reading the accumulators waits for the wgmmas: the slot is free after."""
        if in_registers:
          operand = weight
        else:
          operand_smem[0][...] = weight
          plgpu.commit_smem()
          operand = operand_smem[0]

        def run(*accs):
          for s, acc in enumerate(accs):
            plgpu.wgmma(acc, operand, x_smem.at[slot, pl.ds(s * tile, tile)].T)
          following = None if next_slot is None else widened(next_slot)
          return tuple(acc[...] for acc in accs), following
        return pl.run_scoped(run, *[plgpu.ACC((BLOCK, tile), jnp.float32)] * subtiles)

      def k_step(step, totals, weight, last):
        slot = lax.rem(step, stages)
        scale = scale_gmem[expert, column, part * blocks + step]  # issued before the wgmma it waits behind
        block_products, following = products(weight, slot, None if last else lax.rem(step + 1, stages))
        plgpu.commit_smem()  # the slot's generic reads before the next TMA write into it
        pl.when(step + stages < blocks)(lambda: fetch(step + stages, slot))
        return tuple(total + scale * product for total, product in zip(totals, block_products)), following

      def loop_step(step, carry):
        return k_step(step, *carry, last=False)

      zeros = plgpu.layout_cast(jnp.zeros((BLOCK, tile), jnp.float32), plgpu.Layout.WGMMA)
      # every block but the last loads its successor during its products; the last is peeled (no successor)
      totals, weight = lax.fori_loop(0, blocks - 1, loop_step, ((zeros,) * subtiles, widened(0)))
      totals, _ = k_step(blocks - 1, totals, weight, last=True)
      for s, total in enumerate(totals):
        write_rows(plgpu, total, first + s * tile, start, end, (part, column), total_smem, rows_smem, out_gmem)

  scratch = [
      plgpu.SMEM((stages, span, BLOCK), jnp.bfloat16, transforms=bf16),
      plgpu.SMEM((stages, BLOCK, BLOCK), codes_ENK.dtype,
                 transforms=operand_transforms(plgpu, codes_ENK.dtype, BLOCK)),
      plgpu.SMEM((BLOCK, tile), jnp.float32),
      plgpu.SMEM((tile, BLOCK), jnp.float32),
      plgpu.Barrier(num_arrivals=2, num_barriers=stages),
  ]
  if not in_registers:
    scratch.append(plgpu.SMEM((BLOCK, BLOCK), jnp.bfloat16, transforms=bf16))
  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((split_k, padded, n), jnp.float32),
      scratch_types=scratch,
      grid=(e, n // BLOCK, split_k * row_programs),
      grid_names=("e", "n", "p"),
      kernel_name=KERNEL_NAME,
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
      interpret=interpret_params(plgpu, interpret),
  )
  out = kernel(starts, sizes, x, codes_ENK, scale_EnK.astype(jnp.float32))
  return jnp.sum(out[:, :a], axis=0)  # the K parts (a fixed order: deterministic)
