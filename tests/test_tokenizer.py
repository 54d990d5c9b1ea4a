"""The checkpoint's text side (jax_mtp.tokenizer) refuses what it cannot read with one error naming it: a prompt
that is not UTF-8, a generation_config.json that is not an object, an eos_token_id that is not token ids."""

import json

import pytest

from jax_mtp import decode
from jax_mtp.loader import DEFAULT_MODEL
from jax_mtp.tokenizer import TextCodec, TokenizerError, eos_token_ids


def test_a_prompt_that_is_not_utf8_is_one_error(capsys):
  """argv holds bytes that are not UTF-8 as lone surrogates (os.fsdecode), which the tokenizer cannot take."""
  with pytest.raises(TokenizerError, match=r"prompt 'caf\\udce9' is not valid UTF-8 \(characters 3–3\)"):
    TextCodec(DEFAULT_MODEL).encode("caf\udce9")
  assert decode.main(["--prompt", "\udcff\udcfe", "--max-new-tokens", "1"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: prompt '\\udcff\\udcfe' is not valid UTF-8") and len(err.splitlines()) == 1


@pytest.mark.parametrize("content, match", [
    ("[0]", r"holds \[0\], expected a JSON object"),
    ("3", "holds 3, expected a JSON object"),
    ('{"eos_token_id": "0"}', "eos_token_id='0' must be a token id or a list of them"),
    ('{"eos_token_id": [1, -2]}', r"eos_token_id=\[1, -2\] must be a token id"),
    ("{", "cannot read"),
])
def test_a_malformed_generation_config_is_named(tmp_path, content, match):
  (tmp_path / "generation_config.json").write_text(content)
  with pytest.raises(TokenizerError, match=match):
    eos_token_ids(str(tmp_path))


def test_eos_ids_come_from_generation_config_then_config(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 5}))
  assert eos_token_ids(str(tmp_path)) == (5,)
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
  assert eos_token_ids(str(tmp_path)) == (1, 2)
