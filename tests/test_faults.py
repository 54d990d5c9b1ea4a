"""Faults at run time (issue 16): non-finite logits, caches that cannot fit, unwritable targets.

A row whose target logits become non-finite stops there with an error; the other rows go on. Without
this a NaN hidden makes the vocab argmax pick index 0, and the row silently emits token 0 forever.
The poisoned models are real ones with one embedding row set to NaN (the loader refuses non-finite
weights, so at run time this stands for an overflow): a row reading that token gets NaN hiddens from
then on. Caches that cannot fit the device, and checkpoint / run directories that cannot be
written, are one clear error before any work.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.generate import TargetDecoder
from jax_mtp.sharding import make_mesh
from jax_mtp.speculative import Speculator

CFG = jax_mtp.tiny(vocab_size=128)
PROMPTS = [[5, 17, 3, 99, 4], [42, 7, 8]]
NEW = 12


@pytest.fixture(scope="module")
def clean():
  target, mtp = jax_mtp.init_target_params(CFG, jax.random.key(3)), jax_mtp.init_params(CFG, jax.random.key(4))
  plain = TargetDecoder(CFG, make_mesh(1)).generate(target, PROMPTS, NEW)
  return target, mtp, plain


def _poisoned(target, mtp, token: int):
  embed = target["embed_tokens"].at[token].set(jnp.nan)
  return {**target, "embed_tokens": embed}, {**mtp, "embed_tokens": embed}


def _spec(target, mtp, prompts, k=3, **kwargs):
  spec = Speculator(CFG, make_mesh(1), k)
  return spec.generate(spec.shard(target, mtp), prompts, NEW, **kwargs)


def test_a_nan_in_the_prompt_fails_that_row_before_its_first_token(clean):
  target, mtp, plain = clean
  bad = 100
  assert bad not in PROMPTS[1] + plain[1]
  target, mtp = _poisoned(target, mtp, bad)
  prompts = [PROMPTS[0][:2] + [bad] + PROMPTS[0][2:], PROMPTS[1]]
  result = _spec(target, mtp, prompts)
  assert result.failed_rows == [0]
  assert result.tokens == [[], plain[1]]
  assert TargetDecoder(CFG, make_mesh(1)).generate(target, prompts, NEW) == [[], plain[1]]


@pytest.mark.parametrize("k", [1, 3])
def test_a_row_that_emits_a_poisoned_token_stops_just_after_it(clean, k):
  target, mtp, plain = clean
  # the third token row 0 emits, which nothing else reads (prompts, row 1, row 0 before it)
  j = next(j for j in range(2, NEW - 1) if plain[0][j] not in PROMPTS[0] + PROMPTS[1] + plain[1] + plain[0][:j])
  target, mtp = _poisoned(target, mtp, plain[0][j])
  result = _spec(target, mtp, PROMPTS, k=k)
  assert result.failed_rows == [0]
  assert result.tokens == [plain[0][:j + 1], plain[1]]  # emitted up to the poisoned token, whose successor is NaN
  assert TargetDecoder(CFG, make_mesh(1)).generate(target, PROMPTS, NEW) == result.tokens
  assert np.asarray(result.state.stopped_B).tolist() == [True, False]
  # sampling (rejection sampling's path): a row stops exactly when it has emitted the poisoned token, whose
  # successor would be NaN. Top-k 1 keeps the greedy token, so row 0 reaches it for certain (at temperature 1 over
  # the whole vocabulary no seed tried did, and the check was vacuous); top-k 2 lets the rows wander.
  for top_k, seed in ((1, 1), (2, 1)):
    sampled = _spec(target, mtp, PROMPTS, k=k, temperature=1.0, top_k=top_k, seed=seed)
    assert top_k > 1 or sampled.tokens == result.tokens, sampled.tokens
    for row, tokens in enumerate(sampled.tokens):
      poisoned = plain[0][j] in tokens
      assert (row in sampled.failed_rows) == (poisoned and len(tokens) < NEW), (row, tokens)
      assert not poisoned or tokens.index(plain[0][j]) == len(tokens) - 1, tokens


def test_clean_rows_never_fail(clean):
  target, mtp, plain = clean
  result = _spec(target, mtp, PROMPTS)
  assert result.failed_rows == [] and result.tokens == plain


def test_caches_that_cannot_fit_are_refused_before_allocating(clean):
  """The estimate covers every layer's caches; a request past the device's free memory is one clear
  error naming the sizes (here a CPU device: the host's available memory)."""
  from jax_mtp.request import cache_bytes, check_caches_fit, device_free_bytes  # noqa: PLC0415
  layers = CFG.num_hidden_layers + CFG.num_nextn_predict_layers
  cache = jax.eval_shape(lambda: jax_mtp.init_caches(CFG, 3, 50))
  assert cache_bytes(CFG, 3, 50) == layers * sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache[0])) + 3 * 50 * 4
  free = device_free_bytes(jax.devices()[0])
  assert free is not None and free > 0
  # More rows than the host's whole memory holds, not than this instant's free memory: free memory moves between
  # this line and the checks below (other processes), and a request that then fit would allocate it all.
  total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  assert free <= total
  rows = total // cache_bytes(CFG, 1, CFG.max_position_embeddings) + 1
  with pytest.raises(ValueError, match=rf"caches for {rows} row\(s\) × {CFG.max_position_embeddings:,} positions need "
                                       r"[\d.]+ GiB per device .* more than the [\d.]+ GiB free"):
    check_caches_fit(CFG, rows, CFG.max_position_embeddings, jax.devices())
  target, mtp, _ = clean
  spec = Speculator(CFG, make_mesh(1), 2)
  with pytest.raises(ValueError, match="GiB free"):
    spec.generate(spec.shard(target, mtp), [[1]] * rows, 4, capacity=CFG.max_position_embeddings)


def test_the_cache_error_on_a_gpu_names_jaxs_pool(monkeypatch):
  """On a GPU under JAX's default pool (75 % of the device) the error says how to give JAX more; not where the
  fraction is set, nor on other platforms (a stand-in device: only its platform and memory stats are read)."""
  from jax_mtp.request import check_caches_fit, gpu_pool_hint  # noqa: PLC0415

  class Gpu:
    platform, process_index = "gpu", 0

    def memory_stats(self):
      return {"bytes_limit": 2**30, "bytes_in_use": 0}

  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
  with pytest.raises(ValueError, match=r"more than the 1.00 GiB free on .*XLA_PYTHON_CLIENT_MEM_FRACTION=0.95"):
    check_caches_fit(CFG, 1, 2**30, [Gpu()])
  assert "75%" in gpu_pool_hint(Gpu(), environ={})
  assert gpu_pool_hint(Gpu(), environ={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}) == ""
  assert gpu_pool_hint(Gpu(), environ={"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}) == ""
  assert gpu_pool_hint(jax.devices()[0], environ={}) == ""  # a CPU device


def test_unwritable_targets_are_one_clear_error_and_nothing_is_written(clean, tmp_path):
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  from jax_mtp.orbax_io import save_params  # noqa: PLC0415
  from jax_mtp.safetensors_io import CheckpointError  # noqa: PLC0415
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  target, mtp, _ = clean
  with pytest.raises(CheckpointError, match=r"cannot write the checkpoint to '.*a_file/ckpt': .*nothing written"):
    save_params(str(blocker / "ckpt"), CFG, target, mtp)
  run = subprocess.run([sys.executable, "-m", "jax_mtp.train", "--preset", "tiny", "--out", str(blocker / "run"),
                        "--steps", "1"], capture_output=True, text=True, timeout=300)
  last = run.stderr.strip().splitlines()[-1]
  assert run.returncode == 2 and last.startswith("error: --out ") and "is a file, not a directory" in last, \
      run.stderr[-800:]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
