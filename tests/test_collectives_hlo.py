"""What the compiled tensor-parallel draft step sends between devices, read from its HLO.

With path "top_tokens" (Opt-2) no collective carries anything vocab-sized: the head's only
collective is one all-gather of int32 (value bits, index) pairs [tp, T, 2]. With path "logits" one
collective carries the full (padded) vocab per row. Everything else in the step is the same for both
paths. The tiny config gets a LARGER vocab (4096) so vocab-sized shapes stand out from D = 64.
Also: the HLO parser (`benchmarks.hlo_collectives`) on hand-written HLO, async forms included.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_mtp
from benchmarks.hlo_collectives import Collective, collectives, total_bytes
from jax_mtp.kernels.vocab_argmax import vocab_parallel_argmax
from jax_mtp import ShardedMtp
from jax_mtp.sharding import TP_AXIS, make_mesh, padded_vocab

VOCAB = 4096
B, T, CAPACITY = 1, 4, 8  # capacity > tiny index_topk (4): the DSA indexer runs


@pytest.fixture(scope="module")
def step_collectives():
  """(tp, path) -> the collectives of the compiled draft step (compiled once per pair)."""
  cfg = jax_mtp.tiny(vocab_size=VOCAB)
  params = jax_mtp.init_params(cfg, jax.random.key(0))
  ids_BT = jnp.zeros((B, T), jnp.int32)
  positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  prev_hidden_BTD = jnp.zeros((B, T, cfg.hidden_size), jnp.float32)
  caches = jax_mtp.init_caches(cfg, B, CAPACITY)

  @functools.cache
  def step(tp: int, path: str) -> list[Collective]:
    sharded = ShardedMtp(cfg, make_mesh(tp))
    lowered = sharded.compiled_step(0, None, path).lower(sharded.shard(params), ids_BT, positions_BT,
                                                         prev_hidden_BTD, caches)
    return collectives(lowered.compile().as_text())

  return step


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_top_tokens_path_has_no_vocab_sized_collective(step_collectives, tp):
  """No collective in the Opt-2 step has a dimension ≥ vocab/tp; the head's one collective is an
  all-gather of int32 pairs [tp, B·T, 2] = tp·T·2·4 bytes."""
  found = step_collectives(tp, "top_tokens")
  assert found, "expected the step's psums and the pair all-gather"
  big = [c for c in found if max(c.shape, default=0) >= VOCAB // tp]
  assert not big, f"vocab-sized collectives in the top_tokens path: {big}"
  pairs = [c for c in found if c.dtype == "s32"]
  assert pairs == [Collective("all-gather", "s32", (tp, B * T, 2), tp * B * T * 2 * 4)], found


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_logits_path_gathers_the_full_vocab(step_collectives, tp):
  """The full-logits step carries ≥ vocab elements per row in at least one collective (the padded
  vocab all-gather, fp32), and its other collectives are exactly the top_tokens step's others."""
  found = step_collectives(tp, "logits")
  vocab_sized = [c for c in found if c.shape and c.shape[-1] >= VOCAB]
  assert vocab_sized, f"no vocab-sized collective in the logits path: {found}"
  vp = padded_vocab(jax_mtp.tiny(vocab_size=VOCAB), tp)
  assert vocab_sized == [Collective("all-gather", "f32", (B, T, vp), B * T * vp * 4)]
  others = [c for c in found if c not in vocab_sized]
  assert others == [c for c in step_collectives(tp, "top_tokens") if c.dtype != "s32"]
  assert total_bytes(vocab_sized) > 100 * tp * B * T * 2 * 4


@pytest.mark.parametrize("tp", [2, 8])
def test_vocab_parallel_argmax_alone_is_one_small_all_gather(tp):
  """The kernel on its own compiles to exactly one collective: all-gather s32 [tp, T, 2]."""
  t, vs, d = 3, 128, 16

  def per_shard(h_TD, head_shard_VD):
    return vocab_parallel_argmax(h_TD, head_shard_VD, vocab_size=vs * tp - 5, axis_name=TP_AXIS)

  fn = jax.jit(jax.shard_map(per_shard, mesh=make_mesh(tp), in_specs=(P(), P(TP_AXIS, None)), out_specs=P(),
                             check_vma=False))
  hlo = fn.lower(np.zeros((t, d), np.float32), np.zeros((vs * tp, d), np.float32)).compile().as_text()
  assert collectives(hlo) == [Collective("all-gather", "s32", (tp, t, 2), tp * t * 2 * 4)]


# ---------------------------------------------------------------- the parser itself

HAND_WRITTEN_HLO = """
HloModule m, entry_computation_layout={(f32[4,128]{1,0})->f32[32,128]{1,0}}

%region_1.2 (a: f32[], b: f32[]) -> f32[] {
  ROOT %add = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[4,128]) -> f32[32,128] {
  %psum.21 = f32[1,4,64]{2,1,0} all-reduce(%fusion), channel_id=1, replica_groups=mesh['tp'=2] {'tp'}, to_apply=%region_1.2, metadata={op_name="jit(f)/all-gather(" }
  %all_gather.7 = s32[8,4,2]{2,1,0} all-gather(%c), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}
  %ar-tuple = (bf16[16]{0}, f32[2,3]{1,0:T(8,128)}) all-reduce(bf16[16]{0} %x, f32[2,3]{1,0} %y), replica_groups={{0,1}}, to_apply=%region_1.2
  %ags = (f32[4,128]{1,0}, f32[32,128]{1,0}) all-gather-start(f32[4,128]{1,0} %p), dimensions={0}
  %agd = f32[32,128]{1,0} all-gather-done((f32[4,128]{1,0}, f32[32,128]{1,0}) %ags)
  %cps = (u8[10]{0}, u8[10]{0}, u32[], u32[]) collective-permute-start(u8[10]{0} %q), source_target_pairs={{0,1},{1,0}}
  %cpd = u8[10]{0} collective-permute-done(%cps)
  %ars = f8e4m3fn[7,8]{1,0} all-reduce-start(f8e4m3fn[7,8]{1,0} %z), to_apply=%region_1.2
  %ard = f8e4m3fn[7,8]{1,0} all-reduce-done(%ars)
  %rs = f32[<=16,4]{1,0} reduce-scatter(f32[128,4]{1,0} %w), dimensions={0}, to_apply=%region_1.2
  %a2a = pred[8]{0} all-to-all(pred[8]{0} %v), dimensions={0}
  %not_a_collective = f32[4]{0} fusion(%all-reduce.1), kind=kLoop, calls=%all-gather.fused
  ROOT %copy = f32[32,128]{1,0} copy(%agd)
}
"""


def test_parser_reads_every_collective_once_by_opcode():
  """Sync and `-start` forms, tuple results (one entry per output), layouts with tiling, dynamic
  dims, fp8; `-done` halves, instruction names and metadata that mention collectives are ignored."""
  assert collectives(HAND_WRITTEN_HLO) == [
      Collective("all-reduce", "f32", (1, 4, 64), 1024),
      Collective("all-gather", "s32", (8, 4, 2), 256),
      Collective("all-reduce", "bf16", (16,), 32),
      Collective("all-reduce", "f32", (2, 3), 24),
      Collective("all-gather-start", "f32", (32, 128), 16384),
      Collective("collective-permute-start", "u8", (10,), 10),
      Collective("all-reduce-start", "f8e4m3fn", (7, 8), 56),
      Collective("reduce-scatter", "f32", (16, 4), 256),
      Collective("all-to-all", "pred", (8,), 8),
  ]


def test_parser_on_a_program_without_collectives():
  hlo = jax.jit(lambda x: x * 2).lower(np.zeros(4, np.float32)).compile().as_text()
  assert collectives(hlo) == []
