"""Loading reads slices, not files: checkpoints larger than the memory a process may use still load.

The cap is RLIMIT_DATA (Linux ≥ 4.7), which bounds a process's anonymous memory — what a loader
that reads whole tensors or files would need — but not read-only file mappings, through which
jax_mtp.checkpoint reads each device's slice. Each case runs in a subprocess that sets the cap
above its own baseline after JAX has started:

- the drafter alone (`load_mtp_only`) loads under a cap far below the checkpoint's size, since
  the target layers are never read;
- the whole model loads onto 2 CPU devices (whose buffers are host memory) under a cap of its
  params plus half the checkpoint's size;
- a cap below one file stops a loader that reads a file whole, so the cap is real.
"""

import os
import re
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from benchmarks import checkpoint_memory
from jax_mtp.checkpoint import MTP, plan
from jax_mtp.sharding import SHARED_WITH_TARGET
from jax_mtp.config import tiny

MB = 1 << 20
CFG = tiny(vocab_size=4096, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512,
           num_hidden_layers=10, first_k_dense_replace=1, num_attention_heads=8, q_lora_rank=256,
           kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, n_routed_experts=64,
           n_group=4, topk_group=2, num_experts_per_tok=4, index_n_heads=4, index_head_dim=64,
           dtype="bfloat16", param_dtype="bfloat16")

PRELUDE = textwrap.dedent("""
    import os, resource, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    import numpy as np
    jax.block_until_ready(jax.device_put(np.zeros(1)))  # the runtime is part of the baseline

    def vm_data():
      with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData"))

    resource.setrlimit(resource.RLIMIT_DATA, (vm_data() + int(sys.argv[2]),) * 2)
""")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("big"))
  checkpoint_memory.write(directory, CFG, shard_bytes=96 * MB)
  files = [f for f in os.listdir(directory) if f.endswith(".safetensors")]
  size = sum(os.path.getsize(os.path.join(directory, f)) for f in files)
  assert len(files) >= 3 and size > 300 * MB, (files, size)
  return directory, size


def _run(body: str, directory: str, cap_bytes: int) -> subprocess.CompletedProcess:
  code = PRELUDE + textwrap.dedent(body)
  return subprocess.run([sys.executable, "-c", code, directory, str(cap_bytes)], capture_output=True, text=True,
                        timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)))


def _params_bytes(mtp_only: bool = False) -> int:
  """Bytes of the loaded params (bf16); the drafter's: its MTP layer plus embed/head."""
  params, _ = plan(CFG)
  if mtp_only:
    params = [p for p in params if p.tree == MTP or p.path[-1] in SHARED_WITH_TARGET]
  return sum(int(np.prod(p.shape)) * 2 for p in params)


def test_drafter_loads_under_a_cap_far_below_the_checkpoint(checkpoint):
  directory, size = checkpoint
  cap = _params_bytes(mtp_only=True) + 256 * MB  # the drafter's params + room for a param in flight, the runtime
  assert cap < size // 2
  proc = _run("""
      from jax_mtp.checkpoint import load_mtp_only
      from jax_mtp.sharding import make_mesh
      cfg, mtp = load_mtp_only(sys.argv[1], mesh=make_mesh(2), progress=False)
      leaves = jax.tree.leaves(jax.block_until_ready(mtp))
      print("loaded", sum(x.nbytes for x in leaves), all(bool(jax.numpy.isfinite(x).all()) for x in leaves))
  """, directory, cap)
  assert proc.returncode == 0, proc.stderr[-3000:]
  loaded, finite = proc.stdout.split()[1:]
  assert finite == "True" and 0 < int(loaded) < cap


def test_whole_model_loads_with_half_the_checkpoint_to_spare(checkpoint):
  directory, size = checkpoint
  cap = _params_bytes() + size // 2
  proc = _run("""
      from jax_mtp.checkpoint import load_hf_checkpoint
      from jax_mtp.sharding import make_mesh
      cfg, target, mtp = load_hf_checkpoint(sys.argv[1], mesh=make_mesh(2), progress=False)
      jax.block_until_ready((target, mtp))
      print("loaded")
  """, directory, cap)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["loaded"]


def test_the_cap_stops_a_loader_that_reads_whole_files(checkpoint):
  directory, size = checkpoint
  files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
  biggest = max(files, key=lambda f: os.path.getsize(os.path.join(directory, f)))
  cap = 32 * MB  # below one file (~96 MB): reading it whole cannot fit
  proc = _run(f"""
      try:
        with open(os.path.join(sys.argv[1], {biggest!r}), "rb") as f:
          data = f.read()
        print("fitted")
      except MemoryError:
        print("MemoryError")
  """, directory, cap)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["MemoryError"]


MULTI_PRELUDE = textwrap.dedent("""
    import os, resource, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    processes = int(sys.argv[4])
    if processes > 1:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
      jax.distributed.initialize(coordinator_address=sys.argv[3], num_processes=processes,
                                 process_id=int(sys.argv[5]))
    jax.config.update("jax_num_cpu_devices", 2 // processes)
    import numpy as np
    jax.block_until_ready(jax.device_put(np.zeros(1)))  # the runtime is part of the baseline

    def vm_data():
      with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData"))

    resource.setrlimit(resource.RLIMIT_DATA, (vm_data() + int(sys.argv[2]),) * 2)
    from jax_mtp.checkpoint import load_hf_checkpoint
    from jax_mtp.sharding import make_mesh
    cfg, target, mtp = load_hf_checkpoint(sys.argv[1], mesh=make_mesh(2), progress=False)
    leaves = jax.tree.leaves(jax.block_until_ready((target, mtp)))
    print("loaded", sum(s.data.nbytes for x in leaves for s in x.addressable_shards))
""")


def _share_bytes(processes: int) -> int:
  """Bytes of the params one process holds at tp = 2 over `processes` processes (bf16): split
  params' shards of its devices, and a copy of each replicated param per device it drives."""
  from jax_mtp.sharding import param_spec  # noqa: PLC0415
  params, _ = plan(CFG)
  devices = 2 // processes
  return sum(int(np.prod(p.shape)) * 2 * (devices / 2 if any(param_spec(p.path)) else devices) for p in params)


def test_two_processes_each_load_only_their_share(checkpoint, tmp_path):
  """tp = 2 over 2 processes (jax.distributed, one CPU device each): each process loads under a cap
  of its own share of the params (+ 256 MB for a param in flight and the runtime) — a cap under which
  one process driving both devices cannot load (checked too)."""
  directory, _ = checkpoint
  cap = int(_share_bytes(2)) + 256 * MB
  assert cap < _share_bytes(1) - 512 * MB
  with socket.socket() as s:
    s.bind(("localhost", 0))
    address = f"localhost:{s.getsockname()[1]}"
  root = os.path.dirname(os.path.dirname(__file__))
  procs = [subprocess.Popen([sys.executable, "-c", MULTI_PRELUDE, directory, str(cap), address, "2", str(i)],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
    # its devices' shards: the bf16 estimate within 2% (a few small params load as fp32)
    assert out.split()[0] == "loaded" and abs(int(out.split()[1]) / _share_bytes(2) - 1) < 0.02
  alone = subprocess.run([sys.executable, "-c", MULTI_PRELUDE, directory, str(cap), address, "1", "0"], cwd=root,
                         capture_output=True, text=True, timeout=600)
  assert alone.returncode != 0 and "loaded" not in alone.stdout
  # and it failed for memory (the cap), not for another reason
  assert re.search(r"memory|alloc", alone.stderr, re.IGNORECASE), alone.stderr[-3000:]
