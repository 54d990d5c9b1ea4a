"""Several processes, one model: the CLI on the hosts of a TPU pod slice or on several GPU nodes
(docs/design.md §"Several hosts").

JAX's multi-controller runtime does the work: every process runs the same program on the devices it
drives, `jax.distributed` connects them, and a tp mesh over every process's devices makes the
collectives cross hosts. This module only starts it and checks the processes agree:

  * `validate(args)`, then `initialize(args)` with `jax_settings(args)` applied, before JAX touches a
    device: with --coordinator-address / --num-processes / --process-id as given, or auto-detected
    where a launcher says there are several processes (SLURM with more than one task, a multi-host
    Cloud TPU slice, Open MPI); otherwise one process and nothing happens. A launcher's variable that
    says several processes where JAX's detection of it fails is an error naming the variable
    (`detected_cluster`), never one process per host. On CPU the cross-process collectives are gloo's.
  * A process that dies (killed, crashed, preempted) stops sending heartbeats; after
    --heartbeat-timeout seconds JAX's coordination service ends every other process with a message
    naming the unhealthy task (exit by SIGABRT): no process hangs in a collective.
  * `check_agreement(items)`: every process hashes each item (flags, config, checkpoint listing,
    prompts); one differing from process 0's is an error naming the item and the processes.
  * Output is printed by process 0 (`is_primary`); every process holds the same replicated result.
  * Where tp is smaller than the device count, the devices form device_count / tp data-parallel
    replicas, each a tp mesh over whole processes (`replica_devices`); replica r decodes prompts
    r, r + R, ... (`share`) and `gather` collects every replica's rows, in prompt order, for process 0.

Each process reads only the checkpoint slices its own devices hold (`checkpoint._place` walks the
sharding's addressable devices; orbax restores by sharding the same way).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import os
import socket
import sys
import time

import jax
import numpy as np

from jax_mtp.errors import first_line
from jax_mtp.metrics import SpecMetrics

DEFAULT_HEARTBEAT_TIMEOUT_S = 60
DEFAULT_STARTUP_TIMEOUT_S = 300  # jax.distributed's own default


def add_arguments(parser: argparse.ArgumentParser) -> None:
  g = parser.add_argument_group("several processes (jax.distributed; one command per host, the same flags)")
  g.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                 help="process 0's address (every process gives the same); auto-detected on TPU pods and SLURM")
  g.add_argument("--num-processes", type=int, default=None, help="processes in all (auto-detected where launched "
                 "by SLURM / on a TPU pod)")
  g.add_argument("--process-id", type=int, default=None, help="this process's index, 0 .. num-processes − 1")
  g.add_argument("--startup-timeout", type=int, default=DEFAULT_STARTUP_TIMEOUT_S, metavar="SECONDS",
                 help="how long a process waits for the others to connect before it gives up with an error "
                 f"(default {DEFAULT_STARTUP_TIMEOUT_S})")
  g.add_argument("--heartbeat-timeout", type=int, default=DEFAULT_HEARTBEAT_TIMEOUT_S, metavar="SECONDS",
                 help="a process silent this long is declared dead and every other process exits with an error "
                 f"(default {DEFAULT_HEARTBEAT_TIMEOUT_S})")


# A launcher: (its name, the variable that says how many processes, JAX's cluster classes that detect it;
# jax._src.clusters, private: what jax.distributed.initialize fills unset flags from).
LAUNCHERS = (("SLURM", "SLURM_NTASKS", ("SlurmCluster",)),
             ("Open MPI", "OMPI_COMM_WORLD_SIZE", ("OmpiCluster",)),
             ("a multi-host TPU slice", "TPU_WORKER_HOSTNAMES", ("GkeTpuCluster", "GceTpuCluster")),
             ("a multi-host TPU slice", "TPU_PROCESS_ADDRESSES", ("GkeTpuCluster", "GceTpuCluster")))


def detected_cluster() -> str | None:
  """The launcher that says this is one of several processes, or None. A launcher's variable saying
  several (SLURM_NTASKS or OMPI_COMM_WORLD_SIZE > 1, a TPU worker list of several hosts) needs JAX's
  detection of that launcher to work, as jax.distributed.initialize fills the flags from it: where it
  fails (a private module: it may move), ValueError naming the variable, never one host per process.
  A Cloud TPU slice known only from its metadata is counted by that detection alone; where it fails,
  nothing says there are several hosts, and it is one (then pass the flags)."""
  for name, variable, classes in LAUNCHERS:
    value = os.environ.get(variable, "")
    if _processes(variable, value) > 1:
      try:
        present = any(_jax_cluster(c).is_env_present() for c in classes)
      except Exception as e:  # noqa: BLE001 (any failure of a private API is the same failure)
        present, why = False, f"failed ({type(e).__name__}: {e})"
      else:
        why = f"({', '.join(classes)}) does not find {name}"
      if not present:
        raise ValueError(f"{variable}={value!r} says this is one of several processes, but JAX's cluster "
                         f"detection {why}; give --coordinator-address, --num-processes and --process-id")
      return name
  try:
    hosts = _cloud_tpu_hosts()
  except Exception:  # noqa: BLE001 (no variable says several processes: one, unless the flags say otherwise)
    return None
  return "a multi-host TPU slice" if hosts > 1 else None


def _processes(variable: str, value: str) -> int:
  """How many processes a launcher's variable says (1 where it is unset or not a count)."""
  if variable.startswith("TPU_"):
    return len([host for host in value.split(",") if host.strip()])
  if variable == "SLURM_NTASKS" and not os.environ.get("SLURM_JOB_ID"):  # outside a job: a leftover
    return 1
  return int(value) if value.strip().isdigit() else 1


def _jax_cluster(name: str):
  return getattr(importlib.import_module("jax._src.clusters"), name)


def _cloud_tpu_hosts() -> int:
  """Hosts of this Cloud TPU slice (GCE or GKE metadata) as jax.distributed's own detection counts
  them; 1 off Cloud TPU. Private JAX API: raises however it fails."""
  for name in ("GceTpuCluster", "GkeTpuCluster"):
    cluster = _jax_cluster(name)
    if cluster.is_env_present():
      return cluster.get_process_count()
  return 1


def requested(args: argparse.Namespace) -> bool:
  """Whether the flags or the environment ask for several processes."""
  explicit = (args.coordinator_address, args.num_processes, args.process_id)
  return any(x is not None for x in explicit) or detected_cluster() is not None


def validate(args: argparse.Namespace) -> None:
  """The flags' own consistency (ValueError naming the value), before anything starts."""
  given = {"--coordinator-address": args.coordinator_address, "--num-processes": args.num_processes,
           "--process-id": args.process_id}
  missing = [name for name, v in given.items() if v is None]
  cluster = detected_cluster() if missing else None  # all three given: no detection needed (nor run)
  if 0 < len(missing) < len(given) and cluster is None:
    raise ValueError(f"several processes need {', '.join(given)} together (no SLURM / TPU pod launcher "
                     f"detected); missing {', '.join(missing)}")
  if args.num_processes is not None and args.num_processes < 1:
    raise ValueError(f"--num-processes={args.num_processes} must be ≥ 1")
  if args.process_id is not None and not 0 <= args.process_id < (args.num_processes or 1 << 30):
    within = f"lie in 0 .. {args.num_processes - 1}" if args.num_processes else "be ≥ 0"  # a launcher's count
    raise ValueError(f"--process-id={args.process_id} must {within}")
  if not 1 <= args.heartbeat_timeout <= MAX_HEARTBEAT_SECONDS:  # JAX's client takes a C int of seconds
    raise ValueError(f"--heartbeat-timeout={args.heartbeat_timeout} must be 1 to {MAX_HEARTBEAT_SECONDS} seconds")
  if not 1 <= args.startup_timeout <= MAX_HEARTBEAT_SECONDS:  # a C int of seconds too
    raise ValueError(f"--startup-timeout={args.startup_timeout} must be 1 to {MAX_HEARTBEAT_SECONDS} seconds")
  if args.coordinator_address is not None:
    check_address(args.coordinator_address)


MAX_HEARTBEAT_SECONDS = 2**31 - 1


def check_address(address: str) -> None:
  """--coordinator-address is HOST:PORT (an IPv6 host in brackets), the port in 1 .. 65535: a ValueError naming it
  where it is not (JAX's own parse fails with an IndexError on a bare host)."""
  host, colon, port = address.rpartition(":")
  if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
    raise ValueError(f"--coordinator-address={address!r} must be HOST:PORT with a port in 1 .. 65535")


def host_and_port(address: str) -> tuple[str, int]:
  """A checked --coordinator-address (`check_address`) as (host, port), an IPv6 host without its brackets."""
  host, _, port = address.rpartition(":")
  return host.strip("[]"), int(port)


def jax_settings(args: argparse.Namespace) -> dict:
  """The JAX config several processes need, for the caller to set before JAX starts: gloo for the CPU
  collectives across processes. {} for one process."""
  return {"jax_cpu_collectives_implementation": "gloo"} if requested(args) else {}


def initialize(args: argparse.Namespace) -> bool:
  """Starts jax.distributed where several processes are asked for; True if it did. Runs after
  `validate` with `jax_settings` applied, before any JAX device is touched (the backend then sees
  every process's devices)."""
  if not requested(args):
    return False
  address, timeout = args.coordinator_address, args.startup_timeout
  if address is not None and args.process_id not in (None, 0):
    wait_for_coordinator(address, timeout, args.process_id)
  elif address is not None and args.process_id == 0:
    check_port_free(address)
  try:
    jax.distributed.initialize(coordinator_address=address, num_processes=args.num_processes,
                               process_id=args.process_id, heartbeat_timeout_seconds=args.heartbeat_timeout,
                               initialization_timeout=timeout)
  except RuntimeError as e:  # (JaxRuntimeError is one) a coordinator gone mid-start: one line
    first = first_line(e)
    raise ValueError(f"jax.distributed could not start (process {args.process_id} of {args.num_processes}, "
                     f"coordinator {address or 'auto-detected'}): {first}") from e
  return True


def check_port_free(address: str) -> None:
  """Process 0 serves `address` on every interface: a ValueError naming it where another program holds its port
  (JAX's own failure is a gRPC log line and "Failed to start RPC server")."""
  port = host_and_port(address)[1]
  with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: a closed run's port is free
    try:
      probe.bind(("", port))
    except OSError as e:
      raise ValueError(f"--coordinator-address={address}: process 0 cannot serve port {port} ({e.strerror}); another "
                       f"program holds it: pick a free port") from None


def wait_for_coordinator(address: str, timeout_s: int, process_id: int, poll_s: float = 0.5) -> None:
  """Until process 0's coordinator accepts connections at `address`, up to `timeout_s` seconds, saying so once on
  stderr: JAX's own wait is silent and ends the process by SIGABRT. A ValueError naming the address after that."""
  deadline, told = time.monotonic() + timeout_s, False
  while True:
    try:
      socket.create_connection(host_and_port(address), timeout=poll_s).close()
      return
    except OSError:
      if time.monotonic() >= deadline:
        raise ValueError(f"no coordinator answered at --coordinator-address={address} within --startup-timeout="
                         f"{timeout_s} s: start process 0 (it serves that address) with the same flags") from None
      if not told:
        print(f"process {process_id}: waiting up to {timeout_s} s for the coordinator at {address}", file=sys.stderr)
        told = True
      time.sleep(poll_s)


def is_primary() -> bool:
  return jax.process_index() == 0


def digest(value) -> np.ndarray:
  """Two uint32 words of the SHA-256 of `value`'s JSON (sorted keys; other objects by repr)."""
  text = json.dumps(value, sort_keys=True, default=repr).encode()
  return np.frombuffer(hashlib.sha256(text).digest()[:8], np.uint32)


def check_agreement(items: dict[str, object]) -> None:
  """ValueError naming each item on which some process differs from process 0, and which processes.
  Every process must call it (it is a collective); one process: nothing to compare."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils  # noqa: PLC0415 (only with several processes)
  names = sorted(items)
  mine = np.stack([digest(items[name]) for name in names])  # [items, 2]
  every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, items, 2]
  differ = {name: [p for p in range(every.shape[0]) if not np.array_equal(every[p, i], every[0, i])]
            for i, name in enumerate(names)}
  problems = [f"{name} (process(es) {', '.join(map(str, ps))} differ from process 0)"
              for name, ps in differ.items() if ps]
  if problems:
    raise ValueError(f"the processes disagree on {'; '.join(problems)}: start every process with the same flags, "
                     f"checkpoint and prompts")


def smallest_over_devices(value: int, devices) -> int:
  """The smallest non-negative `value` of the processes driving `devices` (a mesh's: every one of those processes
  must call it, as they all run the mesh's programs); `value` where one process drives them all. A collective over
  those devices only, not every process: with several replicas (`share`) each replica's processes agree among
  themselves, and a replica with no rows calls nothing. Gathered as two 31-bit words a device: JAX's default 32-bit
  integers would cut a byte count above 2 GiB."""
  devices = list(devices)
  if len({d.process_index for d in devices}) == 1:
    return value
  from jax_mtp.sharding import data_parallel_shardings, make_data_mesh  # noqa: PLC0415 (only with several processes)
  whole, split = data_parallel_shardings(make_data_mesh(devices))  # a 1-D mesh: replicated, a row a device
  words = np.asarray([[value >> 31, value & 0x7FFFFFFF]], np.int32)
  mine = [jax.device_put(words, d) for d in devices if d.process_index == jax.process_index()]
  spread = jax.make_array_from_single_device_arrays((len(devices), 2), split, mine)
  every = jax.jit(lambda x: x, out_shardings=whole)(spread)  # an all-gather
  every = np.asarray(every.addressable_data(0)).astype(np.int64)
  return int(np.min((every[:, 0] << 31) | every[:, 1]))


def checkpoint_listing(directory: str | None) -> list | None:
  """What identifies a checkpoint cheaply: its files' names and sizes, and config.json's text."""
  if directory is None:
    return None
  files = sorted((name, os.path.getsize(os.path.join(directory, name))) for name in os.listdir(directory)
                 if os.path.isfile(os.path.join(directory, name)))
  config = os.path.join(directory, "config.json")
  if not os.path.isfile(config):
    return [files, None]
  with open(config, encoding="utf-8") as f:
    return [files, f.read()]


def _replica_layout(tp: int) -> tuple[int, int, int]:
  """(replicas, processes per replica, this process's replica); ValueError naming the numbers where
  tp neither spans whole processes nor divides the devices."""
  devices, local = jax.device_count(), jax.local_device_count()
  if jax.process_count() == 1:
    return 1, 1, 0
  if devices % tp or tp % local:
    raise ValueError(f"--tp={tp}: with {jax.process_count()} processes of {local} devices each, tp must be a multiple "
                     f"of {local} (a replica spans whole processes) and divide the {devices} devices")
  per = tp // local
  return devices // tp, per, jax.process_index() // per


def replica_devices(tp: int) -> list | None:
  """This process's replica's devices (process-major), or None with one process (the first tp devices)."""
  _, per, index = _replica_layout(tp)
  if jax.process_count() == 1:
    return None
  mine = [d for d in jax.devices() if d.process_index // per == index]
  return sorted(mine, key=lambda d: (d.process_index, d.id))


def share(tp: int, count: int) -> list[int]:
  """The prompt rows this process's replica decodes: r, r + R, ... (R replicas)."""
  replicas, _, index = _replica_layout(tp)
  return list(range(index, count, replicas))


@dataclasses.dataclass(frozen=True)
class Gathered:
  """Every replica's rows in prompt order: what the CLI prints (the fields it reads of a SpecResult)."""

  tokens: list[list[int]]
  stopped_rows: list[bool]
  failed_rows: list[int]
  metrics: SpecMetrics
  matches: bool | None  # --check: the outputs match plain greedy decoding, up to near-ties (jax_mtp.greedy_check)
  differences: tuple = ()  # --check: each differing row's first difference (greedy_check.compare's dicts)


def gather(tp: int, rows: list[int], result, check: tuple[bool, list[dict]] | None, total: int, k: int) -> Gathered:
  """Collects each replica's (rows, result, --check's verdict and differences) onto every process (a collective:
  all must call it); `result` is None for a replica with no rows. One process: the result as it is."""
  replicas, per, _ = _replica_layout(tp)
  matches, differences = (None, []) if check is None else check
  mine = {"rows": rows, "tokens": [], "stopped": [], "failed": [], "metrics": [0, [0] * k, 0, 0.0, 0.0], "matches": matches,
          "differences": differences}
  if result is not None:
    m = result.metrics
    mine.update(tokens=result.tokens, stopped=result.stopped_rows, failed=[rows[i] for i in result.failed_rows],
                metrics=[m.rounds, list(m.accepted_per_position), m.tokens_generated, m.seconds, m.compile_seconds])
  if jax.process_count() == 1:  # one process is one replica
    payloads = [mine]
  else:
    from jax.experimental import multihost_utils  # noqa: PLC0415
    data = np.frombuffer(json.dumps(mine).encode(), np.uint8)
    length = int(np.max(multihost_utils.process_allgather(np.asarray([data.size], np.int32))))
    every = np.asarray(multihost_utils.process_allgather(np.pad(data, (0, length - data.size))))
    payloads = [json.loads(bytes(every[r * per]).rstrip(b"\0").decode()) for r in range(replicas)]
  tokens, stopped = [None] * total, [False] * total
  for p in payloads:
    for row, row_tokens, row_stopped in zip(p["rows"], p["tokens"], p["stopped"]):
      tokens[row], stopped[row] = row_tokens, row_stopped
  rounds = sum(p["metrics"][0] for p in payloads)
  accepted = tuple(int(x) for x in np.sum([p["metrics"][1] for p in payloads], axis=0))
  metrics = SpecMetrics(k, rounds, accepted, sum(p["metrics"][2] for p in payloads),
                        max(p["metrics"][3] for p in payloads), max(p["metrics"][4] for p in payloads))
  checks = [p["matches"] for p in payloads if p["rows"]]
  found = tuple(sorted((d for p in payloads for d in p["differences"]), key=lambda d: d["row"]))
  return Gathered(tokens, stopped, sorted(r for p in payloads for r in p["failed"]), metrics,
                  None if matches is None else all(checks), found)
