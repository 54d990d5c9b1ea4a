"""Test-session setup: 8 virtual CPU devices for mesh tests, set before JAX initialises a backend;
JAX's persistent compilation cache; libtpu loadable by several processes (below); and the `full` marker.

The cache: many tests compile the same tiny models' programs through new `Speculator` / `TargetDecoder`
objects (each its own jit), which a disk cache keyed by the program serves after the first compile.
`JAX_MTP_TEST_COMPILE_CACHE` names the folder (default: one in the temporary directory; the keys hold the
jax version and flags, so a stale folder is only unused). The settings go into the environment too, so the
processes tests start (`python -m jax_mtp.decode`, the multi-process runs, the notebooks' kernels) share it.

`@pytest.mark.full`: the cases beyond the bounded form CI runs (docs/testing.md); they skip, with a reason
naming the switch, unless `JAX_MTP_FULL_TESTS=1`; a case that is full-only for some fixture params skips itself
with `FULL_ONLY` unless `FULL_TESTS`."""

import os
import sys
import tempfile

import pytest

# The repo's `kernels/` folder (installed as `jax_mtp.kernels`) sits at the repo root, which `python -m pytest` puts
# first on sys.path; there it shadowed PyPI's `kernels`, which transformers >= 5.25 requires and imports, and every
# test importing transformers failed to collect. The root goes behind site-packages (pyproject's
# `--import-mode=append` keeps pytest from putting it back in front): `tests`, `benchmarks` and `tools` still import
# from it, while `kernels` is PyPI's.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _REPO] + [_REPO]

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu takes a host-wide lockfile (/tmp/libtpu_lockfile) when it loads, to keep a second process off the TPU chips;
# a second load fails while the first process lives. The tests load it only to compile for compile-only topologies
# (tests/tpu_toolchain.py): no chip is claimed, yet a test that compiles in this process would make every process it
# starts (tests/test_tpu_aot.py's tools/tpu_aot_compile.py) fail, and so would another test run at the same time.
# libtpu's own switch for several loads, for this process and the ones it starts; not where the tests may run on TPUs
# (JAX_PLATFORMS naming tpu, or empty: JAX picks the platform).
if os.environ["JAX_PLATFORMS"] and "tpu" not in os.environ["JAX_PLATFORMS"]:
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Every program is written, however fast it compiled (the tiny models' compile in well under a second). No
# size cap: with one, JAX's LRU scans the folder on each write, and a test that runs a model eagerly (thousands
# of one-op programs) ran for over 15 minutes. The folder holds a few hundred MB at most and lives in tmp.
os.environ.update(
    JAX_COMPILATION_CACHE_DIR=os.environ.get(
        "JAX_MTP_TEST_COMPILE_CACHE", os.path.join(tempfile.gettempdir(), "jax_mtp_test_compile_cache")),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

FULL_TESTS = os.environ.get("JAX_MTP_FULL_TESTS") == "1"
FULL_ONLY = "full form only: run with JAX_MTP_FULL_TESTS=1 (docs/testing.md)"  # the skip reason


def pytest_collection_modifyitems(config, items):
  if FULL_TESTS:
    return
  skip = pytest.mark.skip(reason=FULL_ONLY)
  for item in items:
    if item.get_closest_marker("full"):
      item.add_marker(skip)
