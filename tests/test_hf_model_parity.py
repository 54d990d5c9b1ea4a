"""The whole decode path against HF transformers' whole model: tiny DeepSeek-V3.2 and GLM-5
checkpoints written by HF (index_topk 8, sequences of 48+ tokens, so DSA selects at almost every
position), loaded through the CLI's path with `--dtype float32`.

  * teacher-forced logits at every position of a 48-token sequence: within the fp32 tolerance of
    HF's forward (our prefill runs it in chunks of 16, the sparse absorbed form);
  * greedy generation: `python -m jax_mtp.decode --check` (speculative, k = 3, and plain) emits the
    tokens HF's `generate` emits (greedy, its own KV cache, 24 new tokens), token for token, and
    stops where it stops at the checkpoint's EOS.
"""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_mtp import decode, decode_flags, loader
from jax_mtp.model import TargetModel
from jax_mtp.prefill import target_prefill
from jax_mtp.sharding import make_mesh
from tests.hf_model_reference import write_hf_model_checkpoint
from tests.tolerances import assert_close

SEQUENCE, PROMPT, NEW = 48, 24, 24
TOPK, TIE_MARGIN = 8, 1e-4  # index_topk; the k-th / (k+1)-th score gap that fp32 rounding cannot flip


@pytest.fixture(scope="module", params=["deepseek_v32", "glm_moe_dsa"])
def checkpoint(request, tmp_path_factory):
  directory = str(tmp_path_factory.mktemp(request.param))
  # 16 indexer heads: with 4, many keys score exactly 0 (every head's ReLU off) and tie at the top-k
  # boundary, where HF's torch.topk and our radix select may keep different (equally right) slots
  model = write_hf_model_checkpoint(directory, request.param, seed=0, index_topk=TOPK, index_n_heads=16)
  return directory, model


def _cli_loaded(directory: str, extra=()):
  """The config and params exactly as `decode.main` builds them for these flags."""
  args = decode_flags.parser().parse_args(["--checkpoint", directory, "--dtype", "float32", *extra])
  cfg = decode.with_flags(loader.checkpoint_config(directory), args)
  loaded = loader.load(directory, cfg=cfg, mesh=make_mesh(args.tp), weights=args.weights)
  return loaded.cfg, loaded  # the config the weights run with, and the weights


def test_teacher_forced_logits_match_hf_at_every_position(checkpoint):
  directory, model = checkpoint
  cfg, loaded = _cli_loaded(directory, ["--prefill-chunk", "16"])
  assert cfg.dtype == cfg.param_dtype == "float32" and cfg.index_topk == 8
  ids = np.random.default_rng(3).integers(2, cfg.vocab_size, (1, SEQUENCE)).astype(np.int32)
  target = TargetModel(cfg)
  hidden, _, _ = target_prefill(target, {"params": loaded.target}, jnp.asarray(ids), jnp.asarray([SEQUENCE]), 64)
  ours = target.apply({"params": loaded.target}, hidden, method=TargetModel.compute_logits)
  with torch.no_grad(), _IndexScoresSpy() as spy:
    theirs = model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
  assert len(spy.scores) == cfg.num_hidden_layers
  for layer, scores in enumerate(spy.scores):  # the selection is unambiguous, so it must be HF's
    for t in range(TOPK, SEQUENCE):
      row = np.sort(scores[0, t, :t + 1])[::-1]
      assert row[TOPK - 1] - row[TOPK] > TIE_MARGIN, f"near-tie at layer {layer}, position {t}: pick another seed"
  for t in range(SEQUENCE):  # position by position, so a failure names where
    assert_close(ours[0, t], theirs[0, t], "float32", what=f"logits at position {t}")


class _IndexScoresSpy:
  """Records the [B, T, T] index scores HF's indexers hand to `topk` (routers' calls are other shapes)."""

  def __enter__(self):
    self.scores, self._topk = [], torch.Tensor.topk

    def topk(tensor, *args, **kwargs):
      if tensor.ndim == 3 and tensor.shape[-1] == tensor.shape[-2] == SEQUENCE:
        self.scores.append(tensor.detach().numpy().copy())
      return self._topk(tensor, *args, **kwargs)

    torch.Tensor.topk = topk
    return self

  def __exit__(self, *exc):
    torch.Tensor.topk = self._topk


def test_cli_greedy_output_equals_hf_generate(checkpoint, capsys, tmp_path):
  """`--ignore-eos` against HF's generate without an EOS; then, with a token that greedy decoding
  emits mid-way made the checkpoint's EOS (generation_config.json), both stop just after it."""
  shared, model = checkpoint
  directory = str(tmp_path / "checkpoint")
  shutil.copytree(shared, directory)  # its generation_config.json is written below: not into the module's fixture
  prompt = np.random.default_rng(2).integers(2, model.config.vocab_size, PROMPT).tolist()

  def hf_generate(eos):
    with torch.no_grad():
      out = model.generate(torch.as_tensor([prompt]), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                           eos_token_id=eos)
    return out[0, PROMPT:].tolist()

  def cli(*flags):
    argv = ["--checkpoint", directory, "--dtype", "float32", "--json", "--check", "--max-new-tokens", str(NEW),
            "--num-speculative-tokens", "3", "--prompt-ids", ",".join(map(str, prompt)), *flags]
    assert decode.main(argv) == 0
    return json.loads(capsys.readouterr().out)

  full = hf_generate(None)
  out = cli("--ignore-eos")
  assert out["tokens"] == [full] and out["matches_target"] is True and out["finish_reasons"] == ["length"]
  eos = full[NEW // 2]
  with open(os.path.join(directory, "generation_config.json"), "w", encoding="utf-8") as f:
    json.dump({"eos_token_id": [eos, 0]}, f)  # a list, as recent HF configs write it
  expected = hf_generate([eos, 0])
  assert expected[-1] == eos and len(expected) <= NEW // 2 + 1
  out = cli()
  assert out["tokens"] == [expected] and out["matches_target"] is True and out["finish_reasons"] == ["stop"]
