"""benchmarks.sparse_mla_ablate: each named removal changes the kernel that is built (its traced body differs from
the full kernel's), and leaving `ablated` restores the full kernel exactly; unknown phases are refused by name.
On a GPU, the benchmark's rows run."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.sparse_mla_ablate import ABLATIONS, ablated, main, parse
from jax_mtp.kernels import sparse_mla_mgpu as mgpu

# V3.2's latent and rope widths (two buffer sets need the 512-wide latent), one head block, two steps of entries
SHAPES = [((1, 2, 64, 512), jnp.bfloat16), ((1, 2, 64, 64), jnp.bfloat16), ((1, 256, 512), jnp.bfloat16),
          ((1, 256, 64), jnp.bfloat16), ((1, 2, 64), jnp.int32)]


def _lowered(config=None) -> str:
  """The kernel body as traced (its jaxpr, inside the call's): what the CUDA lowering compiles, on any host."""
  fn = jax.jit(lambda *a: mgpu.sparse_mla_mgpu(*a, 0.1, out_dtype=jnp.bfloat16, config=config))
  return str(fn.trace(*(jax.ShapeDtypeStruct(*x) for x in SHAPES)).jaxpr)


def test_each_removal_changes_the_built_kernel_and_leaving_restores_it():
  full = _lowered()
  for phase in ABLATIONS:
    with ablated(parse(phase)):
      assert _lowered() != full, phase
    assert _lowered() == full, phase


def test_unknown_phases_are_refused_by_name():
  assert parse("") == () and parse("qk,pv") == ("qk", "pv")
  with pytest.raises(ValueError, match=r"unknown phases \['dots'\] in row 'qk,dots'"):
    parse("qk,dots")


@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="needs a GPU: the ablated kernels run compiled only")
def test_the_rows_run_on_the_gpu(capsys):
  assert main(["--batch", "2", "--tokens", "2", "--iters", "2", "--rows", "", "qk", "copies,relayout"]) == 0
  text = capsys.readouterr().out
  assert "| none (the kernel) |" in text and "| qk |" in text and "| copies,relayout |" in text
