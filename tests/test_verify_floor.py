"""benchmarks.verify_forward's floors on the tiny config's shapes (jax.eval_shape: no weights made): the roofline
floor is the weights floor plus the caches' bytes when FLOPs cost nothing, the forward's FLOP count when bytes cost
nothing, and never below the weights floor. A row's time is the median of its timed runs, printed with their spread."""

import math

import jax
import pytest

import jax_mtp
from benchmarks.verify_forward import floor_bytes, roofline_seconds
from jax_mtp.model import init_target_params

CFG = jax_mtp.tiny().replace(num_hidden_layers=3, first_k_dense_replace=1)  # 1 dense + 2 MoE layers, fp32
PARAMS = jax.eval_shape(lambda: init_target_params(CFG, jax.random.key(0)))
TOUCHED = [5, 8]  # of 8 routed experts, per MoE layer


def _floor_bytes(touched):
  return floor_bytes(jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), PARAMS), CFG, touched)


@pytest.mark.parametrize("visible", [3, 40], ids=["a cache within top-k (no index scores)", "top-k of 40 positions"])
def test_with_free_flops_the_roofline_is_the_weights_and_the_caches_bytes(visible):
  batch, width = 3, 4
  c, r, j = CFG.kv_lora_rank, CFG.qk_rope_head_dim, CFG.index_head_dim
  entry, key = (c + r) * 4, j * 4  # fp32 caches: the latent and rope key; the indexer's key
  k = min(CFG.index_topk, visible)
  caches = CFG.num_hidden_layers * batch * (k * entry + (visible * key if visible > CFG.index_topk else 0))
  got = roofline_seconds(PARAMS, CFG, batch, width, visible, TOUCHED, bandwidth=1.0, peak=math.inf)
  assert got == pytest.approx(_floor_bytes(TOUCHED) + caches, rel=1e-12)


def test_with_free_bytes_the_roofline_counts_the_forwards_flops():
  batch, width, visible = 2, 4, 40
  tokens = batch * width
  d, f, e_top = CFG.hidden_size, CFG.moe_intermediate_size, CFG.num_experts_per_tok
  leaves = [x for path, x in jax.tree_util.tree_leaves_with_path(PARAMS) if path[0].key != "embed_tokens"]
  matrices = sum(math.prod(x.shape) for x in leaves if len(x.shape) == 2)  # the head and every dense linear
  experts = 2 * 3 * e_top * d * f  # 2 MoE layers × gate, up, down, one expert an assignment
  c, r, n = CFG.kv_lora_rank, CFG.qk_rope_head_dim, CFG.num_attention_heads
  attention = CFG.num_hidden_layers * n * CFG.index_topk * (2 * c + r)
  scores = CFG.num_hidden_layers * CFG.index_n_heads * visible * CFG.index_head_dim
  want = 2 * tokens * (matrices + experts + attention + scores)
  assert roofline_seconds(PARAMS, CFG, batch, width, visible, TOUCHED, bandwidth=math.inf, peak=1.0) == want


@pytest.mark.parametrize("batch", [1, 64])
def test_the_roofline_is_never_below_the_weights_floor(batch):
  got = roofline_seconds(PARAMS, CFG, batch, 4, 40, TOUCHED, bandwidth=4e12, peak=8e14)
  assert got >= _floor_bytes(TOUCHED) / 4e12


def test_a_row_is_the_median_of_its_runs_with_their_spread(capsys):
  """A row of `python -m benchmarks.verify_forward` (the tiny preset's widths, two layers, on this host): its time is
  the median of --repeats timed runs from one compile, printed with the runs' min–max, and the median lies inside."""
  from benchmarks.verify_forward import main  # noqa: PLC0415
  assert main(["--small", "--layers", "2", "--batch", "2", "--capacity", "128", "--iters", "1", "--repeats", "3",
               "--forms", "absorbed"]) == 0
  header, _, row = capsys.readouterr().out.strip().splitlines()[-3:]
  assert "ms (median of 3 runs) | min–max ms" in header
  cells = [c.strip() for c in row.strip("|").split("|")]
  median, (low, high) = float(cells[6]), map(float, cells[7].split("–"))
  assert low <= median <= high and cells[-1] == "True"
