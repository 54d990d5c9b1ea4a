"""benchmarks.e2e.impls_in: what ran for each DSA / experts part, read from a compiled program's HLO text by the
kernels' names (here on hand-made lines naming them as the compiled programs do)."""

from benchmarks.e2e import impls_in
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
  assert got == {"index scores": "XLA", "sparse attention": "XLA", "experts": "gather (XLA)"}
  # our Mosaic kernels are not taken for tokamax's (the experts' check looks for "mosaic" elsewhere)
  assert impls_in(_call(SCORES + "_x"))["experts"] == "gather (XLA)"


def test_the_index_scores_float8_dot_is_read_from_its_name():
  assert impls_in(_call(SCORES))["index scores"] == "Pallas Mosaic GPU kernel"
  assert impls_in(_call(SCORES + FLOAT8_DOT_SUFFIX))["index scores"] == "Pallas Mosaic GPU kernel (float8 × float8)"
