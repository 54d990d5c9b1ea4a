"""benchmarks.sparse_mla_profile: the trace summary (phase durations per warpgroup from Mosaic GPU's profiler
events) on hand-made traces; on a GPU, a real trace of the kernel holds every named phase."""

import jax
import pytest

from benchmarks.sparse_mla_profile import phase_durations, table


def _range(tid, name, begin_us, end_us):
  return [{"name": name, "ph": "B", "ts": begin_us, "pid": 1, "tid": tid},
          {"name": name, "ph": "E", "ts": end_us, "pid": 1, "tid": tid}]


def test_durations_are_each_ranges_end_minus_begin_per_warpgroup():
  # CTA 0: scores (tid 1) two steps of wait + qk; gather (tid 3) one relayout; CTA 1: scores (tid 4) one step
  events = (_range(1, "scores wait", 0.0, 0.5) + _range(1, "qk", 0.5, 0.8) + _range(1, "scores wait", 0.8, 0.9)
            + _range(1, "qk", 0.9, 1.3) + _range(3, "relayout", 0.1, 1.1) + _range(4, "scores wait", 2.0, 2.2))
  got = phase_durations(events)
  assert got.keys() == {("scores", "scores wait"), ("scores", "qk"), ("gather", "relayout")}
  assert got["scores", "scores wait"] == pytest.approx([500.0, 100.0, 200.0])
  assert got["scores", "qk"] == pytest.approx([300.0, 400.0])
  assert got["gather", "relayout"] == pytest.approx([1000.0])
  # skip: each trace's first occurrence of a phase left out (the pipeline's fill)
  skipped = phase_durations(events, skip=1)
  assert skipped.keys() == {("scores", "scores wait"), ("scores", "qk")}
  assert skipped["scores", "scores wait"] == pytest.approx([100.0]) and skipped["scores", "qk"] == pytest.approx([400.0])


def test_a_range_cut_off_by_the_full_buffer_is_left_out():
  # the profiler closes a range whose end did not fit at the trace's last time: its own start
  events = _range(1, "qk", 0.0, 0.4) + _range(1, "softmax", 0.4, 0.4)
  assert phase_durations(events) == {("scores", "qk"): pytest.approx([400.0])}


def test_table_gives_means_and_shares_of_the_warpgroups_recorded_time():
  rows = table({("scores", "qk"): [300.0, 500.0], ("scores", "softmax"): [200.0, 200.0], ("gather", "relayout"): [7.0]})
  assert rows[2:] == ["| scores | qk | 2 | 400 | 67% |", "| scores | softmax | 2 | 200 | 33% |",
                      "| gather | relayout | 1 | 7 | 100% |"]


def test_a_range_ending_inside_another_is_refused():
  events = [{"name": "qk", "ph": "B", "ts": 0.0, "tid": 1}, {"name": "softmax", "ph": "B", "ts": 0.1, "tid": 1},
            {"name": "qk", "ph": "E", "ts": 0.2, "tid": 1}]
  with pytest.raises(ValueError, match="'qk' ends inside 'softmax'"):
    phase_durations(events)


def _lower_profiled(fp8: bool, config):
  """Lower a profiled launch at V3.2's widths, B = 64, T = 4, for CUDA on this host: the Mosaic GPU lowering checks
  the shared memory (scratch + the profiler's buffer) against 227 KiB, then the trace's host callback stops a CPU
  host's lowering (it needs the GPU platform). The error says which of the two stopped it ("" where none did)."""
  import jax.numpy as jnp  # noqa: PLC0415

  from jax_mtp.kernels.sparse_mla_mgpu import sparse_mla_mgpu  # noqa: PLC0415
  b, t = 64, 4
  shapes = [((b, t, 128, 512), jnp.bfloat16), ((b, t, 128, 64), jnp.bfloat16),
            ((b, 4096, 512), jnp.float8_e4m3fn if fp8 else jnp.bfloat16), ((b, 4096, 64), jnp.bfloat16),
            ((b, t, 2048), jnp.int32), ((b, 4096, 4), jnp.float32)]
  fn = jax.jit(lambda *a: sparse_mla_mgpu(*a[:5], 512**-0.5, latent_scale_BSG=a[5] if fp8 else None, config=config,
                                          out_dtype=jnp.bfloat16, profile_dir="/nonexistent"))
  try:
    fn.trace(*(jax.ShapeDtypeStruct(*x) for x in shapes)).lower(lowering_platforms=("cuda",))
  except Exception as error:  # noqa: BLE001 (either stop is an error; its message says which)
    message = str(error)
    # only the two stops the docstring names: any other error (a changed signature, a bad config) fails here
    assert "shared memory" in message or CALLBACK_STOP in message, message
    return message
  return ""  # on a GPU host the whole launch lowers


# The trace's host callback stopping a CPU host's lowering for CUDA (jax's message; past the shared-memory check)
CALLBACK_STOP = "is different from the lowering platform cuda"


@pytest.mark.parametrize("fp8,one_set", [(False, False), (True, False), (False, True)],
                         ids=["bf16, two sets", "fp8, two sets", "bf16, one set"])
def test_the_profiles_ranges_are_as_many_as_the_shared_memory_holds(fp8, one_set, monkeypatch):
  from jax_mtp.kernels import sparse_mla_mgpu as mgpu  # noqa: PLC0415
  config = mgpu.Config(double_buffered=False) if one_set else mgpu.Config()
  assert "shared memory" not in _lower_profiled(fp8, config)  # past the check: profile_ranges' trace fits
  ranges = mgpu.profile_ranges
  monkeypatch.setattr(mgpu, "profile_ranges", lambda used: ranges(used) + 1)
  jax.clear_caches()  # the kernel's entry is jitted (lowered once per launch): its patched form needs a fresh trace
  try:
    assert "exceeds available shared memory" in _lower_profiled(fp8, config)  # and one range more would not
  finally:
    jax.clear_caches()  # nor may a later trace of this launch find the patched one


@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="needs a GPU: Mosaic GPU's profiler runs compiled only")
def test_a_profiled_launch_records_every_phase(tmp_path, capsys):
  from benchmarks.sparse_mla_profile import main  # noqa: PLC0415
  assert main(["--batch", "2", "--tokens", "4", "--capacity", "4096", "--iters", "2", "--skip", "0",
               "--trace-dir", str(tmp_path)]) == 0
  text = capsys.readouterr().out
  for phase in ("gather wait", "relayout", "scores wait", "qk", "softmax", "| pv", "values wait", "values pv"):
    assert phase in text, phase
