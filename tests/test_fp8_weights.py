"""FP8 weights kept on the device (jax_mtp.fp8, `load_hf_checkpoint(fp8_weights=True)`, `--weights`).

A tiny random model is written as a multi-shard FP8 checkpoint by tests/hf_checkpoint.py (DeepSeek's
block quantiser, partial edge blocks). Kept as codes + block scales, every matmul dequantises in its
program to exactly the value the dequantising loader stores, so the two trees must give bit-identical
logits and identical tokens, on one device and under tp; and the FP8 tree must hold its linear and
expert weights in one byte.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mtp
from jax_mtp import fp8
from jax_mtp.checkpoint import load_hf_checkpoint, load_mtp_only
from jax_mtp.generate import TargetDecoder
from jax_mtp.kernels.fp8_grouped_matmul_mgpu import KERNEL_NAME as FP8_KERNEL
from jax_mtp.model import TargetModel, init_target_caches
from jax_mtp.safetensors_io import CheckpointError
from jax_mtp.sharding import make_mesh
from jax_mtp.speculative import Speculator
from tests import fp8_matmul_cases as fp8_cases
from tests.conftest import FULL_ONLY, FULL_TESTS
from tests.devices import needs_devices
from tests.hf_checkpoint import write_checkpoint
from tests.lowered_step import H200, kernel_calls
from tests.tolerances import assert_close

CFG = jax_mtp.tiny(vocab_size=250)
PROMPTS = [[5, 17, 3, 99, 4, 8, 1], [42, 7]]


BLOCKS = [(16, 24), (8, 8)]  # partial edge blocks (which no tp > 1 splits); blocks that split over tp = 2 and 4


def _block_id(block) -> str:
  return f"block{block[0]}x{block[1]}"


def only(block):
  """A test that needs one of BLOCKS' checkpoints: `written` parametrized with it alone (no always-skipped case)."""
  return pytest.mark.parametrize("written", [block], indirect=True, ids=_block_id)


@pytest.fixture(scope="module", params=BLOCKS, ids=_block_id)
def written(request, tmp_path_factory):
  """(directory, block): a 3-shard FP8 checkpoint of a random tiny model."""
  directory = str(tmp_path_factory.mktemp("fp8"))
  params = jax_mtp.init_target_params(CFG, jax.random.key(0)), jax_mtp.init_params(CFG, jax.random.key(1))
  write_checkpoint(directory, CFG, *params, block=request.param, num_files=3)
  return directory, request.param


def _leaves(tree):
  return {jax.tree_util.keystr(path): x for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def test_fp8_tree_holds_codes_and_block_scales_beside_each_fp8_weight(written):
  directory, block = written
  _, target, mtp = load_hf_checkpoint(directory, fp8_weights=True)
  _, dequantised, _ = load_hf_checkpoint(directory)
  leaves, reference = _leaves(target), _leaves(dequantised)
  codes = {name: x for name, x in leaves.items() if x.dtype == jnp.float8_e4m3fn}
  assert any("w_gate_EDF" in name for name in codes) and any("q_b_proj" in name for name in codes)
  for name, x in codes.items():
    scale_key = name[:-2] + fp8.SCALE_SUFFIX + "']"
    assert leaves[scale_key].dtype == jnp.float32, name
    assert leaves[scale_key].shape == fp8.scale_shape(x.shape, block), name
    # the codes times their scales are exactly what the dequantising loader stores
    np.testing.assert_array_equal(np.asarray(fp8.dequantize(x, leaves[scale_key], reference[name].dtype, block)),
                                  np.asarray(reference[name]), err_msg=name)
  # not FP8 in a V3.2 checkpoint: norms, router, embedding / head, eh_proj, the indexer's weights_proj
  assert not any(k in name for name in codes for k in ("norm", "gate']['weight", "embed", "lm_head", "weights_proj"))
  # the MTP layer: its decoder block's linears in FP8, its eh_proj and norms not
  mtp_leaves = _leaves(mtp)
  mtp_codes = {name for name, x in mtp_leaves.items() if x.dtype == jnp.float8_e4m3fn}
  assert any("eh_proj" in name for name in mtp_leaves) and any("q_b_proj" in name for name in mtp_codes)
  assert not any(k in name for name in mtp_codes for k in ("eh_proj", "norm")), sorted(mtp_codes)
  fp8_bytes = sum(x.nbytes for name, x in leaves.items() if name in codes)
  assert fp8_bytes * reference[next(iter(codes))].dtype.itemsize == sum(reference[name].nbytes for name in codes)


def test_fp8_logits_are_bit_identical_to_the_dequantised_checkpoint(written):
  directory, _ = written
  cfg, fp8_target, _ = load_hf_checkpoint(directory, fp8_weights=True)
  _, target, _ = load_hf_checkpoint(directory)
  ids = jnp.asarray([PROMPTS[0]], jnp.int32)
  positions = jnp.arange(ids.shape[1])[None]
  model = TargetModel(cfg)  # the checkpoint's fp8_block (its weight_block_size)
  with pytest.raises(ValueError, match="fp8_block is not the checkpoint's weight_block_size"):
    TargetModel(cfg.replace(fp8_block=(64, 64))).apply(
        {"params": fp8_target}, ids, positions, init_target_caches(cfg, 1, 16))

  def logits(params, absorb):
    out = model.apply({"params": params}, ids, positions, init_target_caches(cfg, 1, 16), absorb=absorb)
    return model.apply({"params": params}, out.hidden_BTD, method=TargetModel.compute_logits)

  for absorb in (False, True):  # prefill's naive MLA and decode's absorbed MLA (kv_b_proj read directly)
    np.testing.assert_array_equal(np.asarray(jax.jit(logits, static_argnums=1)(fp8_target, absorb)),
                                  np.asarray(jax.jit(logits, static_argnums=1)(target, absorb)))


@pytest.mark.parametrize("written, tp", [((16, 24), 1), ((8, 8), 2), ((8, 8), 1)], indirect=["written"],
                         ids=["block16x24-1", "block8x8-2", "block8x8-1"])
def test_fp8_speculative_and_plain_tokens_equal_the_dequantised_checkpoints(written, tp):
  """CI: (16, 24) blocks (partial edge blocks) at tp = 1 and (8, 8) at tp = 2; (8, 8) at tp = 1 in the full form.
  The (16, 24) blocks do not split over tp = 2 (test_blocks_that_do_not_split_over_tp_are_one_clear_error)."""
  directory, block = written
  if (tp, block) == (1, (8, 8)) and not FULL_TESTS:
    pytest.skip(f"(8, 8) blocks at tp = 1: {FULL_ONLY}")
  needs_devices(tp)
  mesh = make_mesh(tp)
  results = []
  for fp8_weights in (True, False):
    cfg, target, mtp = load_hf_checkpoint(directory, mesh=mesh, fp8_weights=fp8_weights)
    spec = Speculator(cfg, mesh, 2)
    params = jax_mtp.SpecParams(target, spec.drafter.shard(mtp, mesh))
    out = spec.generate(params, PROMPTS, 10)
    plain = TargetDecoder(cfg, mesh).generate(target, PROMPTS, 10)
    results.append((out.tokens, out.metrics.draft_tokens_accepted, plain))
  assert results[0] == results[1]
  assert results[0][0] == results[0][2]  # and speculative == plain greedy


def test_mtp_only_load_keeps_fp8_too(written):
  """Loading only the MTP layer gives, leaf for leaf, the MTP tree of the whole FP8 load."""
  directory, _ = written
  _, mtp = load_mtp_only(directory, fp8_weights=True)
  _, _, whole = load_hf_checkpoint(directory, fp8_weights=True)
  got, want = _leaves(mtp), _leaves(whole)
  assert got.keys() == want.keys() and any(x.dtype == jnp.float8_e4m3fn for x in got.values())
  for name, x in got.items():
    assert x.dtype == want[name].dtype, name
    np.testing.assert_array_equal(np.asarray(x), np.asarray(want[name]), err_msg=name)


@only((16, 24))  # (8, 8) blocks split over tp = 4
def test_blocks_that_do_not_split_over_tp_are_one_clear_error(written):
  directory, _ = written
  needs_devices(4)
  with pytest.raises(CheckpointError, match=r"o_proj.weight: the slice \[0:32\] .* FP8 blocks of 24"):
    load_hf_checkpoint(directory, mesh=make_mesh(4), fp8_weights=True)


@only((16, 24))  # (8, 8) blocks split over tp = 2 whole
def test_fp8_weights_kept_on_one_device_refuse_a_mesh_that_splits_their_blocks(written):
  """The library's placement of FP8 weights loaded onto one device (every block whole) onto a tp = 2 mesh, which
  splits (16, 24) blocks, and the decoders given them unplaced: one ValueError naming the weight. Until
  2026-12-06 they were placed as they were, and a device's codes met another block's scales: other tokens, silently
  (174, 146, 64 … against 174, 26, 98 … on this checkpoint)."""
  directory, _ = written
  needs_devices(2)
  loaded = jax_mtp.load(directory, weights="fp8")
  mesh = make_mesh(2)
  spec = Speculator(loaded.cfg, mesh, 2)
  split = r"o_proj/kernel: the slice \[0:64\] of its in dim of 128 does not fall on its FP8 blocks of 24: FP8 weights"
  with pytest.raises(ValueError, match=rf"^layers_\d+/self_attn/{split}"):
    spec.shard(loaded.target, loaded.mtp)
  with pytest.raises(ValueError, match=rf"^layers_0/mtp_block/self_attn/{split}"):
    spec.drafter.shard(loaded.mtp, mesh)
  # handed to a program unplaced (jit's placement splits them the same way)
  with pytest.raises(ValueError, match=rf"^layers_\d+/self_attn/{split}"):
    spec.generate(jax_mtp.SpecParams(loaded.target, loaded.mtp), PROMPTS, 4)
  with pytest.raises(ValueError, match=rf"^layers_\d+/self_attn/{split}"):
    TargetDecoder(loaded.cfg, mesh).generate(loaded.target, PROMPTS, 4)
  draft = jax_mtp.ShardedMtp(loaded.cfg, mesh)
  caches = jax_mtp.init_caches(loaded.cfg, batch=1, capacity=8)
  with pytest.raises(ValueError, match=rf"^layers_0/mtp_block/self_attn/{split}"):
    draft(loaded.mtp, jnp.array([[5]]), jnp.array([[0]]), jnp.zeros((1, 1, CFG.hidden_size), CFG.dtype), caches)


def test_a_checkpoint_without_fp8_weights_refuses_to_keep_them():
  with pytest.raises(CheckpointError, match="stores no FP8 weights"):
    load_hf_checkpoint("jax_mtp/default_model", fp8_weights=True)


def test_a_nan_code_in_a_kept_weight_is_a_load_error(written, tmp_path):
  import shutil  # noqa: PLC0415
  directory = str(tmp_path / "ckpt")
  shutil.copytree(written[0], directory)
  with open(f"{directory}/model.safetensors.index.json") as f:
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    file = f"{directory}/{json.load(f)['weight_map'][name]}"
  raw = open(file, "rb").read()
  header_len = int.from_bytes(raw[:8], "little")
  info = json.loads(raw[8:8 + header_len])[name]
  data = bytearray(raw)
  data[8 + header_len + info["data_offsets"][0] + 5] = 0x7F  # e4m3fn NaN
  open(file, "wb").write(bytes(data))
  assert np.isnan(np.float32(np.frombuffer(b"\x7f", ml_dtypes.float8_e4m3fn)[0]))
  with pytest.raises(CheckpointError, match=f"{name}.*non-finite"):
    load_hf_checkpoint(directory, fp8_weights=True)


def test_unsupported_quantization_is_named(written, tmp_path):
  import shutil  # noqa: PLC0415
  directory = str(tmp_path / "ckpt")
  shutil.copytree(written[0], directory)
  config = json.load(open(f"{directory}/config.json"))
  config["quantization_config"]["quant_method"] = "awq"
  json.dump(config, open(f"{directory}/config.json", "w"))
  with pytest.raises(CheckpointError, match="quant_method='awq'"):
    load_hf_checkpoint(directory)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
  """`decode.main` in this process (the `python -m jax_mtp.decode` entry point is test_decode_cli's):
  (exit code, stdout, stderr)."""
  from jax_mtp import decode  # noqa: PLC0415
  rc = decode.main(list(argv))
  out, err = capsys.readouterr()
  return rc, out, err


@only((8, 8))  # the flag's wiring needs one checkpoint
def test_cli_weights_flag(written, tmp_path, capsys):
  from jax_mtp.orbax_io import save_params  # noqa: PLC0415
  directory, _ = written
  orbax = str(tmp_path / "orbax")
  save_params(orbax, *load_hf_checkpoint(directory, fp8_weights=True))
  outputs = {}
  for checkpoint, weights in ((directory, "fp8"), (directory, "bf16"), (directory, "auto"), (orbax, "auto"),
                              (orbax, "bf16")):
    rc, out, err = _cli(capsys, "--checkpoint", checkpoint, "--prompt-ids", "5,17,3", "--max-new-tokens", "6",
                        "--weights", weights, "--ignore-eos", "--json")
    assert rc == 0, err[-2000:]
    outputs[checkpoint, weights] = json.loads(out)["tokens"]
  assert len({json.dumps(tokens) for tokens in outputs.values()}) == 1, outputs
  rc, _, err = _cli(capsys, "--weights", "fp8")
  assert rc == 2 and err.startswith("error: --weights fp8 is for --checkpoint"), err



@only((8, 8))  # the flag's wiring needs one checkpoint
def test_cli_fp8_matmul_impl_is_refused_where_it_would_pick_nothing(written, capsys):
  """An explicit --fp8-matmul-impl names the kernel multiplying FP8 codes kept on the device. On a CPU without
  --moe-impl fp8_grouped_gpu (Pallas's interpreter) nothing would run it, and bf16 weights have no codes: each is
  one error, exit 2, before or after loading — not a flag silently ignored. (With both, decoding through either
  kernel is test_auto_gpu_paths' FP8 case: this checkpoint's 8 × 8 blocks are not the kernels'.)"""
  directory, _ = written
  base = ("--checkpoint", directory, "--prompt-ids", "5,17,3", "--max-new-tokens", "4", "--ignore-eos", "--json")
  if jax.devices()[0].platform == "cpu":  # on a GPU the flag picks the compiled kernel: nothing to refuse
    rc, _, err = _cli(capsys, *base, "--fp8-matmul-impl", "mosaic_gpu")
    assert rc == 2 and err.startswith("error: --fp8-matmul-impl=mosaic_gpu picks the GPU kernel") and "is cpu" in err, err
  rc, _, err = _cli(capsys, *base, "--weights", "bf16", "--moe-impl", "fp8_grouped_gpu", "--fp8-matmul-impl",
                    "mosaic_gpu")
  assert rc == 2 and "this run keeps none" in err and len(err.splitlines()) == 1, err

def test_orbax_keeps_fp8_weights_fp8(written, tmp_path):
  from jax_mtp.orbax_io import restore_params, save_params  # noqa: PLC0415
  directory, _ = written
  cfg, target, mtp = load_hf_checkpoint(directory, fp8_weights=True)
  save_params(str(tmp_path / "orbax"), cfg, target, mtp)
  restored_cfg, restored_target, restored_mtp = restore_params(str(tmp_path / "orbax"))
  assert restored_cfg == cfg
  for got, expected in ((restored_target, target), (restored_mtp, mtp)):
    got, expected = _leaves(got), _leaves(expected)
    assert got.keys() == expected.keys()
    for name, x in expected.items():
      assert got[name].dtype == x.dtype and np.array_equal(np.asarray(got[name]), np.asarray(x)), name
  _, dequantised_target, _ = load_hf_checkpoint(directory)
  back = fp8.dequantize_params(restored_target, cfg.param_dtype, cfg.fp8_block)
  for name, x in _leaves(dequantised_target).items():
    assert np.array_equal(np.asarray(_leaves(back)[name]), np.asarray(x)), name


# --- the FP8 grouped matmul (kernels/fp8_grouped_matmul.py) --------------------------------------


@pytest.mark.parametrize("e,k,n,sizes,split_k", [(5, 256, 384, (6, 0, 1, 17, 2), 1), (4, 512, 128, (1, 0, 2, 0), 0)])
def test_fp8_grouped_matmul_equals_its_formula_and_the_dequantised_product(e, k, n, sizes, split_k):
  """The op as the model calls it (`fp8_grouped_matmul`, which launches kernels/fp8_grouped_matmul_mgpu.py): groups of
  0, 1, < and > one row tile, spare rows past Σ sizes, vs its jnp formula and x times the exactly dequantised
  weights (x is bf16 in both: the kernel's activations are bf16); K split or not (0: the kernel's choice). In
  Pallas's GPU interpreter here, compiled on a GPU. The kernel's own cases: tests/test_fp8_grouped_matmul_mgpu.py."""
  from jax_mtp.kernels.fp8_grouped_matmul import fp8_grouped_matmul  # noqa: PLC0415
  from jax_mtp.kernels.fp8_grouped_matmul_mgpu import Config  # noqa: PLC0415
  x, codes, scale, sizes = fp8_cases.problem(e, k, n, sizes)
  backend = "gpu" if jax.default_backend() == "gpu" else "interpret"
  got = fp8_grouped_matmul(x, codes, scale, sizes, backend=backend, config=Config(split_k=split_k))
  fp8_cases.assert_equals_the_formula_and_the_dequantised_product(got, x, codes, scale, sizes, "FP8 kernel")


def test_fp8_grouped_matmul_refuses_what_it_cannot_take():
  from jax_mtp.kernels.fp8_grouped_matmul import fp8_grouped_matmul  # noqa: PLC0415
  from jax_mtp.kernels.fp8_grouped_matmul_mgpu import Config  # noqa: PLC0415
  x, codes, sizes = jnp.zeros((2, 128)), jnp.zeros((3, 128, 200), jnp.float8_e4m3fn), jnp.zeros((3,), jnp.int32)
  with pytest.raises(ValueError, match="multiples of 128"):
    fp8_grouped_matmul(x, codes, jnp.zeros((3, 1, 2)), sizes, backend="interpret")
  with pytest.raises(ValueError, match="backend='cuda'"):
    fp8_grouped_matmul(x, codes[..., :128], jnp.zeros((3, 1, 1)), sizes, backend="cuda")
  with pytest.raises(ValueError, match="impl='triton' is not one of"):
    fp8_grouped_matmul(x, codes[..., :128], jnp.zeros((3, 1, 1)), sizes, backend="interpret", impl="triton")
  with pytest.raises(ValueError, match="codes must be float8_e4m3fn, got bfloat16"):
    fp8_grouped_matmul(x, codes[..., :128].astype(jnp.bfloat16), jnp.zeros((3, 1, 1)), sizes, backend="interpret")
  with pytest.raises(ValueError, match="split_k=3 must divide the 1 blocks"):
    fp8_grouped_matmul(x, codes[..., :128], jnp.zeros((3, 1, 1)), sizes, backend="interpret",
                       config=Config(split_k=3))
  with pytest.raises(ValueError, match="one size per expert"):
    fp8_grouped_matmul(x, codes[..., :128], jnp.zeros((3, 1, 1)), sizes[:2], backend="interpret")
  # V3.2's 256 experts on one device: 3.8e9 codes, past 32-bit byte offsets (TMA addresses in 64 bits)
  big = (jax.ShapeDtypeStruct((8, 7168), jnp.bfloat16), jax.ShapeDtypeStruct((256, 7168, 2048), jnp.float8_e4m3fn),
         jax.ShapeDtypeStruct((256, 56, 16), jnp.float32), jax.ShapeDtypeStruct((256,), jnp.int32))
  assert jax.eval_shape(lambda *a: fp8_grouped_matmul(*a, backend="gpu"), *big).shape == (8, 2048)
  from jax_mtp.experts import resolve_expert_impl  # noqa: PLC0415
  weights = jax.ShapeDtypeStruct((256, 7168, 2048), jnp.bfloat16)
  for tokens in (1, 8, 64, 512):
    assert resolve_expert_impl("auto", "gpu", tokens, 8, weights, fp8_codes=True) == "fp8_grouped_gpu"
  assert resolve_expert_impl("auto", "tpu", 1, 8, weights, fp8_codes=True) == "gather"
  # the kernel is Mosaic GPU's (wgmma, TMA): other GPUs dequantise the picked experts, and an explicit ask is refused
  assert resolve_expert_impl("auto", "gpu", 1, 8, weights, fp8_codes=True, hopper=False) == "gather"
  with pytest.raises(ValueError, match="moe_impl='fp8_grouped_gpu': .*Hopper"):
    resolve_expert_impl("fp8_grouped_gpu", "gpu", 1, 8, weights, fp8_codes=True, hopper=False)


def test_fp8_grouped_experts_equal_the_gathered_experts_on_the_same_codes():
  """The whole routed-experts call (sort, gate, up, silu, down, un-sort, the weighted sum; foreign ids
  weight 0) through the FP8 kernel vs the gather impl dequantising the same codes to fp32. The kernel's
  activations are bf16: the bf16 row of the table."""
  from jax_mtp.experts import routed_experts  # noqa: PLC0415
  rng = np.random.default_rng(0)
  e, d, f, t = 6, 256, 128, 3
  ws = [jnp.asarray(rng.standard_normal(shape) * 20, jnp.float8_e4m3fn) for shape in ((e, d, f), (e, d, f), (e, f, d))]
  scales = tuple(jnp.asarray(rng.uniform(1e-3, 1e-2, (e, w.shape[1] // 128, w.shape[2] // 128)), jnp.float32)
                 for w in ws)
  x = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
  ids = jnp.asarray([[0, 5], [2, e], [3, 3]], jnp.int32)  # id E: another device's expert (weight 0)
  weights = jnp.asarray([[0.6, 0.4], [1.0, 0.0], [0.5, 0.5]], jnp.float32)
  kwargs = dict(fp8_scales=scales, fp8_block=(128, 128), dtype=jnp.float32)
  kernel = routed_experts("fp8_grouped_gpu", x, ids, weights, *ws, **kwargs, fp8_matmul_impl="mosaic_gpu")
  gathered = routed_experts("gather", x, ids, weights, *ws, **kwargs)
  assert_close(kernel, gathered, "bfloat16", "fp8_grouped_gpu vs gather")
  with pytest.raises(ValueError, match="takes FP8 expert weights"):
    routed_experts("fp8_grouped_gpu", x, ids, weights, *[w.astype(jnp.float32) for w in ws])


def test_fp8_grouped_kernel_is_in_the_lowered_cuda_step():
  """A MTP step with FP8 weights and moe_impl='fp8_grouped_gpu', exported for an H200 (abstract device)
  from this host, holds the FP8 kernel (the lowering platform picks it, not the host's backend):
  one call for each routed-expert projection and one for each dense FP8 linear the kernel takes
  (local dims multiples of 128); with moe_impl='gather' the dense linears' calls only (fp8_kernel=None
  follows the program's platform, jax_mtp.platform, on any host)."""
  from jax.sharding import AbstractMesh, AxisType  # noqa: PLC0415
  from jax_mtp.layers import Linear  # noqa: PLC0415

  def fp8_kernel_calls(moe_impl):
    cfg = jax_mtp.tiny(hidden_size=256, moe_intermediate_size=128, moe_impl=moe_impl, dtype="bfloat16",
                       param_dtype="bfloat16")
    params = fp8.as_checkpoint_fp8(jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0)),
                                   cfg.fp8_block, fp8.abstract_fp8)
    caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, 2, 64))
    ids, hidden = jax.ShapeDtypeStruct((2, 1), jnp.int32), jax.ShapeDtypeStruct((2, 1, 256), jnp.bfloat16)
    step = jax.jit(lambda p, i, pos, h, c: jax_mtp.MtpPredictor(cfg).apply({"params": p}, i, pos, h, c).hidden_BTD)
    mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
    with jax.sharding.use_abstract_mesh(mesh):
      module = jax.export.export(step, platforms=["cuda"])(params, ids, ids, hidden, caches).mlir_module()
    return kernel_calls(module, FP8_KERNEL), params

  calls, params = fp8_kernel_calls("fp8_grouped_gpu")
  leaves = {tuple(k.key for k in path): x for path, x in jax.tree_util.tree_leaves_with_path(params)}
  dense = [path for path, x in leaves.items() if path[-1] == "kernel" and x.dtype == jnp.float8_e4m3fn
           and all(n % 128 == 0 for n in x.shape)]
  assert Linear.__dataclass_fields__["fp8_kernel"].default is None  # auto: the GPU backend decides elsewhere
  assert dense and calls == 3 + len(dense), (calls, dense)
  # gather dequantises the experts; the dense FP8 linears still take the kernel: the program is for a GPU
  assert fp8_kernel_calls("gather")[0] == len(dense)


def test_auto_runs_a_prefill_chunks_rows_through_xlas_gemm_and_decode_rows_through_the_kernel():
  """With every choice automatic, a dense FP8 linear runs the codes in the FP8 kernel in a program for an H200 up to
  AUTO_MAX_ROWS rows and, at any batch, for decode's few tokens a sequence; a prefill chunk of more rows runs XLA's
  GEMM over the dequantised weight (no kernel). An explicit kernel request keeps the kernel; both paths give x
  times the dequantised weight."""
  from jax.sharding import AbstractMesh, AxisType  # noqa: PLC0415
  from jax_mtp.kernels.fp8_grouped_matmul import AUTO_MAX_ROWS, PREFILL_MIN_TOKENS  # noqa: PLC0415
  from jax_mtp.layers import Linear  # noqa: PLC0415
  rng = np.random.default_rng(4)
  codes = jnp.asarray(rng.standard_normal((256, 384)) * 20, jnp.float8_e4m3fn)
  scale = jnp.asarray(rng.uniform(1e-3, 1e-2, (2, 3)), jnp.float32)
  params = {"kernel": codes, fp8.scale_name("kernel"): scale}

  def kernel_calls(shape, **kwargs):
    module = Linear(256, 384, "bfloat16", "bfloat16", (128, 128), **kwargs)
    step = jax.jit(lambda p, x: module.apply({"params": p}, x))
    mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
    with jax.sharding.use_abstract_mesh(mesh):
      text = jax.export.export(step, platforms=["cuda"])(params, jax.ShapeDtypeStruct((*shape, 256),
                                                                                     jnp.bfloat16)).mlir_module()
    return text.count("custom_call @mosaic_gpu")

  chunk = (AUTO_MAX_ROWS // PREFILL_MIN_TOKENS + 1, PREFILL_MIN_TOKENS)  # a prefill chunk past AUTO_MAX_ROWS
  assert kernel_calls((1, AUTO_MAX_ROWS)) == 1  # a prefill chunk within AUTO_MAX_ROWS
  assert kernel_calls(chunk) == 0
  assert kernel_calls((AUTO_MAX_ROWS, 4)) == 1  # verification of k = 3 at B = 1,024: decode's rows
  assert kernel_calls(chunk, fp8_kernel=True) == 1  # asked for
  assert kernel_calls(chunk, fp8_impl="mosaic_gpu") == 1
  x = jnp.asarray(rng.standard_normal((*chunk, 256)), jnp.bfloat16)
  exact = np.asarray(x, np.float32) @ np.asarray(fp8.dequantize(codes, scale, jnp.float32, (128, 128)))
  for fp8_kernel in (None, True):  # on this CPU: XLA's product; the kernel in its interpreter
    got = Linear(256, 384, "bfloat16", "bfloat16", (128, 128), fp8_kernel=fp8_kernel).apply({"params": params}, x)
    assert_close(got, exact, "bfloat16", f"fp8_kernel={fp8_kernel}, a chunk of {chunk} rows")


def test_a_dense_fp8_linear_through_the_kernel_equals_the_dequantised_product():
  """Linear(fp8_kernel=True) multiplies the codes in the kernel (interpret mode here) and equals x
  times the dequantised weight (bf16 compute: the bf16 row); leading dims of any rank."""
  from jax_mtp.layers import Linear  # noqa: PLC0415
  rng = np.random.default_rng(3)
  codes = jnp.asarray(rng.standard_normal((256, 384)) * 20, jnp.float8_e4m3fn)
  scale = jnp.asarray(rng.uniform(1e-3, 1e-2, (2, 3)), jnp.float32)
  params = {"kernel": codes, fp8.scale_name("kernel"): scale}
  x = jnp.asarray(rng.standard_normal((2, 3, 256)), jnp.bfloat16)
  module = Linear(256, 384, "bfloat16", "bfloat16", (128, 128), fp8_kernel=True)
  assert module.bind({"params": params}).runs_fp8_kernel()
  got = module.apply({"params": params}, x)
  exact = np.einsum("bti,io->bto", np.asarray(x, np.float32),
                    np.asarray(fp8.dequantize(codes, scale, jnp.float32, (128, 128))))
  assert got.shape == (2, 3, 384) and got.dtype == jnp.bfloat16
  assert_close(got, exact, "bfloat16", "dense FP8 kernel vs dequantised product")
  auto = Linear(256, 384, "bfloat16", "bfloat16", (128, 128)).bind({"params": params})
  assert auto.runs_fp8_kernel() == (jax.default_backend() == "gpu")  # fp8_kernel=None: on GPUs only


@only((16, 24))  # (8, 8) blocks split over tp = 2
def test_cli_auto_dequantises_with_a_note_where_tp_splits_blocks_and_fp8_refuses(written, capsys):
  directory, _ = written
  needs_devices(2)
  runs = {}
  for weights in ("auto", "fp8"):
    runs[weights] = _cli(capsys, "--checkpoint", directory, "--tp", "2", "--prompt-ids", "5,17,3", "--max-new-tokens",
                         "4", "--weights", weights, "--json")
  assert runs["auto"][0] == 0, runs["auto"][2][-2000:]
  assert "note: FP8 weights dequantised on load: at tp=2" in runs["auto"][2]
  assert runs["fp8"][0] == 2 and "does not fall on its FP8 blocks of 24" in runs["fp8"][2]
  assert runs["fp8"][1] == ""


@pytest.mark.parametrize("name", ["v3_k3", pytest.param("v3_yarn_k2", marks=pytest.mark.full)])  # v3_yarn_k2: full form
def test_vllm_fixture_models_requantised_to_fp8_decode_as_their_dequantisation(name, tmp_path):
  """The vLLM parity fixtures' models (tests/golden, rebuilt from their seeds) re-quantised to FP8 by
  DeepSeek's block quantiser: speculative decoding of the fixture's prompt with the FP8 weights kept
  gives the tokens, rounds and accepted drafts of the same checkpoint dequantised on load."""
  from jax_mtp.hf_config import from_hf_config  # noqa: PLC0415
  from jax_mtp.reference import fixtures, tiny_checkpoint  # noqa: PLC0415
  meta, a = fixtures.load(os.path.join(os.path.dirname(__file__), "golden", f"{name}.npz"))
  source = str(tmp_path / "source")
  tiny_checkpoint.write(source, tiny_checkpoint.config(meta["checkpoint"]["config"]), meta["checkpoint"]["seed"])
  cfg = from_hf_config(source).replace(dtype="float32", param_dtype="float32")
  _, target, mtp = load_hf_checkpoint(source, cfg=cfg)
  quantised = str(tmp_path / "fp8")
  write_checkpoint(quantised, cfg, target, mtp, block=(8, 8), num_files=2)
  k, prompt = meta["num_speculative_tokens"], [a["prompt_ids"].tolist()]
  runs = []
  for fp8_weights in (True, False):
    run_cfg, run_target, run_mtp = load_hf_checkpoint(quantised, cfg=cfg, fp8_weights=fp8_weights)
    assert bool(fp8.fp8_paths(run_target)) == fp8_weights
    spec = Speculator(run_cfg, make_mesh(1), k)
    result = spec.generate(spec.shard(run_target, run_mtp), prompt, len(a["output_ids"]))
    runs.append((result.tokens, result.metrics.rounds, tuple(result.metrics.accepted_per_position)))
  assert runs[0] == runs[1]
