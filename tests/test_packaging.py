"""Packaging: `kernels/` (repo root) ships as `jax_mtp.kernels`, never as a top-level `kernels`.

A top-level `kernels` would clash with PyPI's `kernels`, which transformers imports. Asserted from
the repo root, from another directory, and from a wheel built and installed away from the checkout.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_PROBE = """
import importlib.util, json, sys
import jax_mtp, jax_mtp.kernels
top = importlib.util.find_spec("kernels")
print(json.dumps({
    "jax_mtp": jax_mtp.__file__, "kernels": jax_mtp.kernels.__file__,
    "top_level_kernels": top.origin if top else None,
    "meta_path": [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path],
}))
"""
# Copying these into the wheel's build tree would be slow (.venv) or stale (build/, *.egg-info).
_NOT_SOURCES = shutil.ignore_patterns(".venv", "venv", ".git", "build", "dist", "*.egg-info", "__pycache__",
                                      ".pytest_cache", ".hypothesis", ".ipynb_checkpoints")


def _clean_env(**extra: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
  env.update(JAX_PLATFORMS="cpu", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
  return env


def _run(cmd: list[str], cwd: Path, **env: str) -> str:
  proc = subprocess.run(cmd, cwd=cwd, env=_clean_env(**env), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
  return proc.stdout


def _probe(cwd: Path, flags: tuple[str, ...] = (), prelude: str = "", **env: str) -> dict:
  """Imports jax_mtp.kernels in a fresh interpreter and reports where everything came from."""
  return json.loads(_run([sys.executable, *flags, "-c", prelude + _PROBE], cwd, **env).strip().splitlines()[-1])


def _assert_is_our_kernels(found: dict) -> None:
  """`jax_mtp.kernels` was loaded from a copy of this checkout's `kernels/__init__.py`."""
  kernels = Path(found["kernels"])
  assert kernels.name == "__init__.py" and kernels.parent.name == "kernels", found
  assert kernels.read_bytes() == (REPO / "kernels" / "__init__.py").read_bytes(), found


def test_import_from_repo_root():
  """From the repo root, `jax_mtp` is the checkout's and `jax_mtp.kernels` is the root `kernels/`."""
  found = _probe(REPO)
  _assert_is_our_kernels(found)
  assert Path(found["jax_mtp"]) == REPO / "jax_mtp" / "__init__.py"
  assert Path(found["kernels"]) == REPO / "kernels" / "__init__.py"


def test_import_from_another_directory(tmp_path):
  """From outside the repo (the installed package, editable or not), `jax_mtp.kernels` imports and
  no top-level `kernels` package comes from this project's `kernels/` (PyPI's, which transformers >= 5.25
  installs, may: in this checkout's .venv it lies under the repo too)."""
  found = _probe(tmp_path)
  _assert_is_our_kernels(found)
  top = found["top_level_kernels"]
  assert top is None or not Path(top).resolve().is_relative_to(REPO / "kernels"), f"top-level `kernels` is {top}"


@pytest.mark.slow
def test_wheel_ships_jax_mtp_kernels_only(tmp_path):
  """A wheel built offline (no build isolation, no index) holds `jax_mtp/__init__.py` and
  `jax_mtp/kernels/__init__.py` and no top-level `kernels/`; installed with `--target` and imported
  with only that target on PYTHONPATH (no site processing, so no editable finder), `jax_mtp` and
  `jax_mtp.kernels` load from the target."""
  try:
    setuptools_major = int(importlib.metadata.version("setuptools").split(".")[0])
  except importlib.metadata.PackageNotFoundError:
    setuptools_major = 0
  if setuptools_major < 77:
    pytest.fail("building the wheel offline needs setuptools>=77 in this interpreter: install the `test` extra")
  src, dist, target = tmp_path / "src", tmp_path / "dist", tmp_path / "target"
  shutil.copytree(REPO, src, ignore=_NOT_SOURCES)  # builds in-tree: keep build/ and egg-info out of REPO
  pip = [sys.executable, "-m", "pip", "--no-input"]
  _run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist)], tmp_path)
  (wheel,) = dist.glob("jax_mtp-*.whl")
  names = set(zipfile.ZipFile(wheel).namelist())
  assert {"jax_mtp/__init__.py", "jax_mtp/kernels/__init__.py", "jax_mtp/mtp.py"} <= names, sorted(names)
  # the embedded default, which `python -m jax_mtp.decode` runs with no --checkpoint, ships whole
  shipped = {f"jax_mtp/default_model/{p.name}" for p in (REPO / "jax_mtp" / "default_model").iterdir() if p.is_file()}
  assert "jax_mtp/default_model/model.safetensors" in shipped and shipped <= names, sorted(shipped - names)
  assert not any(name.startswith("kernels/") for name in names), sorted(names)
  tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
  assert tops == {"jax_mtp"}, sorted(names)

  _run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)], tmp_path)
  # -S: no `site`, so no .pth files and no editable finder; -s -P: no user site, no cwd on sys.path.
  # The dependencies (jax, flax, ...) come from this interpreter's site-packages, appended after the target.
  deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
  found = _probe(tmp_path, ("-S", "-s", "-P"), f"import sys; sys.path += {deps!r}\n", PYTHONPATH=str(target))
  _assert_is_our_kernels(found)
  assert Path(found["jax_mtp"]).is_relative_to(target), found
  assert Path(found["kernels"]) == target / "jax_mtp" / "kernels" / "__init__.py", found
  assert not any("Editable" in name for name in found["meta_path"]), found["meta_path"]
  assert found["top_level_kernels"] is None or not Path(found["top_level_kernels"]).is_relative_to(target)


def test_import_from_an_uninstalled_checkout(tmp_path):
  """`PYTHONPATH=<checkout>` with no install (how the GPU machine runs it): `jax_mtp.kernels` is the
  checkout's `kernels/`, mapped under that name only — no top-level `kernels` appears."""
  deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
  found = _probe(tmp_path, ("-S", "-s", "-P"), f"import sys; sys.path += {deps!r}\n", PYTHONPATH=str(REPO))
  assert Path(found["jax_mtp"]) == REPO / "jax_mtp" / "__init__.py", found
  assert Path(found["kernels"]) == REPO / "kernels" / "__init__.py", found
  assert not any("Editable" in name for name in found["meta_path"]), found["meta_path"]


def test_import_does_not_load_the_gpu_kernels_and_a_jax_without_their_internals_fails_clearly():
  """The GPU kernels use Mosaic GPU internals that move between JAX releases: `import jax_mtp` must not
  load them, and when they are missing only impl='pallas_gpu' fails, with the supported versions."""
  code = textwrap.dedent("""
      import sys
      sys.modules["jax.experimental.pallas.mosaic_gpu"] = None  # a JAX that moved it: importing it fails
      import jax_mtp
      from jax_mtp.kernels.fused_allreduce_rmsnorm import gpu_kernels
      assert not [m for m in sys.modules if m.startswith("jax_mtp.kernels.fused_allreduce_rmsnorm_gpu")]
      cfg = jax_mtp.tiny()
      spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), 2)  # impl xla: no GPU kernel needed
      try:
        gpu_kernels()
      except ImportError as e:
        print("ERROR", e)
  """)
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert run.returncode == 0, run.stderr[-2000:]
  assert "ERROR impl='pallas_gpu' needs the Mosaic GPU internals of jax 0.11.2 and 0.12.0.1" in run.stdout, run.stdout
