"""A grouped matmul straight from FP8 codes: the routed experts' projections with each expert's e4m3
codes read once per group of its rows, block scales applied in registers, and never a dequantised
copy of a weight in HBM.

    y[a, n] = Σ_kb  scale[e_a, kb, n // 128] · Σ_{k in block kb} x[a, k] · code[e_a, k, n]

where the rows a of `x` are sorted by expert and group e holds `group_sizes[e]` consecutive rows
(the contract of `jax_mtp.experts.grouped_experts`, as tokamax's and lax's ragged_dot have it); rows
past Σ group_sizes are left unwritten. fp32 out.

Why a kernel of ours: without it XLA dequantises every local expert to a bf16 copy in HBM before
tokamax's bf16 grouped matmul, which makes the FP8 step slower than the bf16 one, and tokamax's own
quantized ragged_dot (0.0.17) takes only fp16 activations and runs far below the FP8 bytes floor
(benchmarks/RESULTS.md, "FP8 weights kept on the device vs the same weights in bf16", and
"Measurements moved from docstrings (issue 30)").

Layout. Pallas' Triton backend computes a ref's element offsets in int32 below 2^32 bytes, so a
[256, 7168, 2048] code array (3.8e9 codes, DeepSeek-V3.2's experts on one device) wraps past 2^31
and reads another buffer. The kernel therefore sees the codes as uint32 words of 4 consecutive
output columns ([E, K, N / 4], 9.4e8 elements): the view is a bitcast, and each word's 4 bytes are
4 columns' codes. A program owns one expert and 128 output columns (= one scale block): it loops
over its group's rows in tiles (`row_tile_for`) and, per tile, over the K / 128 code blocks, decoding
the 4 byte planes of a [128, 32]-word block to bf16 (exact: e4m3 ⊂ bf16) and multiplying them on
the tensor cores (fp32 accumulation), then scales the block's partial sums. Byte plane i of the
block's words holds its columns 4j + i: the program writes plane i to its columns 32i + j, and one
transpose outside puts them back.

`backend`: "gpu" (Pallas' Triton backend), "interpret" (any host, for tests), or "auto": chosen by the
platform the program is lowered for (`jax.lax.platform_dependent`: interpret on CPU, Triton on CUDA),
so a CUDA export from a CPU host holds the real kernel. `reference` is the formula in jnp; the kernel
differs from it only in summation order.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

KERNEL_NAME = "fp8_grouped_matmul"
BACKENDS = ("auto", "gpu", "interpret")
# The kernels of this op: this module's ("triton", Pallas's Triton backend) and kernels/fp8_grouped_matmul_mgpu.py
# ("mosaic_gpu"); "auto" runs `auto_impl()`.
IMPLS = ("auto", "triton", "mosaic_gpu")
BLOCK = 128  # DeepSeek's FP8 block: 128 × 128 codes share one scale
WORD = 4  # codes per uint32 word
ROW_TILE = 16  # rows per tensor-core product of a group (Triton's dot needs M ≥ 16)
MAX_ROW_TILE = 64  # one group (a dense linear): up to this many rows a product, so the codes are read once
# Programs that keep a Hopper GPU's 132 SMs streaming: at decode sizes few experts are picked (8 at B = 1),
# and their 8 × 16 column blocks of 7168-deep codes leave the K loop latency-bound, so it is split until
# about this many programs have work (why 256 and not 512: benchmarks/RESULTS.md, "FP8 straight from the
# codes", the K-split sweep).
BUSY_PROGRAMS = 256


def auto_impl() -> str:
  """What impl="auto" runs: the Triton kernel while this JAX has Pallas's Triton backend (it measured faster on the
  H200: 0.82–0.92 of the floor on V3.2's experts against the Mosaic kernel's best 0.72–0.83, benchmarks/RESULTS.md,
  "The Triton sparse-MLA kernel removed"); the Mosaic GPU kernel once a JAX release removes that backend (deprecated
  since JAX 0.11.0), so that FP8 models keep decoding on Hopper GPUs instead of failing to import it."""
  return "triton" if has_pallas_triton() else "mosaic_gpu"


@functools.cache
def has_pallas_triton() -> bool:
  """Whether this JAX still has Pallas's Triton backend."""
  try:
    from jax.experimental.pallas import triton  # noqa: F401, PLC0415
  except ImportError:
    return False
  return True


def reference(x_AK, codes_EKN, scale_EkN, group_sizes_E) -> jax.Array:
  """The kernel's formula in jnp (fp32); rows past Σ group_sizes are zero here."""
  a, k = x_AK.shape
  e, _, n = codes_EKN.shape
  ids_A = jnp.repeat(jnp.arange(e), group_sizes_E, total_repeat_length=a)
  valid_A = jnp.arange(a) < jnp.sum(group_sizes_E)
  codes = codes_EKN[ids_A].astype(jnp.float32).reshape(a, k // BLOCK, BLOCK, n)
  partial = jnp.einsum("abk,abkn->abn", x_AK.astype(jnp.float32).reshape(a, k // BLOCK, BLOCK), codes,
                       precision=jax.lax.Precision.HIGHEST)
  scales = jnp.repeat(scale_EkN[ids_A].astype(jnp.float32), BLOCK, axis=-1)  # [A, K/128, N]
  return jnp.where(valid_A[:, None], jnp.sum(partial * scales, axis=1), 0.0)


def as_words(codes_EKN: jax.Array) -> jax.Array:
  """uint32 [E, K, N / 4]: the codes' bytes, 4 consecutive columns a word (a bitcast)."""
  e, k, n = codes_EKN.shape
  return jax.lax.bitcast_convert_type(codes_EKN.reshape(e, k, n // WORD, WORD), jnp.uint32)


MAX_WORDS = 2**31  # uint32 words of codes a weight: Triton's int32 element offsets


def takes(k: int, n: int, block, experts: int = 1) -> bool:
  """Whether the kernel takes `experts` [K, N] weights in FP8 blocks `block` (128 × 128, K and N
  multiples, fewer than MAX_WORDS words of codes in all)."""
  return (tuple(block) == (BLOCK, BLOCK) and k % BLOCK == 0 and n % BLOCK == 0
          and experts * k * n // WORD < MAX_WORDS)


def row_tile_for(rows: int, experts: int) -> int:
  """Rows per product: ROW_TILE for experts (decode-size groups hold a few rows each); for one group
  (a dense linear) the rows rounded up to a power of two, up to MAX_ROW_TILE."""
  if experts > 1:
    return ROW_TILE
  return min(MAX_ROW_TILE, max(ROW_TILE, 1 << (rows - 1).bit_length()))


def check_shapes(x_AK, codes_EKN, scale_EkN, group_sizes_E) -> None:
  """One clear error for operands the op does not take (this kernel's and the Mosaic GPU one's)."""
  a, k = x_AK.shape
  e, k2, n = codes_EKN.shape
  if codes_EKN.dtype != jnp.float8_e4m3fn:
    raise ValueError(f"codes must be float8_e4m3fn, got {codes_EKN.dtype}")
  if k2 != k or k % BLOCK or n % BLOCK:
    raise ValueError(f"x {x_AK.shape} and codes {codes_EKN.shape}: need the same K, K and N multiples of {BLOCK}")
  if scale_EkN.shape != (e, k // BLOCK, n // BLOCK):
    raise ValueError(f"scales {scale_EkN.shape} are not the {BLOCK} × {BLOCK} blocks of codes {codes_EKN.shape}")
  if group_sizes_E.shape != (e,):
    raise ValueError(f"group_sizes {group_sizes_E.shape} must give one size per expert of codes {codes_EKN.shape}")


def check_operands(x_AK, codes_EKN, scale_EkN, group_sizes_E, config: Config) -> None:
  """One clear error for operands (and a completed launch `config`) this kernel does not take."""
  check_shapes(x_AK, codes_EKN, scale_EkN, group_sizes_E)
  e, k, n = codes_EKN.shape
  if e * k * n // WORD >= MAX_WORDS:
    raise ValueError(f"codes {codes_EKN.shape}: {e * k * n // WORD:,} words exceed the kernel's int32 offsets")
  if config.split_k < 1 or (k // BLOCK) % config.split_k:
    raise ValueError(f"split_k={config.split_k} must divide the {k // BLOCK} blocks of K = {k}")
  if config.layout not in LAYOUTS[1:] or (config.layout == "bytes" and not can_take_bytes(e, k, n)):
    raise ValueError(f"layout={config.layout!r} does not take codes {codes_EKN.shape} (one of {LAYOUTS}; 'bytes': "
                     f"one group of fewer than {MAX_WORDS:,} codes)")


def split_k_for(rows: int, experts: int, k: int, n: int) -> int:
  """How many parts the K loop is split into: the fewest (dividing K / 128) that give the groups that
  can have rows (≤ min(rows, experts)) × N / 128 column blocks about BUSY_PROGRAMS programs."""
  programs = min(rows, experts) * (n // BLOCK)
  blocks = k // BLOCK
  return next((s for s in range(1, 9) if blocks % s == 0 and programs * s >= BUSY_PROGRAMS), 1 if blocks % 8 else 8)


LAYOUTS = ("auto", "words", "bytes")
BYTES_MIN_ROWS = 32  # one group of at least this many rows takes the "bytes" layout (see layout_for)
# At most this many row tiles a "bytes" program: its kernel unrolls its row tiles (each a K loop of products and a
# masked store), so its size, and Triton's compile time, grow with the rows. A prefill chunk's thousands of rows
# (4,096 at a 32K prompt: 64 tiles; 65,536 at B = 64 × 1K: 1,024) made programs that did not finish compiling on the
# H200 (benchmarks/RESULTS.md: 2026-12-03, "still compiling when its 270 s ran out"; 2026-12-04 12:47); the "words"
# layout's loop over row tiles is a loop in the kernel, whatever the rows.
BYTES_MAX_TILES = 16
# impl="auto" runs a dense FP8 linear (one group) in a kernel here up to AUTO_MAX_ROWS rows, and above them while
# its rows are decode's (fewer than PREFILL_MIN_TOKENS tokens a sequence: a step, a verification of k + 1): there
# reading the codes (1 byte a weight) bounds the product. A prefill chunk of more rows is compute-bound: XLA's bf16
# GEMM over the weight dequantised in the program runs the tensor cores at full rate, where these kernels' products
# of ≤ 64 rows do not. Decode calls keep the kernel at every batch, so a speculative round and a plain step multiply
# alike (greedy speculative == plain).
AUTO_MAX_ROWS = 1024
PREFILL_MIN_TOKENS = 64


def auto_takes(rows: int, tokens: int) -> bool:
  """Whether impl="auto" runs a dense FP8 linear of `rows` rows, `tokens` a sequence, in a kernel here."""
  return rows <= AUTO_MAX_ROWS or tokens < PREFILL_MIN_TOKENS


def layout_for(experts: int, k: int, n: int, rows: int) -> str:
  """"bytes" for one group (a dense linear) of BYTES_MIN_ROWS to BYTES_MAX_TILES row tiles' rows whose codes
  Triton's int32 offsets reach as bytes: a program multiplies whole 128 × 128 code tiles, which pays once the rows
  fill the product; "words" otherwise (the experts, and few rows, where the words' split K loop was as fast or
  faster; and more rows than the bytes program unrolls). Why: benchmarks/RESULTS.md, "The dense FP8 linears: whole
  128 × 128 tiles"."""
  tiles = -(-rows // row_tile_for(rows, experts))
  return ("bytes" if can_take_bytes(experts, k, n) and rows >= BYTES_MIN_ROWS and tiles <= BYTES_MAX_TILES
          else "words")


def can_take_bytes(experts: int, k: int, n: int) -> bool:
  """Whether the "bytes" layout can read these codes at all (one group, int32 byte offsets)."""
  return experts == 1 and k * n < MAX_WORDS


@dataclasses.dataclass(frozen=True)
class Config:
  """The kernel's launch: Triton's `num_warps` / `num_stages`; `split_k`, the parts of the K loop run by separate
  programs and summed after; `layout`, how a program reads the codes ("words" or "bytes", which needs one group);
  `row_tile`, the rows of one tensor-core product. None / "auto": `config_for` chooses from the operands."""

  num_warps: int = 4
  num_stages: int = 3
  split_k: int | None = None
  layout: str = "auto"
  row_tile: int | None = None


def config_for(rows: int, experts: int, k: int, n: int, config: Config | None = None) -> Config:
  """`config` (default: Config()) with what it leaves open chosen for `rows` × [K, N] over `experts` groups:
  `split_k_for`, `layout_for`, `row_tile_for`."""
  config = config or Config()
  return dataclasses.replace(
      config, split_k=split_k_for(rows, experts, k, n) if config.split_k is None else config.split_k,
      layout=layout_for(experts, k, n, rows) if config.layout == "auto" else config.layout,
      row_tile=row_tile_for(rows, experts) if config.row_tile is None else config.row_tile)


def fp8_grouped_matmul(x_AK: jax.Array, codes_EKN: jax.Array, scale_EkN: jax.Array, group_sizes_E: jax.Array, *,
                       backend: str = "gpu", config: Config | None = None, impl: str = "triton") -> jax.Array:
  """fp32 [A, N]: the rows of group e (sorted, consecutive) times expert e's FP8 weight (codes
  [E, K, N], block scales [E, K/128, N/128]), by `impl` (IMPLS); this module's kernel launched as
  `config_for` completes `config`, the Mosaic GPU one with its own Config (or None)."""
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
  if (auto_impl() if impl == "auto" else impl) == "mosaic_gpu":
    from jax_mtp.kernels.fp8_grouped_matmul_mgpu import fp8_grouped_matmul_mgpu  # noqa: PLC0415 (no cycle)
    from jax_mtp.platform import lowering_platform  # noqa: PLC0415
    # "auto" by the program's platform at trace time (the interpreter's ordered callbacks cannot sit in a
    # platform_dependent branch): a CUDA program traced on a CPU host holds the compiled kernel
    interpret = backend == "interpret" or (backend == "auto" and lowering_platform() == "cpu")
    return fp8_grouped_matmul_mgpu(x_AK, codes_EKN, scale_EkN, group_sizes_E, config=config, interpret=interpret)
  a, k = x_AK.shape
  e, _, n = codes_EKN.shape
  config = config_for(a, e, k, n, config)
  check_operands(x_AK, codes_EKN, scale_EkN, group_sizes_E, config)
  if backend == "auto":
    call = functools.partial(fp8_grouped_matmul, config=config)
    return jax.lax.platform_dependent(x_AK, codes_EKN, scale_EkN, group_sizes_E,
                                      cpu=functools.partial(call, backend="interpret"),
                                      default=functools.partial(call, backend="gpu"))
  sizes = group_sizes_E.astype(jnp.int32)
  starts = jnp.cumsum(sizes) - sizes
  tile, split_k = config.row_tile, config.split_k
  # `tile` spare rows: a tile starting at a group's last row reads (and discards) in bounds
  x_pad = jnp.pad(x_AK.astype(jnp.bfloat16), ((0, tile), (0, 0)))
  if config.layout == "bytes":
    return _one_group_from_bytes(x_pad, codes_EKN[0], scale_EkN[0].astype(jnp.float32), group_sizes_E[0], a,
                                 config, backend)
  kernel = functools.partial(_kernel, blocks=k // BLOCK // split_k, tile=tile)
  out_planes = pl.pallas_call(
      kernel,
      grid=(e, n // BLOCK, split_k),
      in_specs=[pl.BlockSpec()] * 5,  # whole arrays: the rows a program reads are data
      out_specs=pl.BlockSpec(),
      out_shape=jax.ShapeDtypeStruct((split_k, a + tile, n), jnp.float32),
      compiler_params=_compiler_params(backend, config),
      interpret=backend == "interpret",
      name=KERNEL_NAME,
  )(starts, sizes, x_pad, as_words(codes_EKN), scale_EkN.astype(jnp.float32))
  out_planes = jnp.sum(out_planes[:, :a], axis=0)  # the K parts (a fixed order: deterministic)
  # a block's column 32i + j holds its column 4j + i
  return out_planes.reshape(a, n // BLOCK, WORD, BLOCK // WORD).transpose(0, 1, 3, 2).reshape(a, n)


def _one_group_from_bytes(x_pad, codes_KN, scale_kN, rows, a: int, config: Config, backend: str) -> jax.Array:
  """One group (a dense linear): a program owns 128 output columns and one K part, and multiplies
  whole [128, 128] code tiles, read as bytes and widened to bf16 (via f32), on the tensor cores."""
  k, n = codes_KN.shape
  tile, split_k = config.row_tile, config.split_k
  kernel = functools.partial(_bytes_kernel, blocks=k // BLOCK // split_k, tile=tile, tiles=-(-a // tile))
  out = pl.pallas_call(
      kernel,
      grid=(n // BLOCK, split_k),
      in_specs=[pl.BlockSpec()] * 4,
      out_specs=pl.BlockSpec(),
      out_shape=jax.ShapeDtypeStruct((split_k, a + tile, n), jnp.float32),
      compiler_params=_compiler_params(backend, config),
      interpret=backend == "interpret",
      name=KERNEL_NAME,
  )(jnp.reshape(rows, (1,)).astype(jnp.int32), x_pad, codes_KN, scale_kN)
  return jnp.sum(out[:, :a], axis=0)


def _bytes_kernel(rows_ref, x_ref, codes_ref, scale_ref, o_ref, *, blocks: int, tile: int, tiles: int):
  from jax.experimental.pallas import triton as pl_triton  # noqa: PLC0415 (masked stores; also in interpret mode)

  column = pl.program_id(0)
  part = pl.program_id(1)
  rows = rows_ref[0]
  for t in range(tiles):  # ≤ MAX_ROW_TILE rows a tile: decode sizes take one or two
    def k_block(step, acc, first=t * tile):
      kb = part * blocks + step
      x = x_ref[pl.ds(first, tile), pl.ds(kb * BLOCK, BLOCK)]
      codes = codes_ref[pl.ds(kb * BLOCK, BLOCK), pl.ds(column * BLOCK, BLOCK)]
      weight = codes.astype(jnp.float32).astype(jnp.bfloat16)  # exact; via f32 as in _decode
      return acc + scale_ref[kb, column] * jnp.dot(x, weight, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, blocks, k_block, jnp.zeros((tile, BLOCK), jnp.float32))
    live = t * tile + jnp.arange(tile) < rows
    pl_triton.store(o_ref.at[part, pl.ds(t * tile, tile), pl.ds(column * BLOCK, BLOCK)], acc,
                    mask=jnp.broadcast_to(live[:, None], acc.shape))


def _decode(bytes_u32):
  """e4m3 codes held in the low byte of uint32 → bf16 (exact)."""
  codes = jax.lax.bitcast_convert_type(bytes_u32.astype(jnp.uint8), jnp.float8_e4m3fn)
  return codes.astype(jnp.float32).astype(jnp.bfloat16)  # via f32: not every ptxas converts e4m3 → bf16


def _kernel(starts_ref, sizes_ref, x_ref, words_ref, scale_ref, o_ref, *, blocks: int, tile: int):
  from jax.experimental.pallas import triton as pl_triton  # noqa: PLC0415 (masked stores; also in interpret mode)

  expert = pl.program_id(0)
  column = pl.program_id(1)
  part = pl.program_id(2)  # this program's K blocks: part · blocks .. (part + 1) · blocks
  cols = BLOCK // WORD  # words this program owns
  start = starts_ref[expert]
  size = sizes_ref[expert]

  def row_tile(t, carry):
    first = start + t * tile
    row_ids = first + jnp.arange(tile)
    live = row_ids < start + size

    def k_block(step, accs):
      kb = part * blocks + step
      x = x_ref[pl.ds(first, tile), pl.ds(kb * BLOCK, BLOCK)]  # rows past the group: discarded below
      words = words_ref[expert, pl.ds(kb * BLOCK, BLOCK), pl.ds(column * cols, cols)]
      scale = scale_ref[expert, kb, column]
      return tuple(acc + scale * jnp.dot(x, _decode((words >> (8 * i)) & 0xFF), preferred_element_type=jnp.float32)
                   for i, acc in enumerate(accs))

    accs = jax.lax.fori_loop(0, blocks, k_block, tuple(jnp.zeros((tile, cols), jnp.float32) for _ in range(WORD)))
    for i, acc in enumerate(accs):
      pl_triton.store(o_ref.at[part, pl.ds(first, tile), pl.ds(column * BLOCK + i * cols, cols)], acc,
                      mask=jnp.broadcast_to(live[:, None], acc.shape))  # the next group's rows: another program's
    return carry

  jax.lax.fori_loop(0, (size + tile - 1) // tile, row_tile, 0)


def _compiler_params(backend: str, config: Config):
  if backend == "gpu":
    from jax.experimental.pallas import triton as pl_triton  # noqa: PLC0415 (GPU-only module)
    return pl_triton.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages)
  return None
