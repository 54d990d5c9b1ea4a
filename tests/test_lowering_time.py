"""benchmarks.lowering_time on a CPU (its whole work: it exports for an abstract H200): the CLI's two programs at V3.2's
width list each Mosaic GPU kernel's lowerings, and their count does not grow with the model's depth (each launch is
lowered once: `mosaic_gpu_common.lowered_once_per_launch`)."""

from benchmarks.lowering_time import main


def _lowerings(capsys, layers: int, weights: str = "bf16", moe_impl: str = "mosaic_gpu") -> dict[tuple[str, str], int]:
  """{(program, kernel): lowerings} from the table of a run at `layers` (its header naming `weights`)."""
  # a 2,100-token prompt: past index_topk (2,048), so the indexer's kernels run; the prefill's top-k from 64 queries
  assert main(["--layers", str(layers), "--batch", "2", "--prompt", "2100", "--max-new", "8", "--weights", weights,
               "--moe-impl", moe_impl]) == 0
  out = capsys.readouterr().out
  assert f"{weights} weights" in out
  rows = [line.split("|") for line in out.splitlines() if line.startswith("| prefill") or line.startswith("| round")]
  return {(row[1].strip(), row[4].strip()): int(row[5]) for row in rows}


def test_kernel_lowerings_do_not_grow_with_depth(capsys):
  two, four = _lowerings(capsys, 2), _lowerings(capsys, 4)
  ours = {"gmm16_mgpu", "dsa_scores_mgpu", "dsa_sparse_mla_mgpu_two_sets"}
  assert {kernel for (program, kernel) in two if program == "round"} == ours  # B · 4 = 8 queries: XLA's top-k
  assert {kernel for (program, kernel) in two if program == "prefill"} == ours | {"dsa_topk_kth_mgpu"}
  assert two == four


def test_compile_programs_compiles_what_generate_runs():
  """`--compile`'s path on this CPU at the tiny model's width: the two programs lower and compile for the local
  device from abstract arguments, the round's from the compiled prefill's outputs (a GPU adds XLA's GPU compile)."""
  import jax_mtp  # noqa: PLC0415
  from benchmarks.lowering_time import compile_programs  # noqa: PLC0415
  capacity, rows = compile_programs(jax_mtp.tiny(), [[1, 2, 3], [4, 5]], 4, 2)
  assert capacity == 3 + 4 + 2 and [name for name, *_ in rows] == ["prefill", "round"]
  assert all(lowering > 0 and xla > 0 for _, lowering, xla, _ in rows)


def test_fp8_weights_lower_the_fp8_kernel_once_per_launch(capsys):
  """`--weights fp8` (the tree `--weights fp8` loads): the round's FP8 grouped matmul (experts and dense linears) is
  lowered once per distinct launch, so 2 and 4 layers lower it equally often."""
  two = _lowerings(capsys, 2, "fp8", "auto")
  assert two[("round", "fp8_codes_gmm_mgpu")] > 0 and two == _lowerings(capsys, 4, "fp8", "auto")
