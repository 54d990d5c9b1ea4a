"""benchmarks.step_profile's attribution of a trace's kernels to model parts, on hand-written HLO and
events (the GPU trace itself is only on a GPU): kernel names as XLA writes them, kernels with no
instruction of their name placed after the last one that has; and `profile` on this CPU: the traced program (built
without command buffers) is the one whose instruction names it returns."""

import jax
import jax.numpy as jnp

from benchmarks.step_profile import UNGRAPHED, op_names, part_of, profile, summarize

HLO = """
ENTRY %main {
  %gemm_fusion_dot.8 = bf16[64,129280]{1,0} fusion(%a, %b), kind=kCustom, metadata={op_name="jit(draft_step)/MtpPredictor.get_top_tokens/btd,vd->btv/dot_general"}
  %loop_gather_fusion = bf16[64,2048,576]{2,1,0} fusion(%c), kind=kLoop, metadata={op_name="jit(draft_step)/MtpPredictor/layers_0/mtp_block/self_attn/self_attn._absorbed_sparse/gather"}
  ROOT %sort.3 = s32[512]{0} sort(%d), metadata={op_name="jit(draft_step)/MtpPredictor/layers_0/mtp_block/mlp/argsort"}
}
"""


def test_op_names_under_kernel_names():
  names = op_names(HLO)
  assert names["gemm_fusion_dot.8"] == names["gemm_fusion_dot_8"]
  assert part_of(names["gemm_fusion_dot_8"]) == "head (logits + argmax)"
  assert part_of(names["loop_gather_fusion"]) == "attention (MLA, DSA)"
  assert part_of(names["sort_3"]) == "routed experts"
  assert part_of("jit(f)/something/else") == "other"


def test_summarize_places_unnamed_kernels_after_the_last_named_one(capsys):
  names = op_names(HLO)
  # two steps: the gather, a cuBLAS kernel (no instruction of its name), the head's GEMM
  events = [(0, "loop_gather_fusion", 10.0), (1, "nvjet_sm90_x", 4.0), (2, "gemm_fusion_dot_8", 30.0)] * 2
  table = summarize(events, names, calls=2, step_us=50.0, label="test")
  assert table["kernel_us"] == 44.0 and table["kernels_per_step"] == 3
  assert table["parts"] == {"attention (MLA, DSA)": {"kernels": 2.0, "us": 14.0},
                            "head (logits + argmax)": {"kernels": 1.0, "us": 30.0}}
  placed = [op for op in table["ops"] if op["op"].startswith("nvjet_sm90_x after ")]
  assert len(placed) == 1 and placed[0]["op"].endswith("_absorbed_sparse/gather") and placed[0]["us"] == 4.0
  assert "device idle between them ~6 µs" in capsys.readouterr().out


def test_profile_names_the_traced_programs_instructions():
  """The untraced timing runs the program as compiled; the trace a build without command buffers (UNGRAPHED, an
  option every backend's compiler takes), and every traced event names an instruction of that build, whose op names
  come back beside the events."""
  def step(w, x, state):
    return jnp.tanh(x @ w).sum(), state + 1

  args = (jnp.ones((128, 128)), jnp.ones((32, 128)), jnp.zeros(()))
  lowered = jax.jit(step).lower(*args)
  step_us, events, names = profile(lowered, args, calls=2, timed_calls=2)
  assert step_us > 0 and events
  assert all(op in names for _, op, _ in events)
  assert names == op_names(lowered.compile(compiler_options=UNGRAPHED).as_text())
