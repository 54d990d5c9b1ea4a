"""tools/crossover_probe.py: the crossover's pieces (a 2-CTA cluster, each CTA's half of a step's rows re-laid into
its own and its peer's swizzled operand by `plgpu.async_store_smem`) lower for CUDA here; on a GPU, compiled, both
CTAs' operands equal the input. Pallas's GPU interpreter does not run clusters, so nothing runs it on a CPU."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import crossover_probe  # noqa: E402
from jax_mtp.kernels.mosaic_gpu_common import CLUSTER_FENCES_PTX  # noqa: E402
from tests.lowered_step import H200  # noqa: E402

ON_GPU = jax.devices()[0].platform == "gpu"


def test_the_crossover_lowers_for_cuda():
  x = jax.ShapeDtypeStruct((crossover_probe.ROWS, crossover_probe.WIDTH), jnp.bfloat16)
  with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)):
    lowered = jax.jit(crossover_probe.crossover).trace(x).lower(lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text() and lowered.out_info.shape == (2, *x.shape)


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU (the interpreter does not run clusters)")
def test_both_ctas_hold_every_row_after_the_exchange():
  x = jnp.asarray(np.arange(crossover_probe.ROWS * crossover_probe.WIDTH).reshape(crossover_probe.ROWS, -1) % 251,
                  jnp.bfloat16)
  out = np.asarray(jax.jit(crossover_probe.crossover)(x))
  np.testing.assert_array_equal(out[0], np.asarray(x))
  np.testing.assert_array_equal(out[1], np.asarray(x))


@pytest.mark.parametrize("variant", ["dsmem", "fenced", "handshake"])
def test_the_exchange_variants_lower_for_cuda(variant):
  """tools/crossover_variants.py's other exchanges (plain stores into the peer through `plgpu.cluster_ref`, with and
  without the cluster-scope fences, and a cluster barrier alone) lower for CUDA: what its GPU run compares."""
  import crossover_variants  # noqa: PLC0415
  fn = {"dsmem": crossover_variants.dsmem, "fenced": lambda x: crossover_variants.dsmem(x, fenced=True),
        "handshake": crossover_variants.handshake}[variant]
  x = jax.ShapeDtypeStruct((crossover_probe.ROWS, crossover_probe.WIDTH), jnp.bfloat16)
  with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)):
    lowered = jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",))
  text = lowered.as_text()
  assert "mosaic_gpu" in text
  # both fences are in the fenced kernel alone (the sparse MLA's lowering test checks its crossover the same way)
  assert all((piece in text) == (variant == "fenced") for piece in CLUSTER_FENCES_PTX.split("\n\t"))
