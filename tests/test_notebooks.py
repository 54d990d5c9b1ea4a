"""Notebooks: every `notebooks/*.py` (jupytext percent, paired with an `.ipynb`) runs top to bottom
in a `python3` kernel of this interpreter, uses only jax_mtp's public API, and its `.ipynb` holds the
same cells.

Needs the `notebooks` extra (`tools/bootstrap.sh test,reference,notebooks`, as CI runs); without it
these tests fail rather than skip.
"""

import ast
import json
import sys
from pathlib import Path

import pytest

import jax_mtp

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))
# jax.experimental.pallas.tpu: JAX's own API (`force_tpu_interpret_mode`, `InterpretParams`), which runs
# the Opt-1 TPU kernel on CPU devices in notebook 02.
# tempfile: notebook 03 writes a checkpoint. jax_mtp.checkpoint and jax_mtp.reference.*: the HF reader beneath
# `jax_mtp.load` and the vLLM fixture format, public modules that `jax_mtp` does not re-export (they need
# safetensors).
# time, matplotlib.pyplot: notebooks 01 and 03 time and plot the trained default.
ALLOWED_IMPORTS = {"jax", "jax.numpy", "numpy", "jax_mtp", "jax.experimental.pallas.tpu", "tempfile", "time",
                   "matplotlib.pyplot"}
PUBLIC_MODULES = {
    "jax_mtp.checkpoint": {"load_hf_checkpoint", "load_mtp_only"},
    "jax_mtp.reference": {"fixtures", "tiny_checkpoint"},
}
# The kernels are not re-exported from `jax_mtp`: their public API is their modules (kernels/__init__.py),
# of which a notebook may import the documented functions: the public wrapper (with `impl=`), the
# reference (the spec) and `check_operands`.
KERNEL_API = {
    "jax_mtp.kernels.vocab_argmax": {"vocab_parallel_argmax", "reference", "check_operands"},
    "jax_mtp.kernels.fused_allreduce_rmsnorm": {"fused_allreduce_rmsnorm", "reference", "check_operands"},
    "jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_chained": {"gpu_workspace"},  # the `workspace=` of the wrapper
}


def _need(module: str):
  try:
    return __import__(module, fromlist=["_"])
  except ImportError as e:
    pytest.fail(f"the notebook tests need the `notebooks` extra ({e}): run"
                " `tools/bootstrap.sh test,reference,notebooks` or `.venv/bin/python -m pip install -e '.[notebooks]'`",
                pytrace=False)


def _cells(nb) -> list[tuple[str, str]]:
  return [(cell.cell_type, cell.source) for cell in nb.cells]


def _ids(path: Path) -> str:
  return path.name


def test_notebooks_exist():
  """The glob below finds the notebooks (an empty parametrization would skip silently)."""
  assert NOTEBOOKS, "no notebooks/*.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_ipynb_is_in_sync(path):
  """The `.py` declares the `ipynb,py:percent` pairing and the `.ipynb` beside it has the same cells
  (code and markdown, in order); regenerate it with `jupytext --sync notebooks/<name>.py`."""
  jupytext, nbformat = _need("jupytext"), _need("nbformat")
  text_nb = jupytext.read(path)
  assert text_nb.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent", text_nb.metadata
  ipynb = path.with_suffix(".ipynb")
  assert ipynb.exists(), f"{ipynb.name} missing: run `jupytext --sync {path.relative_to(REPO)}`"
  paired_nb = nbformat.read(ipynb, as_version=4)
  assert _cells(paired_nb) == _cells(text_nb), f"{ipynb.name} is stale: run `jupytext --sync {path.relative_to(REPO)}`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_uses_only_the_public_api(path):
  """Code cells import only jax, jax.numpy, jax.experimental.pallas.tpu, numpy, tempfile, `jax_mtp`, the
  kernels' documented functions (KERNEL_API) and the loader / fixture modules (PUBLIC_MODULES), and read
  only `jax_mtp.<name>` for names in `jax_mtp.__all__`."""
  jupytext = _need("jupytext")
  source = "\n".join(cell.source for cell in jupytext.read(path).cells if cell.cell_type == "code")
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      assert {alias.name for alias in node.names} <= ALLOWED_IMPORTS, ast.unparse(node)
    elif isinstance(node, ast.ImportFrom) and node.module in {**KERNEL_API, **PUBLIC_MODULES}:
      allowed = {**KERNEL_API, **PUBLIC_MODULES}[node.module]
      assert {alias.name for alias in node.names} <= allowed, ast.unparse(node)
    elif isinstance(node, ast.ImportFrom):
      assert node.module in ALLOWED_IMPORTS, ast.unparse(node)
      if node.module == "jax_mtp":
        assert {alias.name for alias in node.names} <= set(jax_mtp.__all__), ast.unparse(node)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "jax_mtp":
      assert node.attr in jax_mtp.__all__, ast.unparse(node)


# CI's bounded form: a notebook listed here runs up to (not including) the markdown cell that starts with the
# heading; the rest runs in the full form (JAX_MTP_FULL_TESTS=1, test_notebook_executes_in_full). 03's last
# section times the embedded default at k = 1 … 5 (two-thirds of the notebook's time); its claims, speculative
# == plain greedy and acceptance length at k = 3, are test_default_model.py's in CI.
CI_STOPS_AT = {"03_speculative_decoding.py": "## The trained default"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_executes(path, tmp_path):
  """Every cell runs without error (the notebooks assert their own claims) in a `python3` kernel
  started by this interpreter, with the notebook's folder as working directory (CI_STOPS_AT: the
  sections beyond CI's bounded form run in test_notebook_executes_in_full)."""
  _execute(path, tmp_path, CI_STOPS_AT.get(path.name))


@pytest.mark.full
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name in CI_STOPS_AT], ids=_ids)
def test_notebook_executes_in_full(path, tmp_path):
  """The notebooks CI runs in a bounded form, every cell."""
  _execute(path, tmp_path, None)


def _execute(path: Path, tmp_path: Path, stop_at: str | None) -> None:
  jupytext, nbclient, nbformat = _need("jupytext"), _need("nbclient"), _need("nbformat")
  exceptions = _need("nbclient.exceptions")
  kernelspec, manager = _need("jupyter_client.kernelspec"), _need("jupyter_client.manager")
  # A private `python3` spec, so a user- or system-wide `python3` kernel cannot stand in for this interpreter.
  spec_dir = tmp_path / "kernels" / "python3"
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "Python 3 (ipykernel)", "language": "python",
  }))
  specs = kernelspec.KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
  km = manager.KernelManager(kernel_name="python3", kernel_spec_manager=specs)

  nb = jupytext.read(path)
  if stop_at is not None:
    stops = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown" and cell.source.startswith(stop_at)]
    assert len(stops) == 1, f"{path.name}: CI_STOPS_AT's heading {stop_at!r} is not one markdown cell"
    assert any(cell.cell_type == "code" for cell in nb.cells[:stops[0]]), f"{path.name}: nothing before {stop_at!r}"
    nb.cells = nb.cells[:stops[0]]
  nb.cells.append(nbformat.v4.new_code_cell("import sys, jax_mtp\nprint(sys.executable)\nprint(jax_mtp.__file__)"))
  client = nbclient.NotebookClient(nb, km=km, timeout=120, resources={"metadata": {"path": str(path.parent)}})
  try:
    client.execute()
  except exceptions.CellExecutionError as e:
    pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)
  stdout = "".join(out["text"] for out in nb.cells[-1].outputs if out.get("name") == "stdout")
  executable, package = stdout.split("\n")[:2]
  assert executable == sys.executable
  assert package == jax_mtp.__file__, "the kernel imports another jax_mtp than the tests (not an editable install?)"
