"""Which cross-CTA exchange works on this GPU's jax (the sparse MLA's `Config.crossover` crashed with "unspecified
launch failure" and `tools/crossover_probe.py` hung on an H100 with jax 0.11.2, 2026-12-06 00:25): each variant runs
in its own process under a time bound and reports equal / differs / hung / crashed.

    python tools/crossover_variants.py            # on a Hopper GPU; MOSAIC_GPU_DUMP_PTX=1 for the PTX's barrier lines

  async    the probe: `async_store_smem` into the peer's operand, 128 arrivals a store on the peer's barrier
  dsmem    plain stores into the peer's operand through `plgpu.cluster_ref`, then a `ClusterBarrier` arrival
  fenced   the same with `fence.proxy.async.shared::cluster` and `fence.acq_rel.cluster` from every storing thread
           before `commit_smem`'s warpgroup barrier and the arrival (`commit_smem`'s proxy fence names shared::cta;
           the peer's TMA / wgmma read through the async proxy)
  handshake a `ClusterBarrier` arrival and wait alone, no data: whether remote arrivals complete a phase
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # jax_mtp from this checkout (the device runs it there)

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import crossover_probe as probe  # noqa: E402
import jax_mtp  # noqa: E402, F401 (maps kernels/ as jax_mtp.kernels)
from jax_mtp.kernels.mosaic_gpu_common import cluster_fences  # noqa: E402

VARIANTS = ("handshake", "dsmem", "fenced", "async")  # the one that hung last


def dsmem(x, fenced=False):
  def body(x_gmem, out_gmem, stage, operand, loaded, landed):
    me = jax.lax.axis_index("c")
    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(me * probe.HALF, probe.HALF)], stage, loaded)
    plgpu.barrier_wait(loaded)
    for col in range(0, probe.WIDTH, probe.PIECE):
      piece = plgpu.load(stage.at[:, pl.ds(col, probe.PIECE)], layout=probe.rows_layout(), optimized=False)
      mine = operand.at[pl.ds(me * probe.HALF, probe.HALF), pl.ds(col, probe.PIECE)]
      mine[...] = piece
      plgpu.cluster_ref(mine, {"c": 1 - me})[...] = piece
    if fenced:  # every storing thread's fences before commit_smem's warpgroup barrier, then the arrivals
      cluster_fences(plgpu)
    plgpu.commit_smem()
    plgpu.barrier_arrive(landed)  # in both CTAs: 2 arrivals a phase
    plgpu.barrier_wait(landed)
    plgpu.copy_smem_to_gmem(operand, out_gmem.at[me])
    plgpu.wait_smem_to_gmem(0)

  return probe.cluster_kernel(body, x, plgpu.ClusterBarrier(collective_axes=("c",), num_arrivals=1))


def handshake(x):
  def body(x_gmem, out_gmem, stage, operand, loaded, met):
    me = jax.lax.axis_index("c")
    plgpu.barrier_arrive(met)
    plgpu.barrier_wait(met)
    plgpu.copy_gmem_to_smem(x_gmem, operand, loaded)
    plgpu.barrier_wait(loaded)
    plgpu.copy_smem_to_gmem(operand, out_gmem.at[me])
    plgpu.wait_smem_to_gmem(0)

  return probe.cluster_kernel(body, x, plgpu.ClusterBarrier(collective_axes=("c",), num_arrivals=1))


def run(name: str) -> int:
  x = jnp.asarray(np.arange(probe.ROWS * probe.WIDTH).reshape(probe.ROWS, -1) % 251, jnp.bfloat16)
  fn = {"async": probe.crossover, "dsmem": dsmem, "fenced": lambda x: dsmem(x, fenced=True),
        "handshake": handshake}[name]
  out = np.asarray(jax.jit(fn)(x))
  ok = all(np.array_equal(out[i], np.asarray(x)) for i in (0, 1))
  bad = [int((out[i] != np.asarray(x)).any(axis=1).sum()) for i in (0, 1)]
  print(f"RESULT {name}: {'equal' if ok else f'differs (rows wrong in each CTA: {bad})'}", flush=True)
  return 0 if ok else 1


def main() -> int:
  if len(sys.argv) > 1:
    return run(sys.argv[1])
  for name in VARIANTS:
    try:
      done = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, timeout=40)
      text = done.stdout + done.stderr
      verdict = next((line for line in text.splitlines() if line.startswith("RESULT")), None)
      print(verdict or f"RESULT {name}: crashed (rc {done.returncode}): "
            + " / ".join(line for line in text.splitlines() if "rror" in line)[-600:])
    except subprocess.TimeoutExpired as e:
      text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
      print(f"RESULT {name}: hung (killed after 40 s)")
    barrier_lines = [line.strip() for line in text.splitlines() if "mbarrier" in line or "st.async" in line
                     or "mapa" in line or "barrier.cluster" in line]
    for line in dict.fromkeys(barrier_lines):  # the PTX's distinct barrier instructions (MOSAIC_GPU_DUMP_PTX=1)
      print("  ptx:", line[:200])
  return 0


if __name__ == "__main__":
  sys.exit(main())
