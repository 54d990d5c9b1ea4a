"""Block-scaled FP8 weights kept as stored (DeepSeek-V3's format), and their use in a matmul.

A checkpoint stores a linear's weight as e4m3 codes `W_fp8` [out, in] with one fp32 `weight_scale_inv`
per block of B0 × B1 elements (128 × 128): W[i, j] = W_fp8[i, j] · scale_inv[i // B0, j // B1]
(`jax_mtp.safetensors_io`). Kept on the device, a param holds the codes in our layout with the
scales beside it, transposed the same way:

    kernel            float8_e4m3fn [in, out]                      (a Linear)
    kernel_scale_inv  float32 [ceil(in / B1), ceil(out / B0)]
    w_gate_EDF        float8_e4m3fn [E, D, F]                      (routed experts, stacked)
    w_gate_EDF_scale_inv float32 [E, ceil(D / B1), ceil(F / B0)]

A param is FP8 exactly when its `<name>_scale_inv` sibling exists (`scale_name`); modules test for
it, so the same model code runs a tree loaded `--weights fp8` or dequantised. `dequantize` is the
weight the dequantising loader would have built — bf16(fp32(code) · scale) — computed inside the
jitted program from the 1-byte codes, so a matmul reads half the bytes of a bf16 weight where XLA
fuses the conversion into its consumer (docs/design.md §8, "FP8 weights").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

FP8 = jnp.float8_e4m3fn
SCALE_SUFFIX = "_scale_inv"


def scale_name(param_name: str) -> str:
  """`kernel` → `kernel_scale_inv`: the block scales of an FP8 param."""
  return param_name + SCALE_SUFFIX


def is_scale(param_name: str) -> bool:
  return param_name.endswith(SCALE_SUFFIX)


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
  """Block-scale shape of a weight in our layout (…, in, out): blocks are (B1 over in, B0 over out),
  the checkpoint's [B0 over out, B1 over in] transposed."""
  *lead, rows, cols = shape
  return (*lead, -(-rows // block[1]), -(-cols // block[0]))


def dequantize(codes: jax.Array, scale_inv: jax.Array, dtype, block: tuple[int, int]) -> jax.Array:
  """`codes` (…, in, out) · each element's block scale, in fp32, cast to `dtype`: the values the
  dequantising loader stores. `block` is the checkpoint's (B0 over out, B1 over in); a slice of a
  weight (a device's shard) starts on a block boundary, its last block may be partial."""
  *_, rows, cols = codes.shape
  expected = (-(-rows // block[1]), -(-cols // block[0]))
  if tuple(scale_inv.shape[-2:]) != expected:
    raise ValueError(f"FP8 codes {codes.shape} with blocks {block} need scales [..., {expected[0]}, {expected[1]}], got "
                     f"{scale_inv.shape}: the config's fp8_block is not the checkpoint's weight_block_size")
  expanded = jnp.repeat(jnp.repeat(scale_inv.astype(jnp.float32), block[1], axis=-2)[..., :rows, :], block[0],
                        axis=-1)[..., :cols]
  return (codes.astype(jnp.float32) * expanded).astype(dtype)


@functools.partial(jax.jit, static_argnums=1)
def quantize(w: jax.Array, block: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
  """(codes, scale_inv) of w (..., in, out) by DeepSeek's block quantiser (block = (B0 over out, B1
  over in), scale = amax / 448), partial edge blocks included: `dequantize`'s inverse up to e4m3 rounding."""
  *lead, rows, cols = w.shape
  b_in, b_out = block[1], block[0]
  padded = jnp.pad(w.astype(jnp.float32), [(0, 0)] * len(lead) + [(0, -rows % b_in), (0, -cols % b_out)])
  blocks = padded.reshape(*lead, padded.shape[-2] // b_in, b_in, padded.shape[-1] // b_out, b_out)
  amax = jnp.max(jnp.abs(blocks), axis=(-3, -1))
  scale = jnp.where(amax > 0, amax / float(jnp.finfo(FP8).max), 1.0)
  codes = (blocks / scale[..., :, None, :, None]).astype(FP8).reshape(padded.shape)
  return codes[..., :rows, :cols], scale


def split_problem(name: str, shape: tuple[int, ...], sharding: jax.sharding.Sharding,
                  block: tuple[int, int]) -> str | None:
  """Why a device's share of FP8 codes `shape` (…, in, out) under `sharding` is not whole blocks (B1 over in, B0
  over out; a last partial block at the weight's end counts as whole), or None. A kernel given such a share would
  pair its codes with the wrong block scales."""
  for index in sharding.addressable_devices_indices_map(shape).values():
    for s, n, b, dim in zip(index[-2:], shape[-2:], (block[1], block[0]), ("in", "out")):
      start, stop = s.indices(n)[:2]
      if start % b or (stop % b and stop != n):
        return f"{name}: the slice [{start}:{stop}] of its {dim} dim of {n} does not fall on its FP8 blocks of {b}"
  return None


def fp8_paths(params: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
  """The paths of a params tree's FP8 weights (those with a scale sibling)."""
  paths = []
  for name, value in params.items():
    if isinstance(value, dict):
      paths += fp8_paths(value, prefix + (name,))
    elif scale_name(name) in params:
      paths.append(prefix + (name,))
  return paths


def dequantize_params(params: dict, dtype, block: tuple[int, int]) -> dict:
  """The tree with every FP8 weight replaced by its dequantisation (scales dropped); other leaves as they are."""
  out = {}
  for name, value in params.items():
    if is_scale(name):
      continue
    if isinstance(value, dict):
      out[name] = dequantize_params(value, dtype, block)
    elif scale_name(name) in params:
      out[name] = jax.jit(dequantize, static_argnums=(2, 3))(value, params[scale_name(name)], jnp.dtype(dtype),
                                                             tuple(block))
    else:
      out[name] = value
  return out


# Our param names of the weights a DeepSeek-V3.2 / GLM-5 checkpoint stores in FP8: every linear but
# eh_proj, the indexer's weights_proj and the router; the routed experts.
CHECKPOINT_FP8_LINEARS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "wq_b", "wk",
                          "gate_proj", "up_proj", "down_proj")
CHECKPOINT_FP8_EXPERTS = ("w_gate_EDF", "w_up_EDF", "w_down_EFD")


def as_checkpoint_fp8(params: dict, block: tuple[int, int], convert) -> dict:
  """`params` with the weights a V3.2 checkpoint stores in FP8 replaced by `convert(weight) ->
  (codes, scale_inv)` (a quantiser on arrays; `abstract_fp8` on shapes) — the tree `--weights fp8` loads."""
  out = {}
  for name, value in params.items():
    if isinstance(value, dict):
      if name in CHECKPOINT_FP8_LINEARS and "kernel" in value:
        codes, scale = convert(value["kernel"], block)
        out[name] = {"kernel": codes, scale_name("kernel"): scale}
      else:
        out[name] = as_checkpoint_fp8(value, block, convert)
    elif name in CHECKPOINT_FP8_EXPERTS:
      out[name], out[scale_name(name)] = convert(value, block)
    else:
      out[name] = value
  return out


def abstract_fp8(weight: jax.ShapeDtypeStruct, block: tuple[int, int]):
  """(codes, scales) ShapeDtypeStructs of a weight kept in FP8 (for AOT compiles and memory reports)."""
  return (jax.ShapeDtypeStruct(weight.shape, FP8),
          jax.ShapeDtypeStruct(scale_shape(weight.shape, block), jnp.float32))
