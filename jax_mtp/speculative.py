"""Speculative decoding with MTP drafts (docs/design.md §1): prefill, then rounds of propose → verify → accept.

Round (per row, all rows at once):
    propose   the drafter catches up on the target hiddens committed last round and drafts d1..dk
    verify    ONE target forward over [t1, d1..dk] at positions length .. length + k
    accept    greedy: longest prefix with d_{j+1} == argmax_j, + the bonus token (jax_mtp.acceptance);
              temperature > 0: rejection sampling of the (greedy, one-hot) drafts against the target's
              distribution, restricted by top-k / top-p where given (jax_mtp.acceptance.Sampling)
    commit    length += a + 1 (cut at max_new_tokens); the next t1 is the last emitted token

Ragged batches: positions, not masks. Prompts are right-padded to the longest (T tokens) and
prefilled at positions 0..T−1. Each row then has its own `length` (target positions 0..length−1
committed) and its own positions in every call, and advances by its own a + 1. A cache slot holds the token at that
position and a query at position p reads slots ≤ p (jax_mtp.cache), so prompt padding, rejected
drafts and window padding — all written at positions ≥ length — are overwritten before any query
can read them. Rollback is therefore just `length`: no cache copy, for the target, MTP and DSA
indexer-K caches alike (the indexer's top-k is taken over visible slots only).
A row that has its max_new_tokens, or has emitted a stop id (the checkpoint's EOS; the round cuts
its emitted tokens just after it), freezes (its state stops changing) while the others go on; it
still computes (static shapes), at positions ≥ its length, so its committed cache stays intact.
`tokens_generated` counts emitted tokens only; the draft counters count what the target accepted, as
vLLM's do, so a row's last round also counts the drafts it accepted past its cut (jax_mtp.metrics).

The MTP cache after acceptance: slot p must hold the MTP layer's KV of (target hidden at p, token
at p + 1). Draft steps write slots from their own (draft) hiddens, so the round's verify output
becomes the next round's catch-up `Window` (jax_mtp.drafter): the target's hiddens at positions
length .. length + a paired with the emitted tokens. Step 0 of the next round runs the MTP layer
over it (W = k + 1 entries, count a + 1 valid), rewriting those slots with the target's hiddens
before drafting from the last one — what vLLM does with the accepted tokens' hidden states. The
prefill does the same over the whole prompt.

Shapes are static: the prefill compiles once per (B, T, capacity), the round once per (B, capacity),
each in a greedy and a sampling variant (one per combination of the top-k / top-p filters on); max_new_tokens,
the temperature and the filters' values are traced scalars and
the output buffer has `capacity` columns, so neither the number of tokens nor of rounds recompiles
anything. `capacity = T + max_new_tokens + k` holds every position a row ever writes (an active row
writes ≤ len + max_new − 2 + k, a frozen one ≤ len + max_new − 1 + k).

Embedding and head are shared: the drafter's params hold only the MTP layers and every call puts
the target's `embed_tokens` / `lm_head` arrays into the predictor's tree (one copy, as vLLM shares).
Everything runs inside one `shard_map` on the tp mesh; the state is replicated and every device
computes the same acceptance (the same PRNG key on each, on all-gathered logits).
The prompt's prefill (target and MTP catch-up) runs in chunks (jax_mtp.prefill). Models whose config
sets `index_share_for_mtp_iteration` reuse the step-0 DSA top-k across draft steps (jax_mtp.drafter).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jax_mtp.acceptance import Sampling, accept_greedy, accept_sampled, sample
from jax_mtp.config import MtpConfig
from jax_mtp.drafter import MtpDrafter, Window
from jax_mtp.experts import check_runs_on
from jax_mtp.kernels.fused_allreduce_rmsnorm import check_impl_runtime
from jax_mtp.metrics import SpecMetrics
from jax_mtp.model import TargetModel, init_target_caches
from jax_mtp.mtp import MtpPredictor
from jax_mtp.param_tree import check_param_tree, expected_target_tree
from jax_mtp.prefill import PREFILL_CHUNK_BYTES, apply_in_chunks, prefill_budget, prefill_plan, with_last_hidden
from jax_mtp.ran_kernels import parts_ran
from jax_mtp.request import (check_caches_fit, pack_prompts, required_capacity, stop_id_array, validate_positive,
                             validate_prompts, validate_seed, validate_temperature, validate_top_k, validate_top_p)
from jax_mtp.sharding import (check_fp8_shares, jit_per_shard, param_specs, replicated, shard_params, tensor_parallel,
                              tp_size, validate_tp)


class SpecParams(NamedTuple):
  target: dict  # TargetModel params, placed on the mesh (vocab rows padded to a multiple of tp)
  drafter: dict  # the drafter's own params (MTP layers; embed/head come from `target`)


class RoundStats(NamedTuple):
  rounds_B: jax.Array  # int32: rounds the row took part in
  accepted_at_M: jax.Array  # int32 [k]: rounds (over rows) in which the target accepted draft i, emitted or not


class DecodeState(NamedTuple):
  """Replicated decode state; B rows, O = capacity output slots."""

  length_B: jax.Array  # int32: target positions 0..length−1 are committed
  next_token_B: jax.Array  # int32: last emitted token t1, at position length, not yet in the target cache
  window: Window  # the drafter's catch-up input for the next round
  tokens_BO: jax.Array  # int32: emitted tokens, the first num_out valid
  num_out_B: jax.Array  # int32
  stopped_B: jax.Array  # bool: the row emitted a stop id (EOS), or failed, and takes no further part
  failed_B: jax.Array  # bool: the target's hidden for the row's next token was not finite (NaN / inf): the
  # row stopped before that token, with every token before it emitted (`SpecResult.failed_rows`)
  target_caches: tuple
  drafter_caches: tuple
  stats: RoundStats
  key: jax.Array


@dataclasses.dataclass(frozen=True)
class SpecResult:
  tokens: list[list[int]]  # generated tokens per prompt: max_new_tokens, or fewer ending in a stop id
  metrics: SpecMetrics
  state: DecodeState  # the final state (lengths, caches), for inspection

  @property
  def failed_rows(self) -> list[int]:
    """Rows stopped because the target's logits for their next token were not finite."""
    return [int(i) for i in np.flatnonzero(np.asarray(self.state.failed_B))]

  @property
  def stopped_rows(self) -> list[bool]:
    """Per row: it stopped before max_new_tokens (a stop id, or failed)."""
    return [bool(s) for s in np.asarray(self.state.stopped_B)]


class Speculator:
  """Target model + drafter on a tp mesh; `generate` runs speculative decoding on a batch of prompts.

  `drafter` defaults to the MTP predictor (`drafter_cls`, greedy through its declared path); any
  object with the `jax_mtp.drafter` interface may stand in (the tests' perfect / wrong drafters).
  Greedy and sampling are two compiled programs (sampling one per combination of the top-k / top-p filters on);
  the temperature and the filters' values are traced.
  """

  def __init__(self, cfg: MtpConfig, mesh: Mesh, num_speculative_tokens: int, *, norm_impl: str = "xla",
               drafter_cls: type[MtpPredictor] = MtpPredictor, drafter=None):
    validate_positive("num_speculative_tokens", num_speculative_tokens)
    self.cfg, self.mesh, self.k = cfg, mesh, num_speculative_tokens
    tp = tp_size(mesh)
    validate_tp(cfg, tp)
    check_impl_runtime(norm_impl, mesh)
    check_runs_on(cfg.moe_impl, mesh)
    self.target = TargetModel(cfg, tensor_parallel(tp), norm_impl)
    self.drafter = MtpDrafter(cfg, tensor_parallel(tp), norm_impl, drafter_cls) if drafter is None else drafter
    self._compiled = {}

  def shard(self, target_params: dict, mtp_params: dict) -> SpecParams:
    """Places both trees on the mesh; the MTP tree's own embed/head are dropped (the target's are used)."""
    check_param_tree(target_params, expected_target_tree(self.cfg), "target params")
    return SpecParams(shard_params(target_params, self.cfg, self.mesh), self.drafter.shard(mtp_params, self.mesh))

  def generate(self, params: SpecParams, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
               capacity: int | None = None,
               stop_ids: Sequence[int] = (),
               on_progress: Callable[[int, int], None] | None = None,
               on_tokens: Callable[[list[list[int]]], None] | None = None) -> SpecResult:
    """`max_new_tokens` tokens after each prompt: greedy at temperature 0, else sampled (`seed`) from the target's
    softmax(logits / temperature) restricted to its `top_k` most likely tokens (0: all) and then to their top-`top_p`
    nucleus (1: all), as vLLM's sampler restricts it (`acceptance.Sampling`; greedy's token is in both sets).
    A row that emits one of `stop_ids` (the checkpoint's EOS ids) stops there, the stop id its last
    token; the others go on. `capacity` (cache positions) defaults to the minimum; a larger fixed one
    lets calls with other lengths share the compiled functions. `on_progress(tokens_done,
    tokens_total)` is called after the prefill and after every round (a stopped row counts as done);
    `on_tokens(tokens)` too, with each row's tokens committed so far (streaming output)."""
    validate_prompts(self.cfg, prompts)
    validate_positive("max_new_tokens", max_new_tokens)
    validate_temperature(temperature)
    validate_top_k(top_k)
    validate_top_p(top_p)
    validate_seed(seed)
    # numpy / 0-d array values as Python's
    max_new_tokens, temperature, top_k, top_p = int(max_new_tokens), float(temperature), int(top_k), float(top_p)
    stop_N = stop_id_array(self.cfg, stop_ids)
    capacity = required_capacity(self.cfg, prompts, max_new_tokens, self.k, capacity)
    check_caches_fit(self.cfg, len(prompts), capacity, self.mesh.devices.flat)
    budget = prefill_budget(self.cfg, len(prompts), capacity, self.mesh.devices.flat)
    for tree in params:  # params not placed by `shard`: jit's placement would split FP8 blocks as they are
      check_fp8_shares(tree, self.mesh, self.cfg.fp8_block)
    prompt_BT, lengths_B = pack_prompts(prompts)
    sampled, max_new = temperature > 0, np.int32(max_new_tokens)
    sampling = Sampling.of(temperature, top_k, top_p, self.cfg.vocab_size)
    prefill_args = (*params, prompt_BT, lengths_B, jax.random.key(seed), sampling, stop_N)
    prefill, prefill_seconds = self._compile("prefill", capacity, sampled, prefill_args, budget)
    one_round, round_seconds = self._compile("round", capacity, sampled,
                                             (*params, prefill.out_info, max_new, sampling, stop_N))
    compile_seconds = prefill_seconds + round_seconds

    total = max_new_tokens * len(prompts)
    start = time.perf_counter()
    state = prefill(*prefill_args)
    owed_B = np.asarray(_owed(state.num_out_B, state.stopped_B, max_new_tokens))  # what each row still owes

    def report(owed_B):
      if on_progress is not None:
        on_progress(total - int(owed_B.sum()), total)

    while owed_B.max() > 0:
      report(owed_B)
      if on_tokens is not None:
        on_tokens(_committed(state, max_new_tokens))
      state, owed_dev_B = one_round(*params, state, max_new, sampling, stop_N)
      # A row emits at most k + 1 tokens a round, so one owing more before the round just queued still
      # owes after it: queue the next round before waiting for this one's count, and the device never
      # idles on the host's check (streaming reads every round's tokens, so it waits instead).
      while on_tokens is None and owed_B.max() > self.k + 1:
        state, owed_next_B = one_round(*params, state, max_new, sampling, stop_N)
        owed_B, owed_dev_B = np.asarray(owed_dev_B), owed_next_B
        report(owed_B)
      owed_B = np.asarray(owed_dev_B)
    seconds = time.perf_counter() - start
    report(owed_B)
    tokens = _committed(state, max_new_tokens)
    if on_tokens is not None:
      on_tokens(tokens)
    return SpecResult(tokens, self._metrics(state, sum(map(len, tokens)), seconds, compile_seconds), state)

  def _metrics(self, state: DecodeState, tokens: int, seconds: float, compile_seconds: float) -> SpecMetrics:
    stats = jax.tree.map(np.asarray, state.stats)
    return SpecMetrics(self.k, int(stats.rounds_B.sum()), tuple(int(n) for n in stats.accepted_at_M), tokens,
                       seconds, compile_seconds)

  def _compile(self, name: str, capacity: int, sampled: bool, args, prefill_budget: int = PREFILL_CHUNK_BYTES):
    """(program, seconds spent compiling it now: 0 where compiled before): the prefill or the round AOT-compiled once
    per (capacity, greedy/sampled, argument shapes, the prefill's byte budget); the timing of `generate` then
    excludes compilation."""
    shapes = tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(args))
    key = (name, capacity, sampled, jax.tree.structure(args), shapes, prefill_budget)
    if key in self._compiled:
      return self._compiled[key], 0.0
    start = time.perf_counter()
    self._compiled[key] = self.program(name, capacity, sampled, args, prefill_budget).lower(*args).compile()
    return self._compiled[key], time.perf_counter() - start

  def kernels_ran(self) -> dict[str, dict[str, str]]:
    """{"prefill" / "round": {part: what ran}} over the programs `generate` compiled (`jax_mtp.ran_kernels`: read
    from their HLO, not from the config); a program compiled for several shapes shows each shape's distinct
    answers joined by " / "."""
    found: dict[str, dict[str, list[str]]] = {}
    for (name, *_), compiled in self._compiled.items():
      for part, what in parts_ran(compiled.as_text()).items():
        answers = found.setdefault(name, {}).setdefault(part, [])
        if what not in answers:
          answers.append(what)
    return {name: {part: " / ".join(answers) for part, answers in parts.items()} for name, parts in found.items()}

  def program(self, name: str, capacity: int, sampled: bool, args, prefill_budget: int = PREFILL_CHUNK_BYTES):
    """The jitted prefill or round ("prefill" | "round") for these arguments, not yet lowered (an
    AOT compile for another topology lowers it with abstract arguments: tools/tpu_aot_compile.py); the
    prefill's chunks sized to `prefill_budget` bytes (`jax_mtp.prefill.prefill_budget`)."""
    # the params' specs follow their tree (a FP8 tree has scale leaves, jax_mtp.fp8)
    rep, specs = replicated(), (param_specs(args[0]), param_specs(args[1]))
    if name == "prefill":
      fn = functools.partial(self._prefill_per_shard, capacity=capacity, sampled=sampled, budget=prefill_budget)
      return jit_per_shard(fn, self.mesh, (*specs, rep, rep, rep, rep, rep))
    fn = functools.partial(self._round_per_shard, sampled=sampled)
    return jit_per_shard(fn, self.mesh, (*specs, rep, rep, rep, rep), donate_argnums=(2,))

  # --- per-shard functions (inside shard_map; every array but the params is replicated) ----------

  def _prefill_per_shard(self, target_params, drafter_params, prompt_BT, lengths_B, key, sampling, stop_N, *,
                         capacity: int, sampled: bool, budget: int) -> DecodeState:
    """The target's prefill and the drafter's catch-up over the prompt, a chunk (sized to `budget`) at a time, then
    the first token. Each chunk's target hidden states go straight into the catch-up's (hidden at p, prompt token at
    p + 1) pairs, so no prompt-wide hidden states are held (at V3.2's width 3.8 GB at B = 64 × 4K, held ~1.8 times
    before 2026-12-07). At a row's last position the token after it (t1) is chosen only after the whole prompt; that
    entry is the first round's to write: its window starts there (length − 1, t1) and its catch-up writes it before
    any query reads it."""
    b = prompt_BT.shape[0]
    t_vars = {"params": target_params}
    d_vars = self.drafter.variables(drafter_params, target_params)
    chunk, absorb = prefill_plan(self.cfg, b, capacity, self.target.tp, budget, tokens=prompt_BT.shape[1])
    next_BT = jnp.concatenate([prompt_BT[:, 1:], jnp.zeros((b, 1), jnp.int32)], axis=1)

    def run(inputs, positions_BC, carry):
      (ids_BC, next_BC), (caches, d_caches, last_B1D) = inputs, carry
      out = self.target.apply(t_vars, ids_BC, positions_BC, caches, absorb=absorb)
      count_B = jnp.full((b,), ids_BC.shape[1], jnp.int32)
      _, d_caches = self.drafter.catch_up(d_vars, Window(next_BC, out.hidden_BTD, positions_BC[:, 0], count_B),
                                          d_caches, absorb=absorb)
      return (), (out.caches, d_caches, with_last_hidden(out.hidden_BTD, positions_BC, lengths_B, last_B1D))

    empty = (init_target_caches(self.cfg, b, capacity), self.drafter.init_caches(b, capacity),
             jnp.zeros((b, 1, self.cfg.hidden_size), jnp.dtype(self.cfg.dtype)))
    _, (caches, d_caches, last_B1D) = apply_in_chunks(run, (prompt_BT, next_BT), empty, chunk)
    key, first_key = jax.random.split(key)
    first_B = self._choose(t_vars, last_B1D, first_key, sampling if sampled else None)[:, 0]
    zeros_B = jnp.zeros((b,), jnp.int32)
    w = self.k + 1
    window = Window(jnp.zeros((b, w), jnp.int32).at[:, 0].set(first_B),
                    jnp.zeros((b, w, self.cfg.hidden_size), last_B1D.dtype).at[:, 0].set(last_B1D[:, 0]),
                    lengths_B - 1, zeros_B + 1)
    failed_B = ~_finite_rows(last_B1D)  # no first token from a non-finite hidden: the row emits nothing
    tokens_BO = jnp.zeros((b, capacity), jnp.int32).at[:, 0].set(first_B)
    stats = RoundStats(zeros_B, jnp.zeros((self.k,), jnp.int32))
    return DecodeState(lengths_B, first_B, window, tokens_BO, jnp.where(failed_B, 0, 1),
                       _is_stop(first_B, stop_N) | failed_B, failed_B, caches, d_caches, stats, key)

  def _round_per_shard(self, target_params, drafter_params, state: DecodeState, max_new, sampling, stop_N, *,
                       sampled: bool) -> tuple[DecodeState, jax.Array]:
    """propose → verify → accept → commit for every row; rows with max_new tokens, or stopped, stay frozen.
    Returns the new state and the tokens each row still owes (int32 [B]; 0 once stopped), a separate
    output the host reads while the next round, which takes the donated state, runs."""
    t_vars = {"params": target_params}
    d_vars = self.drafter.variables(drafter_params, target_params)
    key, verify_key = jax.random.split(state.key)
    drafts_BM, d_caches = self.drafter.propose(d_vars, state.window, state.drafter_caches, self.k)
    ids_BW = jnp.concatenate([state.next_token_B[:, None], drafts_BM.astype(jnp.int32)], axis=1)
    positions_BW = state.length_B[:, None] + jnp.arange(self.k + 1, dtype=jnp.int32)
    out = self.target.apply(t_vars, ids_BW, positions_BW, state.target_caches, absorb=True)  # decode-time: absorbed
    a_B, emitted_BW = self._verify(t_vars, out.hidden_BTD, drafts_BM, verify_key, sampling if sampled else None)

    active_B = (state.num_out_B < max_new) & ~state.stopped_B
    # emit the a + 1 tokens, cut at max_new and just after the first stop id among them
    j_W = jnp.arange(self.k + 1)
    stop_BW = _is_stop(emitted_BW, stop_N) & (j_W <= a_B[:, None])
    first_stop_B = jnp.where(stop_BW.any(axis=1), jnp.argmax(stop_BW, axis=1), self.k + 1)
    # token j comes from hidden j: a non-finite hidden among the emitted ones cuts the row before it
    bad_BW = ~_finite_rows(out.hidden_BTD, keep_axis=True) & (j_W <= a_B[:, None])
    first_bad_B = jnp.where(bad_BW.any(axis=1), jnp.argmax(bad_BW, axis=1), self.k + 1)
    n_new_B = jnp.where(active_B, jnp.minimum(jnp.minimum(a_B + 1, max_new - state.num_out_B),
                                              jnp.minimum(first_stop_B + 1, first_bad_B)), 0)
    failed_B = state.failed_B | (active_B & (first_bad_B <= jnp.minimum(a_B, max_new - state.num_out_B - 1))
                                 & (first_bad_B <= first_stop_B))
    stopped_B = state.stopped_B | (active_B & (first_stop_B < n_new_B)) | failed_B
    tokens_BO = _append(state.tokens_BO, emitted_BW, state.num_out_B, n_new_B)
    last_B = jnp.take_along_axis(emitted_BW, jnp.maximum(n_new_B - 1, 0)[:, None], axis=1)[:, 0]
    window = _where_rows(active_B, Window(emitted_BW, out.hidden_BTD, state.length_B, n_new_B), state.window)
    # Frozen rows keep their state; their caches change only at positions ≥ length (and the
    # window's slots, recomputed from the same inputs), so what they committed stays intact.
    # vLLM counts every draft the target accepted, also those past max_new or a stop id, which are not emitted
    # (jax_mtp.metrics); none judged on a non-finite hidden (draft i is judged on hidden i)
    accepted_BM = active_B[:, None] & (jnp.arange(self.k) < jnp.minimum(a_B, first_bad_B)[:, None])
    stats = RoundStats(state.stats.rounds_B + active_B, state.stats.accepted_at_M + accepted_BM.sum(0))
    num_out_B = state.num_out_B + n_new_B
    new_state = DecodeState(state.length_B + n_new_B, jnp.where(active_B, last_B, state.next_token_B), window,
                            tokens_BO, num_out_B, stopped_B, failed_B, out.caches, d_caches, stats, key)
    return new_state, _owed(num_out_B, stopped_B, max_new)

  def _verify(self, t_vars, hidden_BWD, drafts_BM, key, sampling: Sampling | None):
    """(accepted count a_B, emitted_BW): greedy when `sampling` is None, else rejection sampling."""
    if sampling is None:
      return accept_greedy(drafts_BM, self.target.apply(t_vars, hidden_BWD, method=TargetModel.get_top_tokens))
    logits_BWV = self.target.apply(t_vars, hidden_BWD, method=TargetModel.compute_logits)
    return accept_sampled(drafts_BM, logits_BWV, sampling, key)

  def _choose(self, t_vars, hidden_BTD, key, sampling: Sampling | None) -> jax.Array:
    """The target's next token(s) int32 [B, T]: greedy when `sampling` is None, else sampled."""
    if sampling is None:
      return self.target.apply(t_vars, hidden_BTD, method=TargetModel.get_top_tokens)
    return sample(self.target.apply(t_vars, hidden_BTD, method=TargetModel.compute_logits), sampling, key)


def _finite_rows(hidden_BTD: jax.Array, keep_axis: bool = False) -> jax.Array:
  """Per row (and token, with keep_axis) whether the hidden is finite: NaN / inf logits would make
  greedy decoding emit token 0 forever, so such a row stops instead (`DecodeState.failed_B`)."""
  return jnp.isfinite(hidden_BTD).all(axis=-1) if keep_axis else jnp.isfinite(hidden_BTD).all(axis=(1, 2))


def _is_stop(tokens: jax.Array, stop_N: jax.Array) -> jax.Array:
  return (tokens[..., None] == stop_N).any(axis=-1)


def _owed(num_out_B, stopped_B, max_new_tokens):
  """Tokens each row still owes: max_new_tokens − emitted, 0 once stopped; int32 [B]."""
  return jnp.where(stopped_B, 0, jnp.maximum(max_new_tokens - num_out_B, 0)).astype(jnp.int32)


def _append(tokens_BO, new_BW, num_out_B, n_new_B):
  """tokens[b, num_out[b] + j] = new[b, j] for j < n_new[b]; other writes are dropped."""
  b, w = new_BW.shape
  j_W = jnp.arange(w)
  cols_BW = jnp.where(j_W < n_new_B[:, None], num_out_B[:, None] + j_W, tokens_BO.shape[1])
  return tokens_BO.at[jnp.arange(b)[:, None], cols_BW].set(new_BW, mode="drop")


def _where_rows(rows_B, new, old):
  """Per row, the leaves of `new` where rows_B else those of `old`."""
  def pick(x, y):
    return jnp.where(rows_B.reshape((-1,) + (1,) * (x.ndim - 1)), x, y)
  return jax.tree.map(pick, new, old)


def _committed(state: DecodeState, max_new_tokens: int) -> list[list[int]]:
  """Each row's tokens committed so far (at most max_new_tokens)."""
  tokens_BO, num_out_B = np.asarray(state.tokens_BO), np.asarray(state.num_out_B)
  return [row[:min(n, max_new_tokens)].tolist() for row, n in zip(tokens_BO, num_out_B)]
