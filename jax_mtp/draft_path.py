"""How greedy draft tokens leave a drafter: the explicit capability protocol (docs/design.md §2, Opt-2).

A drafter class that sets `supports_local_argmax = True` promises a `get_top_tokens(hidden,
spec_step_idx=0)` that reduces (value, index) pairs across vocab shards; otherwise the speculator
takes `compute_logits` (full-vocab all-gather) and an argmax. vLLM probes a method name and
silently takes the slow path when it is missing; here a class that claims the capability without
the method is rejected when the speculator is built.

`ShardedMtp(cfg, mesh)` is one draft step down either path, on its own: the MTP predictor built with
the mesh's `TensorParallel`, its params placed by `jax_mtp.sharding`'s spec table, one compiled
`shard_map` program per (spec_step_idx, absorb, path). Inputs, caches and outputs are replicated over
tp (the caches are the shared MLA latent). The speculator drafts through `jax_mtp.drafter` instead,
inside its round's program.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
from jax.sharding import Mesh

from jax_mtp.cache import LayerCache
from jax_mtp.config import MtpConfig
from jax_mtp.experts import check_runs_on
from jax_mtp.kernels.fused_allreduce_rmsnorm import check_impl_runtime
from jax_mtp.mtp import MtpPredictor, validate_inputs
from jax_mtp.param_tree import check_param_tree, expected_mtp_tree
from jax_mtp.sharding import (check_fp8_shares, jit_per_shard, param_specs, param_specs_for, replicated, shard_params,
                              tensor_parallel, tp_size, validate_tp)

LOCAL_ARGMAX = "top_tokens"
FULL_LOGITS = "logits"
DRAFT_PATHS = (LOCAL_ARGMAX, FULL_LOGITS)


def greedy_draft_path(drafter_cls: type) -> str:
  """`"top_tokens"` for a drafter with the local-argmax capability, else `"logits"`.

  Raises TypeError when the class claims the capability but has no callable `get_top_tokens`,
  or offers neither path.
  """
  name = drafter_cls.__name__
  if getattr(drafter_cls, "supports_local_argmax", False):
    if not callable(getattr(drafter_cls, "get_top_tokens", None)):
      raise TypeError(f"{name} sets supports_local_argmax=True but has no callable get_top_tokens")
    return LOCAL_ARGMAX
  if not callable(getattr(drafter_cls, "compute_logits", None)):
    raise TypeError(f"{name} has neither get_top_tokens (with supports_local_argmax) nor compute_logits")
  return FULL_LOGITS



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
    self.tp = tp_size(mesh)
    validate_tp(cfg, self.tp)
    check_impl_runtime(norm_impl, mesh)
    check_runs_on(cfg.moe_impl, mesh)
    if sequence_parallel and self.tp > 1 and norm_impl != "xla":  # its tail is XLA's reduce-scatter form
      raise ValueError(f"sequence_parallel=True runs the tail's reduce + norm as XLA's reduce-scatter; "
                       f"norm_impl={norm_impl!r} would not run (use norm_impl='xla')")
    self.greedy_path = greedy_draft_path(drafter_cls)  # a false capability claim fails here
    self.model = drafter_cls(cfg, tensor_parallel(self.tp), norm_impl, sequence_parallel)
    self._param_specs = param_specs(expected_mtp_tree(cfg))

  def shard(self, params) -> dict:
    """Pads the vocab rows and places `init_params`-layout params on the mesh."""
    check_param_tree(params, expected_mtp_tree(self.cfg), "MTP params")
    return shard_params(params, self.cfg, self.mesh)

  def __call__(self, params, input_ids_BT, positions_BT, prev_hidden_BTD, caches, *, spec_step_idx: int = 0,
               absorb: bool | None = None, path: str | None = None) -> DraftStep:
    path = self.greedy_path if path is None else path
    if path not in DRAFT_PATHS:
      raise ValueError(f"path={path!r} is not one of {DRAFT_PATHS}")
    validate_inputs(self.cfg, input_ids_BT, positions_BT, prev_hidden_BTD, caches)
    check_fp8_shares(params, self.mesh, self.cfg.fp8_block)  # unplaced params: jit would split FP8 blocks as they are
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
