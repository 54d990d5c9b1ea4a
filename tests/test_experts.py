"""Routed experts: every implementation that runs on this host (gather, ragged_dot; with FP8 weights also
the FP8 grouped matmul in Pallas interpret mode) equals an independent per-token loop (numpy, fp64) at
the tolerance of the dtype it computes in; the MTP layer and a greedy decode through each impl equal the
same layer and decode with the loop as their experts (hidden states at the fp32 tolerance, token ids
exactly); the "auto" table resolves as documented, and a bad impl is refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp import moe
from jax_mtp.config import ConfigError
from jax_mtp.experts import (MOSAIC_GPU_MIN_ASSIGNMENTS, MOSAIC_GPU_MAX_ROWS_PER_EXPERT, resolve_expert_impl,
                             mosaic_gpu_takes, routed_experts, tokamax_gpu_takes, uses_gathered_experts,
                             uses_mosaic_gpu_experts)
from tests.devices import needs_a_cpu_device
from tests.tolerances import assert_close

CPU_IMPLS = ["gather", "ragged_dot"]  # tokamax_gpu / tokamax_tpu have no CPU form: test_experts_gpu, the AOT tests
FP8_BLOCK = 128  # the FP8 kernel's block (DeepSeek's 128 × 128)


def _experts_loop(x, ids, weights, w_gate, w_up, w_down):
  """Σ_k w[t,k]·down(silu(gate(x))·up(x)) token by token in fp64; ids ≥ E contribute nothing."""
  x, w_gate, w_up, w_down = (np.asarray(jnp.asarray(a, jnp.float32), np.float64) for a in (x, w_gate, w_up, w_down))
  y = np.zeros((x.shape[0], w_down.shape[-1]))
  for t in range(x.shape[0]):
    for k in range(ids.shape[1]):
      e = int(ids[t, k])
      if e >= w_gate.shape[0]:
        continue
      g, u = x[t] @ w_gate[e], x[t] @ w_up[e]
      y[t] += float(weights[t, k]) * ((g / (1 + np.exp(-g)) * u) @ w_down[e])
  return y


def _dequantized(codes, scales):
  """FP8 codes times their 128 × 128 block's scale, in fp64 (the weights the codes stand for)."""
  codes = np.asarray(jnp.asarray(codes, jnp.float32), np.float64)  # e4m3 → fp32 is exact
  return codes * np.repeat(np.repeat(np.asarray(scales, np.float64), FP8_BLOCK, -2), FP8_BLOCK, -1)


def _problem(dtype, t, k, e, d=32, f=24, seed=0, foreign=True):
  rng = np.random.default_rng(seed)
  w = [jnp.asarray(rng.standard_normal(s) / 5, dtype) for s in ((e, d, f), (e, d, f), (e, f, d))]
  x = jnp.asarray(rng.standard_normal((t, d)), dtype)
  ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
  weights = rng.uniform(0.1, 1.0, (t, k)).astype(np.float32)
  if foreign:  # under tp: assignments to another device's expert carry id E and weight 0
    mask = rng.uniform(size=(t, k)) < 0.3
    ids, weights = np.where(mask, e, ids), np.where(mask, 0.0, weights)
  return x, jnp.asarray(ids), jnp.asarray(weights), w


def _fp8_problem(t, k, e, d=256, f=128, seed=0):
  """x, ids, weights as `_problem`'s (fp32 x) and FP8 expert codes with fp32 block scales."""
  x, ids, weights, _ = _problem("float32", t, k, e, d=d, f=f, seed=seed)
  rng = np.random.default_rng(seed + 1)
  codes = [jnp.asarray(rng.standard_normal(s) * 20, jnp.float8_e4m3fn) for s in ((e, d, f), (e, d, f), (e, f, d))]
  scales = tuple(jnp.asarray(rng.uniform(1e-3, 1e-2, (e, c.shape[1] // FP8_BLOCK, c.shape[2] // FP8_BLOCK)),
                             jnp.float32) for c in codes)
  return x, ids, weights, codes, scales


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("t,k,e", [(1, 2, 8), (3, 2, 16), (17, 4, 16), (64, 8, 32)])
def test_impls_equal_a_per_token_loop(impl, dtype, t, k, e):
  x, ids, weights, w = _problem(dtype, t, k, e, seed=t)
  expected = _experts_loop(x, np.asarray(ids), np.asarray(weights), *w)
  actual = jax.jit(routed_experts, static_argnums=0)(impl, x, ids, weights, *w)
  assert actual.dtype == jnp.float32
  # bf16: the hidden [A, F] is rounded to bf16 before the down projection (as the kernel takes it).
  assert_close(actual, expected, dtype, what=f"{impl} vs per-token loop")


# (impl, the dtype it computes in): "gather" and "ragged_dot" dequantise the codes to `dtype`; the FP8 kernel
# multiplies the codes themselves with bf16 activations whatever `dtype` (its rows are rounded to bf16).
FP8_CASES = [("gather", "float32"), ("gather", "bfloat16"), ("ragged_dot", "float32"), ("ragged_dot", "bfloat16"),
             ("fp8_grouped_gpu", "bfloat16"), ("mosaic_gpu", "bfloat16")]


@pytest.mark.parametrize("impl,dtype", FP8_CASES)
@pytest.mark.parametrize("t,k,e", [(3, 2, 6), (9, 4, 8)])
def test_fp8_impls_equal_a_per_token_loop(impl, dtype, t, k, e):
  """FP8 codes + block scales (D = 256, F = 128: two blocks deep; other devices' assignments mixed in): each
  impl, the FP8 kernel in Pallas interpret mode here, vs the loop over the dequantised weights in fp64."""
  x, ids, weights, codes, scales = _fp8_problem(t, k, e, seed=t)
  expected = _experts_loop(x, np.asarray(ids), np.asarray(weights), *map(_dequantized, codes, scales))
  run = jax.jit(lambda *a: routed_experts(impl, *a, fp8_scales=scales, fp8_block=(FP8_BLOCK, FP8_BLOCK),
                                          dtype=jnp.dtype(dtype)))
  actual = run(x, ids, weights, *codes)
  assert actual.dtype == jnp.float32
  assert_close(actual, expected, dtype, what=f"{impl} on FP8 codes ({dtype}) vs per-token loop")


@pytest.mark.parametrize("t,k,e", [(1, 8, 16), (9, 4, 8)])
def test_the_16_bit_kernel_equals_a_per_token_loop(t, k, e):
  """impl "mosaic_gpu" (kernels/grouped_matmul_mgpu.py; in Pallas's interpreter on a CPU, compiled on a GPU) on bf16
  experts of D = 256, F = 128 (two K steps for gate and up), other devices' assignments mixed in."""
  x, ids, weights, w = _problem("bfloat16", t, k, e, d=256, f=128, seed=t)
  actual = jax.jit(routed_experts, static_argnums=0)("mosaic_gpu", x, ids, weights, *w)
  assert actual.dtype == jnp.float32
  assert_close(actual, _experts_loop(x, np.asarray(ids), np.asarray(weights), *w), "bfloat16",
               what="mosaic_gpu vs per-token loop")


def test_the_16_bit_kernel_refuses_what_it_cannot_take():
  x, ids, weights, w = _problem("bfloat16", 3, 2, 8)  # D = 32, F = 24: not multiples of 128
  with pytest.raises(ValueError, match=r"moe_impl='mosaic_gpu' takes bf16/fp16 expert weights .* D=32, F=24"):
    routed_experts("mosaic_gpu", x, ids, weights, *w)
  x, ids, weights, w = _problem("float32", 3, 2, 8, d=256, f=128)
  with pytest.raises(ValueError, match=r"moe_impl='mosaic_gpu' takes bf16/fp16 .* got float32"):
    routed_experts("mosaic_gpu", x, ids, weights, *w)


@pytest.mark.parametrize("row_tile", [8, 128])
def test_row_padding_changes_nothing(row_tile):
  """Rows padded with foreign assignments (to 8s, or to 128 for the TPU kernel) leave y unchanged."""
  from jax_mtp.experts import grouped_experts, grouped_matmul_for
  x, ids, weights, w = _problem("float32", 5, 3, 8, seed=2)  # 15 rows
  padded = grouped_experts(grouped_matmul_for("ragged_dot"), x, ids, weights, *w, row_tile=row_tile)
  assert_close(padded, _experts_loop(x, np.asarray(ids), np.asarray(weights), *w), "float32", what="padded")


def test_every_assignment_foreign_gives_zeros():
  """A device none of whose experts were picked returns exact zeros (no uninitialised rows)."""
  x, _, _, w = _problem("float32", 5, 2, 8)
  ids, weights = jnp.full((5, 2), 8, jnp.int32), jnp.zeros((5, 2), jnp.float32)
  for impl in CPU_IMPLS:
    assert not np.any(np.asarray(routed_experts(impl, x, ids, weights, *w))), impl


@pytest.mark.parametrize("platform,tokens,expected", [
    ("gpu", 1, "tokamax_gpu"), ("gpu", 2048, "tokamax_gpu"),
    ("tpu", 1, "tokamax_tpu"), ("tpu", 4096, "tokamax_tpu"),
    ("cpu", 1, "gather"), ("cpu", 8, "gather"), ("cpu", 9, "ragged_dot"), ("cpu", 256, "ragged_dot"),
])
def test_auto_table(platform, tokens, expected):
  w = jax.ShapeDtypeStruct((256, 7168, 2048), jnp.bfloat16)  # V3.2: K = 8, E = 256
  assert resolve_expert_impl("auto", platform, tokens, 8, w) == expected


@pytest.mark.parametrize("tokens,expected", [(1, "gather"), (256, "ragged_dot")])
def test_auto_on_gpu_keeps_fp32_weights_off_the_kernel(tokens, expected):
  """tokamax's Mosaic-GPU kernel takes 16-bit weights only: fp32 models run as on CPU."""
  assert resolve_expert_impl("auto", "gpu", tokens, 8, jax.ShapeDtypeStruct((256, 64, 32), jnp.float32)) == expected


def test_auto_on_cpu_gathers_small_experts_up_to_2e_assignments():
  """The embedded default's experts (E = 8, K = 2, 256 × 128 fp32): gathered up to T = 8 (measured
  on CPU: faster than ragged_dot to T = 4, within noise to T = 8, and faster speculative rounds at
  k = 4, 5), ragged_dot above; V3.2's (test_auto_table) from T·K > E/4."""
  w = jax.ShapeDtypeStruct((8, 256, 128), jnp.float32)
  assert [resolve_expert_impl("auto", "cpu", t, 2, w) for t in (1, 4, 8, 9)] == ["gather"] * 3 + ["ragged_dot"]


def test_auto_on_tpu_keeps_small_dims_off_the_kernel():
  small = jax.ShapeDtypeStruct((8, 64, 32), jnp.bfloat16)  # tokamax's TPU kernel wants D, F ≥ 128
  assert resolve_expert_impl("auto", "tpu", 1, 2, small) == "gather"
  assert resolve_expert_impl("auto", "tpu", 64, 2, small) == "ragged_dot"


@pytest.mark.parametrize("impl", ["gather", "ragged_dot", "tokamax_gpu", "tokamax_tpu"])
def test_explicit_impl_is_what_runs(impl):
  """An explicit impl is never replaced, also on another platform (AOT compiles for TPU on a CPU host)."""
  assert resolve_expert_impl(impl, "cpu", 1, 8, jax.ShapeDtypeStruct((8, 4, 4), jnp.float32)) == impl


def test_bad_impls_are_refused_by_name():
  assert uses_gathered_experts(1, 2, 8) and not uses_gathered_experts(12, 2, 8)
  assert uses_gathered_experts(8, 2, 8, expert_bytes=2**18) and not uses_gathered_experts(9, 2, 8, expert_bytes=2**18)
  assert not uses_gathered_experts(8, 2, 8, expert_bytes=2**20)  # 16 copies of 1 MiB: over GATHER_BYTES
  w16 = jax.ShapeDtypeStruct((256, 64, 32), jnp.bfloat16)
  with pytest.raises(ValueError, match="moe_impl='dense' is not one of"):
    resolve_expert_impl("dense", "cpu", 1, 8, w16)
  with pytest.raises(ValueError, match="no entry for platform 'metal'"):
    resolve_expert_impl("auto", "metal", 1, 8, w16)
  x, ids, weights, w = _problem("float32", 2, 2, 8)
  with pytest.raises(ValueError, match="needs a resolved impl, got 'auto'"):
    routed_experts("auto", x, ids, weights, *w)
  with pytest.raises(ConfigError, match="moe_impl='triton' is not one of"):
    jax_mtp.tiny().replace(moe_impl="triton")
  with pytest.raises(ValueError, match="'tokamax_gpu' takes bf16/fp16 .* got float32 with D=32, F=24"):
    routed_experts("tokamax_gpu", x, ids, weights, *w)
  x, ids, weights, w = _problem("bfloat16", 2, 2, 8, d=192, f=96)
  with pytest.raises(ValueError, match="'tokamax_gpu' takes .* got bfloat16 with D=192, F=96"):
    routed_experts("tokamax_gpu", x, ids, weights, *w)


@pytest.mark.parametrize("shape,dtype,takes", [
    ((256, 7168, 2048), jnp.bfloat16, True), ((256, 6144, 2048), jnp.float16, True),  # V3.2, GLM-5
    ((8, 64, 32), jnp.bfloat16, True), ((12, 192, 96), jnp.bfloat16, False), ((8, 64, 32), jnp.float32, False)])
def test_what_the_gpu_kernel_takes(shape, dtype, takes):
  """tokamax's kernel under `auto` where it takes the weights, at a prefill chunk's 4,096 tokens (past the 16-bit
  Mosaic kernel's rows an expert)."""
  w = jax.ShapeDtypeStruct(shape, dtype)
  assert tokamax_gpu_takes(w) == takes
  assert (resolve_expert_impl("auto", "gpu", 4096, 8, w) == "tokamax_gpu") == takes


@pytest.mark.parametrize("shape,dtype,takes", [
    ((256, 7168, 2048), jnp.bfloat16, True), ((256, 6144, 2048), jnp.float16, True),  # V3.2, GLM-5
    ((8, 128, 256), jnp.bfloat16, True), ((8, 64, 128), jnp.bfloat16, False), ((8, 128, 192), jnp.bfloat16, False),
    ((8, 128, 128), jnp.float32, False)])
def test_auto_takes_the_16_bit_mosaic_kernel_at_decode_and_verification_sizes(shape, dtype, takes):
  """On a Hopper GPU `auto` runs the 16-bit Mosaic kernel from MOSAIC_GPU_MIN_ASSIGNMENTS (64) assignments to
  MOSAIC_GPU_MAX_ROWS_PER_EXPERT (32) rows an expert, where it takes the weights (16-bit, D and F multiples of 128);
  tokamax's kernel outside that range or where only it takes them; neither on another GPU."""
  w = jax.ShapeDtypeStruct(shape, dtype)
  e, k = shape[0], 8
  assert mosaic_gpu_takes(w) == takes
  assert (MOSAIC_GPU_MIN_ASSIGNMENTS, MOSAIC_GPU_MAX_ROWS_PER_EXPERT) == (64, 32)
  for tokens, inside in [(7, False), (8, True), (4 * e, True), (4 * e + 1, False)]:  # × top-8: 56, 64, 32E, 32E + 8
    assert uses_mosaic_gpu_experts(tokens, k, e) == inside
    otherwise = "tokamax_gpu" if tokamax_gpu_takes(w) else resolve_expert_impl("auto", "cpu", tokens, k, w)
    want = "mosaic_gpu" if inside and takes else otherwise
    assert resolve_expert_impl("auto", "gpu", tokens, k, w) == want, (tokens, shape, dtype)
    assert resolve_expert_impl("auto", "gpu", tokens, k, w, hopper=False) in ("gather", "ragged_dot")
  assert resolve_expert_impl("auto", "tpu", 8, k, w) != "mosaic_gpu"


def mtp_layer_drafts(cfg, params, impl: str, batch: int):
  """(hidden, draft tokens) of the MTP layer with experts `impl` on a fixed batch of 3-token rows."""
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, 3)), jnp.int32)
  hidden = jnp.asarray(rng.standard_normal((batch, 3, cfg.hidden_size)), cfg.dtype)
  positions = jnp.broadcast_to(jnp.arange(3, dtype=jnp.int32), (batch, 3))
  model = jax_mtp.MtpPredictor(cfg.replace(moe_impl=impl))

  def drafts(p):
    out = model.apply({"params": p}, ids, positions, hidden, jax_mtp.init_caches(cfg, batch, 8))
    return out.hidden_BTD, model.apply({"params": p}, out.hidden_BTD, method=model.get_top_tokens)

  return jax.jit(drafts)(params)


def _loop_routed_experts(impl, x_TD, ids_TK, weights_TK, w_gate_EDF, w_up_EDF, w_down_EFD, *, fp8_scales=None,
                         **_):
  """`routed_experts` computed by `_experts_loop` on the host (fp64, returned as fp32): the models' reference."""
  assert fp8_scales is None, "the loop reference takes dequantised weights"
  out = jax.ShapeDtypeStruct(x_TD.shape, jnp.float32)
  return jax.pure_callback(lambda *a: _experts_loop(*a).astype(np.float32), out, x_TD, ids_TK, weights_TK,
                           w_gate_EDF, w_up_EDF, w_down_EFD)


def _loud_experts(params, gain: float = 4.0):
  """`params` with the routed experts' weights × `gain`: at init (normal(0.02)) their output is ~1e-3 of the
  residual stream and no token would depend on them; × 4 on each of the three projections makes it comparable."""
  names = ("w_gate_EDF", "w_up_EDF", "w_down_EFD")
  return {name: _loud_experts(v, gain) if isinstance(v, dict) else v * gain if name in names else v
          for name, v in params.items()}


# The loop reference runs on the host through jax.pure_callback (on a GPU run that needs JAX_PLATFORMS=cuda,cpu;
# with "cuda" alone these failed on the callback, 2026-12-07).
LOOP_ON_THE_HOST = "the per-token loop reference is a jax.pure_callback"


@pytest.fixture(scope="module")
def mtp_reference():
  """(cfg, params, hidden and drafts of the MTP layer with the loop as its experts); fp32 tiny model."""
  needs_a_cpu_device(LOOP_ON_THE_HOST)
  cfg = jax_mtp.tiny()
  params = _loud_experts(jax_mtp.init_params(cfg, jax.random.key(0)))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(moe, "routed_experts", _loop_routed_experts)
    return cfg, params, mtp_layer_drafts(cfg, params, "gather", 2)


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_mtp_layer_equals_the_layer_with_the_loop_as_its_experts(impl, mtp_reference):
  """The whole MTP layer (T = 6 > the gather bound: explicit impls run as asked) vs the loop's: hidden states at
  the fp32 tolerance, draft tokens exactly."""
  cfg, params, (ref_hidden, ref_tokens) = mtp_reference
  hidden, tokens = mtp_layer_drafts(cfg, params, impl, 2)
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref_tokens))
  assert_close(hidden, ref_hidden, cfg.dtype, what=f"MTP hidden, {impl} vs loop")


def target_greedy_tokens(cfg, params, impl: str):
  """(final hidden, greedy next token at every position) of the target over 2 rows of 24 tokens (one forward,
  teacher-forced: the ids a greedy decode's verification compares; 24 > index_topk, so DSA selects)."""
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 24)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(24, dtype=jnp.int32), (2, 24))
  model = jax_mtp.TargetModel(cfg.replace(moe_impl=impl))

  def forward(p):
    hidden = model.apply({"params": p}, tokens, positions, jax_mtp.init_target_caches(cfg, 2, 32)).hidden_BTD
    return hidden, model.apply({"params": p}, hidden, method=model.get_top_tokens)

  return jax.jit(forward)(params)


def test_greedy_tokens_are_the_same_through_every_impl_and_the_loop(monkeypatch):
  """A tiny fp32 target whose routed experts matter (`_loud_experts`): the greedy token ids at all 48 positions
  through gather, ragged_dot and the fp64 loop are identical (hidden states within the fp32 tolerance)."""
  needs_a_cpu_device(LOOP_ON_THE_HOST)
  cfg = jax_mtp.tiny()
  params = _loud_experts(jax_mtp.init_target_params(cfg, jax.random.key(0)))
  runs = {impl: target_greedy_tokens(cfg, params, impl) for impl in CPU_IMPLS}
  monkeypatch.setattr(moe, "routed_experts", _loop_routed_experts)
  ref_hidden, ref_tokens = target_greedy_tokens(cfg, params, "gather")
  for impl, (hidden, tokens) in runs.items():
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref_tokens), err_msg=impl)
    assert_close(hidden, ref_hidden, cfg.dtype, what=f"target hidden, {impl} vs loop")


def test_the_tokamax_kernels_we_name_exist():
  """The installed tokamax has the GPU op at the path experts.py imports it from, and its TPU kernel
  under the implementation name we pass (its GPU kernel itself runs only on a GPU: test_experts_gpu)."""
  from tokamax._src.ops.ragged_dot import api
  from tokamax._src.ops.ragged_dot.pallas_mosaic_gpu import Config, PallasMosaicGpuRaggedDot

  assert "mosaic_tpu" in api.IMPLEMENTATIONS
  Config(block_m=64, block_n=128, block_k=128, num_stages=4, split_k=1, persistent=False)
  assert PallasMosaicGpuRaggedDot.config_cls is Config
