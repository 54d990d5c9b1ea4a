"""tokamax's Mosaic-GPU grouped matmul as the routed experts (impl "tokamax_gpu"), and ours over 16-bit weights
(impl "mosaic_gpu", kernels/grouped_matmul_mgpu.py), on a GPU.

Skipped where no GPU is present (the kernel's lowering asks the device for its architecture, so it
cannot be lowered for an abstract CUDA device on a CPU host). Run by benchmarks/h200_session.sh.
"""

import functools

import jax
import numpy as np
import pytest

import jax_mtp
from jax_mtp.experts import resolve_expert_impl, routed_experts
from jax_mtp.kernels.grouped_matmul_mgpu import KERNEL_NAME as GROUPED_KERNEL
from tests.test_experts import _experts_loop, _loud_experts, _problem, mtp_layer_drafts
from tests.tolerances import assert_close

pytestmark = pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="needs a GPU (tokamax Mosaic-GPU kernel)")


@pytest.mark.parametrize("impl,t,k,e,d,f", [
    *[(impl, *shape) for impl in ("tokamax_gpu", "mosaic_gpu")
      for shape in ((1, 8, 16, 256, 128), (3, 2, 16, 256, 128), (17, 4, 32, 512, 256), (64, 8, 32, 256, 128))],
    ("tokamax_gpu", 5, 2, 8, 64, 32)])
def test_kernels_equal_ragged_dot_and_a_loop(impl, t, k, e, d, f):
  """Awkward shapes included (F < 64 for tokamax, T·K not a multiple of 8, T < K); other devices' assignments
  mixed in. Dims a kernel cannot take are refused before it runs (tests/test_experts.py)."""
  x, ids, weights, w = _problem("bfloat16", t, k, e, d=d, f=f, seed=t)
  fast = jax.jit(functools.partial(routed_experts, impl))(x, ids, weights, *w)
  xla = jax.jit(functools.partial(routed_experts, "ragged_dot"))(x, ids, weights, *w)
  assert_close(fast, xla, "bfloat16", what=f"{impl} vs ragged_dot")
  assert_close(fast, _experts_loop(x, np.asarray(ids), np.asarray(weights), *w), "bfloat16", what="vs loop")


def test_kernel_is_in_the_compiled_program():
  x, ids, weights, w = _problem("bfloat16", 9, 4, 16, d=256, f=128)

  def compiled(impl):
    return jax.jit(functools.partial(routed_experts, impl)).lower(x, ids, weights, *w).compile().as_text()

  assert compiled("tokamax_gpu").count("mosaic_gpu") >= 3  # gate, up, down
  assert compiled("mosaic_gpu").count(GROUPED_KERNEL) >= 3
  assert "mosaic_gpu" not in compiled("ragged_dot")
  assert resolve_expert_impl("auto", jax.default_backend(), 9, 4, w[0]) == "tokamax_gpu"


@pytest.mark.parametrize("impl", ["tokamax_gpu", "mosaic_gpu"])
def test_mtp_layer_same_hidden_and_drafts_as_ragged_dot(impl):
  """The MTP layer with its routed experts loud enough to matter (`_loud_experts`: at init scale no draft depends on
  them): the same hidden states within bf16's tolerance, the same drafts."""
  cfg = jax_mtp.tiny().replace(dtype="bfloat16", param_dtype="bfloat16", hidden_size=256, moe_intermediate_size=128)
  params = _loud_experts(jax_mtp.init_params(cfg, jax.random.key(0)))
  hidden, fast = mtp_layer_drafts(cfg, params, impl, 4)
  hidden_xla, xla = mtp_layer_drafts(cfg, params, "ragged_dot", 4)
  assert_close(hidden, hidden_xla, "bfloat16", what=f"MTP hidden, {impl} vs ragged_dot")
  np.testing.assert_array_equal(np.asarray(fast), np.asarray(xla))
