"""The FP8 grouped matmul on Pallas Mosaic GPU (kernels/fp8_grouped_matmul_mgpu.py): equal to the op's formula and to x
times the exactly dequantised weights, on groups of 0, 1, < and > one row tile, a dense
linear's one group over several row programs, the K loop split or not; in Pallas's GPU interpreter on a CPU
(compiled on a GPU); lowered for CUDA at DeepSeek-V3.2's expert and dense shapes (the Mosaic GPU lowering runs on any
host); refused by name where it cannot run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp.kernels.fp8_grouped_matmul import reference
from jax_mtp.kernels.fp8_grouped_matmul_mgpu import KERNEL_NAME, Config, config_for, fp8_grouped_matmul_mgpu
from jax_mtp.kernels.grouped_rows_mgpu import active_groups
from tests.fp8_matmul_cases import assert_equals_the_formula_and_the_dequantised_product, problem
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"


@pytest.mark.parametrize("e,k,n,sizes,config", [
    (5, 256, 384, (6, 0, 1, 17, 2), Config(row_tile=8)),  # a group over 3 tiles, empty groups
    (3, 128, 128, (0, 0, 1), Config()),
    (2, 384, 256, (33, 0), Config(row_tile=16, split_k=3, stages=2)),
    (4, 512, 128, (1, 0, 2, 0), Config(split_k=2, stages=1)),
    (1, 256, 256, (70,), Config(row_tile=16, row_programs=2)),  # a dense linear: 5 tiles over 2 CTAs
    # groups starting off an 8-row boundary and crossing it (on the H200 a copy from such a row dropped the rows
    # past the boundary, 2026-12-03)
    (3, 128, 128, (3, 12, 9), Config(row_tile=8)), (2, 128, 256, (1, 25), Config(row_tile=16)),
    # the output staged in the weights' shared memory: several tiles a CTA, so a tile's widening follows the last
    # tile's rows out
    (3, 256, 128, (3, 12, 9), Config(row_tile=8, share_output_smem=True)),
    (1, 256, 256, (70,), Config(row_tile=16, row_programs=2, share_output_smem=True)),
    # two products a widened block: a dense linear's 70 rows as 3 spans of 2 × 16 over 2 CTAs, the last subtile
    # past the rows; experts' groups off the 8-row boundary
    (1, 256, 256, (70,), Config(row_tile=16, subtiles=2, row_programs=2)),
    (3, 256, 128, (3, 12, 9), Config(row_tile=8, subtiles=2)),
    # what a call without a Config launches for a dense linear of 57–112 rows (default_config): both at once
    (1, 256, 256, (70,), None),
    # fewer rows than experts (a decode step's): the grid's 3 group slots hold the 2 non-empty groups and one empty;
    # and the same over all 6 experts (the uncompacted grid)
    (6, 256, 128, (0, 1, 0, 0, 2, 0), Config(row_tile=8)),
    (6, 256, 128, (0, 1, 0, 0, 2, 0), Config(row_tile=8, compact_groups=False)),
])
def test_kernel_equals_the_formula_and_the_dequantised_product(e, k, n, sizes, config):
  x, codes, scale, sizes_E = problem(e, k, n, sizes)
  rows = sum(sizes)
  got = np.asarray(fp8_grouped_matmul_mgpu(x, codes, scale, sizes_E, config=config, interpret=not ON_GPU))[:rows]
  assert_equals_the_formula_and_the_dequantised_product(got, x, codes, scale, sizes_E, "Mosaic kernel")


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
@pytest.mark.parametrize("config", [Config(row_tile=8, stages=2), Config(row_tile=8, share_output_smem=True),
                                    Config(row_tile=16, subtiles=2, row_programs=2),
                                    Config(row_tile=8, subtiles=2, share_output_smem=True)],
                         ids=["2 stages", "output in the weights' memory", "two subtiles", "both"])
def test_no_shared_memory_race_between_the_warpgroups(config):
  """The GPU interpreter's race detector (vector clocks over every shared-memory access, TMA copies included) finds
  no unordered access: groups over several tiles and off the 8-row boundary, the pipeline's stages, the output
  staged in the weights' shared memory, two subtiles a block. It raises at the first race."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  x, codes, scale, sizes_E = problem(3, 256, 128, (3, 12, 9))
  got = np.asarray(fp8_grouped_matmul_mgpu(x, codes, scale, sizes_E, config=config,
                                           interpret=plgpu.InterpretGPUParams(detect_races=True)))[:24]
  assert_equals_the_formula_and_the_dequantised_product(got, x, codes, scale, sizes_E, "race-checked kernel")


def test_a_tile_spanning_past_its_group_leaves_the_next_groups_rows_alone():
  """A one-row group's 8-row tile spans the 9-row group after it: every row holds its own group's product (the
  tile stores only its group's rows). Rows past Σ sizes (another device's assignments) are the contract's
  don't-care: the output is a fresh buffer, so this test cannot observe them and does not look."""
  x, codes, scale, sizes = problem(3, 128, 128, (1, 9, 0), spare=6)
  got = np.asarray(fp8_grouped_matmul_mgpu(x, codes, scale, sizes, config=Config(row_tile=8), interpret=not ON_GPU))
  want = np.asarray(reference(x, codes, scale, sizes))
  assert_close(got[:10], want[:10], "float32", "the groups' rows")


@pytest.mark.parametrize("variant", [{}, {"share_output_smem": True}, {"subtiles": 2}])
@pytest.mark.parametrize("rows,experts,k,n", [(8, 256, 7168, 2048), (2048, 256, 2048, 7168), (64, 1, 16384, 7168),
                                              (4096, 1, 7168, 1536)])
def test_kernel_lowers_for_cuda_at_v32_shapes(rows, experts, k, n, variant):
  """Experts at B = 1 (gate/up) and B = 64 × 4 queries (down; 3.8e9 codes, past int32 byte offsets), o_proj at
  B = 64, q_a at a 4,096-token prefill chunk (a dense linear's rows over row programs)."""
  args = (jax.ShapeDtypeStruct((rows, k), jnp.bfloat16), jax.ShapeDtypeStruct((experts, k, n), jnp.float8_e4m3fn),
          jax.ShapeDtypeStruct((experts, k // 128, n // 128), jnp.float32), jax.ShapeDtypeStruct((experts,), jnp.int32))
  call = jax.jit(lambda *a: fp8_grouped_matmul_mgpu(*a, config=Config(**variant)))
  text = call.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert KERNEL_NAME in text


@pytest.mark.parametrize("sizes,slots,ids,kept", [
    ((0, 1, 0, 0, 2, 0), 3, (1, 4, 0), (1, 2, 0)),  # two non-empty, one spare slot
    ((3, 0, 2), 3, (0, 2, 0), (3, 2, 0)),
    ((1, 1, 1, 1), 4, (0, 1, 2, 3), (1, 1, 1, 1)),  # every expert has rows
    ((0, 0, 0, 0), 2, (0, 0), (0, 0)),  # no rows at all: nothing runs
])
def test_active_groups_lists_every_non_empty_group_then_empty_slots(sizes, slots, ids, kept):
  got_ids, got_sizes = active_groups(jnp.array(sizes, jnp.int32), slots)
  assert tuple(np.asarray(got_ids)) == ids and tuple(np.asarray(got_sizes)) == kept


def test_config_fills_the_machine():
  # B = 1: 8 rows over 8 experts' 16 column blocks → 4 K parts (512 CTAs); B = 64 × 4 queries: 2,048 rows, 24-row
  # tiles (twice the mean 8, + 7 before an unaligned group), no split; o_proj at B = 64 from Config(): 56-row tiles,
  # 56 column blocks × 2 row programs × 4 parts = 448 CTAs; a prefill chunk's q_a: 74 row programs of 56 rows × 12
  # column blocks, no split
  assert config_for(8, 256, 7168, 2048) == Config(row_tile=8, stages=2, split_k=4, row_programs=1)
  assert config_for(2048, 256, 7168, 2048) == Config(row_tile=24, stages=2, split_k=1, row_programs=1)
  # o_proj at B = 64 (without a Config): two 40-row subtiles a block in one CTA, the output in the weights' memory
  assert config_for(64, 1, 16384, 7168) == Config(row_tile=40, stages=2, split_k=8, row_programs=1,
                                                  share_output_smem=True, subtiles=2)
  assert config_for(64, 1, 16384, 7168, Config()) == Config(row_tile=56, stages=2, split_k=4, row_programs=2)
  assert config_for(8, 1, 16384, 7168) == Config(row_tile=8, stages=2, split_k=8, row_programs=1)  # one tile
  assert config_for(4096, 1, 7168, 1536) == Config(row_tile=56, stages=2, split_k=1, row_programs=74)
  # two products a block: o_proj's 64 rows as 2 × 40 in one CTA a column block and K part
  assert config_for(64, 1, 16384, 7168, Config(subtiles=2)) == Config(row_tile=40, stages=2, split_k=8,
                                                                       row_programs=1, subtiles=2)


def test_kernel_refuses_what_it_cannot_take():
  x, codes, scale, sizes = problem(3, 128, 128, (1, 0, 2))
  with pytest.raises(ValueError, match="row_tile=32 is not one of"):
    fp8_grouped_matmul_mgpu(x, codes, scale, sizes, config=Config(row_tile=32), interpret=True)
  with pytest.raises(ValueError, match="split_k=3 must divide the 1 blocks"):
    fp8_grouped_matmul_mgpu(x, codes, scale, sizes, config=Config(split_k=3), interpret=True)
  with pytest.raises(ValueError, match="codes must be float8_e4m3fn, got bfloat16"):
    fp8_grouped_matmul_mgpu(x, codes.astype(jnp.bfloat16), scale, sizes, interpret=True)
  with pytest.raises(ValueError, match="subtiles=0 must be ≥ 1"):
    fp8_grouped_matmul_mgpu(x, codes, scale, sizes, config=Config(subtiles=0), interpret=True)
  with pytest.raises(ValueError, match="one size per expert"):
    fp8_grouped_matmul_mgpu(x, codes, scale, sizes[:2], interpret=True)
