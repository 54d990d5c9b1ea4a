"""The embedded default (jax_mtp/default_model, trained by python -m jax_mtp.train): it loads through
the HF checkpoint path, decodes readable text that equals plain greedy decoding, drafts with mean
acceptance length ≥ 1.8 at k = 3 on held-out prompts it never trained on, stops at its EOS, and streams
its text."""

from __future__ import annotations

import io
import json
import os

import pytest

from jax_mtp import corpus, decode
from jax_mtp.config import demo, from_hf_config
from jax_mtp.decode import TextStream
from jax_mtp.loader import DEFAULT_MODEL
from jax_mtp.generate import TargetDecoder
from jax_mtp.sharding import make_mesh
from jax_mtp.speculative import Speculator
from jax_mtp.tokenizer import TextCodec, eos_token_ids


def test_the_default_is_the_demo_preset_with_its_tokenizer_and_eos():
  cfg = from_hf_config(DEFAULT_MODEL)
  assert cfg == demo()  # the preset `python -m jax_mtp.train --preset demo` trains
  codec = TextCodec(DEFAULT_MODEL)
  assert eos_token_ids(DEFAULT_MODEL) == (codec._tok.token_to_id(corpus.EOS),)
  assert codec.decode(codec.encode("def fibonacci(n):\n")) == "def fibonacci(n):\n"


def test_no_arguments_streams_text_that_matches_plain_greedy(capsys):
  assert decode.main(["--max-new-tokens", "24", "--check"]) == 0
  out = capsys.readouterr().out
  lines = out.splitlines()
  assert lines[0].startswith("the embedded default") and lines[1] == "def fibonacci(n):"
  assert "check: the output matches plain greedy decoding with the target" in out
  assert "acceptance length" in out


def test_json_text_prompt(capsys):
  assert decode.main(["--json", "--prompt", "import os\n", "--prompt", "class Stack:", "--max-new-tokens", "12",
                      "--check"]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["matches_target"] and len(result["text"]) == 2
  assert all(len(tokens) <= 12 for tokens in result["tokens"])


# The default's training corpus, reconstructed (the file's "what" says how): the stdlib files it trained on,
# by their path relative to the stdlib root.
TRAINING_CORPUS = os.path.join(os.path.dirname(__file__), "golden", "default_model_corpus.json")


def unseen_held_out_files() -> list[corpus.CorpusFile]:
  """This Python's stdlib files that the path rule holds out (`corpus.is_held_out`) and the default never read:
  held out when it was trained (under the absolute-path hash of that time), or not in its corpus at all."""
  with open(TRAINING_CORPUS) as f:
    trained = set(json.load(f)["trained"])
  return [f for f in corpus.default_corpus() if corpus.is_held_out(f, corpus.HELD_OUT) and f.relative not in trained]


def test_held_out_acceptance_at_k3():
  """Four windows of the stdlib files both held out by the path rule and unseen by the default, 48 new tokens
  each: speculative == plain greedy, and the mean acceptance length is ≥ 1.8."""
  import tokenizers  # noqa: PLC0415
  from jax_mtp.checkpoint import load_hf_checkpoint  # noqa: PLC0415
  tok = tokenizers.Tokenizer.from_file(f"{DEFAULT_MODEL}/tokenizer.json")
  try:
    files = unseen_held_out_files()
  except corpus.CorpusError as e:
    pytest.skip(str(e))
  if not files:  # e.g. the default's own image: every file the rule holds out there, it trained on
    pytest.skip("no stdlib file here is both held out by the path rule and unseen by the default")
  data = corpus.TokenData.build(files, tok)
  assert not data.train.size  # every file held out: the windows are theirs
  prompts = [row.tolist() for row in data.held_out_batches(1, 4, 48)[0]]
  cfg, target, mtp = load_hf_checkpoint(DEFAULT_MODEL, progress=False)
  spec = Speculator(cfg, make_mesh(1), 3)
  result = spec.generate(spec.shard(target, mtp), prompts, 48)
  plain = TargetDecoder(cfg, make_mesh(1))
  assert result.tokens == plain.generate(plain.shard(target), prompts, 48, capacity=None)
  assert result.metrics.acceptance_length_mean >= 1.8, result.metrics.as_dict()


def test_text_stream_prints_what_is_new_and_holds_back_split_characters():
  codec = TextCodec(DEFAULT_MODEL)
  ids = codec._tok.encode("x = 'é→ü'\n").ids  # byte-level BPE: the non-ASCII chars may span tokens
  out = io.StringIO()
  stream = TextStream(codec, out)
  for end in range(1, len(ids) + 1):
    stream([ids[:end]])
    assert "\ufffd" not in out.getvalue()
    assert "x = 'é→ü'\n".startswith(out.getvalue())
  assert out.getvalue() == "x = 'é→ü'\n"
