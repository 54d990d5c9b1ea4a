"""`python -m jax_mtp.decode`: exit codes, text and JSON output, determinism and input errors."""

import json
import os
import re
import subprocess
import sys

import pytest

import jax_mtp
from jax_mtp import decode

VOCAB = jax_mtp.tiny().vocab_size


def _assert_drafts(drafts, k: int) -> None:
  assert isinstance(drafts, list) and len(drafts) == k, drafts
  assert all(type(t) is int and 0 <= t < VOCAB for t in drafts), drafts


def _json_run(capsys, argv: list[str]) -> dict:
  assert decode.main(["--json", *argv]) == 0
  out, err = capsys.readouterr()
  lines = out.splitlines()
  assert len(lines) == 1, out  # one JSON object, nothing else on stdout
  assert err == ""
  return json.loads(lines[0])


def test_text_output_prints_the_drafts(capsys):
  """Default run returns 0 and prints the prompt and k=3 draft ids in [0, vocab)."""
  assert decode.main([]) == 0
  out, err = capsys.readouterr()
  assert err == ""
  assert "prompt [1, 2, 3, 4, 5, 6, 7, 8]" in out
  match = re.search(r"draft tokens \(3 greedy steps\): \[([0-9, ]*)\]", out)
  assert match, out
  _assert_drafts([int(t) for t in match.group(1).split(",")], 3)


def test_json_output_and_same_seed_same_drafts(capsys):
  """`--json` prints exactly {prompt_ids, draft_tokens, seconds} with k ints in [0, vocab); a second
  run with the same seed drafts the same tokens."""
  argv = ["--prompt-ids", "5, 6,7,8,9", "--num-speculative-tokens", "4", "--seed", "3"]
  first = _json_run(capsys, argv)
  assert set(first) == {"prompt_ids", "draft_tokens", "seconds"}
  assert first["prompt_ids"] == [5, 6, 7, 8, 9]
  _assert_drafts(first["draft_tokens"], 4)
  assert isinstance(first["seconds"], float) and first["seconds"] >= 0
  assert _json_run(capsys, argv)["draft_tokens"] == first["draft_tokens"]


@pytest.mark.parametrize("argv, named", [
    (["--prompt-ids", "1,999"], "999"),  # outside the tiny vocab (256)
    (["--prompt-ids", "1"], "'1'"),  # one token: no (hidden, next token) pair
    (["--prompt-ids", "a,b"], "'a,b'"),
    (["--num-speculative-tokens", "0"], "=0"),
])
def test_bad_input_returns_2_with_one_error_line(capsys, argv, named):
  """Bad input returns 2, prints nothing on stdout and one `error: ...` line naming the value on stderr."""
  assert decode.main(argv) == 2
  out, err = capsys.readouterr()
  assert out == ""
  lines = err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], err


@pytest.mark.slow
def test_module_entry_point_json(tmp_path):
  """`python -m jax_mtp.decode --json`, run from outside the repo, exits 0 with one parseable JSON
  object holding the default prompt and 3 drafts."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "jax_mtp.decode", "--json"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(proc.stdout)
  assert result["prompt_ids"] == [1, 2, 3, 4, 5, 6, 7, 8]
  _assert_drafts(result["draft_tokens"], 3)
