"""Self-check of the torch/HF reference harness in ``tests/hf_reference.py`` (CPU, fp32, a few seconds)."""
import math

import numpy as np
import pytest

from tests import hf_reference as R
from tests.tolerances import assert_close

KINDS = ["deepseek_v32", "deepseek_v3", "glm_moe_dsa"]
B, T, D = 2, 12, 64


def _inputs(seed=0, offset=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    h = rng.standard_normal((B, T, D)).astype(np.float32)
    pos = np.tile(np.arange(T) + offset, (B, 1))
    return x, h, pos


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layer_idx", [0, 1])
def test_decoder_layer_runs_and_is_deterministic(kind, layer_idx):
    cfg = R.tiny_hf_config_dict(kind)
    x, _, pos = _inputs()
    m1, m2 = R.build_hf_decoder_layer(cfg, layer_idx, 0), R.build_hf_decoder_layer(cfg, layer_idx, 0)
    assert hasattr(m1.mlp, "gate") == (layer_idx >= cfg["first_k_dense_replace"])  # MoE vs dense
    r1, r2 = R.run_hf_decoder_layer(m1, cfg, x, pos), R.run_hf_decoder_layer(m2, cfg, x, pos)
    assert r1["out"].shape == r1["attn_out"].shape == (B, T, D)
    for k, v in r1.items():
        np.testing.assert_array_equal(v, r2[k])  # bit-identical
        if v.dtype == np.float32 and k != "index_scores":
            assert np.isfinite(v).all(), k
    assert ("index_mask" in r1) == (kind != "deepseek_v3")
    r3 = R.run_hf_decoder_layer(R.build_hf_decoder_layer(cfg, layer_idx, 1), cfg, x, pos)
    assert np.abs(r3["out"] - r1["out"]).max() > 1e-3


def test_randomised_weights_and_layouts():
    cfg = R.tiny_hf_config_dict("deepseek_v32")
    sd = R.hf_state_dict_numpy(R.build_hf_decoder_layer(cfg, 1, 0))
    assert all(v.dtype == np.float32 for v in sd.values())
    shapes = {
        "self_attn.q_b_proj.weight": (4 * 24, 32), "self_attn.kv_a_proj_with_mqa.weight": (16 + 8, 64),
        "self_attn.kv_b_proj.weight": (4 * 32, 16), "self_attn.indexer.wq_b.weight": (4 * 16, 32),
        "self_attn.indexer.k_norm.bias": (16,), "mlp.experts.gate_up_proj": (8, 64, 64),
        "mlp.experts.down_proj": (8, 64, 32), "mlp.gate.e_score_correction_bias": (8,),
    }
    for k, s in shapes.items():
        assert sd[k].shape == s, k
    for k in ("input_layernorm.weight", "self_attn.indexer.k_norm.weight", "self_attn.q_a_layernorm.weight"):
        assert np.abs(sd[k] - 1).max() > 0.05, k
    assert np.abs(sd["mlp.gate.e_score_correction_bias"]).max() > 0.01
    assert np.abs(sd["self_attn.indexer.k_norm.bias"]).max() > 0.01


@pytest.mark.parametrize("kind", KINDS)
def test_softmax_scale(kind):
    cfg = R.tiny_hf_config_dict(kind)
    attn = R.build_hf_decoder_layer(cfg, 0, 0).self_attn
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    mscale = 0.1 * math.log(40.0) + 1.0 if cfg["rope_scaling"] else 1.0
    assert attn.scaling == pytest.approx(qk**-0.5 * mscale**2, rel=1e-12)


@pytest.mark.parametrize("kind", ["deepseek_v32", "glm_moe_dsa"])
def test_indexer_selection_is_sparse(kind):
    cfg = R.tiny_hf_config_dict(kind)
    x, _, pos = _inputs()
    r = R.run_hf_decoder_layer(R.build_hf_decoder_layer(cfg, 1, 0), cfg, x, pos)
    k = cfg["index_topk"]
    assert k < T and r["topk_indices"].shape == (B, T, k)
    counts = r["index_mask"].sum(-1)
    np.testing.assert_array_equal(counts, np.broadcast_to(np.minimum(np.arange(T) + 1, k), (B, T)))
    assert (counts[:, k:] < np.arange(k, T) + 1).all()  # late rows really attend fewer than all keys
    assert not np.triu(r["index_mask"], 1).any()
    s = r["index_scores"]  # selected visible scores dominate unselected visible ones
    vis = np.isfinite(s)
    lo = np.where(r["index_mask"], s, np.inf).min(-1)
    hi = np.where(vis & ~r["index_mask"], s, -np.inf).max(-1)
    assert (lo >= hi).all()


@pytest.mark.parametrize("kind", KINDS)
def test_mtp_layer(kind):
    import torch

    cfg = R.tiny_hf_config_dict(kind)
    e, h, pos = _inputs(1)
    m = R.build_hf_mtp_layer(cfg, 5)
    assert hasattr(m.mtp_block.mlp, "gate")  # the MTP block is an MoE layer
    y = R.run_hf_mtp_layer(m, cfg, e, h, pos)
    assert y.shape == (B, T, D) and np.isfinite(y).all()
    np.testing.assert_array_equal(y, R.run_hf_mtp_layer(R.build_hf_mtp_layer(cfg, 5), cfg, e, h, pos))
    assert np.abs(R.run_hf_mtp_layer(R.build_hf_mtp_layer(cfg, 6), cfg, e, h, pos) - y).max() > 1e-3
    # wiring: post_norm(block(eh_proj([enorm(e) | hnorm(h)])))
    with torch.no_grad():
        z = m.eh_proj(torch.cat([m.enorm(torch.from_numpy(e)), m.hnorm(torch.from_numpy(h))], -1))
        blk = R.run_hf_decoder_layer(m.mtp_block, cfg, z.numpy(), pos)["out"]
        ref = m.post_norm(torch.from_numpy(blk)).numpy()
    assert_close(y, ref, "float32", what="MTP layer wiring")
