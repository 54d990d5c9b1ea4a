"""libtpu, the TPU toolchain the AOT tests compile with on a machine without TPUs: compile-only
topologies (`jax.experimental.topologies`) and `tools/tpu_aot_compile.py`. The `tpu` extra installs it,
and CI does; the lent GPU image has none. One place says how its absence is found, and the tests that
need it skip there with that reason (conftest.py lets several processes load it at once)."""

import importlib.util

import pytest

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
requires_libtpu = pytest.mark.skipif(
    not HAS_LIBTPU, reason="needs libtpu to compile for a TPU topology: install the `tpu` extra (CI does)")
