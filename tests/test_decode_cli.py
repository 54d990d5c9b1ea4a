"""`python -m jax_mtp.decode`: exit codes, text and JSON output, --check, batches, seeds, progress, and
input errors (exit 2, one `error:` line naming the value, nothing on stdout)."""

import dataclasses
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

import jax_mtp
from jax_mtp import decode, decode_flags, decode_kernels
from jax_mtp.decode_output import exit_code, print_result
from jax_mtp.distributed import Gathered
from jax_mtp.errors import first_line

VOCAB = jax_mtp.tiny().vocab_size
METRIC_KEYS = {"acceptance_length_mean", "acceptance_rate_per_position", "draft_tokens_proposed",
               "draft_tokens_accepted", "tokens_per_second", "compile_seconds", "compilation_cache"}


def _json_run(capsys, argv: list[str]) -> dict:
  """A --json run of the tiny random model (the embedded default's tests are test_default_model.py's)."""
  assert decode.main(["--json", "--random-tiny", *argv]) == 0
  out, err = capsys.readouterr()
  lines = out.splitlines()
  assert len(lines) == 1, out  # one JSON object, nothing else on stdout
  assert err == ""  # no progress bar when stderr is not a terminal
  return json.loads(lines[0])


def _assert_tokens(tokens, rows: int, n: int) -> None:
  assert isinstance(tokens, list) and len(tokens) == rows, tokens
  for row in tokens:
    assert len(row) == n and all(type(t) is int and 0 <= t < VOCAB for t in row), row


def test_random_tiny_run_prints_tokens_and_metrics(capsys):
  """--random-tiny alone: the tiny random model decodes the default ids (32 tokens, k = 3, greedy)."""
  assert decode.main(["--random-tiny"]) == 0
  out, err = capsys.readouterr()
  assert err == ""
  match = re.search(r"prompt 0 \[1, 2, 3, 4, 5, 6, 7, 8\] → \[([0-9, ]*)\]", out)
  assert match, out
  _assert_tokens([[int(t) for t in match.group(1).split(",")]], 1, 32)
  assert re.search(r"acceptance length \d\.\d\d · per position \[.*\] · drafts accepted \d+/\d+", out), out
  assert re.search(r"[0-9.]+ tokens/s = [0-9.]+ rounds/s \(summed over rows\) × acceptance length \d\.\d\d", out), out
  assert re.search(r"compiling the prefill and the round took \d+\.\d s before the prefill", out), out


def test_json_batch_with_check(capsys):
  """A batch of two prompts of different lengths; `--check` adds `matches_target`, which is true, and
  `check_differences`, empty (the tiny model is fp32: nothing differs)."""
  result = _json_run(capsys, ["--prompt-ids", "1,2,3", "--prompt-ids", " 200", "--max-new-tokens", "6", "--check"])
  assert set(result) == METRIC_KEYS | {"tokens", "finish_reasons", "matches_target", "check_differences", "kernels"}
  assert result["check_differences"] == []
  _assert_tokens(result["tokens"], 2, 6)
  assert result["matches_target"] is True
  assert len(result["acceptance_rate_per_position"]) == 3
  rounds = result["draft_tokens_proposed"] / 3  # k = 3 drafts a (row, round)
  assert rounds == int(rounds) and rounds >= 2  # each row's 6 tokens need ≥ 2 rounds of at most 4
  # the JSON's counts agree with each other (metrics.py's table): accepted = Σ over positions of rate · rounds
  assert result["draft_tokens_accepted"] == round(sum(result["acceptance_rate_per_position"]) * rounds)
  assert result["draft_tokens_accepted"] <= result["draft_tokens_proposed"]
  assert result["acceptance_length_mean"] == pytest.approx(1 + result["draft_tokens_accepted"] / rounds, rel=1e-12)
  assert result["tokens_per_second"] > 0
  assert result["compile_seconds"] > 0  # a fresh Speculator compiles its two programs


def test_check_at_tp2(capsys):
  result = _json_run(capsys, ["--tp", "2", "--num-speculative-tokens", "2", "--max-new-tokens", "5", "--check"])
  assert result["matches_target"] is True
  _assert_tokens(result["tokens"], 1, 5)


def test_sampling_is_seeded(capsys):
  """`--temperature` samples; the same `--seed` gives the same tokens, another seed others, and neither is greedy's
  (the tiny random model's next-token distribution is near uniform at τ = 0.8: 8 tokens alike by chance is
  ~(1/V)^8). Without --check there is no `matches_target`."""
  argv = ["--temperature", "0.8", "--seed", "3", "--max-new-tokens", "8"]
  first = _json_run(capsys, argv)
  assert set(first) == METRIC_KEYS | {"tokens", "finish_reasons", "kernels"}
  _assert_tokens(first["tokens"], 1, 8)
  assert _json_run(capsys, argv)["tokens"] == first["tokens"]
  assert _json_run(capsys, [*argv[:3], "4", *argv[4:]])["tokens"] != first["tokens"]
  assert _json_run(capsys, ["--max-new-tokens", "8"])["tokens"] != first["tokens"]


def test_top_k_1_sampling_prints_the_greedy_tokens(capsys):
  """`--top-k 1` (or a tiny `--top-p`) keeps one token: hot sampling then decodes as greedy does (8 tokens)."""
  greedy = _json_run(capsys, ["--max-new-tokens", "8"])["tokens"]
  assert _json_run(capsys, ["--temperature", "1.5", "--top-k", "1", "--seed", "2", "--max-new-tokens", "8"])[
      "tokens"] == greedy
  assert _json_run(capsys, ["--temperature", "1.5", "--top-p", "1e-9", "--max-new-tokens", "8"])["tokens"] == greedy


@pytest.mark.parametrize("argv, named", [
    (["--tpp", "2"], "unrecognized arguments: --tpp 2 (python -m jax_mtp.decode --help lists the flags)"),
    (["--prompt-ids", ""], "prompt 0 is empty"),
    (["--prompt-ids", "1,2", "--prompt-ids", "1,999"], "prompt 1 holds token id 999, outside [0, 256)"),
    (["--prompt-ids", "a,b"], "'a,b'"),
    (["--prompt-ids", "1,,2"], "--prompt-ids '1,,2': entry 1 of 3 is empty"),
    (["--prompt-ids", "1,2,"], "--prompt-ids '1,2,': entry 2 of 3 is empty"),
    (["--prompt-ids", "1_0"], "--prompt-ids '1_0': entry 0 of 1 '1_0' is not an integer"),  # int() reads 10
    (["--prompt-ids", "1, 2_5"], "--prompt-ids '1, 2_5': entry 1 of 2 '2_5' is not an integer"),
    (["--prompt-ids", "1,\u0663"], "--prompt-ids '1,\u0663': entry 1 of 2 '\u0663' is not an integer"),  # Arabic 3
    (["--prompt-ids", "1,+-2"], "entry 1 of 2 '+-2' is not an integer"),
    (["--prompt-ids", "1,0x2"], "entry 1 of 2 '0x2' is not an integer"),
    (["--num-speculative-tokens", "0"], "--num-speculative-tokens=0"),
    (["--max-new-tokens", "0"], "--max-new-tokens=0"),
    (["--max-new-tokens", "1000"], "max_new_tokens=1000 needs a cache of 1011 positions"),
    (["--max-new-tokens", "x"], "'x'"),
    (["--temperature", "-1"], "--temperature=-1.0"),
    (["--temperature", "1e-30"], "--temperature=1e-30 is below 0.0001 (the logits would overflow); use 0"),
    (["--check", "--temperature", "0.5"], "needs --temperature 0, got 0.5"),
    (["--top-k", "-1"], "--top-k=-1 must be an integer ≥ 0 (0: off)"),
    (["--top-p", "0"], "--top-p=0.0 must be a number in (0, 1] (1: off)"),
    (["--top-p", "1.5"], "--top-p=1.5 must be a number in (0, 1] (1: off)"),
    (["--top-p", "nan"], "--top-p=nan must be a number in (0, 1] (1: off)"),
    (["--tp", "3"], "tp=3 does not divide num_attention_heads=8"),
    (["--tp", "0"], "--tp=0 must be ≥ 1"),
    (["--impl", "nope"], "'nope'"),
    (["--impl", "pallas_tpu"], "--impl=pallas_tpu needs TPU devices, found cpu"),
    (["--checkpoint", "/no/such/dir"], "--checkpoint '/no/such/dir' does not exist"),
    (["--checkpoint", __file__], f"--checkpoint {__file__!r} is a file, not a directory"),
    (["--prompt", "hello"], "--prompt needs a tokenizer, and --random-tiny has none"),
    (["--prompt", "hello", "--prompt-ids", "1"], "give --prompt or --prompt-ids, not both"),
    (["--no-such-flag"], "--no-such-flag"),
    (["--dtype", "float64"], "'float64'"),
    (["--moe-impl", "dense"], "'dense'"),
    (["--index-scores-impl", "pallas_tpu"], "--index-scores-impl=pallas_tpu runs on tpu; this machine's JAX platform"),
    (["--index-scores-impl", "mosaic_gpu"], "--index-scores-impl=mosaic_gpu runs on gpu; this machine's JAX platform"),
    (["--sparse-attention-impl", "pallas_gpu"], "invalid choice: 'pallas_gpu'"),  # the removed Triton kernel
    (["--sparse-attention-impl", "mosaic_gpu"], "--sparse-attention-impl=mosaic_gpu runs on gpu; this machine's JAX"),
    (["--sparse-attention-impl", "flash"], "'flash'"),
    (["--topk-impl", "mosaic_gpu"], "--topk-impl=mosaic_gpu runs on gpu; this machine's JAX platform is cpu"),
    (["--topk-impl", "sort"], "'sort'"),
    (["--prefill-chunk", "-2"], "prefill_chunk=-2 must be a whole number of tokens"),
    (["--gpu-memory-fraction", "0"], "--gpu-memory-fraction=0.0 must be in (0, 1]"),
    (["--gpu-memory-fraction", "1.5"], "--gpu-memory-fraction=1.5 must be in (0, 1]"),
    (["--gpu-memory-fraction", "nan"], "--gpu-memory-fraction=nan must be in (0, 1]"),
    # found by a CLI audit (2026-12-04): each was a traceback, a hang or a message blaming the wrong value
    (["--seed", "99999999999999999999999"], "--seed=99999999999999999999999 must fit in 64 bits"),
    (["--temperature", "1e300"], "--temperature=1e+300 is above 3.4e+38, the largest float32"),
    (["--moe-impl", "tokamax_gpu"], "--moe-impl=tokamax_gpu runs on gpu; this machine's JAX platform is cpu"),
    (["--moe-impl", "tokamax_tpu"], "--moe-impl=tokamax_tpu runs on tpu; this machine's JAX platform is cpu"),
    # the 16-bit Mosaic GPU experts (Pallas's interpreter on a CPU) on the tiny model's fp32 experts of D = 64: named
    # before any weight is made, not at the first trace (2026-12-06)
    (["--moe-impl", "mosaic_gpu"], "moe_impl='mosaic_gpu' takes bf16/fp16 expert weights whose hidden size and "
                                   "expert intermediate size are multiples of 128, got float32 with D=64, F=32"),
    (["--tp", "100000"], "--tp=100000 is more than 1024 devices"),
    (["--num-speculative-tokens", "5000"], "num_speculative_tokens=5000 leaves no room in the cache"),
    (["--prompt-ids", "1,99999999999999999999999"], "prompt 0 holds token id 99999999999999999999999, outside"),
    (["--coordinator-address", "notanaddress", "--num-processes", "1", "--process-id", "0"],
     "--coordinator-address='notanaddress' must be HOST:PORT"),
    (["--coordinator-address", "localhost:99999", "--num-processes", "1", "--process-id", "0"],
     "--coordinator-address='localhost:99999' must be HOST:PORT with a port in 1 .. 65535"),
    (["--heartbeat-timeout", "99999999999999999999", "--coordinator-address", "localhost:12355", "--num-processes",
      "1", "--process-id", "0"], "--heartbeat-timeout=99999999999999999999 must be 1 to 2147483647 seconds"),
])
def test_bad_input_returns_2_with_one_error_line(capsys, argv, named):
  """Bad input returns 2, prints nothing on stdout and one `error: ...` line naming the value (of the
  tiny random model's flags; the checkpoint's errors are test_checkpoint.py's)."""
  assert decode.main(argv if "--checkpoint" in argv else ["--random-tiny", *argv]) == 2
  out, err = capsys.readouterr()
  assert out == ""
  lines = err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], err


@pytest.mark.parametrize("error, line", [
    (ValueError("shape (3, 4) is refused\n  with kilobytes of detail\n  below"), "shape (3, 4) is refused"),
    (RuntimeError(), "RuntimeError"),  # a bare raise: its class, not an empty `error:` line
])
def test_an_errors_one_line_is_its_first_line_or_its_class(error, line):
  """What decode's `error:` line (and hub's, orbax_io's, distributed's, train_state's wrapped errors) say of an error."""
  assert first_line(error) == line


@pytest.mark.parametrize("flag", ["--index-scores-impl", "--sparse-attention-impl"])
def test_an_explicit_dsa_kernel_for_another_platform_is_refused_for_a_short_request_too(capsys, flag):
  """The embedded default's short request (its cache within top-64: no indexer runs) with a
  kernel of another platform: refused as a long request is, not accepted and ignored (found by an audit)."""
  impl = "pallas_tpu" if flag == "--index-scores-impl" else "mosaic_gpu"
  assert decode.main([flag, impl, "--max-new-tokens", "2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and err.splitlines() == [f"error: {flag}={impl} runs on {decode_kernels.KERNEL_PLATFORMS[impl]}; this "
                                            f"machine's JAX platform is cpu"]


@pytest.mark.parametrize("impls", [dict(index_scores_impl="mosaic_gpu"), dict(sparse_attention_impl="mosaic_gpu"),
                                   dict(index_scores_impl="pallas_tpu"), dict(index_scores_impl="xla"),
                                   dict(sparse_attention_impl="xla"), dict(topk_impl="xla")])
def test_an_explicit_dsa_impl_for_a_model_without_an_indexer_is_refused(impls):
  """A V3 model (dense MLA, no indexer) runs no DSA part at any length: an explicit kernel was ignored, and so was an
  explicit `xla` (accepted, naming XLA, which ran nothing)."""
  v3 = jax_mtp.tiny(model_type="deepseek_v3", index_n_heads=0, index_head_dim=0, index_topk=0, **impls)
  (flag, impl), = ((f"--{k.replace('_', '-')}", v) for k, v in impls.items())
  with pytest.raises(decode.BadInput, match=rf"^{flag}={impl} names a DSA part's implementation, and this model "
                                            r"\(deepseek_v3\) has no DSA indexer"):
    decode.check_kernel_impls(v3, 40)
  decode.check_kernel_impls(jax_mtp.tiny(model_type="deepseek_v3", index_n_heads=0, index_head_dim=0, index_topk=0),
                            40)  # auto: nothing to refuse


def test_an_eos_id_outside_the_vocabulary_names_the_checkpoint_it_came_from(capsys, tmp_path):
  """A checkpoint whose generation_config.json names an EOS id past the vocabulary: exit 2, one line naming the
  directory and the field, not only the id (found by a CLI audit, 2026-12-04)."""
  directory = tmp_path / "model"
  shutil.copytree(os.path.join(os.path.dirname(jax_mtp.__file__), "default_model"), directory)
  (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": 999999}))
  assert decode.main(["--checkpoint", str(directory), "--max-new-tokens", "2"]) == 2
  out, err = capsys.readouterr()
  lines = err.splitlines()
  assert out == "" and len(lines) == 1, err
  assert str(directory) in lines[0] and "eos_token_id" in lines[0] and "stop id 999999 is outside" in lines[0]


def test_gpu_memory_fraction_sets_jaxs_variable(capsys, monkeypatch):
  """--gpu-memory-fraction sets XLA_PYTHON_CLIENT_MEM_FRACTION (read when JAX creates its GPU client) and the run
  goes on; without the flag the variable is left as it was."""
  # setenv first: delenv alone on an unset variable records nothing to restore, and the 0.9 below would outlive the
  # test (into later tests' subprocesses); setenv records the variable's state, which the teardown restores
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION")
  assert decode.main(["--random-tiny", "--max-new-tokens", "2"]) == 0
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ
  capsys.readouterr()
  assert decode.main(["--random-tiny", "--max-new-tokens", "2", "--gpu-memory-fraction", "0.9"]) == 0
  assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"
  err = capsys.readouterr().err  # off a GPU the flag changes nothing, and a note says so
  import jax  # noqa: PLC0415
  backend = jax.default_backend()
  assert err.splitlines() == ([] if backend == "gpu" else [
      f"note: --gpu-memory-fraction sizes JAX's GPU memory pool; this run's devices are {backend}'s: "
      "it changes nothing"])


@pytest.mark.parametrize("as_json", [False, True])
def test_failed_check_exits_1(capsys, as_json):
  """--check finding a row that differs where the target chose clearly (row 1) is a failed run: exit 1, not 0,
  and not 2 (bad input); the output is printed in full, then one line per differing row and one `error: --check:`
  line on stderr. Differences at near-ties only (row 0's here) pass, each with a note."""
  speculative = [[5, 6, 7], [8, 9, 4]]
  near_tie = {"row": 0, "index": 1, "speculative": 6, "plain": 2, "margin": 0.003, "near_tie": True}
  clear = {"row": 1, "index": 2, "speculative": 4, "plain": 3, "margin": 0.25, "near_tie": False}
  metrics = jax_mtp.SpecMetrics(3, 4, (2, 1, 0), 6, 0.5)
  result = Gathered(speculative, [False, False], [], metrics, matches=False, differences=(near_tie, clear))
  args = dict(as_json=as_json, model_line="a model", prompts=[[1, 2], [3]], texts=None, codec=None, streamed=False)
  assert print_result(result, **args) == 1
  assert exit_code(result) == 1  # what a process other than 0 returns, printing nothing
  out, err = capsys.readouterr()
  if as_json:
    assert json.loads(out)["matches_target"] is False and json.loads(out)["check_differences"] == [near_tie, clear]
  else:
    assert "DIFFERS FROM plain greedy decoding" in out
  assert err.splitlines() == [
      "note: --check: prompt 0 first differs from plain greedy decoding at token 1 (6 for plain's 2): the target's top "
      "two logits there are 0.003 apart (relative), a near-tie, which a 16-bit model's verification and plain steps "
      "may break either way",
      "error: --check: prompt 1 first differs from plain greedy decoding at token 2 (4 for plain's 3): the target's "
      "top two logits there are 0.25 apart (relative), no near-tie",
      "error: --check: the speculative output differs from plain greedy decoding with the target (they must match "
      "token for token, up to near-ties of the target's top two logits in a 16-bit model)"]
  ties_only = dataclasses.replace(result, matches=True, differences=(near_tie,))
  assert print_result(ties_only, **args) == 0
  assert capsys.readouterr().err.startswith("note: --check: prompt 0 first differs")
  assert print_result(dataclasses.replace(result, matches=True, differences=()), **args) == 0
  assert capsys.readouterr().err == ""
  assert "exit 1 if the outputs differ" in " ".join(decode_flags.parser().format_help().split())


def test_progress_line():
  """The progress bar writes one carriage-returned line and a final newline; off when not a terminal."""
  stream = io.StringIO()
  progress = decode.Progress(stream, force=True)
  progress(0, 10)
  progress(10, 10)
  progress.close()
  assert stream.getvalue().endswith("\rdecoding [" + "#" * 30 + "] 10/10 tokens\n"), stream.getvalue()
  quiet = io.StringIO()
  decode.Progress(quiet)(5, 10)
  assert quiet.getvalue() == ""


@pytest.mark.slow
def test_module_entry_point_json(tmp_path):
  """`python -m jax_mtp.decode --json`, run from outside the repo, exits 0 with one JSON object
  holding exactly the issue's keys."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  argv = ["--json", "--random-tiny", "--max-new-tokens", "4", "--num-speculative-tokens", "1"]
  proc = subprocess.run([sys.executable, "-m", "jax_mtp.decode", *argv], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(proc.stdout)
  assert set(result) == METRIC_KEYS | {"tokens", "finish_reasons", "kernels"}
  _assert_tokens(result["tokens"], 1, 4)


def test_dtype_moe_impl_and_prefill_chunk_flags(capsys):
  """--dtype sets compute and parameter dtypes (auto keeps the model's), --moe-impl the experts' impl,
  --prefill-chunk the prompt tokens per prefill call; speculative decoding still equals plain greedy
  decoding in bf16 with XLA's grouped matmul and a 9-token prompt prefilled 4 tokens at a time."""
  tiny = jax_mtp.tiny()
  assert decode.with_flags(tiny, decode_flags.parser().parse_args([])) == tiny
  args = decode_flags.parser().parse_args(["--dtype", "bfloat16", "--moe-impl", "ragged_dot", "--prefill-chunk", "4"])
  assert decode.with_flags(tiny, args) == tiny.replace(dtype="bfloat16", param_dtype="bfloat16", moe_impl="ragged_dot",
                                                       prefill_chunk=4)
  out = _json_run(capsys, ["--dtype", "bfloat16", "--moe-impl", "ragged_dot", "--prefill-chunk", "4", "--check",
                           "--max-new-tokens", "8", "--prompt-ids", "1,2,3,4,5,6,7,8,9", "--prompt-ids", "5"])
  assert out["matches_target"] is True
  _assert_tokens(out["tokens"], 2, 8)


@pytest.mark.parametrize("moe_impl,experts", [("gather", "gather (XLA)"), ("ragged_dot", "lax.ragged_dot")])
def test_the_output_says_what_the_compiled_programs_ran(capsys, moe_impl, experts):
  """JSON's "kernels" and the text's "ran" line: each program's parts as its compiled HLO holds them (the tiny model's
  8-token prompt past its top-k: the indexer and the sparse attention in both programs, XLA's on a CPU)."""
  out = _json_run(capsys, ["--moe-impl", moe_impl, "--max-new-tokens", "4"])
  parts = {"index scores": "XLA", "top-k": "XLA", "sparse attention": "XLA", "dense attention": "—",
           "experts": experts}
  assert out["kernels"] == {"prefill": parts, "round": parts}
  assert decode.main(["--random-tiny", "--moe-impl", moe_impl, "--max-new-tokens", "4"]) == 0
  line = (f"ran (read from the compiled programs): prefill and round: index scores XLA, top-k XLA, sparse attention "
          f"XLA, experts {experts}")
  assert line in capsys.readouterr().out.splitlines()


def test_a_program_that_cannot_be_read_loses_the_report_not_the_output(capsys, monkeypatch):
  """A backend whose compiled programs print no HLO: the rows still print (exit 0), with one note on stderr."""
  def unreadable(self):
    raise NotImplementedError("this plugin's executables have no HLO text")
  monkeypatch.setattr(jax_mtp.Speculator, "kernels_ran", unreadable)
  assert decode.main(["--json", "--random-tiny", "--max-new-tokens", "4"]) == 0
  out, err = capsys.readouterr()
  assert "kernels" not in json.loads(out) and len(json.loads(out)["tokens"][0]) == 4
  assert err == "note: could not read what the compiled programs ran: this plugin's executables have no HLO text\n"


class _FailingStdout(io.StringIO):
  """A stdout whose writes fail as a closed pipe's or a full disk's do (no file descriptor: none to close)."""

  def __init__(self, error: OSError):
    super().__init__()
    self.error = error

  def write(self, text):
    raise self.error


@pytest.mark.parametrize("error, message", [
    (BrokenPipeError(32, "Broken pipe"), None),  # `| head`: a reader gone is no error to report
    (OSError(28, "No space left on device"), "error: cannot write the output: No space left on device"),
])
def test_an_output_that_cannot_be_written_is_exit_1_with_at_most_one_line(capsys, monkeypatch, error, message):
  """The decoded rows cannot be printed (stdout a closed pipe, a full disk): exit 1, not a traceback; a closed pipe
  silently (as other command-line tools stop), any other failure with one line saying why."""
  monkeypatch.setattr(sys, "stdout", _FailingStdout(error))
  assert decode.main(["--random-tiny", "--max-new-tokens", "2", "--json"]) == 1
  err = capsys.readouterr().err.splitlines()
  assert err == ([message] if message else []), err


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
  """SIGINT while the embedded default decodes (after its model line is printed, so inside main): exit 130 and
  one `error: interrupted` line on stderr, no traceback."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.Popen([sys.executable, "-m", "jax_mtp.decode", "--prompt", "def f(", "--max-new-tokens", "400",
                           "--ignore-eos"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  # (SIGINT restored in the child: under `nohup … &`, as CI runs, a shell starts background jobs with it ignored,
  # and Python then installs no KeyboardInterrupt handler)
  try:
    assert proc.stdout.readline()  # the model line: main is running
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
  finally:
    proc.kill()
  assert proc.returncode == 130, err
  assert "Traceback" not in err and err.strip().splitlines()[-1] == "error: interrupted", err


def test_a_device_error_while_building_is_one_line_and_exit_2(monkeypatch, capsys):
  """Placing the weights can exhaust a device's memory (XLA's RESOURCE_EXHAUSTED, kilobytes of detail below its
  first line): one `error:` line, exit 2, as a failure inside the run is (test_user_path_kernels)."""
  import jax  # noqa: PLC0415

  def exhausted(request):
    raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 15.00GiB\n  detail\n  detail")
  monkeypatch.setattr(decode, "build", exhausted)
  assert decode.main(["--random-tiny", "--max-new-tokens", "2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and err.splitlines() == ["error: RESOURCE_EXHAUSTED: Out of memory allocating 15.00GiB"]


@pytest.mark.slow
def test_a_terminal_that_cannot_show_a_character_gets_its_escape(tmp_path):
  """An ASCII stdout: the text output's '→' (and any token text it cannot show) is printed as its backslash
  escape, exit 0, not a UnicodeEncodeError."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONIOENCODING": "ascii"}
  proc = subprocess.run([sys.executable, "-m", "jax_mtp.decode", "--random-tiny", "--max-new-tokens", "2"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert "\\u2192" in proc.stdout and "→" not in proc.stdout, proc.stdout


def test_a_checkpoint_naming_no_eos_id_is_noted(tmp_path, capsys):
  """An orbax step saved without its source's model files has no generation_config.json / config.json: its rows
  cannot stop at EOS, and a note says so (they decode all --max-new-tokens)."""
  from jax_mtp import loader  # noqa: PLC0415
  from jax_mtp.orbax_io import save_params  # noqa: PLC0415
  cfg = jax_mtp.tiny()
  save_params(tmp_path / "orbax", cfg, *loader.random_weights(cfg))
  assert decode.main(["--checkpoint", str(tmp_path / "orbax"), "--prompt-ids", "1,2,3", "--max-new-tokens", "3",
                      "--json"]) == 0
  out, err = capsys.readouterr()
  _assert_tokens(json.loads(out)["tokens"], 1, 3)
  assert err.splitlines() == [
      f"note: {tmp_path / 'orbax'} names no EOS id (no eos_token_id in a generation_config.json or config.json "
      "there): rows stop at --max-new-tokens only"], err
