"""Training the target and its MTP layer (DeepSeek-V3's joint MTP objective) or the MTP layer alone.

One teacher-forced forward over a window of L tokens t_0..t_{L-1}:

    h_0..h_{L-1}  = target(t)                                post-final-norm hidden (MLA's naive form)
    lm            = CE(head(h_i), t_{i+1})                   i < L - 1
    g_i           = MTP layer(h_i, t_{i+1}) at position i    vLLM's inference convention (jax_mtp.mtp)
    joint   mtp   = CE(head(g_i), t_{i+2})                   i < L - 2; loss = lm + λ·mtp (DeepSeek-V3 §2.2)
    distill mtp   = CE(head(g_i), softmax(head(h_{i+1})))    the frozen target's own prediction for i + 2
                    (or its greedy token); h stops the gradient; loss = mtp
    indexer       = mean over layers, queries of KL(attention ‖ softmax(indexer scores))   DeepSeek-V3.2

The indexer's loss follows DeepSeek-V3.2: its target is the main attention averaged over heads
(gradient stopped), its inputs are detached from the model (jax_mtp.indexer), and both
distributions run over the slots the query attended — all visible slots while `index_topk` ≥ L
(the dense warm-up), the selected ones after. MoE load is balanced without an auxiliary loss
(DeepSeek-V3): after each step, bias_e += γ·sign(mean load − load_e).

Params are {"target": ..., "mtp": ...}; the MTP tree holds its layers only, the embedding and head
being the target's (shared, as at inference). Batches are split over the mesh's data axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.traverse_util as traverse
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from jax_mtp.sharding import SHARED_WITH_TARGET
from jax_mtp.config import MtpConfig
from jax_mtp.indexer import INDEXER_TRAINING
from jax_mtp.model import TargetModel, init_target_caches
from jax_mtp.moe import EXPERT_LOAD
from jax_mtp.mtp import MtpPredictor, init_caches
from jax_mtp.sharding import data_parallel_shardings

MODES = ("joint", "distill")
DISTILL_TARGETS = ("logits", "greedy")


@dataclasses.dataclass(frozen=True)
class Objective:
  """What a step optimises. `dense`: train with index_topk raised to the window (DSA's warm-up)."""

  mode: str = "joint"
  mtp_weight: float = 0.3  # λ (DeepSeek-V3: 0.3 for the first 10T tokens)
  indexer_weight: float = 1.0
  distill_targets: str = "logits"
  bias_rate: float = 1e-3  # γ of the load-balancing bias update
  dense: bool = False

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"mode={self.mode!r} must be one of {MODES}")
    if self.distill_targets not in DISTILL_TARGETS:
      raise ValueError(f"distill_targets={self.distill_targets!r} must be one of {DISTILL_TARGETS}")


class Forward(NamedTuple):
  target_logits: jax.Array  # fp32 [B, L, V]
  mtp_logits: jax.Array  # fp32 [B, L - 1, V]: position i predicts t_{i+2}
  indexer_kl: jax.Array  # scalar
  expert_load: dict  # router path → tokens per expert [E]


def training_config(cfg: MtpConfig, length: int, dense: bool) -> MtpConfig:
  """The model config a training step traces: XLA's differentiable experts, index scores and sparse
  attention (the kernels have no VJP), and in the dense warm-up an index_topk that keeps every slot of the window."""
  cfg = cfg.replace(moe_impl="ragged_dot", index_scores_impl="xla", sparse_attention_impl="xla", topk_impl="xla",
                    prefill_chunk=0)
  return cfg.replace(index_topk=max(cfg.index_topk, length)) if dense and cfg.has_indexer else cfg


def split_params(target_params: dict, mtp_params: dict) -> dict:
  """{"target": ..., "mtp": ...} with the MTP tree's copies of the embedding and head dropped."""
  return {"target": target_params, "mtp": {k: v for k, v in mtp_params.items() if k not in SHARED_WITH_TARGET}}


def mtp_with_shared(params: dict) -> dict:
  """The MTP predictor's params: its layers plus the target's embedding and head."""
  return {**params["mtp"], **{k: params["target"][k] for k in SHARED_WITH_TARGET}}


def forward(cfg: MtpConfig, params: dict, tokens_BL: jax.Array, *, frozen_target: bool = False) -> Forward:
  b, length = tokens_BL.shape
  target, mtp = TargetModel(cfg), MtpPredictor(cfg)
  collections = [INDEXER_TRAINING, EXPERT_LOAD]
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
  out, target_sown = target.apply({"params": params["target"]}, tokens_BL, positions,
                                  init_target_caches(cfg, b, length), absorb=False, mutable=collections)
  hidden_BLD = jax.lax.stop_gradient(out.hidden_BTD) if frozen_target else out.hidden_BTD
  target_logits = target.apply({"params": params["target"]}, hidden_BLD, method=TargetModel.compute_logits)
  mtp_vars = {"params": mtp_with_shared(params)}
  mtp_out, mtp_sown = mtp.apply(mtp_vars, tokens_BL[:, 1:], positions[:, :-1], hidden_BLD[:, :-1],
                                init_caches(cfg, b, length), absorb=False, mutable=collections)
  mtp_logits = mtp.apply(mtp_vars, mtp_out.hidden_BTD, method=MtpPredictor.compute_logits)
  kls = indexer_kls(target_sown.get(INDEXER_TRAINING, {})) + indexer_kls(mtp_sown.get(INDEXER_TRAINING, {}))
  load = {("target",) + k: v for k, v in _sown_load(target_sown).items()}
  load |= {("mtp",) + k: v for k, v in _sown_load(mtp_sown).items()}
  kl = jnp.mean(jnp.stack(kls)) if kls else jnp.zeros((), jnp.float32)
  return Forward(target_logits, mtp_logits, kl, load)


def indexer_kls(sown: dict) -> list[jax.Array]:
  """One mean KL(attention ‖ softmax(scores)) per attention call that sowed both."""
  flat = traverse.flatten_dict(sown)
  kls = []
  for path, (attention_BTS,) in ((p, v) for p, v in flat.items() if p[-1] == "attention_BTS"):
    (visible_BTS,) = flat[path[:-1] + ("visible_BTS",)]
    (scores_BTS,) = flat[path[:-1] + ("indexer", "scores_BTS")]
    log_q = jax.nn.log_softmax(jnp.where(visible_BTS, scores_BTS, -jnp.inf), axis=-1)
    p = attention_BTS / jnp.sum(attention_BTS, axis=-1, keepdims=True)
    terms = jnp.where(visible_BTS & (p > 0), p * (jnp.log(jnp.where(p > 0, p, 1.0)) - log_q), 0.0)
    kls.append(jnp.mean(jnp.sum(terms, axis=-1)))
  return kls


def _sown_load(sown: dict) -> dict:
  return {path[:-1]: value[0] for path, value in traverse.flatten_dict(sown.get(EXPERT_LOAD, {})).items()}


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean token cross-entropy; `labels` int ids or a probability distribution over the vocab."""
  log_p = jax.nn.log_softmax(logits, axis=-1)
  if labels.ndim == logits.ndim:
    return -jnp.mean(jnp.sum(labels * log_p, axis=-1))
  return -jnp.mean(jnp.take_along_axis(log_p, labels[..., None], axis=-1))


def loss_and_metrics(cfg: MtpConfig, objective: Objective, params: dict, tokens_BL: jax.Array):
  distill = objective.mode == "distill"
  f = forward(cfg, params, tokens_BL, frozen_target=distill)
  lm = cross_entropy(f.target_logits[:, :-1], tokens_BL[:, 1:])
  if distill:
    teacher = jax.lax.stop_gradient(f.target_logits[:, 1:-1])
    labels = (jax.nn.softmax(teacher, axis=-1) if objective.distill_targets == "logits"
              else jnp.argmax(teacher, axis=-1))
    mtp = cross_entropy(f.mtp_logits[:, :-1], labels)
    loss = mtp
  else:
    mtp = cross_entropy(f.mtp_logits[:, :-1], tokens_BL[:, 2:])
    loss = lm + objective.mtp_weight * mtp
  loss = loss + objective.indexer_weight * f.indexer_kl
  metrics = {"loss": loss, "lm_loss": lm, "mtp_loss": mtp, "indexer_kl": f.indexer_kl,
             "acceptance": draft_agreement(f)}
  return loss, (metrics, f.expert_load)


def draft_agreement(f: Forward) -> jax.Array:
  """Teacher-forced draft acceptance: how often the MTP head's top-1 at i equals the target's top-1
  at i + 1 (the token greedy decoding emits after t_{i+1}), as MaxText reports it."""
  drafts = jnp.argmax(f.mtp_logits[:, :-1], axis=-1)
  return jnp.mean((drafts == jnp.argmax(f.target_logits[:, 1:-1], axis=-1)).astype(jnp.float32))


def optimizer(learning_rate: float, steps: int, warmup: int) -> optax.GradientTransformation:
  """AdamW (decay on matrices only) with linear warm-up and cosine decay, gradients clipped at 1."""
  schedule = optax.warmup_cosine_decay_schedule(learning_rate / max(warmup, 1), learning_rate, max(warmup, 1), max(steps, warmup + 1),
                                                end_value=learning_rate * 0.1)
  decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)  # noqa: E731
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1, mask=decay_mask))


def trainable(objective: Objective, params: dict) -> dict:
  """The subtree the optimizer updates: everything (joint), the MTP layers (distill)."""
  return params["mtp"] if objective.mode == "distill" else params


def _merge(objective: Objective, params: dict, updated: dict) -> dict:
  return {**params, "mtp": updated} if objective.mode == "distill" else updated


def make_train_step(cfg: MtpConfig, objective: Objective, opt: optax.GradientTransformation, length: int,
                    mesh: Mesh):
  """A jitted (params, opt_state, tokens [B, L]) → (params, opt_state, metrics); the batch is split
  over the mesh's data axis, params and optimizer state are replicated."""
  model_cfg = training_config(cfg, length, objective.dense)

  def step(params, opt_state, tokens_BL):
    def loss_of(train_params):
      return loss_and_metrics(model_cfg, objective, _merge(objective, params, train_params), tokens_BL)

    grads, (metrics, load) = jax.grad(loss_of, has_aux=True)(trainable(objective, params))
    updates, opt_state = opt.update(grads, opt_state, trainable(objective, params))
    params = _merge(objective, params, optax.apply_updates(trainable(objective, params), updates))
    params = balance_experts(params, load, objective)
    metrics["grad_norm"] = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    return params, opt_state, metrics

  replicated, batch = data_parallel_shardings(mesh)
  return jax.jit(step, in_shardings=(replicated, replicated, batch), out_shardings=replicated, donate_argnums=(0, 1))


def balance_experts(params: dict, load: dict, objective: Objective) -> dict:
  """bias_e += γ·sign(mean load − load_e) for every router that sowed its load (the target's only
  while it trains)."""
  flat = traverse.flatten_dict(params)
  for path, tokens_E in load.items():
    if path[0] == "target" and objective.mode == "distill":
      continue
    key = path + ("e_score_correction_bias",)
    flat[key] = flat[key] + objective.bias_rate * jnp.sign(jnp.mean(tokens_E) - tokens_E)
  return traverse.unflatten_dict(flat)


def make_eval(cfg: MtpConfig, length: int, mesh: Mesh, dense: bool = False):
  """A jitted (params, tokens [B, L]) → {lm_loss, mtp_loss, acceptance}, held-out teacher forcing
  with the model's own index_topk (or the dense warm-up's)."""
  model_cfg = training_config(cfg, length, dense)

  def evaluate(params, tokens_BL):
    f = forward(model_cfg, params, tokens_BL)
    return {"lm_loss": cross_entropy(f.target_logits[:, :-1], tokens_BL[:, 1:]),
            "mtp_loss": cross_entropy(f.mtp_logits[:, :-1], tokens_BL[:, 2:]),
            "acceptance": draft_agreement(f)}

  replicated, batch = data_parallel_shardings(mesh)
  return jax.jit(evaluate, in_shardings=(replicated, batch), out_shardings=replicated)


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(metrics).items()}
