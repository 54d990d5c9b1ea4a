"""The MTP predictor as the speculator's drafter: catch-up on the target's hiddens, then k greedy steps.

A round starts from a `Window` — the target's post-norm hiddens of the tokens committed since the
last round, each paired with the token that follows it (vLLM's convention, jax_mtp.mtp):

    step 0:     MTP(ids = window tokens, positions = start .. start+W−1, prev_hidden = target hiddens)
                writes the MTP cache for every committed position with the TARGET's hidden; the
                output at the last valid entry (hidden at length−1, token t1) gives d1 and h1
    step i ≥ 1: MTP(d_i, position length−1+i, prev_hidden = h_i) → d_{i+1}, h_{i+1}   (recycling)

With `index_share_for_mtp_iteration` (GLM-5.2's config; vLLM honours it) step 0's DSA top-k — that
of t1's query — is reused by steps 1..k−1 instead of running the indexer over the whole cache
again; each reusing step also sees the draft slots written since step 0 (`_reused_selection`).

Step i uses MTP layer i % num_nextn_predict_layers (spec_step_idx = i), so k may exceed the number
of layers. Only layer 0 sees the catch-up window; with several MTP layers the later ones keep the
entries their own draft steps wrote, as in vLLM. Greedy tokens leave through the drafter class's
declared path (`get_top_tokens` when it supports the local argmax, else `compute_logits` + argmax).
With norm_impl="pallas_gpu" at tp ≥ 2 and at least CHAIN_MIN_CALLS steps after the first, those
steps share one Opt-1 workspace: their fused all-reduce + norm kernels run as one chain without
XLA's per-kernel device barrier (jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_chained).

The drafter interface the speculator uses (test doubles implement the same methods):
`param_specs()`, `shard(params, mesh)`, `variables(own_params, target_params)`,
`init_caches(batch, capacity)`, `catch_up(variables, window, caches, absorb=)`,
`propose(variables, window, caches, num_drafts)`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax.traverse_util import flatten_dict
from jax.sharding import Mesh

from jax_mtp.config import MtpConfig
from jax_mtp.draft_path import LOCAL_ARGMAX, greedy_draft_path
from jax_mtp.indexer import Selection, selects_all
from jax_mtp.mtp import MtpPredictor, init_caches
from jax_mtp.param_tree import check_param_tree, expected_mtp_tree
from jax_mtp.kernels.fused_allreduce_rmsnorm import workspace_for_chain
from jax_mtp.sharding import SHARED_WITH_TARGET, TensorParallel, param_specs, place_params



class Window(NamedTuple):
  """Target hiddens paired with the tokens after them, W entries per row.

  Entry j sits at position `start + j`: `hidden_BWD[:, j]` is the target's post-norm hidden there and
  `ids_BW[:, j]` the token at the next position. Entries j < count are valid (count ≥ 1) and the last
  valid one is (hidden at length − 1, the not-yet-verified token t1). Entries ≥ count are padding at
  positions ≥ length: they are written into the MTP cache and overwritten before any query reads them.
  """

  ids_BW: jax.Array  # int32
  hidden_BWD: jax.Array  # activation dtype
  start_B: jax.Array  # int32
  count_B: jax.Array  # int32

  @property
  def length_B(self) -> jax.Array:
    """The target's committed length: the position of t1."""
    return self.start_B + self.count_B


class MtpDrafter:
  """Greedy drafts from `drafter_cls` (an `MtpPredictor`) built with the mesh's `TensorParallel`.

  Its params are the MTP layers only: `embed_tokens` and `lm_head` are the target's arrays, put into
  the predictor's tree by `variables` on every call, so one copy serves both (vLLM shares them too).
  """

  def __init__(self, cfg: MtpConfig, tp: TensorParallel, norm_impl: str = "xla",
               drafter_cls: type[MtpPredictor] = MtpPredictor):
    self.cfg = cfg
    self.path = greedy_draft_path(drafter_cls)  # a false capability claim fails here
    self.model = drafter_cls(cfg, tp, norm_impl)

  def param_specs(self) -> dict:
    return param_specs(_own(expected_mtp_tree(self.cfg)))

  def shard(self, params: dict, mesh: Mesh) -> dict:
    """Places `init_params`-layout params on the mesh, dropping the embedding and head (the
    target's are used), checked against the config's first (`param_tree`)."""
    check_param_tree(_own(params), _own(expected_mtp_tree(self.cfg)), "MTP params")  # the shared ones: not read
    return place_params(_own(params), mesh, self.cfg.fp8_block)

  def variables(self, own_params: dict, target_params: dict) -> dict:
    shared = {name: target_params[name] for name in SHARED_WITH_TARGET}
    return {"params": {**own_params, **shared}}

  def init_caches(self, batch: int, capacity: int):
    return init_caches(self.cfg, batch, capacity)

  def catch_up(self, variables: dict, window: Window, caches, *, absorb: bool):
    """MTP step 0 over the window. Returns (hidden at the last valid entry [B, 1, D], caches).
    `absorb`: MLA's absorbed form (a round's k + 1 window) or the naive one (the prompt's prefill)."""
    hidden_B1D, caches, _ = self._catch_up(variables, window, caches, absorb=absorb, keep_selection=False)
    return hidden_B1D, caches

  def _catch_up(self, variables: dict, window: Window, caches, *, absorb: bool, keep_selection: bool):
    """`catch_up`, and with `keep_selection` also the DSA selection of its last valid query (t1's, at
    length − 1): `index_share_for_mtp_iteration`'s step-0 top-k, which the later draft steps reuse."""
    positions_BW = window.start_B[:, None] + jnp.arange(window.ids_BW.shape[1], dtype=jnp.int32)
    out, sown = self.model.apply(variables, window.ids_BW, positions_BW, window.hidden_BWD, caches, spec_step_idx=0,
                                 absorb=absorb, mutable=["dsa"] if keep_selection else [])
    last_B11 = (window.count_B - 1)[:, None, None]
    shared = None
    if keep_selection:
      (selection,) = flatten_dict(sown["dsa"]).values()  # the MTP layer's one indexer call: a 1-tuple
      shared = Selection(*(jnp.take_along_axis(x, last_B11, axis=1) for x in selection[0]))  # [B, 1, K]
    return jnp.take_along_axis(out.hidden_BTD, last_B11, axis=1), out.caches, shared

  def propose(self, variables: dict, window: Window, caches, num_drafts: int):
    """k = num_drafts greedy drafts int32 [B, k] after the window's t1, and the updated caches."""
    share = (self.cfg.index_share_for_mtp_iteration and num_drafts > 1
             and not selects_all(self.cfg, caches[0].capacity))
    hidden_B1D, caches, shared = self._catch_up(variables, window, caches, absorb=True, keep_selection=share)
    token_B1 = self._greedy(variables, hidden_B1D, 0)
    if num_drafts == 1:
      return token_B1, caches
    workspace = self._step_workspace(token_B1.shape[0], num_drafts - 1)
    if self.cfg.num_nextn_predict_layers > 1:  # each step picks its layer: unrolled
      return self._unrolled_steps(variables, window.length_B, token_B1, hidden_B1D, caches, num_drafts, workspace)

    def step(carry, i):  # i % 1 == 0: every step is layer 0, so one scanned step compiles for any k
      token_B1, hidden_B1D, caches = carry
      selection = None if shared is None else _reused_selection(shared, window.length_B, i, num_drafts)
      out = self.model.apply(variables, token_B1, (window.length_B - 1 + i)[:, None], hidden_B1D, caches,
                             workspace=workspace, selection=selection)
      token_B1 = self._greedy(variables, out.hidden_BTD, 0)
      return (token_B1, out.next_prev_hidden_BTD, out.caches), token_B1[:, 0]

    (_, _, caches), rest_MB = jax.lax.scan(step, (token_B1, hidden_B1D, caches), jnp.arange(1, num_drafts))
    return jnp.concatenate([token_B1, rest_MB.T], axis=1), caches

  def _step_workspace(self, batch: int, steps: int):
    """The Opt-1 GPU workspace the `steps` draft steps after the first chain their kernel through
    (`workspace_for_chain`: pallas_gpu, tp ≥ 2, ≥ CHAIN_MIN_CALLS steps), or None."""
    tp, cfg = self.model.tp, self.cfg
    return workspace_for_chain(self.model.norm_impl, tp.axis, tp.size, steps, batch, cfg.hidden_size, cfg.dtype)

  def _unrolled_steps(self, variables, length_B, token_B1, hidden_B1D, caches, num_drafts: int, workspace):
    tokens = [token_B1]
    for i in range(1, num_drafts):
      out = self.model.apply(variables, tokens[-1], (length_B - 1 + i)[:, None], hidden_B1D, caches, spec_step_idx=i,
                             workspace=workspace)
      hidden_B1D, caches = out.next_prev_hidden_BTD, out.caches
      tokens.append(self._greedy(variables, out.hidden_BTD, i))
    return jnp.concatenate(tokens, axis=1), caches

  def _greedy(self, variables: dict, hidden_B1D: jax.Array, step: int) -> jax.Array:
    model = self.model
    if self.path == LOCAL_ARGMAX:
      return model.apply(variables, hidden_B1D, step, method=model.get_top_tokens)
    logits_B1V = model.apply(variables, hidden_B1D, step, method=model.compute_logits)
    return jnp.argmax(logits_B1V, axis=-1).astype(jnp.int32)


def _reused_selection(shared: Selection, length_B: jax.Array, step: jax.Array, num_drafts: int) -> Selection:
  """Step `step`'s slots under index sharing: step 0's top-k (every slot ≤ length − 1) plus the
  draft slots written since, length .. length − 2 + k, of which those ≤ the step's own position
  (length − 1 + step) are visible. K + k − 1 slots; the visible ones are distinct (step 0's invalid
  fillers may repeat a draft slot, masked)."""
  offsets = jnp.arange(1, num_drafts, dtype=jnp.int32)
  drafts_B1M = ((length_B - 1)[:, None] + offsets)[:, None, :]
  visible_B1M = jnp.broadcast_to(offsets <= step, drafts_B1M.shape)
  return Selection(jnp.concatenate([shared.slots_BTK, drafts_B1M], axis=-1),
                   jnp.concatenate([shared.valid_BTK, visible_B1M], axis=-1))


def _own(params: dict) -> dict:
  return {name: value for name, value in params.items() if name not in SHARED_WITH_TARGET}
