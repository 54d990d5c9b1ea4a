"""benchmarks.dense_gemms: its rows run on this host (XLA's only: the kernels are Hopper's), its roofline, and jax's
Hopper matmul at the configs it picks lowers for CUDA at V3.2's widths (an abstract H200: the kernel asks the mesh
for the core count), or is skipped where the width does not split into its CTA's columns."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType

from benchmarks import dense_gemms
from tests.lowered_step import H200


def test_the_rows_run_here_with_xla(capsys):
  assert dense_gemms.main(["--small", "--rows", "8", "--iters", "1"]) == 0
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "(small)" in line]
  assert len(rows) == len(dense_gemms.SMALL) and all("| XLA |" in row and row.endswith("0.0e+00 |") for row in rows)


def test_the_roofline_is_the_larger_of_bytes_and_flops():
  assert dense_gemms.roofline_seconds(1, 10, 10, 2, bandwidth=1.0, peak=1e9) == 2 * (100 + 10 + 10)
  assert dense_gemms.roofline_seconds(1000, 10, 10, 2, bandwidth=1e12, peak=1.0) == 2 * 1000 * 10 * 10


@pytest.mark.parametrize("name,m,tile_n", [("q_b_proj", 256, 128), ("q_b_proj", 64, 128), ("o_proj", 1024, 64),
                                            ("kv_a_proj_with_mqa", 256, 64)])
def test_the_hopper_matmul_lowers_for_cuda_at_v32_widths(name, m, tile_n):
  (_, k, n), = [s for s in dense_gemms.SHAPES if s[0] == name]
  config = dense_gemms.hopper_config(m, n, tile_n)
  assert config.tile_m == (min(m, 256) // 2 if m >= 128 else 64)  # two warpgroups along M take the whole M to 256
  mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
  with jax.sharding.use_abstract_mesh(mesh):
    lowered = jax.jit(dense_gemms.hopper_gemm(config)).trace(
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16)).lower(
            lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text() and lowered.out_info.shape == (m, n)


def test_a_width_the_ctas_columns_do_not_split_gets_no_config():
  assert dense_gemms.hopper_config(256, 576, 128) is None  # kv_a's 576 columns in 128-wide tiles
  assert dense_gemms.hopper_config(64, 576, 128) is None  # two warpgroups along N: 256 a CTA
  assert dense_gemms.hopper_config(256, 576, 64) is not None
