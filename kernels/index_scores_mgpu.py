"""The DSA indexer's scores on Pallas's Mosaic GPU backend (Hopper: TMA copies, wgmma): the op of
`kernels/index_scores.py` without Pallas's deprecated Triton backend (issue 28).

    I[b, t, s] = scale · Σ_i w[b, t, i] · ReLU(q[b, t, i] · k[b, s])

Transposed on the tensor cores: for each query t of a block, logitsᵀ = K · q_tᵀ is one wgmma with M = the step's
slots (`Config.block_slots`), N = the indexer heads, K = the head dim, so the weighted sum over heads is a
reduction along each accumulator row (in a thread and its quad: no shared-memory round trip), and the row of
scores lands in the layout a slot vector is stored from. A CTA holds its query block's q [tb, I, J] and w [tb, I]
in shared memory and streams its share of the row's keys past them through `emit_pipeline` (TMA, several steps
in flight); the grid is (B, T / tb, splits) with `splits` CTAs sharing a row's slots, enough CTAs to fill the
machine at decode's batch sizes.

With `positions_BT`, a step whose first slot lies past its query block's last position writes zeros without a
dot (those slots are invisible to every query of the block: slot s holds position s); with
`Config.bound_reads` its keys are not read either (the pipeline is as long as the seen steps). Keys in q's dtype
(bf16 / f16), or float8 with per-key scales: widened to q's dtype in shared memory (wgmma has no bf16 × fp8 form),
the scales applied to the fp32 logits.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mtp.kernels.index_scores import check_shapes
from jax_mtp.kernels.mosaic_gpu_common import interpret_params, lowered_once_per_launch, operand_transforms

KERNEL_NAME = "dsa_scores_mgpu"  # not containing the Triton kernel's name: a test can tell them apart
FLOAT8_DOT_SUFFIX = "_float8_dot"  # a launch's name: KERNEL_NAME + this where q is float8 (a float8 × float8 wgmma)
MIN_STEPS_PER_CTA = 4
FLOAT8_KEYS = (jnp.float8_e4m3fn, jnp.float8_e5m2)


@dataclasses.dataclass(frozen=True)
class Config:
  """Launch parameters. `splits` = 0: `config_for` picks it."""

  block_slots: int = 128  # slots per pipeline step: the wgmma's M (a multiple of 64)
  block_tokens: int = 4  # queries per CTA: q [tb, I, J] stays in shared memory
  # CTAs per (row, query block), each over ⌈steps / splits⌉ key blocks, the last over what is left where the split
  # does not divide the steps (with bound_reads only: its window ends at the row's end, its pipeline as long as its
  # share). `config_for` takes an uneven one where no divisor fills two waves: the CLI's capacities (4,352 slots = 34
  # steps: 2 or 34 CTAs a query block as divisors; docs/mosaic_gpu_notes.md)
  splits: int = 0
  max_concurrent_steps: int = 4  # key blocks in flight
  # With positions: True shortens the pipeline to the seen steps, so their keys are never read; False streams every
  # step and skips the unseen steps' dots. Both passed their compiled tests on the H200 (2026-12-03 13:40); at a
  # 2,048-token prefill chunk True took 1,437 µs, False 1,515 (12:42, benchmarks/RESULTS.md)
  bound_reads: bool = True
  # Queries of a block overlapped (T > 1): query n + 1's wgmma is issued into a second accumulator before query n's
  # epilogue (ReLU, head weights, the row sum) runs, so the tensor cores and the epilogue work at once instead of in
  # turn. Why: on the H200 (2026-12-04 18:39, benchmarks/RESULTS.md) four queries a block took 2.2× one query's time
  # over the same keys (1,184 against 545 µs at B = 64, 128K): a step's tb dots and epilogues ran one after another.
  # On by default: at T = 4 (18:56) it was faster in all 8 rows timed, by 0.6-14 % (B = 64, 128K: 1,160 against
  # 1,177 µs; B = 8, 32K: 62.4 against 72.8), so the serial chain was a small part of the T = 4 gap.
  overlap_queries: bool = True
  # A step's keys loaded once from shared memory into registers (wgmma's A operand) for all of a block's queries,
  # where each query's wgmma re-reads them from shared memory. Why: at T = 4 a step's four [128, 128] key reads and
  # four [64, 128] query reads are 192 KiB of shared-memory traffic (~1,500 cycles at 128 B a cycle, about the step's
  # measured time); from registers, 96 KiB. Float8 keys are widened in shared memory first, as without it.
  # None: `config_for` takes it for 16-bit keys and not for float8 ones. Timed on the H200 at T = 4 (2026-12-04 21:23,
  # benchmarks/RESULTS.md): bf16 keys 1,174 → 1,150 µs at B = 64 × 128K, 174 → 168 at B = 8 × 128K, 92.6 → 81.8 at
  # B = 8 × 32K, 306 → 309 at B = 64 × 32K; float8 keys slower in 3 of 4 rows (1,363 → 1,429 µs at B = 64 × 128K),
  # their widening pass already reading the keys once. Compiled only (the GPU interpreter has no register-operand
  # wgmma; there the keys stay in shared memory, the same product).
  keys_in_registers: bool | None = None


def allowed_splits(steps: int) -> list[int]:
  """The split counts a row of `steps` key blocks takes: divisors of the steps that leave each CTA
  ≥ MIN_STEPS_PER_CTA steps (or one CTA), fewest first."""
  return [d for d in range(1, steps + 1) if steps % d == 0 and (steps // d >= MIN_STEPS_PER_CTA or d == 1)]


def leaves_a_cta_empty(steps: int, splits: int) -> bool:
  """Whether `splits` CTAs of ⌈steps / splits⌉ key blocks each would leave the last one none (an uneven split's
  CTAs must each have a block)."""
  return (splits - 1) * -(-steps // splits) >= steps


def config_for(batch: int, tokens: int, slots: int, config: Config | None = None, cores: int = 132, *,
               float8_keys: bool = False) -> Config:
  """The call's launch: query blocks of min(T, block_tokens); `splits` the smallest divisor of the row's steps
  that gives ≥ 2 CTAs per core while each CTA keeps ≥ MIN_STEPS_PER_CTA steps (its q block is loaded once per CTA:
  64 KiB at V3.2 widths, as much as two steps of keys). (A CTA holds ~192 KiB of shared memory at V3.2's widths, so
  one runs a core at a time and this is two waves; swept on the H200, 2026-12-04 18:39, no other divisor was faster
  across B and T: benchmarks.index_scores_splits.) Where no divisor reaches two CTAs a core, the split of the fewest
  waves × steps a CTA (ties: the most CTAs), uneven ones included (`uneven_splits`; bound_reads only): the CLI's
  capacities have few divisors, 4,352 slots = 34 steps left B = 1 and 8 two CTAs a query block where 9 uneven ones
  ran 1.1–2.3× faster in 10 of 12 rows at T = 1 and 4 (an H100, 2026-12-07 15:27, RESULTS); at B = 64 it keeps the
  2 (one wave of 17 steps, where 5 would be three waves of 7; not timed against them).
  `keys_in_registers` unset: on for 16-bit keys, off for float8 ones (`float8_keys`), as timed (Config)."""
  config = config or Config()
  tb = min(tokens, config.block_tokens)
  splits = config.splits
  if not splits:
    steps = max(slots // config.block_slots, 1)
    query_blocks = batch * -(-tokens // tb)
    allowed = allowed_splits(steps)
    splits = next((d for d in allowed if query_blocks * d >= 2 * cores), None)
    if splits is None:  # the fewest waves × steps a CTA, uneven splits too (one CTA a core: ~192 KiB each)
      candidates = uneven_splits(steps) if config.bound_reads else allowed
      splits = min(candidates, key=lambda s: (-(-query_blocks * s // cores) * -(-steps // s), -s))
  registers = (not float8_keys) if config.keys_in_registers is None else config.keys_in_registers
  return dataclasses.replace(config, block_tokens=tb, splits=splits, keys_in_registers=registers)


def uneven_splits(steps: int) -> list[int]:
  """The split counts a row of `steps` key blocks takes with `bound_reads`: each CTA ⌈steps / splits⌉ blocks, at
  least MIN_STEPS_PER_CTA of them (or one CTA), the last CTA at least one; fewest first (divisors among them)."""
  return [s for s in range(1, steps + 1)
          if (-(-steps // s) >= MIN_STEPS_PER_CTA or s == 1) and not leaves_a_cta_empty(steps, s)]


def check_operands(q_BTIJ, k_BSJ, w_BTI, *, k_scale_BS, positions_BT, config: Config) -> None:
  """A ValueError naming the offending value where the kernel cannot take these operands."""
  check_shapes(q_BTIJ, k_BSJ, w_BTI)  # the scales' shape below, with what float8 keys need beside it
  b, t, i, j = q_BTIJ.shape
  s = k_BSJ.shape[1]
  fp8 = k_BSJ.dtype in FLOAT8_KEYS
  sixteen_bit_q = q_BTIJ.dtype in (jnp.bfloat16, jnp.float16) and (k_BSJ.dtype == q_BTIJ.dtype or fp8)
  if not (sixteen_bit_q or (fp8 and q_BTIJ.dtype == k_BSJ.dtype)):
    raise ValueError(f"q {q_BTIJ.dtype} and keys {k_BSJ.dtype}: q must be bfloat16 or float16 (wgmma's inputs) "
                     f"with keys in q's dtype or float8 with scales, or q in the float8 keys' own dtype")
  if config.keys_in_registers and q_BTIJ.dtype in FLOAT8_KEYS:
    raise ValueError(f"keys_in_registers loads 16-bit keys into wgmma's register operand; with q {q_BTIJ.dtype} the "
                     "keys stay in shared memory (keys_in_registers=False, or None: config_for's choice)")
  if fp8 != (k_scale_BS is not None) or (fp8 and (k_scale_BS.shape != (b, s) or j % 32)):
    raise ValueError(f"keys {k_BSJ.dtype} with k_scale_BS {None if k_scale_BS is None else k_scale_BS.shape}: "
                     f"float8 keys take one scale a key, shape {(b, s)}, and a head dim that is a multiple of 32 "
                     f"(got {j}); 16-bit keys none")
  steps = s // config.block_slots
  if config.block_slots % 64 or s % config.block_slots:
    raise ValueError(f"cache capacity {s} is not a multiple of block_slots={config.block_slots} (a multiple of 64)")
  if not 1 <= config.splits <= steps or leaves_a_cta_empty(steps, config.splits):
    raise ValueError(f"splits={config.splits} over {steps} key blocks leaves a CTA none (⌈steps / splits⌉ each)")
  if steps % config.splits and not config.bound_reads:
    raise ValueError(f"splits={config.splits} does not divide {steps} key blocks: an uneven split takes "
                     f"bound_reads=True")
  if i % 8 or i > 256 or (j * 2) % 32:
    raise ValueError(f"index heads {i} (a multiple of 8, ≤ 256) or head dim {j} (a multiple of 16) do not fit wgmma")
  if positions_BT is not None and positions_BT.shape != (b, t):
    raise ValueError(f"positions_BT of shape {positions_BT.shape} does not match the queries' {(b, t)}")


@lowered_once_per_launch("scale", "config", "interpret")
def index_scores_mgpu(q_BTIJ: jax.Array, k_BSJ: jax.Array, w_BTI: jax.Array, scale: float, *,
                      k_scale_BS: jax.Array | None = None, positions_BT: jax.Array | None = None,
                      config: Config | None = None, interpret=False) -> jax.Array:
  """fp32 [B, T, S] index scores (S a multiple of block_slots; see Config.splits). `k_scale_BS`: per-key scales of float8
  keys (e4m3 / e5m2), whose scales multiply the fp32 logits. Beside 16-bit q the kernel widens such keys to q's
  dtype in shared memory (through fp32: exact) before the dot; q in the keys' own float8 (`indexer.quantize_queries`,
  its scales already in w) is a float8 × float8 wgmma over the keys as they landed, at twice bf16's tensor-core
  rate and without the widening pass (the official FP8 indexer's numerics: each product exact, fp32 sums).
  `positions_BT` (int32, optional): each query's position; steps that start past its query block's last position
  are then written as zeros without a dot (and, with `config.bound_reads`, without reading their keys).
  `interpret`: Pallas's GPU interpreter (any host: the tests; True, or a `plgpu.InterpretGPUParams`: the tests'
  race detection)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  b, t, i, j = q_BTIJ.shape
  s = k_BSJ.shape[1]
  config = config_for(b, t, s, config, float8_keys=k_BSJ.dtype in FLOAT8_KEYS)
  check_operands(q_BTIJ, k_BSJ, w_BTI, k_scale_BS=k_scale_BS, positions_BT=positions_BT, config=config)
  tb, bs, splits = config.block_tokens, config.block_slots, config.splits
  padded = -(-t // tb) * tb  # padding queries have zero weights: their scores are 0 and dropped
  q = jnp.pad(q_BTIJ, [(0, 0), (0, padded - t), (0, 0), (0, 0)]).reshape(b, padded * i, j)  # TMA: ≤ 5 dims
  w = jnp.pad(w_BTI.astype(jnp.float32), [(0, 0), (0, padded - t), (0, 0)])
  if positions_BT is None:
    last_BQ = jnp.full((b, padded // tb), s - 1, jnp.int32)
  else:  # padding queries at −1: they never extend a block's visible slots
    pos = jnp.pad(positions_BT.astype(jnp.int32), [(0, 0), (0, padded - t)], constant_values=-1)
    last_BQ = pos.reshape(b, padded // tb, tb).max(-1)
  scaled = k_scale_BS is not None
  steps = -(-(s // bs) // splits)  # key blocks per CTA (the last CTA's share may be shorter)
  share = steps * bs  # slots per CTA
  uneven = (s // bs) % splits != 0
  operand = operand_transforms(plgpu, q.dtype, j)

  def body(q_gmem, k_gmem, w_gmem, last_gmem, *refs):
    k_scale_gmem = refs[0] if scaled else None
    o_gmem, q_smem, w_smem, o_smem, *widened_smem, loaded = refs[scaled:]
    widened_smem = widened_smem[0] if widened_smem else None
    bi, qi, si = lax.axis_index("b"), lax.axis_index("q"), lax.axis_index("s")
    plgpu.copy_gmem_to_smem(q_gmem.at[bi, pl.ds(qi * tb * i, tb * i)], q_smem, loaded)
    plgpu.copy_gmem_to_smem(w_gmem.at[bi, pl.ds(qi * tb, tb)], w_smem, loaded)
    plgpu.barrier_wait(loaded)
    first = si * share
    # an uneven split's last CTA: its window [window, window + share) ends at the row's end, its steps `offset` in
    own_steps, window, offset = steps, first, 0
    if uneven:
      own_steps = jnp.minimum(steps, (s - first) // bs)
      window = jnp.minimum(first, s - share)
      offset = (first - window) // bs
    # the steps this CTA streams: those starting at or before the block's last position (all without positions)
    seen = jnp.clip(lax.div(last_gmem[bi, qi] - first + bs, jnp.int32(bs)), 0, own_steps)
    o_row = o_gmem.at[bi, pl.ds(qi * tb, tb)]

    def write_zeros(out):  # an unseen step's scores
      for n in range(tb):
        out[n] = plgpu.layout_cast(jnp.zeros((bs,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))

    def step(indices, k_smem, *scale_smem):
      (st,) = indices
      out = o_smem.at[st % 2]  # two score buffers: a step writes one while the other's copy to HBM drains
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)
      if config.bound_reads:  # every streamed step is seen
        scores(k_smem, scale_smem, out)
      else:
        pl.when(st < seen)(lambda: scores(k_smem, scale_smem, out))
        pl.when(st >= seen)(lambda: write_zeros(out))
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(out, o_row.at[:, pl.ds(first + st * bs, bs)])

    def scores(k_smem, scale_smem, out):
      keys = k_smem
      if widened_smem is not None:  # float8 keys → q's dtype, through fp32 (exact), for wgmma's same-dtype operands
        widened_smem[...] = k_smem[...].astype(jnp.float32).astype(q.dtype)
        plgpu.commit_smem()
        keys = widened_smem
      k_scale = (lax.broadcast_in_dim(plgpu.load(scale_smem[0], layout=plgpu.Layout.WGMMA.reduce(1)), (bs, i), [0])
                 if scale_smem else None)

      # one shared-memory read of the step's keys for all tb queries (compiled only: Pallas's GPU interpreter runs no
      # wgmma with a register operand, so there the keys stay in shared memory, the same product)
      if config.keys_in_registers and tb > 1 and not interpret:
        keys = plgpu.load(keys, layout=plgpu.Layout.WGMMA, optimized=False)

      def issue(acc_ref, n):  # query n's logitsᵀ [slots, heads] += keys · q_nᵀ (async)
        plgpu.wgmma(acc_ref, keys, q_smem.at[pl.ds(n * i, i)].transpose((1, 0)))

      def epilogue(logits, n):
        if k_scale is not None:
          logits = logits * k_scale
        w_row = plgpu.load(w_smem.at[n], layout=plgpu.Layout.WGMMA.reduce(0))
        weighted = jnp.maximum(logits, 0.0) * lax.broadcast_in_dim(w_row, (bs, i), [1])
        out[n] = weighted.sum(axis=1) * scale

      if not config.overlap_queries or tb == 1:
        for n in range(tb):
          def dot(acc_ref, n=n):
            issue(acc_ref, n)
            return acc_ref[...]
          epilogue(pl.run_scoped(dot, plgpu.ACC((bs, i), jnp.float32)), n)
        return

      def overlapped(n, previous):  # query n's dot issued, then query n − 1's epilogue while it runs
        def scoped(acc_ref):  # a fresh (zero) accumulator a query, nested so that two are live at once
          issue(acc_ref, n)
          if previous is not None:
            epilogue(plgpu.wgmma_accumulator_load(previous, wait_n=1), n - 1)
          if n + 1 < tb:
            overlapped(n + 1, acc_ref)
          else:
            epilogue(plgpu.wgmma_accumulator_load(acc_ref, wait_n=0), n)
        pl.run_scoped(scoped, plgpu.ACC((bs, i), jnp.float32))

      overlapped(0, None)

    in_specs = [plgpu.BlockSpec((bs, j), lambda st: (st + offset, 0),
                                transforms=operand_transforms(plgpu, k_gmem.dtype, j))]
    gmem = [k_gmem.at[bi, pl.ds(window, share)]]
    if scaled:
      in_specs.append(plgpu.BlockSpec((bs,), lambda st: (st + offset,)))
      gmem.append(k_scale_gmem.at[bi, pl.ds(window, share)])
    plgpu.emit_pipeline(step, grid=(seen if config.bound_reads else steps,), in_specs=in_specs,
                        max_concurrent_steps=min(config.max_concurrent_steps, steps))(*gmem)
    plgpu.wait_smem_to_gmem(0)
    if not config.bound_reads:
      return

    @pl.when(seen < own_steps)  # the unseen steps: zeros, copied from one buffer
    def _():
      write_zeros(o_smem.at[0])
      plgpu.commit_smem()

      @pl.loop(seen, own_steps)
      def _(st):
        plgpu.copy_smem_to_gmem(o_smem.at[0], o_row.at[:, pl.ds(first + st * bs, bs)])

      plgpu.wait_smem_to_gmem(0)

  widened = [plgpu.SMEM((bs, j), q.dtype, transforms=operand)] if k_BSJ.dtype != q.dtype else []
  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((b, padded, s), jnp.float32),
      scratch_types=[plgpu.SMEM((tb * i, j), q.dtype, transforms=operand), plgpu.SMEM((tb, i), jnp.float32),
                     plgpu.SMEM((2, tb, bs), jnp.float32), *widened, plgpu.Barrier(num_arrivals=2)],
      grid=(b, padded // tb, splits),
      grid_names=("b", "q", "s"),
      kernel_name=KERNEL_NAME + (FLOAT8_DOT_SUFFIX if q.dtype in FLOAT8_KEYS else ""),
      interpret=interpret_params(plgpu, interpret),
  )
  inputs = [q, k_BSJ, w, last_BQ] + ([k_scale_BS.astype(jnp.float32)] if scaled else [])
  return kernel(*inputs)[:, :t]

