"""Fuzzing `python -m jax_mtp.decode` (issue 16): random flag values, and a checkpoint with random bytes
in its safetensors headers and data, truncated files, shuffled shards and wrong dtypes.

The property, for every example: `main` returns 0 with valid output (JSON whose tokens are vocabulary
ids), or 2 with one `error: ` line on stderr and nothing on stdout, or 1 — rows whose logits became
non-finite, reported as such (JSON `finish_reasons` "error", one `error: prompt i` line per row); never
an exception out of `main` (a traceback), never past the per-example deadline, never a file written.
`main` runs in this process (the same code path as the CLI after argv; no interpreter start per
example). CI runs a bounded number of examples (JAX_MTP_FUZZ_EXAMPLES, default 12 per test); the
closing note of the session that built this reports a long run's count.
"""

import contextlib
import io
import json
import os
import random
import shutil
import tempfile

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_mtp
from jax_mtp import decode
from tests.hf_checkpoint import write_checkpoint

EXAMPLES = int(os.environ.get("JAX_MTP_FUZZ_EXAMPLES", "12"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=240_000, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CFG = jax_mtp.tiny()


def _run(argv: list[str], cwd) -> tuple[int, str, str]:
  out, err = io.StringIO(), io.StringIO()
  before = sorted(os.listdir(cwd))
  here = os.getcwd()
  os.chdir(cwd)
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      rc = decode.main(argv)
  finally:
    os.chdir(here)
  assert sorted(os.listdir(cwd)) == before, "a file was written"
  return rc, out.getvalue(), err.getvalue()


def _check(rc: int, out: str, err: str, vocab: int) -> None:
  errors = [line for line in err.splitlines() if line.startswith("error: ")]
  if rc == 2:
    assert out == "" and len(errors) == 1, (out[-500:], err[-2000:])
    return
  assert rc in (0, 1), (rc, err[-2000:])
  result = json.loads(out.splitlines()[-1])
  assert all(0 <= t < vocab for row in result["tokens"] for t in row)
  failed = [i for i, reason in enumerate(result["finish_reasons"]) if reason == "error"]
  assert (rc == 1) == bool(failed) and len(errors) == len(failed), (rc, failed, err[-2000:])


_INTS = st.one_of(st.integers(-3, 6), st.sampled_from([0, 10**9, -(2**31)]))
_FLAGS = {
    "--max-new-tokens": _INTS.map(str),
    "--num-speculative-tokens": _INTS.map(str),
    "--tp": st.sampled_from(["0", "1", "2", "3", "9", "x"]),
    "--temperature": st.one_of(st.sampled_from(["0", "1e-30", "nan", "inf", "-1", "0.7", "abc"]),
                               st.floats(-2, 3, allow_nan=False).map(repr)),
    "--seed": st.sampled_from(["0", "-1", "7", "1e3"]),
    "--prompt-ids": st.one_of(st.sampled_from(["1,2,3", "", ",", "-1", "255", "256", "1,,2", "a,b", "99999999999"]),
                              st.lists(st.integers(0, 300), min_size=0, max_size=6).map(lambda xs: ",".join(map(str, xs)))),
    "--dtype": st.sampled_from(["auto", "float32", "bfloat16", "float8", ""]),
    "--moe-impl": st.sampled_from(["auto", "gather", "ragged_dot", "bogus"]),
    "--impl": st.sampled_from(["xla", "pallas_gpu", "nope"]),
    "--prefill-chunk": st.sampled_from(["0", "1", "3", "-5"]),
    "--weights": st.sampled_from(["auto", "fp8", "bf16"]),
    "--prompt": st.text(max_size=8),
    "--heartbeat-timeout": st.sampled_from(["0", "5"]),
}
_SWITCHES = ["--json", "--check", "--ignore-eos", "--bogus-flag"]


@st.composite
def _argv(draw):
  argv = ["--random-tiny", "--json", "--max-new-tokens", "2", "--prompt-ids", "1,2,3"]
  for flag in draw(st.lists(st.sampled_from(sorted(_FLAGS)), max_size=4, unique=True)):
    argv += [flag, draw(_FLAGS[flag])]
  argv += draw(st.lists(st.sampled_from(_SWITCHES), max_size=2, unique=True))
  return argv


@SETTINGS
@given(argv=_argv())
def test_random_flags_exit_0_with_output_or_2_with_one_error(argv, tmp_path):
  rc, out, err = _run(argv, tmp_path)
  _check(rc, out, err, CFG.vocab_size)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """A 2-shard FP8 checkpoint of the tiny model (block 8 × 8)."""
  directory = str(tmp_path_factory.mktemp("fuzz_ckpt"))
  params = jax_mtp.init_target_params(CFG, jax.random.key(0)), jax_mtp.init_params(CFG, jax.random.key(1))
  write_checkpoint(directory, CFG, *params, block=(8, 8), num_files=2)
  return directory


def _mutate(directory: str, rng: random.Random, how: str) -> str:
  files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
  target = os.path.join(directory, rng.choice(files))
  data = bytearray(open(target, "rb").read())
  header = 8 + int.from_bytes(data[:8], "little")
  if how == "header bytes":
    for _ in range(rng.randint(1, 4)):
      data[rng.randrange(0, header)] = rng.randrange(256)
  elif how == "data bytes":
    for _ in range(rng.randint(1, 64)):
      data[rng.randrange(header, len(data))] = rng.randrange(256)
  elif how == "truncated":
    data = data[:rng.randrange(0, len(data))]
  elif how == "wrong dtype":
    text = data[8:header].decode("latin-1")
    swaps = [("F8_E4M3", "F16"), ("F32", "BF16"), ("BF16", "F8_E4M3"), ("F32", "I64")]
    old, new = rng.choice([s for s in swaps if s[0] in text] or [("F32", "F64")])
    data[8:header] = text.replace(old, new, 1).encode("latin-1")[:header - 8].ljust(header - 8, b" ")
  elif how == "shuffled shards":
    index_path = os.path.join(directory, "model.safetensors.index.json")
    index = json.load(open(index_path))
    names = sorted(index["weight_map"])
    a, b = rng.sample(names, 2)
    index["weight_map"][a], index["weight_map"][b] = index["weight_map"][b], index["weight_map"][a]
    if index["weight_map"][a] == index["weight_map"][b]:  # same shard: move one to the other shard
      index["weight_map"][a] = next(f for f in files if f != index["weight_map"][a])
    with open(index_path, "w") as f:
      json.dump(index, f)
    return how
  with open(target, "wb") as f:
    f.write(bytes(data))
  return f"{how} in {os.path.basename(target)}"


@SETTINGS
@given(how=st.sampled_from(["header bytes", "data bytes", "truncated", "wrong dtype", "shuffled shards"]),
       seed=st.integers(0, 2**32 - 1))
def test_damaged_checkpoints_exit_0_or_2_with_one_error(checkpoint, how, seed, tmp_path):
  directory = os.path.join(tempfile.mkdtemp(dir=tmp_path), "ckpt")  # one per example (tmp_path is shared)
  shutil.copytree(checkpoint, directory)
  _mutate(directory, random.Random(seed), how)
  rc, out, err = _run(["--checkpoint", directory, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--json",
                       "--ignore-eos"], tmp_path)
  _check(rc, out, err, CFG.vocab_size)
