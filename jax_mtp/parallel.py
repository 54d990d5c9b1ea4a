"""The MTP draft step under `shard_map` on a tensor-parallel mesh.

`ShardedMtp(cfg, mesh)` places params with `jax_mtp.sharding`'s spec table and compiles one draft
step per (spec_step_idx, path). The per-shard math is the Flax predictor itself, built with the
mesh's `TensorParallel`; this module is the only place it is wrapped in `shard_map` (`jit_per_shard`
does the same for the speculator's prefill and round functions).
Inputs, caches and outputs are replicated over tp (the caches are the shared MLA latent).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
from jax.sharding import Mesh

from jax_mtp.cache import LayerCache
from jax_mtp.config import MtpConfig
from jax_mtp.kernels.fused_allreduce_rmsnorm import gpu_kernels
from jax_mtp.draft_path import FULL_LOGITS, LOCAL_ARGMAX, greedy_draft_path
from jax_mtp.mtp import MtpPredictor, init_params, validate_inputs
from jax_mtp.sharding import (TP_AXIS, named_shardings, param_specs, param_specs_for, replicated, shard_params,
                              tensor_parallel, validate_tp)

DRAFT_PATHS = (LOCAL_ARGMAX, FULL_LOGITS)


class DraftStep(NamedTuple):
  hidden_BTD: jax.Array  # post-norm hidden, recycled as the next step's prev_hidden
  caches: tuple[LayerCache, ...]
  tokens_BT: jax.Array | None  # greedy drafts (path "top_tokens"), or None
  logits_BTV: jax.Array | None  # full-vocab logits (path "logits"), or None


class ShardedMtp:
  """MTP predictor on a 1-D `tp` mesh. `path="top_tokens"` is Opt-2 (local argmax);
  `path="logits"` all-gathers the full logits (for sampling, and the baseline). The default path
  is the drafter's greedy path by its declared capability (jax_mtp.draft_path)."""

  def __init__(self, cfg: MtpConfig, mesh: Mesh, *, norm_impl: str = "xla", sequence_parallel: bool = False,
               drafter_cls: type[MtpPredictor] = MtpPredictor):
    self.cfg, self.mesh = cfg, mesh
    self.tp = mesh.shape[TP_AXIS]
    validate_tp(cfg, self.tp)
    check_impl_runtime(norm_impl, mesh)
    self.greedy_path = greedy_draft_path(drafter_cls)  # a false capability claim fails here
    self.model = drafter_cls(cfg, tensor_parallel(self.tp), norm_impl, sequence_parallel)
    abstract = jax.eval_shape(lambda key: init_params(cfg, key), jax.random.key(0))
    self._param_specs = param_specs(abstract)

  def shard(self, params) -> dict:
    """Pads the vocab rows and places `init_params`-layout params on the mesh."""
    return shard_params(params, self.cfg, self.mesh)

  def __call__(self, params, input_ids_BT, positions_BT, prev_hidden_BTD, caches, *, spec_step_idx: int = 0,
               absorb: bool | None = None, path: str | None = None) -> DraftStep:
    path = self.greedy_path if path is None else path
    if path not in DRAFT_PATHS:
      raise ValueError(f"path={path!r} is not one of {DRAFT_PATHS}")
    validate_inputs(self.cfg, input_ids_BT, positions_BT, prev_hidden_BTD, caches)
    step = self.compiled_step(spec_step_idx % self.cfg.num_nextn_predict_layers, absorb, path,
                              jax.tree.structure(params))
    return step(params, input_ids_BT, positions_BT, prev_hidden_BTD, caches)

  @functools.lru_cache(maxsize=None)
  def compiled_step(self, spec_step_idx: int, absorb: bool | None, path: str, structure=None):
    """The jitted shard_map'd step for one (spec_step_idx, absorb, path) and params tree structure
    (None: `init_params`'s; an FP8 tree has its scale leaves, jax_mtp.fp8)."""
    model = self.model

    def per_shard(params, ids, positions, prev_hidden, caches):
      variables = {"params": params}
      out = model.apply(variables, ids, positions, prev_hidden, caches, spec_step_idx=spec_step_idx,
                        absorb=absorb)
      if path == LOCAL_ARGMAX:
        tokens = model.apply(variables, out.hidden_BTD, spec_step_idx, method=model.get_top_tokens)
        return DraftStep(out.hidden_BTD, out.caches, tokens, None)
      logits = model.apply(variables, out.hidden_BTD, spec_step_idx, method=model.compute_logits)
      return DraftStep(out.hidden_BTD, out.caches, None, logits)

    rep = replicated()
    specs = self._param_specs if structure is None else param_specs_for(structure)
    return jit_per_shard(per_shard, self.mesh, (specs, rep, rep, rep, rep))


def check_impl_runtime(norm_impl: str, mesh) -> None:
  """Fails at construction when a Pallas impl cannot run on the mesh's devices. An AbstractMesh
  (lowering/export only) is not checked; "pallas_tpu" is not either, because TPU interpret mode
  (`pltpu.force_tpu_interpret_mode`) runs it on CPU devices."""
  if norm_impl == "pallas_gpu" and isinstance(mesh, Mesh):
    gpu_kernels()[0].check_gpu_runtime(mesh.devices.flat)


def jit_per_shard(per_shard, mesh: Mesh, in_specs: tuple, *, donate_argnums: tuple[int, ...] = ()):
  """`per_shard` under `shard_map` on `mesh`, jitted: argument i is placed by `in_specs[i]` (a spec
  tree, or one spec for the whole argument), every output is replicated over tp."""
  rep = replicated()
  sharded = jax.shard_map(per_shard, mesh=mesh, in_specs=in_specs, out_specs=rep, check_vma=False)
  return jax.jit(sharded, in_shardings=named_shardings(mesh, in_specs), out_shardings=named_shardings(mesh, rep),
                 donate_argnums=donate_argnums)
