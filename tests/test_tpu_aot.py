"""The sharded MTP draft step, with the Opt-1 Mosaic kernel, and the two-shot kernel alone compile
for a real TPU topology (v5e 2x2) on this CPU machine through libtpu (the `tpu` extra; CI installs it;
skipped without it, tests/tpu_toolchain.py), libtpu loaded here or not."""

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_mtp.kernels.fused_allreduce_rmsnorm import fused_allreduce_rmsnorm
from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu_two_shot import KERNEL_NAME as TWO_SHOT
from tests.tpu_toolchain import requires_libtpu

TOOL = Path(__file__).resolve().parents[1] / "tools" / "tpu_aot_compile.py"
pytestmark = requires_libtpu


def test_processes_started_after_libtpu_loaded_here_load_it_too():
  """A compile test in this process loads libtpu (and its host-wide lockfile); the processes tests
  start after it (the tool below) load it too, whatever the order of tests (conftest.py)."""
  topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
  load = "from jax.experimental import topologies; topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu')"
  run = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
  assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.slow
def test_mtp_step_compiles_for_tpu_with_the_mosaic_kernel():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = subprocess.run([sys.executable, str(TOOL), "--topology", "v5e:2x2", "--preset", "tiny"],
                       capture_output=True, text=True, env=env, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  lines = [line for line in run.stdout.splitlines() if "impl=" in line]
  assert len(lines) == 2, run.stdout
  xla, pallas = lines
  assert "fused_allreduce_rmsnorm_tpu present: False" in xla and "'all-reduce': 3" in xla
  assert "fused_allreduce_rmsnorm_tpu present: True" in pallas and "'all-reduce': 2" in pallas


@pytest.mark.slow
def test_two_shot_kernel_compiles_for_tpu_at_prefill_size():
  """The two-shot (reduce-scatter + all-gather) Mosaic kernel alone, v5e 2x2 (tp=4), T=1024 rows of
  D=7168 bf16: several row blocks, dynamic chunk offsets and remote DMAs through libtpu's compiler."""
  mesh = Mesh(np.array(topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices), ("tp",))
  t, d = 1024, 7168

  def per_device(x_1TD, residual_TD, weight_D):
    return fused_allreduce_rmsnorm(x_1TD[0], residual_TD, weight_D, 1e-6, axis_name="tp", impl="pallas_tpu",
                                   tpu_algorithm="two_shot")

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=P(), check_vma=False))
  arg = lambda shape, spec: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))  # noqa: E731
  hlo = step.lower(arg((4, t, d), P("tp")), arg((t, d), P()), arg((d,), P())).compile().as_text()
  assert hlo.count("tpu_custom_call") == 1 and TWO_SHOT in hlo
  assert not re.search(r"\b(all-reduce|all-gather|reduce-scatter)(-start)?\(", hlo)


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [1, 40])
def test_routed_experts_compile_for_tpu_with_tokamax_kernels(tokens):
  """impl tokamax_tpu: gate, up and down are tokamax's Mosaic-TPU grouped matmuls in the compiled v5e
  program (3 Mosaic calls, no XLA ragged dot), at a decode size (8 rows, padded to 128) and above."""
  import functools

  from jax_mtp.experts import routed_experts
  mesh = Mesh(np.array(topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[:1]), ("x",))
  e, d, f, k = 16, 256, 128, 8
  arg = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))  # noqa: E731
  args = (arg((tokens, d), jnp.bfloat16), arg((tokens, k), jnp.int32), arg((tokens, k), jnp.float32),
          arg((e, d, f), jnp.bfloat16), arg((e, d, f), jnp.bfloat16), arg((e, f, d), jnp.bfloat16))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # tokamax reads the chip from the context
    lowered = jax.jit(functools.partial(routed_experts, "tokamax_tpu")).lower(*args)
  hlo = lowered.compile().as_text()
  assert hlo.count("tpu_custom_call") == 3
  assert not re.search(r"= \S+ ragged-dot\(", hlo)  # no XLA ragged-dot instruction left


def test_the_sampling_filters_compile_for_tpu_without_a_sort():
  """V3.2-Exp's sampling settings and a top-k (temperature 0.6, top-k 50, top-p 0.95) over its 129,280-token vocabulary at B = 64 ×
  4 verified positions, compiled for a v5e chip: the radix search's program holds no sort (a TPU sort of the
  vocabulary is what it replaced); the sort's form does."""
  from jax_mtp.acceptance import Sampling, sampling_logits, sampling_logits_reference  # noqa: PLC0415
  mesh = Mesh(np.array(topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[:1]), ("x",))
  logits = jax.ShapeDtypeStruct((64, 4, 129_280), jnp.float32, sharding=NamedSharding(mesh, P()))
  sampling = Sampling(np.float32(0.6), np.int32(50), np.float32(0.95))
  hlo = jax.jit(sampling_logits).lower(logits, sampling).compile().as_text()
  assert not re.search(r"\ssort\(", hlo)
  assert re.search(r"\ssort\(", jax.jit(sampling_logits_reference).lower(logits, sampling).compile().as_text())
