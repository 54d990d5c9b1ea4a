"""`decode --check`'s judge (jax_mtp.greedy_check): a row's first difference from plain greedy decoding counts only
where the target chose clearly — in a 16-bit model a near-tie may break either way — measured on real tiny models:
the margins equal a teacher-forced forward's, an exact tie (two tokens with the same head row) passes in bf16 and
fails in fp32, a clear difference fails in both."""

import jax
import numpy as np
import pytest

import jax_mtp
from jax_mtp.greedy_check import NEAR_TIE, compare, first_difference
from tests.greedy import greedy_margins
from tests.tolerances import TOLERANCE

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6]]
NEW, CAPACITY = 8, 16


def _model(dtype: str, twin: bool):
  """A tiny target (64 tokens) and its plain greedy tokens; `twin`: the head row of the first row's first greedy
  token copied to another token, so the two tie exactly wherever either is the largest."""
  cfg = jax_mtp.tiny(vocab_size=64, dtype=dtype, param_dtype=dtype)
  params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  decoder = jax_mtp.TargetDecoder(cfg, jax_mtp.make_mesh(1))
  plain = decoder.generate(decoder.shard(params), PROMPTS, NEW, capacity=CAPACITY)
  if twin:
    token = plain[0][0]
    head = np.asarray(params["lm_head"]).copy()
    twin_id = (token + 1) % cfg.vocab_size
    head[twin_id] = head[token]  # lm_head is [V, D]
    params = {**params, "lm_head": jax.numpy.asarray(head, params["lm_head"].dtype)}
    plain = decoder.generate(decoder.shard(params), PROMPTS, NEW, capacity=CAPACITY)
  return cfg, decoder, decoder.shard(params), params, plain


def test_first_difference():
  assert first_difference([1, 2, 3], [1, 2, 3]) is None
  assert first_difference([1, 5, 3], [1, 2, 3]) == 1
  assert first_difference([1, 2], [1, 2, 3]) == 2  # one ended


def test_the_margins_are_a_teacher_forced_forwards():
  cfg, decoder, sharded, params, plain = _model("float32", twin=False)
  got = decoder.top2_margins(sharded, [PROMPTS[0] + plain[0][:i] for i in range(NEW)])
  expected = greedy_margins(cfg, params, PROMPTS[:1], plain[:1], capacity=CAPACITY)[0]
  assert [token for token, _ in got] == plain[0]
  np.testing.assert_allclose([m for _, m in got], expected, rtol=TOLERANCE["float32"]["rtol"] * 10, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_difference_at_an_exact_tie_passes_in_16_bits_only(dtype):
  """Plain's first token and its twin tie exactly (plain takes the lower id); a speculative row that took the twin
  differs at an exact tie."""
  cfg, decoder, sharded, _, plain = _model(dtype, twin=True)
  speculative = [[(plain[0][0] + 1) % cfg.vocab_size] + plain[0][1:], plain[1]]  # the twin at token 0
  matches, differences = compare(cfg, decoder, sharded, PROMPTS, [0, 1], speculative, plain)
  (d,) = differences
  assert (d["row"], d["index"], d["plain"]) == (0, 0, plain[0][0]) and d["margin"] == 0.0  # the twins tie exactly
  assert matches is d["near_tie"] is (dtype == "bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_clear_difference_fails(dtype):
  cfg, decoder, sharded, _, plain = _model(dtype, twin=False)
  margins = decoder.top2_margins(sharded, [PROMPTS[1] + plain[1][:i] for i in range(NEW)])
  index = int(np.argmax([m for _, m in margins]))  # the clearest choice
  assert margins[index][1] >= NEAR_TIE
  speculative = [plain[0], plain[1][:index] + [(plain[1][index] + 1) % cfg.vocab_size] + plain[1][index + 1:]]
  matches, differences = compare(cfg, decoder, sharded, PROMPTS, [4, 7], speculative, plain)
  assert not matches and [(d["row"], d["index"], d["near_tie"]) for d in differences] == [(7, index, False)]
  assert differences[0]["margin"] == pytest.approx(margins[index][1])
