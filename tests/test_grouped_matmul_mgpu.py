"""The 16-bit grouped matmul on Pallas Mosaic GPU (kernels/grouped_matmul_mgpu.py): equal to its formula and to
`lax.ragged_dot` on groups of 0, 1, < and > one row tile, groups off the 8-row boundary, a dense linear's one group
over several row programs, the K loop split or not and pipelined 1–4 deep, bf16 and fp16; in Pallas's GPU
interpreter on a CPU (compiled on a GPU); lowered for CUDA at DeepSeek-V3.2's expert shapes (the Mosaic GPU
lowering runs on any host); refused by name where it cannot run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp.kernels.grouped_matmul_mgpu import (KERNEL_NAME, Config, config_for, grouped_matmul_mgpu, reference,
                                                 smem_bytes)
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"


def problem(e, k, n, sizes, dtype=jnp.bfloat16, spare=3, seed=0):
  """x [Σ sizes + spare, K] (rows past the groups: another device's assignments), w [E, K, N], sizes."""
  rng = np.random.default_rng(seed + e + k)
  w = jnp.asarray(rng.standard_normal((e, k, n)), dtype)
  x = jnp.asarray(rng.standard_normal((sum(sizes) + spare, k)), dtype)
  return x, w, jnp.asarray(sizes, jnp.int32)


def assert_equals_the_formula_and_ragged_dot(got, x, w, sizes_E, what):
  rows = int(np.asarray(sizes_E).sum())
  got = np.asarray(got)[:rows]
  assert_close(got, np.asarray(reference(x, w, sizes_E))[:rows], "float32", f"{what} vs formula")
  ragged = jax.lax.ragged_dot(x[:rows].astype(jnp.float32), w.astype(jnp.float32), sizes_E,
                              precision=jax.lax.Precision.HIGHEST)
  assert_close(got, np.asarray(ragged), "float32", f"{what} vs lax.ragged_dot")


@pytest.mark.parametrize("e,k,n,sizes,config,dtype", [
    (5, 256, 384, (6, 0, 1, 17, 2), Config(row_tile=8), jnp.bfloat16),  # a group over 3 tiles, empty groups
    (3, 128, 128, (0, 0, 1), Config(), jnp.bfloat16),  # one K step: a one-deep pipeline
    (2, 384, 256, (33, 0), Config(row_tile=16, split_k=3, stages=2), jnp.bfloat16),
    (4, 512, 128, (1, 0, 2, 0), Config(split_k=2, stages=1), jnp.bfloat16),
    (2, 640, 128, (5, 4), Config(row_tile=8, stages=4), jnp.bfloat16),  # 4 deep over 5 steps: refills wrap around
    (1, 256, 256, (70,), Config(row_tile=16, row_programs=2), jnp.bfloat16),  # a dense linear: 5 tiles over 2 CTAs
    # groups starting off an 8-row boundary and crossing it (a TMA copy from such a row drops the rows past it)
    (3, 128, 128, (3, 12, 9), Config(row_tile=8), jnp.bfloat16), (2, 128, 256, (1, 25), Config(row_tile=16), jnp.bfloat16),
    # fewer rows than experts (a decode step's): 3 group slots hold the 2 non-empty groups and one empty
    (6, 256, 128, (0, 1, 0, 0, 2, 0), Config(row_tile=8), jnp.bfloat16),
    (3, 384, 256, (7, 0, 20), None, jnp.float16),  # what a call without a Config launches, in fp16
])
def test_kernel_equals_the_formula_and_ragged_dot(e, k, n, sizes, config, dtype):
  x, w, sizes_E = problem(e, k, n, sizes, dtype)
  got = grouped_matmul_mgpu(x, w, sizes_E, config=config, interpret=not ON_GPU)
  assert got.shape == (x.shape[0], n) and got.dtype == jnp.float32
  assert_equals_the_formula_and_ragged_dot(got, x, w, sizes_E, "Mosaic kernel")


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
@pytest.mark.parametrize("config", [Config(row_tile=8, stages=2), Config(row_tile=8, stages=3, split_k=1),
                                    Config(row_tile=16, row_programs=2, stages=2)],
                         ids=["2 stages", "3 stages", "two row programs"])
def test_no_shared_memory_race(config):
  """The GPU interpreter's race detector (vector clocks over the shared-memory accesses, TMA copies included) finds
  no unordered access: groups over several tiles and off the 8-row boundary, the pipeline's refills. It raises at
  the first race. It does not see a wgmma's operands as read asynchronously (it missed a refill made one product too
  early, 2026-12-06): that order, a slot refilled only after `wgmma_wait` covers the product that read it, is the
  compiled tests' on a GPU."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  x, w, sizes_E = problem(3, 512, 128, (3, 12, 9))
  got = grouped_matmul_mgpu(x, w, sizes_E, config=config, interpret=plgpu.InterpretGPUParams(detect_races=True))
  assert_equals_the_formula_and_ragged_dot(got, x, w, sizes_E, "race-checked kernel")


def test_a_tile_spanning_past_its_group_leaves_the_next_groups_rows_alone():
  """A one-row group's 8-row tile spans the 9-row group after it: every row holds its own group's product."""
  x, w, sizes = problem(3, 128, 128, (1, 9, 0), spare=6)
  got = np.asarray(grouped_matmul_mgpu(x, w, sizes, config=Config(row_tile=8), interpret=not ON_GPU))
  assert_close(got[:10], np.asarray(reference(x, w, sizes))[:10], "float32", "the groups' rows")


@pytest.mark.parametrize("rows,experts,k,n", [(8, 256, 7168, 2048), (2048, 256, 2048, 7168), (8192, 256, 7168, 2048),
                                              (64, 1, 7168, 2048)])
def test_kernel_lowers_for_cuda_at_v32_shapes(rows, experts, k, n):
  """Experts at B = 1 (gate/up), B = 64 × 4 queries (down: 3.8e9 weights, past int32 byte offsets), B = 256 × 4
  (gate/up, 56-row tiles) and a dense linear's one group."""
  args = (jax.ShapeDtypeStruct((rows, k), jnp.bfloat16), jax.ShapeDtypeStruct((experts, k, n), jnp.bfloat16),
          jax.ShapeDtypeStruct((experts,), jnp.int32))
  text = jax.jit(grouped_matmul_mgpu).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert KERNEL_NAME in text


def test_config_keeps_the_most_copies_in_flight_a_core():
  # B = 1: 8 rows over 8 experts' 16 column blocks → 4 K parts; 8-row tiles, 3 stages (two CTAs a core: 4 copies in
  # flight); B = 64 × 4 queries: 24-row tiles (twice the mean 8, + 7), 4 stages in one CTA a core (3 in flight
  # against 2 × 1 at 2 stages); B = 256 × 4: 56-row tiles, 3 stages (one CTA: 4 would not fit)
  assert config_for(8, 256, 7168, 2048) == Config(row_tile=8, stages=3, split_k=4, row_programs=1)
  assert config_for(2048, 256, 7168, 2048) == Config(row_tile=24, stages=4, split_k=1, row_programs=1)
  assert config_for(8192, 256, 2048, 7168) == Config(row_tile=56, stages=3, split_k=1, row_programs=1)
  assert smem_bytes(56, 3) <= 227 * 1024 < smem_bytes(56, 4)
  assert config_for(8, 256, 128, 2048).stages == 1  # one K step: nothing to pipeline
  assert config_for(8, 256, 7168, 2048, Config(stages=2, row_tile=16)).stages == 2  # given values stay


def test_kernel_refuses_what_it_cannot_take():
  x, w, sizes = problem(3, 128, 128, (1, 0, 2))
  with pytest.raises(ValueError, match="row_tile=32 is not one of"):
    grouped_matmul_mgpu(x, w, sizes, config=Config(row_tile=32), interpret=True)
  with pytest.raises(ValueError, match="split_k=3 must divide the 1 blocks"):
    grouped_matmul_mgpu(x, w, sizes, config=Config(split_k=3), interpret=True)
  with pytest.raises(ValueError, match="must be one 16-bit dtype"):
    grouped_matmul_mgpu(x.astype(jnp.float32), w.astype(jnp.float32), sizes, interpret=True)
  with pytest.raises(ValueError, match="must be one 16-bit dtype"):
    grouped_matmul_mgpu(x.astype(jnp.float16), w, sizes, interpret=True)
  with pytest.raises(ValueError, match="need the same K"):
    grouped_matmul_mgpu(x[:, :64], w, sizes, interpret=True)
  with pytest.raises(ValueError, match="one size per expert"):
    grouped_matmul_mgpu(x, w, sizes[:2], interpret=True)
