"""Checks shared by the sampling tests: sampled tokens against the distribution they should follow (a chi-square
test at the table's SAMPLING_MIN_PVALUE), and the XLA compilations a block of code triggers."""

import contextlib

import jax
import numpy as np
from scipy import stats

from tests.tolerances import SAMPLING_MIN_PVALUE

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # jax's event for each XLA compilation


def assert_follows(samples, probs, what: str) -> None:
  """`samples` (token ids) are drawn from `probs`: none where p = 0, and a chi-square p-value ≥ SAMPLING_MIN_PVALUE."""
  counts = np.bincount(np.asarray(samples), minlength=len(probs))
  probs = np.asarray(probs, np.float64) / np.sum(probs)  # fp32 softmax sums to 1 only within 1e-7
  outside = counts[probs == 0].sum()  # a filtered-out token (top-k, top-p) must never be sampled
  assert outside == 0, f"{what}: {outside} samples of tokens whose probability is 0 (p {np.round(probs, 3)})"
  support = probs > 0
  pvalue = stats.chisquare(counts[support], probs[support] * counts.sum()).pvalue
  assert pvalue >= SAMPLING_MIN_PVALUE, f"{what}: counts {counts} vs p {np.round(probs, 3)}, p-value {pvalue:.2g}"


@contextlib.contextmanager
def compilations():
  """Yields the list of function names XLA compiles while the block runs."""
  compiled = []

  def listener(event, duration, **kwargs):
    if event == BACKEND_COMPILE:
      compiled.append(kwargs.get("fun_name"))

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield compiled
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
