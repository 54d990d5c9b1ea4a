"""The library's entry points refuse what they cannot run with a ValueError naming the argument and value (the
CLI's are test_decode_cli's and test_fuzz's): prompts, stop ids and counts as users write them, params trees of
another config (which Flax would have run silently with the layers it asks for), meshes, impls, cache sizes and the
fused norm's eps. Found by an audit of the API (2026-12-05); each case was a TypeError, a trace error from deep
inside JAX, or a silently wrong result before."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import jax_mtp
from jax_mtp.kernels.fused_allreduce_rmsnorm import fused_allreduce_rmsnorm

CFG = jax_mtp.tiny(vocab_size=16, num_hidden_layers=1)


@pytest.fixture(scope="module")
def speculator():
  spec = jax_mtp.Speculator(CFG, jax_mtp.make_mesh(1), 2)
  target, mtp = jax_mtp.init_target_params(CFG, jax.random.key(0)), jax_mtp.init_params(CFG, jax.random.key(1))
  return spec, target, mtp, spec.shard(target, mtp)


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[1, 2, 3]), "prompt 0 is 1, not a list of token ids: prompts is a list of prompts"),
    (dict(prompts="1,2,3"), "prompts must be a list of prompts, each a list of token ids; got str"),
    (dict(stop_ids=3), "stop_ids=3 must be a list of token ids (one stop id is [id]; none is [])"),
    (dict(stop_ids=[2.7]), "stop id 2.7 is not an integer token id"),
    (dict(capacity=64.0), "capacity=64.0 must be an integer in [9, 640]"),
    (dict(capacity="64"), "capacity='64' must be an integer in [9, 640]"),
    (dict(temperature=True), "temperature=True must be a finite number ≥ 0"),
])
def test_generate_refuses_naming_the_argument(speculator, kwargs, message):
  spec, _, _, params = speculator
  call = {"prompts": [[1, 2, 3]], **kwargs}
  with pytest.raises(ValueError, match=re.escape(message)):
    spec.generate(params, call.pop("prompts"), 4, **call)


def test_numpy_and_jax_scalars_are_the_numbers_they_hold(speculator):
  """Counts and temperatures computed with numpy or jax (np.float32, 0-d jax arrays) decode as the Python numbers
  do (they were refused as "not an integer" / "not a finite number")."""
  spec, _, _, params = speculator
  python = spec.generate(params, [[1, 2, 3]], 4, temperature=0.8, seed=3, capacity=64)
  arrays = spec.generate(params, [[1, 2, 3]], jnp.int32(4), temperature=np.float32(0.8), seed=np.int64(3),
                         capacity=np.int64(64))
  assert arrays.tokens == python.tokens


@pytest.mark.parametrize("tree, message", [
    ("three_layers", "target params do not fit this config at the top level: missing [], extra ['layers_1', "
                     "'layers_2']"),
    ("wrapped", "target params do not fit this config at the top level: missing ['embed_tokens', 'layers_0', "
                "'lm_head', 'norm'], extra ['params']"),
    ("wider", "target params: embed_tokens has shape (16, 128), this config's model takes (16, 64)"),
    ("mtp_of_two_layers", "MTP params do not fit this config at the top level: missing [], extra ['layers_1']"),
])
def test_shard_refuses_params_of_another_config(speculator, tree, message):
  """A 3-layer target's params under a 1-layer config decoded with layer 0 alone, silently (Flax reads only what
  a module asks for); a wrapped tree or another width failed deep in a trace. Every key and shape is checked."""
  spec, target, mtp, _ = speculator
  other = {
      "three_layers": lambda: (jax_mtp.init_target_params(CFG.replace(num_hidden_layers=3), jax.random.key(0)), mtp),
      "wrapped": lambda: ({"params": target}, mtp),
      "wider": lambda: (jax_mtp.init_target_params(CFG.replace(hidden_size=128), jax.random.key(0)), mtp),
      "mtp_of_two_layers": lambda: (target, jax_mtp.init_params(CFG.replace(num_hidden_layers=2,
                                                                            num_nextn_predict_layers=2),
                                                                jax.random.key(1))),
  }[tree]
  with pytest.raises(ValueError, match=re.escape(message)):
    spec.shard(*other())


def test_fp8_trees_pass_the_check():
  """An FP8 weight kept as stored has its weight's shape and a `_scale_inv` sibling: not an extra key."""
  from jax_mtp import fp8  # noqa: PLC0415
  cfg = jax_mtp.tiny(hidden_size=128, moe_intermediate_size=128, intermediate_size=128)
  target = fp8.as_checkpoint_fp8(jax_mtp.init_target_params(cfg, jax.random.key(0)), (128, 128), fp8.quantize)
  mtp = fp8.as_checkpoint_fp8(jax_mtp.init_params(cfg, jax.random.key(1)), (128, 128), fp8.quantize)
  assert fp8.fp8_paths(target) and fp8.fp8_paths(mtp)
  jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), 1).shard(target, mtp)


def test_meshes_and_impls_are_checked_where_a_model_is_built():
  one = np.asarray(jax.devices()[:1])
  with pytest.raises(ValueError, match=re.escape("has no 'tp' axis: build it with jax_mtp.make_mesh(tp)")):
    jax_mtp.Speculator(CFG, Mesh(one, ("model",)), 2)
  with pytest.raises(ValueError, match=re.escape("mesh=None has no 'tp' axis")):
    jax_mtp.TargetDecoder(CFG, None)
  with pytest.raises(ValueError, match=re.escape("norm_impl='foo' is not one of ('xla', 'pallas_tpu', 'pallas_gpu')")):
    jax_mtp.Speculator(CFG, jax_mtp.make_mesh(1), 2, norm_impl="foo")
  with pytest.raises(ValueError, match=re.escape("tp=2.0 needs an integer 1 ≤ tp ≤")):
    jax_mtp.make_mesh(2.0)
  for impl in ("tokamax_gpu", "tokamax_tpu"):  # the CPU devices run neither (tokamax failed inside its compiler)
    with pytest.raises(ValueError, match=re.escape(f"moe_impl={impl!r} runs on {impl[-3:].upper()}s; this mesh's "
                                                   "devices are cpu")):
      jax_mtp.TargetDecoder(CFG.replace(moe_impl=impl), jax_mtp.make_mesh(1))


def test_cache_sizes_and_the_norms_eps_are_checked():
  for batch, capacity, name in ((1, -1, "capacity=-1"), (1, 0, "capacity=0"), (1.0, 8, "batch=1.0")):
    with pytest.raises(ValueError, match=re.escape(f"{name} must be an integer ≥ 1")):
      jax_mtp.init_caches(CFG, batch, capacity)
  x = jnp.ones((2, 8), jnp.float32)
  for eps in (-1e-6, 0.0, float("nan"), "1e-6"):
    with pytest.raises(ValueError, match=re.escape(f"eps={eps!r} must be a finite number > 0")):
      fused_allreduce_rmsnorm(x, x, jnp.ones(8), eps, axis_name=None)
  with pytest.raises(ValueError, match="x_partial dtype int32 is not a floating dtype"):
    fused_allreduce_rmsnorm(x.astype(jnp.int32), x.astype(jnp.int32), jnp.ones(8), 1e-6, axis_name=None)


def test_the_kernels_references_refuse_operands_that_do_not_agree():
  """The XLA references of the sparse MLA and the index scores (the model's XLA path, and what users compare a
  kernel with) broadcast a query batch of one over a cache of two, silently; they name the shapes now."""
  from jax_mtp.kernels import index_scores, sparse_mla  # noqa: PLC0415
  b, t, n, c, r, s, k = 2, 3, 4, 16, 8, 32, 5
  zeros = lambda *shape: jnp.zeros(shape, jnp.float32)  # noqa: E731
  slots, valid = jnp.zeros((b, t, k), jnp.int32), jnp.ones((b, t, k), bool)
  sparse_mla.reference(zeros(b, t, n, c), zeros(b, t, n, r), zeros(b, s, c), zeros(b, s, r), slots, valid, 1.0)
  with pytest.raises(ValueError, match=re.escape("shapes q_lat (1, 3, 4, 16), q_pe (1, 3, 4, 8), latent (2, 32, 16)")):
    sparse_mla.reference(zeros(1, t, n, c), zeros(1, t, n, r), zeros(b, s, c), zeros(b, s, r), slots, valid, 1.0)
  i, j = 4, 8
  index_scores.reference(zeros(b, t, i, j), zeros(b, s, j), zeros(b, t, i), 1.0)
  with pytest.raises(ValueError, match=re.escape("shapes q (1, 3, 4, 8), k (2, 32, 8), w (1, 3, 4) do not agree")):
    index_scores.reference(zeros(1, t, i, j), zeros(b, s, j), zeros(1, t, i), 1.0)
  with pytest.raises(ValueError, match=re.escape("chunk=0 must be ≥ 1")):
    index_scores.reference(zeros(b, t, i, j), zeros(b, s, j), zeros(b, t, i), 1.0, chunk=0)
