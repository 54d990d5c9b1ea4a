"""Test-session setup: 8 virtual CPU devices for mesh tests, set before JAX initialises a backend, and
JAX's persistent compilation cache: many tests compile the same tiny models' programs through new
`Speculator` / `TargetDecoder` objects (each its own jit), which a disk cache keyed by the program
serves after the first compile. `JAX_MTP_TEST_COMPILE_CACHE` names the folder (default: one in the
temporary directory; the keys hold the jax version and flags, so a stale folder is only unused)."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_compilation_cache_dir", os.environ.get(
    "JAX_MTP_TEST_COMPILE_CACHE", os.path.join(tempfile.gettempdir(), "jax_mtp_test_compile_cache")))
# Every program is written, however fast it compiled (the tiny models' compile in well under a second). No
# size cap: with one, JAX's LRU scans the folder on each write, and a test that runs a model eagerly (thousands
# of one-op programs) ran for over 15 minutes. The folder holds a few hundred MB at most and lives in tmp.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
