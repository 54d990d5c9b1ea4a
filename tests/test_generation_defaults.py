"""The sampling a checkpoint's generation_config.json asks for (jax_mtp.generation_defaults): applied by
`python -m jax_mtp.decode` where its flags leave a setting unset (`--generation-config auto`, the default, as vLLM),
never over a flag, not with do_sample false, `--generation-config none` or `--check`; bad values are one error naming
the file. End to end on a copy of the embedded default: the file's settings decode the tokens the same flags give."""

import json
import os
import shutil

import pytest

import jax_mtp
from jax_mtp import decode
from jax_mtp.generation_defaults import GREEDY, from_file, resolve

NONE_GIVEN = {"temperature": None, "top_k": None, "top_p": None}


def _write(directory, data) -> str:
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "generation_config.json"), "w") as f:
    json.dump(data, f)
  return str(directory)


def test_the_files_settings_fill_the_flags_not_given(tmp_path):
  directory = _write(tmp_path, {"eos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.95})
  values, note = resolve(NONE_GIVEN, directory, "auto", check=False)
  assert values == {"temperature": 0.6, "top_k": 0, "top_p": 0.95}
  assert note.startswith("note: sampling with temperature 0.6, top-p 0.95 from ") and directory in note
  # a flag given wins, the rest still come from the file
  values, note = resolve({**NONE_GIVEN, "top_p": 0.5}, directory, "auto", check=False)
  assert values == {"temperature": 0.6, "top_k": 0, "top_p": 0.5} and "top-p" not in note
  # a flag asking for greedy: the file's filters change nothing, and no note claims they do
  assert resolve({**NONE_GIVEN, "temperature": 0.0}, directory, "auto", check=False) == ({**GREEDY}, None)


@pytest.mark.parametrize("data, mode, check", [
    ({"temperature": 0.6, "top_p": 0.95}, "none", False),  # --generation-config none
    ({"temperature": 0.6, "top_p": 0.95}, "auto", True),  # --check compares greedy outputs
    ({"do_sample": False, "temperature": 0.6}, "auto", False),  # transformers' greedy
    ({"top_p": 0.9}, "auto", False),  # no temperature: greedy, its filters moot
    ({"eos_token_id": [1, 2]}, "auto", False),  # no sampling keys (the embedded default's file)
])
def test_greedy_where_the_file_does_not_apply(tmp_path, data, mode, check):
  assert resolve(NONE_GIVEN, _write(tmp_path, data), mode, check=check) == ({**GREEDY}, None)
  assert resolve(NONE_GIVEN, None, "auto", check=False) == ({**GREEDY}, None)  # no checkpoint files


@pytest.mark.parametrize("given, named", [({"top_k": 5}, "--top-k filters"), ({"top_p": 0.5}, "--top-p filters"),
                                         ({"top_k": 5, "top_p": 0.5}, "--top-k and --top-p filter")])
def test_a_filter_given_to_greedy_decoding_is_noted(tmp_path, given, named):
  """Greedy decoding (no temperature anywhere) ignores --top-k / --top-p: said, not silent; with a temperature they
  apply and nothing is said."""
  values, note = resolve({**NONE_GIVEN, **given}, _write(tmp_path, {"top_p": 0.9}), "auto", check=False)
  assert values == {**GREEDY, **given} and note.startswith(f"note: {named} what sampling draws from; greedy")
  assert resolve({**NONE_GIVEN, **given, "temperature": 0.7}, None, "auto", check=False)[1] is None


@pytest.mark.parametrize("data, message", [
    ({"temperature": -1}, "temperature=-1 must be a finite number ≥ 0"),
    ({"top_p": 0}, "top_p=0 must be a number in"),
    ({"top_k": 2.5}, "top_k=2.5 must be an integer ≥ 0"),
])
def test_a_value_the_sampler_cannot_take_names_the_file(tmp_path, data, message):
  directory = _write(tmp_path, data)
  with pytest.raises(ValueError, match=message) as raised:
    from_file(directory)
  assert os.path.join(directory, "generation_config.json") in str(raised.value)
  (tmp_path / "generation_config.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match="expected a JSON object"):
    from_file(directory)


def _run(capsys, directory, *flags) -> tuple[list, str]:
  assert decode.main(["--checkpoint", directory, "--json", "--max-new-tokens", "12", "--seed", "3", *flags]) == 0
  out, err = capsys.readouterr()
  return json.loads(out)["tokens"], err


def test_the_cli_decodes_with_the_files_sampling_as_with_the_same_flags(capsys, tmp_path):
  """A copy of the embedded default whose generation_config.json asks for temperature 0.9 and top-k 40: the CLI's
  tokens equal those of the same flags given explicitly (the seed fixed), with a note saying where they came from;
  with --generation-config none they are greedy decoding's."""
  directory = tmp_path / "model"
  shutil.copytree(os.path.join(os.path.dirname(jax_mtp.__file__), "default_model"), directory)
  with open(directory / "generation_config.json") as f:
    data = json.load(f)
  _write(directory, {**data, "temperature": 0.9, "top_k": 40})
  sampled, err = _run(capsys, str(directory))
  assert "note: sampling with temperature 0.9, top-k 40 from" in err
  explicit, err = _run(capsys, str(directory), "--temperature", "0.9", "--top-k", "40")
  assert sampled == explicit and "note:" not in err
  greedy, _ = _run(capsys, str(directory), "--generation-config", "none")
  assert greedy == _run(capsys, str(directory), "--temperature", "0")[0] != sampled
