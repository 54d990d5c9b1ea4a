"""The DSA top-k's k-th key on Pallas Mosaic GPU (kernels/topk_mgpu.py): equal to a sort's k-th key and to XLA's
radix passes on awkward rows (ties, negative and −inf scores, fewer visible slots than k, none visible, k = 1 and
k = S), in Pallas's GPU interpreter; the model's top-k through it picks lax.top_k's slots; lowered for CUDA; `auto`
and explicit choices resolved with the offending value named. On a GPU the same cases run compiled, and V3.2's
verification shape too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp import topk
from jax_mtp.cache import causal_mask
from jax_mtp.kernels.topk_mgpu import (COUNT_FORMS, KERNEL_NAME, MAX_SLOTS, Config, config_for,
                                      kth_key_and_tie_cutoff_mgpu, kth_key_mgpu, reference, reference_tie_cutoff)
from tests.greedy import plain_and_speculative
from tests.lowered_step import mtp_step_module

ON_GPU = jax.devices()[0].platform == "gpu"


def _row(b, t, s, seed):
  """Scores with ties (every 7th slot 0.5), a run of equal negatives, an −inf, and positions from none visible (−1)
  to all."""
  rng = np.random.default_rng(seed)
  scores = rng.standard_normal((b, t, s)).astype(np.float32)
  scores[:, :, ::7] = 0.5
  scores[0, 0, :50] = -3.0
  scores[-1, -1, 3] = -np.inf
  positions = rng.integers(-1, s, (b, t)).astype(np.int32)
  positions.flat[0] = s - 1
  positions.flat[-1] = -1 if b * t > 1 else s - 1
  return jnp.asarray(scores), jnp.asarray(positions)


# Rows the chunk does not divide (1,152 / 640 / 1,408 slots: a last step over padding beyond the row), each count form
# (packed: two counts an int32, the default; separate; packed_lazy) and both pass forms (a loop, the default; unrolled)
@pytest.mark.parametrize("b,t,s,k,config", [
    (1, 1, 128, 1, Config()), (2, 3, 384, 64, Config(chunk=128)), (1, 4, 1152, 1152, Config()),
    (3, 2, 1024, 100, Config(chunk=256)), (2, 2, 2048, 2048, Config()), (1, 2, 8192, 700, Config()),
    (2, 1, 8192, 2048, Config(chunk=1024)), (3, 2, 640, 90, Config(chunk=256, counts="separate")),
    (2, 2, 1408, 300, Config(chunk=512)), (2, 3, 1152, 200, Config(counts="packed_lazy")),
    (2, 2, 1408, 300, Config(chunk=512, passes="unrolled"))])
def test_kth_key_equals_the_sort_and_the_radix_passes(b, t, s, k, config):
  scores, positions = _row(b, t, s, s + k)
  got = kth_key_mgpu(scores, positions, k, config=config, interpret=not ON_GPU)
  _assert_sorts_and_radix_passes_kth(got, scores, positions, k)


def _assert_sorts_and_radix_passes_kth(got, scores, positions, k):
  np.testing.assert_array_equal(np.asarray(got), np.asarray(reference(scores, positions, k)))
  keys = topk.order_keys(scores, causal_mask(positions, scores.shape[-1]))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(topk.kth_key_sibling_reductions(keys, k)))


def test_packed_counts_past_the_sign_bit():
  """33,024 positive scores (the CLI's capacity for a 32K prompt), all visible: every key is at or above the first
  pass's second candidate, so its count (33,024 ≥ 2^15) fills the packed int32's high half past the sign bit; the
  logical shift reads it back, and the k-th key and tie cutoff are still a sort's."""
  s = 33024
  scores = jnp.asarray((1.0 + np.random.default_rng(0).random((1, 1, s))).astype(np.float32))
  positions = jnp.full((1, 1), s - 1, jnp.int32)
  kth, cutoff = kth_key_and_tie_cutoff_mgpu(scores, positions, 2048, interpret=not ON_GPU)
  np.testing.assert_array_equal(np.asarray(kth), np.asarray(reference(scores, positions, 2048)))
  np.testing.assert_array_equal(np.asarray(cutoff), np.asarray(reference_tie_cutoff(scores, positions, 2048)))


def _tied_rows(b, t, s, seed):
  """`_row`'s scores with more ties (every 3rd slot 0.5, so the k-th key is often 0.5 with some of its ties dropped);
  a query seeing only 6 slots (fewer than k: its ties are −inf's keys, the invisible slots after a visible −inf);
  and one seeing every slot, all −inf but 3 (−inf's key with visible ties dropped: the kernel's binary search)."""
  scores, positions = _row(b, t, s, seed)
  scores, positions = scores.at[..., ::3].set(0.5).reshape(b * t, s), positions.reshape(-1)
  scores, positions = scores.at[1, 2].set(-np.inf), positions.at[1].set(5)
  if b * t > 2:
    scores, positions = scores.at[2, 3:].set(-np.inf), positions.at[2].set(s - 1)
  return scores.reshape(b, t, s), positions.reshape(b, t)


@pytest.mark.parametrize("b,t,s,k,config", [
    (2, 3, 384, 64, Config(chunk=128)), (1, 4, 1024, 1024, Config()), (2, 2, 2048, 700, Config()),
    (3, 2, 512, 90, Config(chunk=128)), (3, 2, 640, 90, Config(chunk=256)), (3, 2, 1152, 300, Config()),
    (2, 3, 384, 64, Config(chunk=128, counts="separate")), (3, 2, 640, 90, Config(chunk=256, counts="packed_lazy")),
    (3, 2, 640, 90, Config(chunk=256, passes="unrolled"))])
def test_the_tie_cutoff_is_the_last_tied_slot_kept(b, t, s, k, config):
  """The kernel's tie cutoff is the reference's (the (k − above)-th tied slot, S where every tie is kept) on rows
  whose k-th key has ties dropped, rows with fewer visible slots than k, visible −inf scores, none visible and
  k = S; its k-th key is still a sort's."""
  scores, positions = _tied_rows(b, t, s, s + k)
  kth, cutoff = kth_key_and_tie_cutoff_mgpu(scores, positions, k, config=config, interpret=not ON_GPU)
  want = np.asarray(reference_tie_cutoff(scores, positions, k))
  np.testing.assert_array_equal(np.asarray(kth), np.asarray(reference(scores, positions, k)))
  np.testing.assert_array_equal(np.asarray(cutoff), want)
  assert (want < s).any() or k == s  # the search ran for some row (at k = S every tie is kept)


def test_selection_by_the_tie_cutoff_equals_xlas_radix_select():
  """With the kernel's tie cutoff, XLA's compaction takes one scan and lists exactly the radix select's slots in its
  order; so does the reference's cutoff through the same compaction (the reference's own check)."""
  scores, positions = _tied_rows(2, 3, 512, 5)
  visible = causal_mask(positions, 512)
  want = topk.topk_selection_radix(scores, visible, 40)
  got = topk.topk_selection_kernel(scores, positions, 40, tie_cutoff=True, interpret=not ON_GPU)
  by_reference = topk.select_by_tie_cutoff(topk.order_keys(scores, visible), visible, reference(scores, positions, 40),
                                           reference_tie_cutoff(scores, positions, 40), 40)
  for selection in (got, by_reference):
    np.testing.assert_array_equal(np.asarray(selection.slots_BTK), np.asarray(want.slots_BTK))
    np.testing.assert_array_equal(np.asarray(selection.valid_BTK), np.asarray(want.valid_BTK))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
def test_no_shared_memory_race():
  """The GPU interpreter's race detector (every shared-memory access, the copy out included, the tie cutoff's
  search too) finds no unordered access over several loop steps and a last step over padding beyond the row (640
  slots in chunks of 256: the padding's stores too); it raises at the first race."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  scores, positions = _row(2, 1, 640, 3)
  detect = plgpu.InterpretGPUParams(detect_races=True)
  got = kth_key_mgpu(scores, positions, 40, config=Config(chunk=256), interpret=detect)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(reference(scores, positions, 40)))
  scores, positions = _tied_rows(1, 3, 640, 3)
  _, cutoff = kth_key_and_tie_cutoff_mgpu(scores, positions, 40, config=Config(chunk=256), interpret=detect)
  np.testing.assert_array_equal(np.asarray(cutoff), np.asarray(reference_tie_cutoff(scores, positions, 40)))


@pytest.mark.skipif(not ON_GPU, reason="V3.2's verification shape, compiled (256 rows of 32K slots: in the "
                                       "interpreter, far past the CPU suite's budget)")
@pytest.mark.parametrize("b,t,s,config", [
    (64, 4, 32768, Config()), (1, 1, 4608, Config()), (8, 4, 49152, Config()), (64, 4, 32768, Config(chunk=512)),
    (1, 1, 4608, Config(chunk=512)), (8, 4, 49152, Config(chunk=512)), (16, 4, 33280, Config()),
    (1, 2048, 33280, Config()), (64, 4, 32768, Config(counts="separate")), (64, 4, 33024, Config(counts="packed_lazy")),
    (64, 4, 4864, Config()), (64, 4, 4864, Config(passes="unrolled"))])
def test_kth_key_at_v32_shapes_on_the_gpu(b, t, s, config):
  """Verification's rows over 4,608 / 32K / 48K slots, and over the CLI's 33,280 and 4,864 slots for 32K and 4K
  prompts (a last step over padding beyond the row) as verification and as a prefill chunk's 2,048 queries, the
  passes a loop and unrolled; tie cutoffs too."""
  scores, _ = _row(b, t, s, 0)
  positions = jnp.asarray(np.random.default_rng(1).integers(s // 2, s, (b, t)), jnp.int32).at[0, 0].set(s - 1)
  got = jax.jit(lambda x, p: kth_key_mgpu(x, p, 2048, config=config))(scores, positions)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(reference(scores, positions, 2048)))
  _, cutoff = jax.jit(lambda x, p: kth_key_and_tie_cutoff_mgpu(x, p, 2048, config=config))(scores, positions)
  np.testing.assert_array_equal(np.asarray(cutoff), np.asarray(reference_tie_cutoff(scores, positions, 2048)))


@pytest.mark.parametrize("b,t,s,k", [(2, 3, 384, 64), (1, 2, 256, 300)])
def test_model_top_k_through_the_kernel_picks_lax_top_ks_slots(b, t, s, k):
  """`topk.select_topk` with topk_impl="mosaic_gpu" (the interpreter here) picks lax.top_k's slots, ties to the
  lowest, invalid fillers where fewer than k are visible, k > S clipped to S."""
  scores, positions = _row(b, t, s, 7)
  cfg = jax_mtp.tiny().replace(index_topk=k, topk_impl="mosaic_gpu")
  got = topk.select_topk(cfg, scores, positions)
  want = topk.topk_selection(scores, causal_mask(positions, s), k)
  np.testing.assert_array_equal(np.sort(np.asarray(got.slots_BTK), -1), np.sort(np.asarray(want.slots_BTK), -1))
  np.testing.assert_array_equal(np.asarray(got.mask(s)), np.asarray(want.mask(s)))


def test_speculative_equals_plain_greedy_through_the_kernel():
  """A tiny DSA model at a 256-slot cache (> index_topk: the indexer selects) with the top-k's k-th key in the
  kernel (the interpreter here): speculative decoding gives plain greedy decoding's tokens, and the plain tokens
  are those of XLA's top-k."""
  cfg = jax_mtp.tiny(topk_impl="mosaic_gpu")
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(7))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(8))
  prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8]]
  plain, result = plain_and_speculative(cfg, target_params, mtp_params, prompts, 6, capacity=256)
  assert result.tokens == plain
  xla, _ = plain_and_speculative(cfg.replace(topk_impl="xla"), target_params, mtp_params, prompts, 6, capacity=256)
  assert plain == xla


def test_the_kernel_is_in_the_lowered_step_when_asked_for():
  cfg = jax_mtp.tiny(dtype="bfloat16", param_dtype="bfloat16", topk_impl="mosaic_gpu")
  assert KERNEL_NAME in mtp_step_module(cfg, "cuda", 2, 512)
  assert KERNEL_NAME not in mtp_step_module(cfg.replace(topk_impl="auto"), "cuda", 2, 512)  # 2 queries: XLA's
  assert KERNEL_NAME in mtp_step_module(cfg.replace(topk_impl="auto"), "cuda", 64, 512)  # 64: the kernel


@pytest.mark.parametrize("kernel,counts,passes", [(kth_key_mgpu, "packed", "loop")] + [
    (kth_key_and_tie_cutoff_mgpu, counts, "loop") for counts in COUNT_FORMS] + [
    (kth_key_and_tie_cutoff_mgpu, "packed", "unrolled")])
def test_lowered_for_cuda_names_the_kernel(kernel, counts, passes):
  """The kernel lowers for CUDA (Mosaic GPU's own checks: layouts, barriers) in each form, over the CLI's 33,024
  slots for a 32K prompt (a last step over padding beyond the row)."""
  fn = jax.jit(lambda x, p: kernel(x, p, 2048, config=Config(counts=counts, passes=passes)))
  args = jax.ShapeDtypeStruct((64, 4, 33024), jnp.float32), jax.ShapeDtypeStruct((64, 4), jnp.int32)
  assert KERNEL_NAME in fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_config_for_takes_the_widest_chunk_reading_at_most_an_eighth_more():
  """A row the chunk does not divide ends in one step over padding, reading more keys: 33,280 slots (the CLI's
  cache for a 32K prompt) take 4,096 (10.8 % more); 4,608 take 1,024 (11.1 %), not 4,096 (78 %)."""
  assert [config_for(s).chunk for s in (32768, 33280, 4608, 1152, 384)] == [4096, 4096, 1024, 256, 128]
  assert config_for(4096, Config(chunk=256)).chunk == 256
  assert config_for(4096).counts == "packed"


@pytest.mark.parametrize("scores,positions,k,config,match", [
    ((1, 1, 256), (1, 1), 8, None, "scores bfloat16: the kernel takes float32 scores"),
    ((1, 2, 256), (1, 1), 8, None, "positions_BT of shape"),
    ((1, 1, 200), (1, 1), 8, None, "not a multiple of 128"),
    ((1, 1, MAX_SLOTS + 1024), (1, 1), 8, None, "MAX_SLOTS"),
    ((1, 1, 384), (1, 1), 8, Config(chunk=512), "chunk=512"),
    ((1, 1, 256), (1, 1), 0, None, "k=0"),
    ((1, 1, 512), (1, 1), 8, Config(chunk=640), "chunk=640"),
    ((1, 1, 512), (1, 1), 8, Config(counts="bytes"), "counts='bytes'"),
    ((1, 1, 512), (1, 1), 8, Config(passes="scan"), "passes='scan'"),
])
def test_operands_it_cannot_take_are_named(scores, positions, k, config, match):
  dtype = jnp.bfloat16 if match.startswith("scores bfloat16") else jnp.float32
  with pytest.raises(ValueError, match=match):
    kth_key_mgpu(jnp.zeros(scores, dtype), jnp.zeros(positions, jnp.int32), k, config=config, interpret=True)


def test_resolve_topk_impl():
  """xla as asked; auto: the kernel only on a Hopper GPU within MAX_SLOTS at the query counts it was timed faster
  at (64 a call and up), else xla; an explicit mosaic_gpu runs where it can (a CPU: the interpreter) and names why where
  it cannot."""
  cfg = jax_mtp.tiny()
  resolve = topk.resolve_topk_impl
  assert resolve(cfg.replace(topk_impl="xla"), "gpu", 4096, queries=256) == "xla"
  assert [resolve(cfg, "gpu", 32768, queries=q) for q in (64, 256, 2048, 8192)] == ["mosaic_gpu"] * 4
  assert [resolve(cfg, "gpu", 32768, queries=q) for q in (None, 4, 32, 63)] == ["xla"] * 4
  assert [resolve(cfg, "cpu", 4096, queries=256), resolve(cfg, "tpu", 4096, queries=256),
          resolve(cfg, "gpu", 4096, queries=256, hopper=False), resolve(cfg, "gpu", 131072, queries=256),
          resolve(cfg, "gpu", 4100, queries=256)] == ["xla"] * 5
  explicit = cfg.replace(topk_impl="mosaic_gpu")
  assert resolve(explicit, "cpu", 4096) == resolve(explicit, "gpu", 4096) == "mosaic_gpu"
  with pytest.raises(ValueError, match="131072 slots exceed MAX_SLOTS"):
    resolve(explicit, "gpu", 131072)
  with pytest.raises(ValueError, match="Hopper"):
    resolve(explicit, "gpu", 4096, hopper=False)


def test_config_rejects_an_unknown_topk_impl():
  with pytest.raises(jax_mtp.config.ConfigError, match="topk_impl='sort'"):
    jax_mtp.tiny().replace(topk_impl="sort")
