"""Plain greedy decoding with the target model alone: the reference speculative decoding must match.

Prefill as the speculator does (right-padded prompts, positions 0..T−1), then one token per row per
step at the row's own position (absorbed MLA, T = 1). Runs on the same tp mesh, compiled once per
(B, T, capacity) for the prefill and once per (B, capacity) for the step.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jax_mtp.config import MtpConfig
from jax_mtp.experts import check_runs_on
from jax_mtp.kernels.fused_allreduce_rmsnorm import check_impl_runtime
from jax_mtp.model import TargetModel
from jax_mtp.param_tree import check_param_tree, expected_target_tree
from jax_mtp.request import (check_caches_fit, pack_prompts, required_capacity, stop_id_array, validate_positive,
                             validate_prompts)
from jax_mtp.sharding import (check_fp8_shares, jit_per_shard, param_specs_for, replicated, shard_params, tensor_parallel,
                              tp_size, validate_tp)
from jax_mtp.prefill import prefill_budget, target_prefill


class TargetDecoder:
  """Greedy decoding of a batch of prompts with the target model on a tp mesh."""

  def __init__(self, cfg: MtpConfig, mesh: Mesh, *, norm_impl: str = "xla"):
    tp = tp_size(mesh)
    validate_tp(cfg, tp)
    check_impl_runtime(norm_impl, mesh)
    check_runs_on(cfg.moe_impl, mesh)
    self.cfg, self.mesh = cfg, mesh
    self.target = TargetModel(cfg, tensor_parallel(tp), norm_impl)

  def shard(self, target_params: dict) -> dict:
    check_param_tree(target_params, expected_target_tree(self.cfg), "target params")
    return shard_params(target_params, self.cfg, self.mesh)

  def generate(self, params: dict, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
               capacity: int | None = None, stop_ids: Sequence[int] = ()) -> list[list[int]]:
    """`max_new_tokens` greedy tokens after each prompt, each row cut just after its first stop id
    (a row's greedy tokens do not depend on the others', so cutting afterwards is exact), or before
    its first token from a non-finite hidden (as `Speculator` stops such a row). Give the
    speculator's `capacity` to compare with it under identical cache shapes (the default is the
    minimum, longest prompt + max_new)."""
    stops = set(int(i) for i in stop_id_array(self.cfg, stop_ids))
    validate_prompts(self.cfg, prompts)
    validate_positive("max_new_tokens", max_new_tokens)
    max_new_tokens = int(max_new_tokens)  # a numpy / 0-d array value as Python's
    capacity = required_capacity(self.cfg, prompts, max_new_tokens, 0, capacity)
    check_caches_fit(self.cfg, len(prompts), capacity, self.mesh.devices.flat)
    budget = prefill_budget(self.cfg, len(prompts), capacity, self.mesh.devices.flat)
    check_fp8_shares(params, self.mesh, self.cfg.fp8_block)  # params not placed by `shard`: jit would split blocks
    prompt_BT, lengths_B = pack_prompts(prompts)
    structure = jax.tree.structure(params)  # the params' specs follow their tree (FP8: jax_mtp.fp8)
    tokens_BO, length_B, next_B, caches, valid_B = self._prefill(capacity, structure, budget)(params, prompt_BT,
                                                                                             lengths_B)
    step = self._step(structure)
    for i in range(1, max_new_tokens):
      tokens_BO, length_B, next_B, caches, valid_B = step(params, np.int32(i), length_B, next_B, caches, tokens_BO,
                                                          valid_B)
    return [_cut_after_stop(row[:min(max_new_tokens, n)].tolist(), stops)
            for row, n in zip(np.asarray(tokens_BO), np.asarray(valid_B))]

  def top2_margins(self, params: dict, prefixes: Sequence[Sequence[int]]) -> list[tuple[int, float]]:
    """Per prefix: (the target's greedy token after it, the gap between its two largest logits there relative to the
    largest), from one prefill over the prefixes (--check's measure of a near-tie, `jax_mtp.greedy_check`)."""
    validate_prompts(self.cfg, prefixes)
    capacity = required_capacity(self.cfg, prefixes, 1, 0)
    prompt_BT, lengths_B = pack_prompts(prefixes)
    budget = prefill_budget(self.cfg, len(prefixes), capacity, self.mesh.devices.flat)
    fn = self._margins(capacity, jax.tree.structure(params), budget)
    token_B, margin_B = (np.asarray(x) for x in fn(params, prompt_BT, lengths_B))
    return [(int(t), float(m)) for t, m in zip(token_B, margin_B)]

  @functools.lru_cache(maxsize=None)
  def _margins(self, capacity: int, structure, budget: int):
    fn = functools.partial(self._margins_per_shard, capacity=capacity, budget=budget)
    return jit_per_shard(fn, self.mesh, (param_specs_for(structure), replicated(), replicated()))

  def _margins_per_shard(self, params, prompt_BT, lengths_B, *, capacity: int, budget: int):
    t_vars = {"params": params}
    _, last_B1D, _ = target_prefill(self.target, t_vars, prompt_BT, lengths_B, capacity, budget=budget)
    logits_BV = self.target.apply(t_vars, last_B1D, method=TargetModel.compute_logits)[:, 0]
    (first_B, second_B), token_B = jax.lax.top_k(logits_BV, 2)[0].T, jnp.argmax(logits_BV, axis=-1)
    return token_B.astype(jnp.int32), (first_B - second_B) / jnp.abs(first_B)

  @functools.lru_cache(maxsize=None)
  def _prefill(self, capacity: int, structure, budget: int):
    fn = functools.partial(self._prefill_per_shard, capacity=capacity, budget=budget)
    return jit_per_shard(fn, self.mesh, (param_specs_for(structure), replicated(), replicated()))

  @functools.lru_cache(maxsize=None)
  def _step(self, structure):
    rep = replicated()
    return jit_per_shard(self._step_per_shard, self.mesh, (param_specs_for(structure),) + (rep,) * 6,
                         donate_argnums=(4,))

  def _prefill_per_shard(self, params, prompt_BT, lengths_B, *, capacity: int, budget: int):
    t_vars = {"params": params}
    _, last_B1D, caches = target_prefill(self.target, t_vars, prompt_BT, lengths_B, capacity, budget=budget)
    first_B = self.target.apply(t_vars, last_B1D, method=TargetModel.get_top_tokens)[:, 0]
    tokens_BO = jnp.zeros((prompt_BT.shape[0], capacity), jnp.int32).at[:, 0].set(first_B)
    valid_B = jnp.where(jnp.isfinite(last_B1D).all(axis=(1, 2)), capacity, 0)
    return tokens_BO, lengths_B, first_B, caches, valid_B

  def _step_per_shard(self, params, i, length_B, next_B, caches, tokens_BO, valid_B):
    """Token i of every row: the target at (next token, its position), greedy. `valid_B`: tokens
    before the row's first non-finite hidden (capacity while there is none), as the speculator cuts."""
    t_vars = {"params": params}
    out = self.target.apply(t_vars, next_B[:, None], length_B[:, None], caches)
    token_B = self.target.apply(t_vars, out.hidden_BTD, method=TargetModel.get_top_tokens)[:, 0]
    valid_B = jnp.where(jnp.isfinite(out.hidden_BTD).all(axis=(1, 2)), valid_B, jnp.minimum(valid_B, i))
    return tokens_BO.at[:, i].set(token_B), length_B + 1, token_B, out.caches, valid_B


def _cut_after_stop(tokens: list[int], stops: set[int]) -> list[int]:
  for i, token in enumerate(tokens):
    if token in stops:
      return tokens[:i + 1]
  return tokens
