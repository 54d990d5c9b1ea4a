"""The sweep benchmarks' own logic on CPU: which launches they time (around `config_for`'s choice, only ones the
kernel takes) and, for the MLA projections, that the laid-out-ahead forms compute the model form's outputs."""

import jax
import jax.numpy as jnp

from benchmarks import (index_scores_splits, mla_projections, naive_prefill_attention, sampling_filters, sparse_mla,
                        sparse_mla_padding, sparse_mla_splits)
from jax_mtp.kernels import index_scores_mgpu, sparse_mla_mgpu
from tests.tolerances import TOLERANCE, assert_close


def test_sparse_mla_splits_brackets_auto():
  auto = sparse_mla_mgpu.config_for(16, 128, 2048, 512)  # B = 8, T = 2: 32 blocks, 4 splits
  assert auto.splits == 4
  assert sparse_mla_splits.candidate_splits(auto) == [1, 2, 4, 8]
  one = sparse_mla_mgpu.config_for(1, 128, 2048, 512)  # one set of 64 entries: 32 steps, 16 splits
  assert sparse_mla_splits.candidate_splits(one) == [4, 8, 16]  # never past MAX_SPLITS


def test_sparse_mla_padding_times_both_widths_in_the_interpreter(capsys):
  """A CPU smoke run of stage `padsel`'s command: 300 entries at B = 1, T = 1 (5 steps of 64: one split) padded
  to whole steps (320) and to padded_entries' width (512: 8 splits of one step), each within XLA's output."""
  assert sparse_mla_padding.main(["--rows", "1x1x300", "--capacity", "512", "--iters", "1",
                                  "--backend", "interpret"]) == 0
  rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines()
          if line.startswith("| 1 | 1 |")]
  assert [(row[3], row[4], row[5], row[6]) for row in rows] == [
      ("XLA", "300", "", ""), ("whole steps", "320", "1", "5"), ("padded_entries", "512", "8", "1")]
  assert all(float(row[-1]) <= TOLERANCE["bfloat16"]["rtol"] for row in rows[1:])


def test_index_scores_splits_keep_the_kernels_rules():
  auto = index_scores_mgpu.config_for(1, 1, 131072)
  steps = 131072 // auto.block_slots
  chosen = index_scores_splits.candidate_splits(auto, steps)
  assert auto.splits in chosen and len(chosen) >= 3
  assert all(steps % d == 0 and steps // d >= index_scores_mgpu.MIN_STEPS_PER_CTA for d in chosen)
  # the CLI's 4,352 slots (34 key blocks): auto's 9 uneven CTAs (4 blocks each, the last 2) beside the divisor 2;
  # with --uneven also 6 and 5 CTAs (6, 7 blocks each)
  auto = index_scores_mgpu.config_for(1, 4, 4352)
  assert auto.splits == 9 and index_scores_splits.candidate_splits(auto, 34) == [2, 9]
  assert index_scores_splits.candidate_splits(auto, 34, uneven=True) == [2, 5, 6, 9]


def test_index_scores_splits_runs_every_key_form_in_the_interpreter(capsys):
  """A CPU smoke run of the device stage's command: bf16 keys, fp8 keys beside bf16 q, fp8 q and keys, each with
  its flipped options (keys_in_registers only where the keys are 16-bit), every row within XLA's scores."""
  assert index_scores_splits.main(["--capacity", "256", "--batch", "1", "--tokens", "2", "--iters", "1",
                                   "--backend", "interpret", "--no-sweep", "--keys-in-registers"]) == 0
  rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| 256 |")]
  assert [row[4].strip() for row in rows].count("fp8 q") == 2 and len(rows) == 10
  assert all(float(row[-2]) <= TOLERANCE["float32"]["rtol"] for row in rows)  # each row's max error / max |XLA|


def test_mla_projection_forms_agree():
  n, p, r, c, h, q = (mla_projections.N, mla_projections.P, mla_projections.R, mla_projections.C,
                      mla_projections.H, mla_projections.Q)
  keys = iter(jax.random.split(jax.random.key(1), 4))
  x = jax.random.normal(next(keys), (3, q), jnp.float32)
  w_qb = jax.random.normal(next(keys), (q, n * (p + r)), jnp.float32) * 0.02
  w_kvb = jax.random.normal(next(keys), (c, n * (p + h)), jnp.float32) * 0.02
  o = jax.random.normal(next(keys), (3, n, c), jnp.float32)
  w_qb_NK, w_kvb_CNK = w_qb.reshape(q, n, p + r), w_kvb.reshape(c, n, p + h)
  w_uk_NPC, w_uv_NCH = w_kvb_CNK[..., :p].transpose(1, 2, 0), w_kvb_CNK[..., p:].transpose(1, 0, 2)
  model = mla_projections.q_model(x, w_qb, w_kvb)
  for form in (mla_projections.q_uk_prelaid(x, w_qb, w_uk_NPC),
               mla_projections.q_prelaid(x, w_qb_NK[..., :p].reshape(q, -1), w_qb_NK[..., p:].reshape(q, -1),
                                         w_uk_NPC)):
    for got, want in zip(form, model, strict=True):
      assert_close(got, want, "float32", "q form")
  assert_close(mla_projections.v_prelaid(o, w_uv_NCH), mla_projections.v_model(o, w_kvb), "float32", "W_UV form")


def test_a_refused_sparse_mla_config_is_a_row_of_the_same_cells():
  """A candidate the compiler refuses (apart, 2026-12-05: ptxas) is a table row saying so, as many cells as a timed
  row, and the sweep goes on to the next config."""
  timed, failed = sparse_mla._cells((505.5e-6, 3.9e-3), 183.4), sparse_mla._cells("ptxas fatal: (C7602) ...", 183.4)
  assert timed.split("|")[0].strip() == "505.5" and failed.startswith("failed: ptxas fatal")
  assert failed.count("|") == timed.count("|")


def test_the_copies_column_counts_copy_and_transpose_instructions():
  assert mla_projections.layout_copies("  %t = f32[2,3]{0,1} transpose(%p), dimensions={1,0}\n"
                                       "  ROOT %c = f32[2,3]{1,0} copy(%t)\n  %d = f32[2,2]{1,0} dot(%a, %b)") == 2


def test_naive_prefill_attention_probe_runs_the_naive_form_and_tokamaxs_on_a_cpu(capsys):
  """A CPU smoke run of stage `flashprobe`'s command: an 8-token chunk at the end of a 2,112-slot cache (past
  KEY_BLOCK), the model's naive form whole and in blocks with the expansion in the call, then the attention alone
  beside tokamax's XLA forms (its GPU forms run on a GPU only), each equal to its table's first row."""
  assert naive_prefill_attention.main(["--batch", "1", "--chunk", "8", "--capacity", "2112", "--iters", "1",
                                       "--forms", "xla_chunked", "xla"]) == 0
  rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines()
          if line.startswith("| 1 | 8 |")]
  assert [row[3] for row in rows] == ["naive, whole (the model's up to 2,048 slots)",
                                      "naive, blocks of 2,048 (the model's past them)", "naive, whole",
                                      "tokamax xla_chunked", "tokamax xla"]
  assert all(float(row[-1]) <= TOLERANCE["bfloat16"]["rtol"] for row in rows)


def test_sampling_filters_times_greedy_and_each_setting_on_a_cpu(capsys):
  """A CPU smoke run of stage `sampling`'s first command over a 512-token vocabulary: a row for greedy, the sort and
  each sampling setting, and for each filtering setting its filter by the radix search and by the sort, each with
  a positive time and its floor."""
  assert sampling_filters.main(["--batch", "2", "--vocab", "512", "--iters", "1"]) == 0
  rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines()
          if line.startswith("| 2 |")]
  filtered = [name for name, (_, top_k, top_p) in sampling_filters.SETTINGS.items() if top_k or top_p < 1]
  assert [row[1] for row in rows] == ["greedy (argmax)", "the sort alone (descending)", *[
      row for name in sampling_filters.SETTINGS for row in [name] + (
          [f"{name}: the filter (radix search)", f"{name}: the filter (sort, the reference)"] if name in filtered
          else [])]]
  assert all(float(row[2].replace(",", "")) > 0 and float(row[3].replace(",", "")) > 0 for row in rows)
