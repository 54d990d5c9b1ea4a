"""The FP8 grouped matmul over codes stored [E, N, K] (kernels/fp8_grouped_matmul_mgpu_nk.py): equal to the op's
formula, to x times the exactly dequantised weights and to the [E, K, N] Mosaic kernel, on groups of 0, 1, < and > one
row tile, off the 8-row boundary, a dense linear's one group over several row programs, two subtiles, the K loop split
or not; in Pallas's GPU interpreter on a CPU (the widened block through shared memory there, as the interpreter's
wgmma takes it) and compiled on a GPU (the block in wgmma's register operand); lowered for CUDA at DeepSeek-V3.2's
shapes; refused by name where it cannot run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp.kernels.fp8_grouped_matmul_mgpu import Config, fp8_grouped_matmul_mgpu
from jax_mtp.kernels.fp8_grouped_matmul_mgpu_nk import KERNEL_NAME, as_nk, fp8_grouped_matmul_mgpu_nk
from tests.fp8_matmul_cases import assert_equals_the_formula_and_the_dequantised_product, problem
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"


@pytest.mark.parametrize("e,k,n,sizes,config", [
    (5, 256, 384, (6, 0, 1, 17, 2), Config(row_tile=8)),  # a group over 3 tiles, empty groups
    (2, 384, 256, (33, 0), Config(row_tile=16, split_k=3)),  # one block a CTA: no successor to read
    (4, 512, 128, (1, 0, 2, 0), Config(split_k=2, stages=3)),
    (1, 256, 256, (70,), Config(row_tile=16, row_programs=2)),  # a dense linear: 5 tiles over 2 CTAs
    (3, 256, 128, (3, 12, 9), Config(row_tile=8, subtiles=2)),  # groups off the 8-row boundary, two products
    (2, 640, 128, (1, 25), Config(row_tile=16)),  # five blocks through two slots
])
def test_kernel_equals_the_formula_the_dequantised_product_and_the_kn_kernel(e, k, n, sizes, config):
  x, codes, scale, sizes_E = problem(e, k, n, sizes)
  rows = sum(sizes)
  got = np.asarray(fp8_grouped_matmul_mgpu_nk(x, *as_nk(codes, scale), sizes_E, config=config,
                                              interpret=not ON_GPU))[:rows]
  assert_equals_the_formula_and_the_dequantised_product(got, x, codes, scale, sizes_E, "[E, N, K] kernel")
  kn = fp8_grouped_matmul_mgpu(x, codes, scale, sizes_E, config=config, interpret=not ON_GPU)
  assert_close(got, np.asarray(kn)[:rows], "float32", "[E, N, K] vs [E, K, N] Mosaic kernel")


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
def test_no_shared_memory_race():
  """The GPU interpreter's race detector finds no unordered shared-memory access (TMA copies included) while a
  block's successor is read during its products, over groups off the 8-row boundary and several tiles a CTA."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  x, codes, scale, sizes_E = problem(3, 384, 128, (3, 12, 9))
  got = fp8_grouped_matmul_mgpu_nk(x, *as_nk(codes, scale), sizes_E, config=Config(row_tile=8),
                                   interpret=plgpu.InterpretGPUParams(detect_races=True))
  assert_equals_the_formula_and_the_dequantised_product(got, x, codes, scale, sizes_E, "race-checked kernel")


@pytest.mark.parametrize("rows,experts,k,n,config", [
    (8, 256, 7168, 2048, Config()),  # experts at B = 1 (gate/up)
    (2048, 256, 2048, 7168, Config(stages=4)),  # B = 64 × 4 queries (down; 3.8e9 codes)
    (64, 1, 16384, 7168, Config(subtiles=2)),  # o_proj at B = 64
])
def test_kernel_lowers_for_cuda_at_v32_shapes(rows, experts, k, n, config):
  args = (jax.ShapeDtypeStruct((rows, k), jnp.bfloat16), jax.ShapeDtypeStruct((experts, n, k), jnp.float8_e4m3fn),
          jax.ShapeDtypeStruct((experts, n // 128, k // 128), jnp.float32), jax.ShapeDtypeStruct((experts,), jnp.int32))
  call = jax.jit(lambda *a: fp8_grouped_matmul_mgpu_nk(*a, config=config))
  assert KERNEL_NAME in call.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_kernel_refuses_what_it_cannot_take():
  x, codes, scale, sizes = problem(3, 256, 128, (1, 0, 2))
  codes_nk, scale_nk = as_nk(codes, scale)
  with pytest.raises(ValueError, match="stages=1: this kernel reads block b"):
    fp8_grouped_matmul_mgpu_nk(x, codes_nk, scale_nk, sizes, config=Config(stages=1), interpret=True)
  with pytest.raises(ValueError, match="share_output_smem"):
    fp8_grouped_matmul_mgpu_nk(x, codes_nk, scale_nk, sizes, config=Config(share_output_smem=True), interpret=True)
  with pytest.raises(ValueError, match=r"scales \(3, 2, 1\) are not the 128 × 128 blocks"):
    fp8_grouped_matmul_mgpu_nk(x, codes_nk, scale, sizes, interpret=True)
  with pytest.raises(ValueError, match="row_tile=32 is not one of"):
    fp8_grouped_matmul_mgpu_nk(x, codes_nk, scale_nk, sizes, config=Config(row_tile=32), interpret=True)
