"""Tensor parallelism: the one module that names mesh axes, and the partition spec of every weight.

One mesh axis, `tp`. Per-shard math lives in the Flax modules (they read `TensorParallel` for their
local sizes and the axis to reduce over); `jit_per_shard` wraps a per-shard function once in `shard_map`.

Layout and the collectives each choice costs, per MTP step of T tokens:

  weight                          spec            why / collective
  embed_tokens [Vp, D]            rows over tp    masked local lookup + psum [T, D]   (vLLM VocabParallelEmbedding)
  enorm, hnorm, eh_proj           replicated      eh_proj's input [e; h] and output x are needed whole on every
                                                  device; replicated costs 2·D² params per device and no
                                                  collective (column-parallel would add an all-gather of x,
                                                  row-parallel a psum of x)
  q_a_proj, kv_a_proj, norms      replicated      the latent path is shared by all heads (MQA), as in vLLM
  q_b_proj, kv_b_proj [., N·k]    heads over tp   column-parallel: no collective
  o_proj [N·H, D]                 heads over tp   row-parallel: psum [T, D] before the residual add
  indexer (wq_b, wk, k_norm, w)   replicated      every device needs the same top-k mask; no collective
  router gate, bias               replicated      every device routes every token
  routed experts [E, ., .]        experts over tp local experts only; output is a partial sum
  shared expert gate/up | down    F over tp       column | row-parallel; output is a partial sum
  shared_head_norm                replicated      the tail: psum(partial y) + residual + RMSNorm = Opt-1
  lm_head [Vp, D]                 rows over tp    logits stay sharded: greedy drafts reduce (value, index)
                                                  pairs [T, 2]; full logits all-gather [T, Vp]
  caches (latent, k_pe, index_k)  replicated      computed from replicated projections on every device

Vp is the vocab padded up to a multiple of tp; padded head rows never win the argmax.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_mtp.config import MtpConfig
from jax_mtp import fp8
from jax_mtp.fp8 import SCALE_SUFFIX

# The target's embedding and head: split over the vocab (rows padded to a multiple of tp), and shared with every MTP
# layer (one copy, as vLLM shares them).
SHARED_WITH_TARGET = ("embed_tokens", "lm_head")

TP_AXIS = "tp"
DATA_AXIS = "data"  # training splits its batches over it (jax_mtp.training)


@dataclasses.dataclass(frozen=True)
class TensorParallel:
  """What a per-shard module needs to know: the tp size and the axis to reduce over (None = no mesh)."""

  size: int = 1
  axis: str | None = None

  def local(self, total: int, what: str) -> int:
    """`total / size`, or an error naming both numbers."""
    if total % self.size:
      raise ValueError(f"tp={self.size} does not divide {what}={total}")
    return total // self.size


def tensor_parallel(tp: int) -> TensorParallel:
  return TensorParallel(tp, TP_AXIS if tp > 1 else None)


def make_mesh(tp: int, devices=None) -> Mesh:
  """A 1-D mesh over the first `tp` devices (axis `tp`)."""
  devices = jax.devices() if devices is None else devices
  if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or not 1 <= tp <= len(devices):
    raise ValueError(f"tp={tp!r} needs an integer 1 ≤ tp ≤ {len(devices)} (available devices)")
  return Mesh(np.asarray(devices[:tp]), (TP_AXIS,))


def tp_size(mesh) -> int:
  """The size of `mesh`'s tensor-parallel axis; a ValueError where it has none (a mesh `make_mesh` did not make)."""
  shape = getattr(mesh, "shape", None)
  if not isinstance(shape, Mapping) or TP_AXIS not in shape:
    raise ValueError(f"mesh={mesh!r} has no {TP_AXIS!r} axis: build it with jax_mtp.make_mesh(tp) (its axis "
                     f"names are jax_mtp.sharding's)")
  return shape[TP_AXIS]


def make_data_mesh(devices=None) -> Mesh:
  """A 1-D mesh over all devices on the data axis (training is data parallel)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def data_parallel_shardings(mesh: Mesh) -> tuple[NamedSharding, NamedSharding]:
  """(replicated, split over the batch) on a `make_data_mesh` mesh: params and optimizer state
  are replicated, [B, ...] batches split along B."""
  return NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def padded_vocab(cfg: MtpConfig, tp: int) -> int:
  return -(-cfg.vocab_size // tp) * tp


def validate_tp(cfg: MtpConfig, tp: int) -> None:
  """Every split the layout makes must be exact; the error names both numbers."""
  parallel = TensorParallel(tp)
  parallel.local(cfg.num_attention_heads, "num_attention_heads")
  parallel.local(cfg.n_routed_experts, "n_routed_experts")
  parallel.local(cfg.moe_intermediate_size * cfg.n_shared_experts, "shared expert intermediate size")
  parallel.local(cfg.intermediate_size, "intermediate_size")
  parallel.local(padded_vocab(cfg, tp), "padded vocab")


# Rules on the param path (tuple of keys). The first matching suffix wins; default replicated.
_TP = TP_AXIS
_RULES: tuple[tuple[tuple[str, ...], PartitionSpec], ...] = (
    (("embed_tokens",), PartitionSpec(_TP, None)),
    (("lm_head",), PartitionSpec(_TP, None)),
    (("q_b_proj", "kernel"), PartitionSpec(None, _TP)),
    (("kv_b_proj", "kernel"), PartitionSpec(None, _TP)),
    (("o_proj", "kernel"), PartitionSpec(_TP, None)),
    (("w_gate_EDF",), PartitionSpec(_TP, None, None)),
    (("w_up_EDF",), PartitionSpec(_TP, None, None)),
    (("w_down_EFD",), PartitionSpec(_TP, None, None)),
    (("gate_proj", "kernel"), PartitionSpec(None, _TP)),  # shared expert / dense MLP: column
    (("up_proj", "kernel"), PartitionSpec(None, _TP)),
    (("down_proj", "kernel"), PartitionSpec(_TP, None)),  # row
)


def param_spec(path: tuple[str, ...]) -> PartitionSpec:
  if path and path[-1].endswith(SCALE_SUFFIX):  # FP8 block scales split as their weight (jax_mtp.fp8)
    path = path[:-1] + (path[-1][:-len(SCALE_SUFFIX)],)
  for suffix, spec in _RULES:
    if path[-len(suffix):] == suffix:
      return spec
  return PartitionSpec()


def param_sharding(mesh: Mesh, path: tuple[str, ...]) -> NamedSharding:
  """Where the param at `path` (a tuple of keys) lives on `mesh`: its `param_spec`. Every placement of
  a param — `place_params`, the checkpoint and orbax readers, jitted programs' in_shardings — goes
  through here, so the spec table above is the only layout."""
  return NamedSharding(mesh, param_spec(path))


def named_shardings(mesh: Mesh, specs):
  """The NamedSharding tree of a PartitionSpec tree (or of one spec) on `mesh`."""
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def place_params(params, mesh: Mesh, fp8_block: tuple[int, int]):
  """Places every weight of a params tree on `mesh` by its spec, as it is (no vocab padding: that is
  `shard_params`). FP8 weights kept as codes (jax_mtp.fp8, blocks of `fp8_block`) must split into whole blocks on
  every device: a ValueError naming the first that does not (its codes would meet another block's scales)."""
  check_fp8_shares(params, mesh, fp8_block)
  return jax.tree_util.tree_map_with_path(lambda p, x: jax.device_put(x, param_sharding(mesh, _keys(p))), params)


def check_fp8_shares(params, mesh: Mesh, fp8_block: tuple[int, int]) -> None:
  """A ValueError naming the first FP8 weight of `params` whose share on some device of `mesh` is not whole blocks
  (`fp8_split_problems`): a matmul over such a share would pair its codes with another block's scales."""
  problems = fp8_split_problems(params, mesh, fp8_block)
  if problems:
    raise ValueError(f"{problems[0]}: FP8 weights kept as codes need each device's share in whole blocks; load them "
                     f"onto this mesh with jax_mtp.load(..., mesh=mesh), which dequantises such weights, or "
                     f"dequantise them first (jax_mtp.fp8.dequantize_params)")


def fp8_split_problems(params, mesh: Mesh | None, fp8_block: tuple[int, int], name_prefix: str = "") -> list[str]:
  """Why each FP8 weight of `params` (codes beside `_scale_inv` block scales, jax_mtp.fp8; arrays or
  ShapeDtypeStructs) cannot be kept on `mesh` as it is: a device's share not whole blocks of `fp8_block`
  (`fp8.split_problem`), one line a weight named `name_prefix` + its path; [] with no mesh. Shapes and specs only
  (no data is read); a `params` that is no dict is left to the tree checks that name what it is."""
  if mesh is None or not isinstance(params, Mapping):
    return []
  shapes = tuple((path, tuple(np.shape(_at(params, path)))) for path in fp8.fp8_paths(params))
  return [name_prefix + problem for problem in _split_problems(shapes, mesh, tuple(fp8_block))] if shapes else []


@functools.lru_cache(maxsize=64)
def _split_problems(shapes: tuple, mesh: Mesh, fp8_block: tuple[int, int]) -> tuple[str, ...]:
  """`fp8_split_problems` on (path, shape) pairs, once per tree layout and mesh: a draft step's call checks its tree
  every step, and the specs' device maps cost ~0.1 ms an MTP layer (~9 ms for V3.2's target at tp = 8)."""
  problems = (fp8.split_problem("/".join(path), shape, param_sharding(mesh, path), fp8_block)
              for path, shape in shapes)
  return tuple(problem for problem in problems if problem)


def _at(tree: dict, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def _keys(path) -> tuple[str, ...]:
  return tuple(k.key for k in path)


def param_specs(params) -> dict:
  """The PartitionSpec tree for a params tree (from `init_params`)."""
  return jax.tree_util.tree_map_with_path(lambda p, _: param_spec(_keys(p)), params)


def param_specs_for(structure) -> dict:
  """The PartitionSpec tree of params with this tree structure (a jitted function's in_specs before
  it sees the arrays; an FP8 tree has scale leaves an `init_params` tree lacks, jax_mtp.fp8)."""
  return param_specs(jax.tree.unflatten(structure, [0] * structure.num_leaves))


def replicated() -> PartitionSpec:
  return PartitionSpec()


def shard_params(params, cfg: MtpConfig, mesh: Mesh):
  """Pads the vocab rows to a multiple of tp and places every weight with its spec (a target's or an MTP layers'
  tree; the entry points check it is `cfg`'s first: jax_mtp.param_tree)."""
  tp = tp_size(mesh)
  validate_tp(cfg, tp)
  params = dict(params)
  pad = padded_vocab(cfg, tp) - cfg.vocab_size
  for name in SHARED_WITH_TARGET:
    params[name] = jax.numpy.pad(params[name], ((0, pad), (0, 0)))
  return place_params(params, mesh, cfg.fp8_block)


def jit_per_shard(per_shard, mesh: Mesh, in_specs: tuple, *, donate_argnums: tuple[int, ...] = ()):
  """`per_shard` under `shard_map` on `mesh`, jitted: argument i is placed by `in_specs[i]` (a spec
  tree, or one spec for the whole argument), every output is replicated over tp. The one place a
  program of the package is wrapped in `shard_map` (the speculator's prefill and round, plain
  decoding's steps, `ShardedMtp`'s draft step)."""
  rep = replicated()
  sharded = jax.shard_map(per_shard, mesh=mesh, in_specs=in_specs, out_specs=rep, check_vma=False)
  return jax.jit(sharded, in_shardings=named_shardings(mesh, in_specs), out_shardings=named_shardings(mesh, rep),
                 donate_argnums=donate_argnums)
