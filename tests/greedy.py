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
  chose `tokens` (`greedy_margins`). Implementations whose logits differ by roundings choose the same greedy tokens
  only where this is above their difference (tests/tolerances.py, GREEDY_MIN_MARGIN)."""
  return min(min(row) for row in greedy_margins(cfg, target_params, prompts, tokens, capacity=capacity))


def greedy_margins(cfg, target_params, prompts, tokens, *, capacity: int) -> list[list[float]]:
  """Per row, per token: the gap between the target's two largest logits at the position that chose it, relative
  to the largest (one teacher-forced forward over each row's prompt + tokens); 0 where the argmax there is not the
  token (the forward's form disagrees with the decode's: a tie)."""
  model = TargetModel(cfg)
  margins = []
  for prompt, row in zip(prompts, tokens, strict=True):
    seq = list(prompt) + list(row)
    hidden, _, _ = target_prefill(model, {"params": target_params}, jnp.asarray([seq], jnp.int32),
                                  jnp.asarray([len(seq)], jnp.int32), capacity)
    logits = np.asarray(model.apply({"params": target_params}, hidden, method=TargetModel.compute_logits), np.float64)
    row_margins = []
    for position, token in enumerate(row, start=len(prompt) - 1):
      first, second = np.sort(logits[0, position])[::-1][:2]
      chosen = int(np.argmax(logits[0, position])) == token
      row_margins.append((first - second) / abs(first) if chosen else 0.0)
    margins.append(row_margins)
  return margins


def assert_same_greedy_tokens(cfg, target_params, prompts, actual, expected, *, capacity: int,
                              min_margin: float) -> None:
  """`actual` greedy tokens equal `expected` (the reference's), or first differ in a row where the reference's top
  two logits lie within `min_margin` of each other (relative): a near-tie two forms of the same model may break
  either way by roundings, after which the row's tokens follow another prefix and are not compared. A difference
  where the reference chose clearly fails, naming the row, the position and the margin."""
  assert len(actual) == len(expected), (len(actual), len(expected))
  for row, (prompt, got, want) in enumerate(zip(prompts, actual, expected, strict=True)):
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None:
      assert len(got) == len(want), f"row {row}: {len(got)} tokens, the reference {len(want)}"
      continue
    margin = greedy_margins(cfg, target_params, [prompt], [want[:first + 1]], capacity=capacity)[0][-1]
    assert margin < min_margin, (f"row {row} differs at token {first} ({got[first]} for the reference's "
                                 f"{want[first]}), where the reference's top-2 margin {margin:.3g} is no tie "
                                 f"(≥ {min_margin:.3g}): {got} != {want}")
