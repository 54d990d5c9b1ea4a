"""Fuzzing `python -m jax_mtp.decode` (issues 16 and 29): hostile checkpoints, prompts and flags, mostly past
flag parsing — valid flags with a checkpoint whose safetensors, index, config.json, generation_config.json or
tokenizer.json is damaged (truncated, corrupt bytes, wrong dtypes, shapes that do not match the config, keys
missing or of the wrong type), or with prompts that are empty, not UTF-8, out of the vocabulary or too long.

The property, for every example: `main` returns 0 with valid output (JSON whose tokens are vocabulary
ids), or 2 with one `error: ` line on stderr and nothing on stdout, or 1 — rows whose logits became
non-finite, reported as such (JSON `finish_reasons` "error", one `error: prompt i` line per row); never
an exception out of `main` (a traceback), never past the per-example deadline, never a file written.
`main` runs in this process (the same code path as the CLI after argv; no interpreter start per example).

The examples differ from run to run: they follow JAX_MTP_FUZZ_SEED, a fresh random seed unless it is set,
printed at the start of this file's tests and beside any failure; setting it (with the same
JAX_MTP_FUZZ_EXAMPLES) repeats a run's examples.
CI runs a bounded number of examples (JAX_MTP_FUZZ_EXAMPLES per test, default 8; half that for the flags), in
about the time this file's two tests took with 12 examples each that mostly stopped at the flags.
"""

import contextlib
import io
import json
import os
import random
import shutil
import tempfile
from unittest import mock

import jax
import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

import jax_mtp
from jax_mtp import decode
from tests.hf_checkpoint import write_checkpoint

SEED = int(os.environ.get("JAX_MTP_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
EXAMPLES = int(os.environ.get("JAX_MTP_FUZZ_EXAMPLES", "8"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=240_000, derandomize=False, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# flags alone: half as many (most now run a model, each a program of its own to compile)
FLAG_SETTINGS = settings(SETTINGS, max_examples=max(1, EXAMPLES // 2))
CFG = jax_mtp.tiny()
REPEAT = f"JAX_MTP_FUZZ_SEED={SEED}"  # what repeats this run's examples


@pytest.fixture(scope="module", autouse=True)
def _say_the_seed(request):
  """The seed on the terminal once, past pytest's capture (as `capsys.disabled()` prints), also when all pass."""
  with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
    print(f"\ntests/test_fuzz.py: {REPEAT} (set it to repeat these examples)", flush=True)


def _run(argv: list[str], cwd) -> tuple[int, str, str]:
  note(f"{REPEAT}; argv {argv}")
  out, err = io.StringIO(), io.StringIO()
  before = sorted(os.listdir(cwd))
  here = os.getcwd()
  os.chdir(cwd)
  try:  # os.environ restored after: --gpu-memory-fraction sets a variable later tests' subprocesses would inherit
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), mock.patch.dict(os.environ):
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


def _mostly(valid, hostile):
  """Valid values three times in four: most examples get past the flags to the model."""
  return st.one_of(valid, valid, valid, hostile)


# --- flags ---------------------------------------------------------------------------------------

_INTS = st.one_of(st.integers(-3, 6), st.sampled_from([0, 10**9, -(2**31)]))
_FLAGS = {
    "--max-new-tokens": _mostly(st.integers(1, 4), _INTS).map(str),
    "--num-speculative-tokens": _mostly(st.integers(1, 5), _INTS).map(str),
    "--tp": _mostly(st.sampled_from(["1", "2", "4"]), st.sampled_from(["0", "3", "9", "x", "100000"])),
    "--temperature": _mostly(st.sampled_from(["0", "0.7", "1", "1e-30"]),
                             st.one_of(st.sampled_from(["nan", "inf", "-1", "abc", "1e300"]),
                                       st.floats(-2, 3, allow_nan=False).map(repr))),
    "--seed": st.sampled_from(["0", "-1", "7", "1e3", str(10**25)]),
    "--top-k": _mostly(st.sampled_from(["0", "1", "5", "1000"]), st.sampled_from(["-1", "x", "1.5", str(10**25)])),
    "--top-p": _mostly(st.sampled_from(["1", "0.9", "1e-9"]), st.sampled_from(["0", "1.5", "nan", "-0.1", "inf"])),
    "--system": st.sampled_from(["", "Be brief.", "\udcff"]),
    "--dtype": _mostly(st.sampled_from(["auto", "float32", "bfloat16", "float16"]), st.sampled_from(["float8", ""])),
    "--moe-impl": _mostly(st.sampled_from(["auto", "gather", "ragged_dot"]),
                          st.sampled_from(["bogus", "tokamax_gpu", "fp8_grouped_gpu"])),
    "--index-scores-impl": st.sampled_from(["auto", "xla", "mosaic_gpu"]),
    "--sparse-attention-impl": st.sampled_from(["auto", "xla", "pallas_gpu", "mosaic_gpu"]),  # pallas_gpu: removed
    "--kv-cache-dtype": _mostly(st.sampled_from(["auto", "bfloat16", "fp8"]), st.sampled_from(["float8", "int8"])),
    "--fp8-matmul-impl": st.sampled_from(["auto", "triton", "mosaic_gpu", "cutlass"]),  # triton: removed
    "--generation-config": st.sampled_from(["auto", "none", "vllm"]),
    "--index-cache-dtype": _mostly(st.sampled_from(["auto", "bfloat16", "fp8"]), st.sampled_from(["int4", ""])),
    "--impl": st.sampled_from(["xla", "xla", "pallas_gpu", "nope"]),
    "--prefill-chunk": st.sampled_from(["0", "1", "3", "-5"]),
    "--weights": st.sampled_from(["auto", "auto", "fp8", "bf16"]),
    "--heartbeat-timeout": st.sampled_from(["0", "5", str(2**40)]),
    "--gpu-memory-fraction": _mostly(st.sampled_from(["0.5", "0.95", "1"]), st.sampled_from(["0", "1.5", "nan", "x"])),
}
_SWITCHES = ["--json", "--check", "--ignore-eos", "--ignore-eos", "--bogus-flag", "--chat", "--thinking"]


@st.composite
def _argv(draw):
  argv = ["--random-tiny", "--json", "--max-new-tokens", "2", "--prompt-ids", "1,2,3"]
  for flag in draw(st.lists(st.sampled_from(sorted(_FLAGS)), max_size=3, unique=True)):
    argv += [flag, draw(_FLAGS[flag])]
  argv += draw(st.lists(st.sampled_from(_SWITCHES), max_size=2, unique=True))
  return argv


@FLAG_SETTINGS
@seed(SEED)
@given(argv=_argv())
def test_random_flags_exit_0_with_output_or_2_with_one_error(argv, tmp_path):
  rc, out, err = _run(argv, tmp_path)
  _check(rc, out, err, CFG.vocab_size)


# --- prompts -------------------------------------------------------------------------------------

_HOSTILE_IDS = st.one_of(
    st.sampled_from(["", ",", " ", "1,,2", "-1", "256", "255,256", "99999999999", str(10**30), "1e3", "0x10",
                     "a,b", "١,٢", "1;2", "\x00", "\udcff\udcfe"]),
    st.lists(st.integers(-2, 300), min_size=0, max_size=6).map(lambda xs: ",".join(map(str, xs))),
    st.integers(600, 700).map(lambda n: ",".join(["7"] * n)),  # past max_position_embeddings (640)
)
_TEXTS = st.one_of(
    st.sampled_from(["", " ", "\x00", "\udcff\udcfe", "caf\udce9", "\ufffd" * 3, "def f(x):\n  return x\n"]),
    st.text(max_size=12),
    st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape")),  # as argv holds non-UTF-8 bytes
)


@pytest.fixture(scope="module")
def text_checkpoint(checkpoint, tmp_path_factory):
  """The fuzzed checkpoint with a tokenizer.json (a word-level BPE of under 256 ids, trained here in
  milliseconds): text prompts reach the model."""
  import tokenizers  # noqa: PLC0415
  from tokenizers import models, pre_tokenizers, trainers  # noqa: PLC0415
  directory = str(tmp_path_factory.mktemp("fuzz_text") / "ckpt")
  shutil.copytree(checkpoint, directory)
  tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  trainer = trainers.BpeTrainer(vocab_size=CFG.vocab_size - 56, special_tokens=["[UNK]"], show_progress=False)
  tok.train_from_iterator(["def f(x):\n  return x + 1\n", "import os, sys  # café €"] * 10, trainer=trainer)
  tok.save(os.path.join(directory, "tokenizer.json"))
  return directory


@st.composite
def _prompt_argv(draw):
  """Valid flags around hostile prompts: ids for the random tiny model (several rows at times), or text (None: the
  model with a tokenizer)."""
  if draw(st.integers(0, 3)) == 0:
    texts = draw(st.lists(_TEXTS, min_size=1, max_size=2))
    return None, [arg for text in texts for arg in ("--prompt", text)]
  rows = draw(st.lists(_mostly(st.lists(st.integers(0, 255), min_size=1, max_size=8)
                               .map(lambda xs: ",".join(map(str, xs))), _HOSTILE_IDS), min_size=1, max_size=3))
  return "--random-tiny", [arg for row in rows for arg in ("--prompt-ids", row)]


@SETTINGS
@seed(SEED)
@given(prompt=_prompt_argv(), k=st.integers(1, 3))
def test_hostile_prompts_exit_0_with_output_or_2_with_one_error(text_checkpoint, prompt, k, tmp_path):
  model, prompts = prompt
  model_flags = ["--checkpoint", text_checkpoint, "--ignore-eos"] if model is None else [model]
  rc, out, err = _run([*model_flags, *prompts, "--max-new-tokens", "2", "--num-speculative-tokens", str(k), "--json"],
                      tmp_path)
  _check(rc, out, err, CFG.vocab_size)


# --- checkpoints ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """A 2-shard FP8 checkpoint of the tiny model (block 8 × 8)."""
  directory = str(tmp_path_factory.mktemp("fuzz_ckpt"))
  params = jax_mtp.init_target_params(CFG, jax.random.key(0)), jax_mtp.init_params(CFG, jax.random.key(1))
  write_checkpoint(directory, CFG, *params, block=(8, 8), num_files=2)
  return directory


def _shard(directory: str, rng: random.Random) -> str:
  return os.path.join(directory, rng.choice(sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))))


def _header(data: bytes) -> tuple[int, dict]:
  """(the data's first byte, the header) of a safetensors file."""
  size = int.from_bytes(data[:8], "little")
  return 8 + size, json.loads(data[8:8 + size])


def _with_header(data: bytes, header: dict) -> bytes:
  text = json.dumps(header).encode()
  text += b" " * (-len(text) % 8)
  return len(text).to_bytes(8, "little") + text + data[_header(data)[0]:]


def _damage_safetensors(directory: str, rng: random.Random, how: str) -> None:
  target = _shard(directory, rng)
  data = bytearray(open(target, "rb").read())
  start, header = _header(data)
  names = sorted(n for n in header if n != "__metadata__")
  name = rng.choice(names)
  if how == "header bytes":
    for _ in range(rng.randint(1, 4)):
      data[rng.randrange(0, start)] = rng.randrange(256)
  elif how == "data bytes":  # in one tensor's bytes (NaN / inf codes and scales included): the load succeeds
    begin, end = header[rng.choice([n for n in names if "embed_tokens" not in n and "head" not in n])]["data_offsets"]
    for _ in range(rng.randint(1, 16)):
      data[start + rng.randrange(begin, end)] = rng.choice([rng.randrange(256), 0x7F, 0xFF])
  elif how == "truncated":
    data = data[:rng.randrange(0, len(data))]
  elif how == "wrong dtype":
    header[name]["dtype"] = rng.choice(["F16", "BF16", "F32", "F64", "I64", "F8_E4M3", "U8", "BOOL", "F8_E5M2"])
    data = _with_header(data, header)
  elif how == "wrong shape":  # the same bytes seen as another shape, or a shape the bytes do not fill
    shape = header[name]["shape"]
    header[name]["shape"] = rng.choice([shape[::-1], [1, *shape], shape[:-1], [0], [2**40], [-1, 3]])
    data = _with_header(data, header)
  elif how == "tensor removed":
    del header[name]
    data = _with_header(data, header)
  elif how == "offsets":
    header[name]["data_offsets"] = rng.choice([[0, 0], [-8, 8], [0, len(data) * 2], [10**20, 0], "x", [1]])
    data = _with_header(data, header)
  with open(target, "wb") as f:
    f.write(bytes(data))


def _damage_index(directory: str, rng: random.Random, how: str) -> None:
  path = os.path.join(directory, "model.safetensors.index.json")
  index = json.load(open(path))
  names = sorted(index["weight_map"])
  files = sorted(set(index["weight_map"].values()))
  if how == "shuffled shards":
    a, b = rng.sample(names, 2)
    index["weight_map"][a], index["weight_map"][b] = index["weight_map"][b], index["weight_map"][a]
    if index["weight_map"][a] == index["weight_map"][b]:  # same shard: move one to the other shard
      index["weight_map"][a] = next(f for f in files if f != index["weight_map"][a])
  elif how == "index entry":
    index["weight_map"][rng.choice(names)] = rng.choice(["missing.safetensors", "../config.json", "", 7, None])
  elif how == "index json":
    index = rng.choice([[], "x", {"weight_map": []}, {"weight_map": {"a": 1}}, {}, None])
  elif how == "shard missing":
    os.remove(os.path.join(directory, rng.choice(files)))
    return
  with open(path, "w") as f:
    json.dump(index, f)


# values of the wrong type or range for any config key
_WRONG = [None, "64", "", -1, 0, 2**31, 1e30, 1.5, True, [], {}, [64], "nan", float("inf")]
_SHAPES = ["hidden_size", "vocab_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
           "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
           "n_routed_experts", "index_n_heads", "index_head_dim", "num_nextn_predict_layers", "first_k_dense_replace"]


_LOADABLE = {"rms_norm_eps": [1e-30, 1e30, 1], "routed_scaling_factor": [1e-30, 1e30, 100],
             "index_topk": [1, 2, 3, 5, 1000], "max_position_embeddings": [1, 4, 6, 2**31],
             "num_experts_per_tok": [1, 8], "topk_group": [1, 4], "norm_topk_prob": [False], "rope_theta": [1e-30, 1, 1e30],
             "rope_scaling": [None, {"type": "yarn", "factor": 1e6, "original_max_position_embeddings": 1}],
             "torch_dtype": ["float16", "bfloat16"]}


def _damage_config(directory: str, rng: random.Random, how: str) -> None:
  path = os.path.join(directory, "config.json")
  config = json.load(open(path))
  key = rng.choice(sorted(config))
  if how == "config key missing":
    del config[key]
  elif how == "config wrong type":
    config[key] = rng.choice(_WRONG)
  elif how == "config shapes":  # a valid config the tensors do not match
    name = rng.choice(_SHAPES)
    config[name] = max(1, config[name] + rng.choice([-1, 1, config[name]]))
  elif how == "config values":  # values the tensors still fit: the model runs with them
    name, values = rng.choice(sorted(_LOADABLE.items()))
    config[name] = rng.choice(values)
  elif how == "config nested":
    part = rng.choice(["rope_scaling", "quantization_config"])
    if rng.random() < 0.5 or not isinstance(config.get(part), dict):
      config[part] = rng.choice(_WRONG + [{"type": "linear"}, {"weight_block_size": [8]}])
    else:
      config[part][rng.choice(sorted(config[part]))] = rng.choice(_WRONG)
  elif how == "config json":
    with open(path, "wb") as f:
      f.write(rng.choice([b"", b"{", b"[1, 2]", b"null", b"\xff\xfe{}", json.dumps(config).encode()[:-5]]))
    return
  with open(path, "w") as f:
    json.dump(config, f)


def _damage_side_files(directory: str, rng: random.Random, how: str) -> None:
  if how == "generation config":
    value = rng.choice([{"eos_token_id": v} for v in (_WRONG + [[1, "2"], [-3], [10**6], 255])] + [[], "x", 3])
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
      json.dump(value, f)
  elif how == "tokenizer":  # read for --prompt
    with open(os.path.join(directory, "tokenizer.json"), "wb") as f:
      f.write(rng.choice([b"", b"{}", b"[]", b"\x00\xff", b'{"model": {"type": "BPE"}}', b'{"version": "1.0"']))


_DAMAGE = {**dict.fromkeys(["header bytes", "data bytes", "truncated", "wrong dtype", "wrong shape", "tensor removed",
                            "offsets"], _damage_safetensors),
           **dict.fromkeys(["shuffled shards", "index entry", "index json", "shard missing"], _damage_index),
           **dict.fromkeys(["config key missing", "config wrong type", "config shapes", "config values",
                            "config nested", "config json"], _damage_config),
           **dict.fromkeys(["generation config", "tokenizer"], _damage_side_files)}


# each kind once, and those whose checkpoint still loads (the model then runs on it) three times more
_KINDS = sorted(_DAMAGE) + ["config values", "data bytes", "wrong dtype"] * 3


@SETTINGS
@seed(SEED)
@given(how=st.sampled_from(_KINDS), damage_seed=st.integers(0, 2**32 - 1),
       weights=st.sampled_from(["auto", "auto", "fp8", "bf16"]))
def test_damaged_checkpoints_exit_0_or_2_with_one_error(checkpoint, how, damage_seed, weights, tmp_path):
  directory = os.path.join(tempfile.mkdtemp(dir=tmp_path), "ckpt")  # one per example (tmp_path is shared)
  shutil.copytree(checkpoint, directory)
  _DAMAGE[how](directory, random.Random(damage_seed), how)
  prompt = ["--prompt", "x = 1"] if how == "tokenizer" else ["--prompt-ids", "1,2,3"]
  eos = [] if how == "generation config" else ["--ignore-eos"]
  rc, out, err = _run(["--checkpoint", directory, *prompt, "--max-new-tokens", "2", "--json", "--weights", weights,
                       *eos], tmp_path)
  _check(rc, out, err, CFG.vocab_size)
