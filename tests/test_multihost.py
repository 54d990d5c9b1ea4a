"""Several processes (jax.distributed, issue 15): `python -m jax_mtp.decode` started as 2 and 4 CPU
processes on this machine — a local coordinator, gloo collectives, 8 / N CPU devices each, tp = 8
spanning every process — decodes the same tokens as one process with 8 devices; processes that
disagree stop with one clear error; a killed process ends the others within the heartbeat timeout; a
launcher that says several processes where JAX's cluster detection fails is one clear error.
(gloo prints connection lines on stdout; the JSON is the line that starts with "{".)
"""

import re
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from jax_mtp import compile_cache, decode, decode_flags, distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODE = [sys.executable, "-m", "jax_mtp.decode", "--random-tiny", "--tp", "8", "--json", "--num-speculative-tokens", "2",
          "--prompt-ids", "5,17,3", "--prompt-ids", "9,2", "--max-new-tokens", "8"]
TIMEOUT_S = 420


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _env() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  env.pop("XLA_FLAGS", None)  # the CLI asks for its own share of CPU devices
  # the suite's compilation cache (tests/conftest.py) stays set: one process reads it, several turn it off
  # (jax_mtp.compile_cache: on jax 0.12.1 they hung when one read a program that another compiled)
  return env


def _start(n: int, args: list[str], tmp_path, port: int | None = None, per_process=None,
           env: dict | None = None) -> list[subprocess.Popen]:
  port = port or _free_port()
  procs = []
  for i in range(n):
    extra = per_process(i) if per_process else []
    cmd = args + extra + ["--num-processes", str(n), "--process-id", str(i), "--coordinator-address",
                          f"localhost:{port}"]
    procs.append(subprocess.Popen(cmd, cwd=tmp_path, env={**_env(), **(env or {})}, stdout=open(tmp_path / f"out{i}", "w"),
                                  stderr=open(tmp_path / f"err{i}", "w")))
  return procs


def _wait(procs, tmp_path, timeout=TIMEOUT_S) -> list[tuple[int, str, str]]:
  deadline = time.monotonic() + timeout
  try:
    for p in procs:
      p.wait(timeout=max(1, deadline - time.monotonic()))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  return [(p.returncode, (tmp_path / f"out{i}").read_text(), (tmp_path / f"err{i}").read_text())
          for i, p in enumerate(procs)]


def _json(stdout: str) -> dict | None:
  lines = [line for line in stdout.splitlines() if line.startswith("{")]
  return json.loads(lines[-1]) if lines else None


@pytest.fixture(scope="module")
def one_process():
  proc = subprocess.run(DECODE, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return _json(proc.stdout)


# 4 processes: the full form only (JAX_MTP_FULL_TESTS=1; ~70 s on 2 cores); CI runs 2 processes here and in
# the tests below (orbax restore, replicas, a killed process).
@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.full)])
def test_decode_across_processes_gives_the_tokens_of_one_process(n, one_process, tmp_path):
  """tp = 8 over n processes: the MTP draft steps, verification and plain decoding (--check) all run
  with their collectives across processes; process 0 prints, the others print no result."""
  args = DECODE + (["--check"] if n == 2 else [])
  runs = _wait(_start(n, args, tmp_path), tmp_path)
  for i, (rc, out, err) in enumerate(runs):
    assert rc == 0, f"process {i}: {err[-3000:]}"
  primary = _json(runs[0][1])
  assert primary["tokens"] == one_process["tokens"]
  assert primary["draft_tokens_proposed"] == one_process["draft_tokens_proposed"]
  if n == 2:
    assert primary["matches_target"] is True
  assert all(_json(out) is None for _, out, _ in runs[1:])


def test_several_cpu_processes_run_without_a_compilation_cache_the_second_time_too(tmp_path):
  """JAX's cache set (every program written): the processes turn it off with a note, so a second run cannot find
  process 0's programs in it while the others compile theirs, which hung on jax 0.12.1 (jax_mtp.compile_cache)."""
  folder = tmp_path / "jax_cache"
  env = {"JAX_COMPILATION_CACHE_DIR": str(folder), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  for attempt in ("first", "second"):
    logs = tmp_path / attempt
    logs.mkdir()
    runs = _wait(_start(2, DECODE, logs, env=env), logs, timeout=TIMEOUT_S // 2)
    for i, (rc, _, err) in enumerate(runs):
      assert rc == 0, f"{attempt} run, process {i}: {err[-3000:]}"
    assert f"note: no compilation cache: {compile_cache.SEVERAL_CPU_PROCESSES}\n" in runs[0][2]
    assert _json(runs[0][1])["compilation_cache"] == {"folder": None, "programs_read": 0}
  assert not folder.exists() or not any(folder.iterdir())


def test_a_compilation_cache_named_for_several_cpu_processes_is_one_error(tmp_path):
  runs = _wait(_start(2, DECODE + ["--compilation-cache", str(tmp_path / "cc")], tmp_path), tmp_path)
  for rc, out, err in runs:
    assert rc == 2 and _json(out) is None and err.strip().splitlines()[-1] == (
        f"error: --compilation-cache {tmp_path / 'cc'}: {compile_cache.SEVERAL_CPU_PROCESSES} (give `off`)"), err


def test_processes_that_disagree_stop_with_one_clear_error(tmp_path):
  runs = _wait(_start(2, DECODE, tmp_path, per_process=lambda i: ["--prompt-ids", "4,4"] if i else []), tmp_path)
  for rc, out, err in runs:
    assert rc == 2, err[-3000:]
    assert _json(out) is None
    assert "error: the processes disagree on flags (process(es) 1 differ from process 0); prompts (process(es) 1 " \
           "differ from process 0)" in err


def test_a_killed_process_ends_the_others_within_the_heartbeat_timeout(tmp_path):
  """Process 1 is killed once the processes' collectives are connected (gloo says so on stdout);
  process 0 must exit with an error naming the dead task within the heartbeat timeout (+ slack for
  this 2-core machine), print no result, and write nothing."""
  heartbeat = 5
  args = DECODE[:-1] + ["400"]  # --max-new-tokens 400: still decoding when killed
  procs = _start(2, args + ["--heartbeat-timeout", str(heartbeat)], tmp_path)
  deadline = time.monotonic() + TIMEOUT_S
  while "connected" not in (tmp_path / "out1").read_text() and time.monotonic() < deadline:
    assert procs[1].poll() is None, (tmp_path / "err1").read_text()[-3000:]
    time.sleep(0.5)
  assert procs[0].poll() is None, "process 0 finished before process 1 was killed: decode longer"
  procs[1].send_signal(signal.SIGKILL)
  killed = time.monotonic()
  rc, out, err = _wait(procs[:1], tmp_path, timeout=heartbeat + 60)[0]
  assert time.monotonic() - killed < heartbeat + 60
  assert rc != 0 and _json(out) is None
  assert "task" in err and ("died" in err or "unhealthy" in err or "heartbeat" in err), err[-3000:]
  assert sorted(os.listdir(tmp_path)) == ["err0", "err1", "out0", "out1"]  # nothing written beside the logs


@pytest.mark.parametrize("flags,message", [
    (["--process-id", "0"], "missing --coordinator-address, --num-processes"),
    (["--num-processes", "2", "--process-id", "2", "--coordinator-address", "localhost:1"],
     "--process-id=2 must lie in 0 .. 1"),
    (["--num-processes", "0", "--process-id", "0", "--coordinator-address", "localhost:1"], "--num-processes=0"),
    (["--heartbeat-timeout", "0"], "--heartbeat-timeout=0 must be 1 to 2147483647 seconds"),
    (["--startup-timeout", "0"], "--startup-timeout=0 must be 1 to 2147483647 seconds"),
])
def test_inconsistent_process_flags_are_one_error(flags, message):
  proc = subprocess.run(DECODE + flags, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and proc.stdout == ""
  assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and message in proc.stderr


def test_orbax_checkpoint_restored_by_two_processes_gives_the_tokens_of_one(one_process, tmp_path):
  """The --random-tiny weights saved with orbax (jax_mtp.orbax_io), restored by 2 processes onto the
  tp = 8 mesh (orbax's multi-process restore: each process its devices' shards)."""
  import jax  # noqa: PLC0415

  import jax_mtp  # noqa: PLC0415
  from jax_mtp.loader import WEIGHT_SEED  # noqa: PLC0415
  from jax_mtp.orbax_io import save_params  # noqa: PLC0415
  cfg = jax_mtp.tiny()
  directory = str(tmp_path / "orbax")
  save_params(directory, cfg, jax_mtp.init_target_params(cfg, jax.random.key(WEIGHT_SEED)),
              jax_mtp.init_params(cfg, jax.random.key(WEIGHT_SEED + 1)))
  args = [a for a in DECODE if a != "--random-tiny"] + ["--checkpoint", directory]
  logs = tmp_path / "logs"
  logs.mkdir()
  runs = _wait(_start(2, args, logs), logs)
  for i, (rc, _, err) in enumerate(runs):
    assert rc == 0, f"process {i}: {err[-3000:]}"
  assert _json(runs[0][1])["tokens"] == one_process["tokens"]


def test_a_checkpoint_converted_by_two_processes_decodes_the_sources_tokens(tmp_path, capsys):
  """`python -m jax_mtp.convert` as 2 processes of 4 CPU devices: the mesh spans all 8, each process reads its
  devices' slices of an FP8 HF checkpoint (tp = 8 splits its blocks: dequantised, with a note from process 0) and
  orbax writes each process's shards into one step; process 0 alone writes the model files and prints the line.
  The copy then decodes the source's tokens in one process."""
  import jax  # noqa: PLC0415

  import jax_mtp  # noqa: PLC0415
  from tests.hf_checkpoint import write_checkpoint  # noqa: PLC0415
  cfg = jax_mtp.tiny()
  source, out, logs = tmp_path / "hf", tmp_path / "orbax", tmp_path / "logs"
  write_checkpoint(str(source), cfg, jax_mtp.init_target_params(cfg, jax.random.key(0)),
                   jax_mtp.init_params(cfg, jax.random.key(1)), block=(16, 24))
  (source / "generation_config.json").write_text(json.dumps({"eos_token_id": 3}))
  logs.mkdir()
  convert = [sys.executable, "-m", "jax_mtp.convert", "--checkpoint", str(source), "--out", str(out), "--tp", "8"]
  runs = _wait(_start(2, convert, logs), logs)
  for i, (rc, _, err) in enumerate(runs):
    assert rc == 0, f"process {i}: {err[-3000:]}"
  wrote = [line for line in runs[0][1].splitlines() if line.startswith("wrote ")]  # gloo prints its own lines
  assert len(wrote) == 1 and wrote[0].startswith(f"wrote {out} step 0: ") and wrote[0].endswith(
      "0 FP8 weights kept as codes + block scales; beside it: generation_config.json"), runs[0][1]
  assert "note: dequantised (the mesh splits its blocks): " in runs[0][2] and "note:" not in runs[1][2], runs[1][2]
  assert "wrote" not in runs[1][1]
  assert sorted(os.listdir(out)) == ["0", "generation_config.json"]
  argv = ["--json", "--tp", "8", "--prompt-ids", "5,17,3", "--prompt-ids", "9,2", "--max-new-tokens", "8"]
  results = []
  for checkpoint in (source, out):
    assert decode.main(["--checkpoint", str(checkpoint), *argv]) == 0
    results.append(json.loads(capsys.readouterr().out))
  assert results[1]["tokens"] == results[0]["tokens"] and results[1]["finish_reasons"] == results[0]["finish_reasons"]


def test_a_conversion_over_part_of_the_processes_devices_is_one_error(tmp_path):
  """Each process writes its own devices' shards, so a conversion's mesh spans them all: --tp 4 of 8 is exit 2."""
  from jax_mtp.loader import DEFAULT_MODEL  # noqa: PLC0415
  convert = [sys.executable, "-m", "jax_mtp.convert", "--checkpoint", DEFAULT_MODEL, "--out", str(tmp_path / "o"),
             "--tp", "4"]
  runs = _wait(_start(2, convert, tmp_path, env={"JAX_NUM_CPU_DEVICES": "4"}), tmp_path)
  for rc, _, err in runs:
    assert rc == 2 and err.strip().splitlines()[-1] == (
        "error: --tp=4: with 2 processes a conversion's mesh spans all 8 devices (leave --tp out)"), err[-2000:]
  assert not (tmp_path / "o").exists()


def _with_tp(tp: str) -> list[str]:
  args = list(DECODE)
  args[args.index("--tp") + 1] = tp
  return args


REPLICAS = _with_tp("4") + ["--prompt-ids", "7,7,7,7"]


def test_two_replicas_of_one_process_each_decode_their_share_of_the_prompts(tmp_path):
  """2 processes × 4 CPU devices (JAX_NUM_CPU_DEVICES) at tp = 4: two data-parallel replicas; replica r
  decodes prompts r, r + 2, ... and process 0 prints all three rows in prompt order, equal to one
  process decoding them at tp = 4 (metrics summed over the replicas: the drafts proposed equal too)."""
  alone = subprocess.run(REPLICAS, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
  assert alone.returncode == 0, alone.stderr[-3000:]
  runs = _wait(_start(2, REPLICAS + ["--check"], tmp_path, env={"JAX_NUM_CPU_DEVICES": "4"}), tmp_path)
  for i, (rc, _, err) in enumerate(runs):
    assert rc == 0, f"process {i}: {err[-3000:]}"
  primary, expected = _json(runs[0][1]), _json(alone.stdout)
  assert len(primary["tokens"]) == 3 and primary["tokens"] == expected["tokens"]
  assert primary["draft_tokens_proposed"] == expected["draft_tokens_proposed"] and primary["matches_target"] is True


def test_tp_that_splits_a_process_is_one_error(tmp_path):
  """4 devices a process at tp = 2: a replica would split a process (not built): exit 2 naming it."""
  args = _with_tp("2")
  runs = _wait(_start(2, args, tmp_path, env={"JAX_NUM_CPU_DEVICES": "4"}), tmp_path)
  for rc, out, err in runs:
    assert rc == 2 and _json(out) is None, err[-3000:]
    assert "error: --tp=2: with 2 processes of 4 devices each, tp must be a multiple of 4" in err, err[-2000:]


LAUNCHER_VARIABLES = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID",
                      "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_hnp_uri", "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES",
                      "TPU_PROCESS_ADDRESSES_PATH")


@pytest.fixture
def launcher_env(monkeypatch):
  """Sets a launcher's variables on an environment that has none."""
  for name in LAUNCHER_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  return lambda **variables: [monkeypatch.setenv(k, v) for k, v in variables.items()]


@pytest.fixture
def detection_fails(monkeypatch):
  """JAX's cluster detection (jax._src.clusters, private) gone, as if it had moved: its import fails."""
  monkeypatch.setitem(sys.modules, "jax._src.clusters", None)


@pytest.mark.parametrize("variables,named", [
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, "SLURM_NTASKS='4'"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_SIZE='2'"),
    ({"TPU_WORKER_HOSTNAMES": "t-0,t-1"}, "TPU_WORKER_HOSTNAMES='t-0,t-1'"),
])
def test_several_processes_with_failed_detection_is_one_error(launcher_env, detection_fails, capsys, variables,
                                                              named):
  """A launcher's variable says several processes and JAX's detection fails: the CLI stops (exit 2)
  with one error naming the variable, rather than each host decoding alone."""
  launcher_env(**variables)
  with pytest.raises(ValueError, match=f"{named} says this is one of several processes, but JAX's cluster "
                                       f"detection failed \\(ModuleNotFoundError"):
    distributed.detected_cluster()
  assert decode.main(["--random-tiny"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"error: {named} says"), err


def test_several_processes_that_detection_does_not_find_is_one_error(launcher_env):
  """Detection works but finds no such launcher (SLURM's task count without the rest of a job step):
  jax.distributed.initialize could not fill the flags in, so the same error, naming the variable."""
  launcher_env(SLURM_JOB_ID="7", SLURM_NTASKS="4")
  with pytest.raises(ValueError, match=r"SLURM_NTASKS='4' says .* \(SlurmCluster\) does not find SLURM; give "
                                       r"--coordinator-address, --num-processes and --process-id"):
    distributed.detected_cluster()


def test_detection_is_needed_only_where_several_processes_are_said(launcher_env, monkeypatch):
  """Controls: a launcher JAX detects is that launcher; one process said (or nothing) with detection
  failing is one process; the three flags given need no detection at all."""
  launcher_env(SLURM_JOB_ID="7", SLURM_NTASKS="2", SLURM_STEP_NODELIST="n[1-2]", SLURM_PROCID="0", SLURM_LOCALID="0")
  assert distributed.detected_cluster() == "SLURM"
  monkeypatch.setitem(sys.modules, "jax._src.clusters", None)
  launcher_env(SLURM_NTASKS="1")  # the job above, as one task
  for variables in ({}, {"OMPI_COMM_WORLD_SIZE": "1"}, {"TPU_WORKER_HOSTNAMES": "t-0"}):
    launcher_env(**variables)
    assert distributed.detected_cluster() is None, variables
  launcher_env(SLURM_NTASKS="4")
  args = decode_flags.parser().parse_args(["--coordinator-address", "h:1", "--num-processes", "4", "--process-id", "0"])
  distributed.validate(args)


def test_a_worker_whose_coordinator_never_starts_is_one_error_after_the_startup_timeout():
  """Process 1 of 2 with no process 0 serving the address: one line saying it waits, then after --startup-timeout
  one error naming the address, exit 2 — not JAX's silent wait ended by SIGABRT (5 minutes, a C++ stack)."""
  address = f"localhost:{_free_port()}"
  start = time.monotonic()
  proc = subprocess.run(DECODE + ["--coordinator-address", address, "--num-processes", "2", "--process-id", "1",
                                  "--startup-timeout", "2"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2 and proc.stdout == "", proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert lines[0] == f"process 1: waiting up to 2 s for the coordinator at {address}", lines
  assert lines[-1].startswith(f"error: no coordinator answered at --coordinator-address={address}"), lines
  assert time.monotonic() - start < 60


def test_a_coordinator_port_in_use_is_one_error():
  """Process 0 cannot serve --coordinator-address (another program holds the port): one error line, exit 2."""
  with socket.socket() as held:
    held.bind(("localhost", 0))
    held.listen()
    address = f"localhost:{held.getsockname()[1]}"
    proc = subprocess.run(DECODE + ["--coordinator-address", address, "--num-processes", "1", "--process-id", "0"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and proc.stdout == "", proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert lines == [f"error: --coordinator-address={address}: process 0 cannot serve port {address.split(':')[1]} "
                   "(Address already in use); another program holds it: pick a free port"], lines


def test_a_negative_process_id_under_a_launcher_is_named(monkeypatch):
  """Under SLURM the launcher gives the process count, so --num-processes is absent: a bad --process-id is still
  one error naming it (it once raised a TypeError computing the bound from the missing count)."""
  for name, value in {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2",
                      "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}.items():
    monkeypatch.setenv(name, value)
  args = decode_flags.parser().parse_args(["--random-tiny", "--process-id", "-1"])
  with pytest.raises(ValueError, match=re.escape("--process-id=-1 must be ≥ 0")):
    distributed.validate(args)


AGREED_BUDGET = """
import sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, pid = sys.argv[1], int(sys.argv[2])
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
from jax_mtp.distributed import smallest_over_devices

mine = [4, 8][pid] * 2**30  # each host's own budget (free memory on either side of a power of two)
print("mesh", smallest_over_devices(mine, jax.devices()))  # one mesh over both processes' devices
print("replica", smallest_over_devices(mine, jax.local_devices()))  # each process its own replica
"""


def test_the_processes_of_a_mesh_agree_on_the_smallest_prefill_budget(tmp_path):
  """`prefill.prefill_budget` reads only this process's GPU; hosts whose free memory falls on either side of a power
  of two (budgets of 4 and 8 GiB) would compile prefills of different chunks, whose collectives do not match. The
  processes of one mesh agree on the smallest (4 GiB: above 2^31, so the gather must not cut it to 32 bits); a
  replica of one process keeps its own, and calls no collective (a replica with no rows runs nothing)."""
  script, port = tmp_path / "budget.py", _free_port()
  script.write_text(AGREED_BUDGET)
  procs = [subprocess.Popen([sys.executable, str(script), str(port), str(i)], cwd=ROOT, env=_env(),
                            stdout=open(tmp_path / f"out{i}", "w"), stderr=open(tmp_path / f"err{i}", "w"))
           for i in range(2)]
  for i, (code, out, err) in enumerate(_wait(procs, tmp_path, timeout=120)):
    assert code == 0, err[-2000:]
    assert re.findall(r"^mesh (\d+)$", out, re.M) == [str(4 * 2**30)], out
    assert re.findall(r"^replica (\d+)$", out, re.M) == [str([4, 8][i] * 2**30)], out
