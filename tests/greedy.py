"""Greedy decoding of one model twice, for the tests that speculative decoding equals plain decoding: the plain
`TargetDecoder` and the `Speculator`, on one device, over the same prompts and capacity; and the margin by which
the target chose each greedy token, which says whether two implementations' tokens can be compared at all."""

import jax.numpy as jnp
import numpy as np

import jax_mtp
from jax_mtp.model import TargetModel
from jax_mtp.prefill import target_prefill


def plain_and_speculative(cfg, target_params, mtp_params, prompts, new: int, *, capacity: int, k: int = 3):
  """(plain greedy tokens, the speculator's SpecResult)."""
  decoder = jax_mtp.TargetDecoder(cfg, jax_mtp.make_mesh(1))
  plain = decoder.generate(decoder.shard(target_params), prompts, new, capacity=capacity)
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), k)
  return plain, spec.generate(spec.shard(target_params, mtp_params), prompts, new, capacity=capacity)


def greedy_margin(cfg, target_params, prompts, tokens, *, capacity: int) -> float:
  """The smallest gap between the target's two largest logits, relative to the largest, over the positions that
  chose `tokens` (one teacher-forced forward over each row's prompt + tokens); 0 where a position's argmax is not its
  token (the forward's form disagrees with the decode's: a tie). Implementations whose logits differ by roundings
  choose the same greedy tokens only where this is above their difference (tests/tolerances.py, GREEDY_MIN_MARGIN)."""
  model = TargetModel(cfg)
  margins = []
  for prompt, row in zip(prompts, tokens, strict=True):
    seq = list(prompt) + list(row)
    hidden, _, _ = target_prefill(model, {"params": target_params}, jnp.asarray([seq], jnp.int32),
                                  jnp.asarray([len(seq)], jnp.int32), capacity)
    logits = np.asarray(model.apply({"params": target_params}, hidden, method=TargetModel.compute_logits), np.float64)
    for position, token in enumerate(row, start=len(prompt) - 1):
      first, second = np.sort(logits[0, position])[::-1][:2]
      chosen = int(np.argmax(logits[0, position])) == token
      margins.append((first - second) / abs(first) if chosen else 0.0)
  return min(margins)
