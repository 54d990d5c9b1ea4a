"""benchmarks.e2e.impls_in: what ran for each DSA / experts part, read from a compiled program's HLO text by the
kernels' names (on hand-made lines naming them as the compiled programs do), and the dense attention's products
by their operand types (on a program compiled here)."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.e2e import impls_in
from jax_mtp.mla import dense_latent_attention
from jax_mtp.kernels.index_scores_mgpu import FLOAT8_DOT_SUFFIX, KERNEL_NAME as SCORES
from jax_mtp.kernels.sparse_mla_mgpu import FORM_SUFFIXES, KERNEL_NAME as SPARSE


def _call(name):
  return f'  %custom-call.1 = bf16[8] custom-call(...), custom_call_target="mosaic_gpu_v2", name="{name}"'


def test_the_sparse_mlas_form_is_read_from_its_name():
  one, two = _call(SPARSE + FORM_SUFFIXES["one set"]), _call(SPARSE + FORM_SUFFIXES["two sets"])
  assert impls_in(one)["sparse attention"] == "Pallas Mosaic GPU kernel (one set)"
  assert impls_in(two)["sparse attention"] == "Pallas Mosaic GPU kernel (two sets)"
  # a round: one query a draft step (one set), B · (k + 1) in its verification (two)
  assert impls_in(f"{two}\n{one}")["sparse attention"] == "Pallas Mosaic GPU kernel (one set + two sets)"


def test_xla_where_no_kernel_is_named():
  got = impls_in("  %dot.1 = f32[8,8] dot(...)\n  %gather.2 = bf16[8] gather(...)")
  assert got == {"index scores": "XLA", "sparse attention": "XLA", "dense attention": "—", "experts": "gather (XLA)"}
  # our Mosaic kernels are not taken for tokamax's (the experts' check looks for "mosaic" elsewhere)
  assert impls_in(_call(SCORES + "_x"))["experts"] == "gather (XLA)"


def test_the_index_scores_float8_dot_is_read_from_its_name():
  assert impls_in(_call(SCORES))["index scores"] == "Pallas Mosaic GPU kernel"
  assert impls_in(_call(SCORES + FLOAT8_DOT_SUFFIX))["index scores"] == "Pallas Mosaic GPU kernel (float8 × float8)"


@pytest.mark.parametrize("cache,form", [("bfloat16", "XLA, 16-bit dots"), ("float32", "XLA, fp32 dots")])
def test_the_dense_attentions_products_are_read_from_a_compiled_program(cache, form):
  """A real program (compiled here for the CPU): the dense absorbed attention over a 16-bit cache puts 16-bit
  operands on its products, over an fp32 one fp32 operands (what a GPU runs on its CUDA cores)."""
  b, t, n, c, r, s = 2, 2, 4, 64, 16, 24
  args = (jnp.ones((b, t, n, c), jnp.float32), jnp.ones((b, t, n, r), cache), jnp.ones((b, s, c), cache),
          jnp.ones((b, s, r), cache), jnp.ones((b, t, s), bool))
  hlo = jax.jit(lambda *a: dense_latent_attention(*a, 0.1)).lower(*args).compile().as_text()
  assert impls_in(hlo)["dense attention"] == form
