"""jax_mtp.ran_kernels: what ran for each DSA / experts part, read from a compiled program's HLO text by the
kernels' names (on hand-made lines naming them as the compiled programs do), and the dense attention's products
by their operand types (on a program compiled here)."""

import jax
import jax.numpy as jnp
import pytest

from jax_mtp.ran_kernels import NOT_IN_PROGRAM, parts_ran, summary
from jax_mtp.mla import dense_latent_attention
from jax_mtp.kernels.fp8_grouped_matmul_mgpu import KERNEL_NAME as GROUPED_FP8
from jax_mtp.kernels.grouped_matmul_mgpu import KERNEL_NAME as GROUPED16
from jax_mtp.kernels.index_scores_mgpu import FLOAT8_DOT_SUFFIX, KERNEL_NAME as SCORES
from jax_mtp.kernels.sparse_mla_mgpu import FORM_SUFFIXES, KERNEL_NAME as SPARSE
from jax_mtp.kernels.topk_mgpu import KERNEL_NAME as TOPK


def _call(name):
  return f'  %custom-call.1 = bf16[8] custom-call(...), custom_call_target="mosaic_gpu_v2", name="{name}"'


def test_the_sparse_mlas_form_is_read_from_its_name():
  one, two = _call(SPARSE + FORM_SUFFIXES["one set"]), _call(SPARSE + FORM_SUFFIXES["two sets"])
  assert parts_ran(one)["sparse attention"] == "Pallas Mosaic GPU kernel (one set)"
  assert parts_ran(two)["sparse attention"] == "Pallas Mosaic GPU kernel (two sets)"
  # a round: one query a draft step (one set), B · (k + 1) in its verification (two)
  assert parts_ran(f"{two}\n{one}")["sparse attention"] == "Pallas Mosaic GPU kernel (one set + two sets)"


def _scoped(scope):
  return f'  %dot.1 = f32[8,8] dot(%a, %b), metadata={{op_name="jit(round)/layers_1/{scope}/dot_general"}}'


def test_xla_where_the_part_is_held_and_no_kernel_is_named():
  held = "\n".join(map(_scoped, ("index_scores", "topk", "sparse_attention", "routed_experts_gather")))
  got = parts_ran(held)
  assert got == {"index scores": "XLA", "top-k": "XLA", "sparse attention": "XLA", "dense attention": "—",
                 "experts": "gather (XLA)"}
  # our Mosaic kernels are not taken for tokamax's (the experts' check looks for "mosaic" elsewhere)
  for ours in (SCORES + "_x", TOPK):
    assert parts_ran(_call(ours) + "\n" + _scoped("routed_experts_gather"))["experts"] == "gather (XLA)"
  # a round's drafts and its verification may resolve different impls: both are named
  both = _scoped("routed_experts_gather") + "\n" + _scoped("routed_experts_ragged_dot")
  assert parts_ran(both)["experts"] == "gather (XLA) + lax.ragged_dot"


def test_a_part_the_program_does_not_hold_is_said_so():
  """A short request's dense cache runs no indexer and no sparse attention; a dense model has no routed experts."""
  got = parts_ran("  %dot.1 = f32[8,8] dot(...)\n  %gather.2 = bf16[8] gather(...)")
  assert set(got.values()) == {NOT_IN_PROGRAM}


def test_the_summary_shows_programs_that_ran_alike_once():
  same = parts_ran(_scoped("routed_experts_gather"))
  assert summary({"prefill": same, "round": same}) == "prefill and round: experts gather (XLA)"
  assert summary({"prefill": same, "round": parts_ran(_scoped("sparse_attention"))}) == (
      "prefill: experts gather (XLA); round: sparse attention XLA")


def test_the_top_k_kernel_is_read_from_its_name():
  assert parts_ran(_call(TOPK) + "\n" + _scoped("topk"))["top-k"] == "Pallas Mosaic GPU kernel (k-th key)"


def test_the_index_scores_float8_dot_is_read_from_its_name():
  assert parts_ran(_call(SCORES))["index scores"] == "Pallas Mosaic GPU kernel"
  assert parts_ran(_call(SCORES + FLOAT8_DOT_SUFFIX))["index scores"] == "Pallas Mosaic GPU kernel (float8 × float8)"


@pytest.mark.parametrize("cache,form", [("bfloat16", "XLA, 16-bit dots"), ("float32", "XLA, fp32 dots")])
def test_the_dense_attentions_products_are_read_from_a_compiled_program(cache, form):
  """A real program (compiled here for the CPU): the dense absorbed attention over a 16-bit cache puts 16-bit
  operands on its products, over an fp32 one fp32 operands (what a GPU runs on its CUDA cores)."""
  b, t, n, c, r, s = 2, 2, 4, 64, 16, 24
  args = (jnp.ones((b, t, n, c), jnp.float32), jnp.ones((b, t, n, r), cache), jnp.ones((b, s, c), cache),
          jnp.ones((b, s, r), cache), jnp.ones((b, t, s), bool))
  hlo = jax.jit(lambda *a: dense_latent_attention(*a, 0.1)).lower(*args).compile().as_text()
  assert parts_ran(hlo)["dense attention"] == form


def test_tokamax_is_a_mosaic_call_that_is_none_of_ours():
  tokamax = '  %custom-call.2 = bf16[8] custom-call(...), custom_call_target="mosaic_gpu_v2", name="ragged_dot_kernel"'
  assert parts_ran(tokamax)["experts"] == "tokamax (Mosaic GPU)"
  # a kernel module's file name in the text's stack frames is not a call
  assert parts_ran('1 {file_name="jax_mtp/kernels/mosaic_gpu_common.py"}')["experts"] == NOT_IN_PROGRAM


def test_the_experts_kernels_of_ours_are_read_from_their_names():
  """Our two grouped matmuls (FP8 codes, 16-bit weights) are Mosaic GPU calls too: named as ours, not as tokamax."""
  assert parts_ran(_call(GROUPED16))["experts"] == "16-bit grouped matmul (Pallas Mosaic GPU)"
  assert parts_ran(_call(GROUPED_FP8))["experts"] == "FP8 grouped matmul (Pallas Mosaic GPU)"
