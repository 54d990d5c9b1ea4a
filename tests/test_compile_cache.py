"""`--compilation-cache` (jax_mtp.compile_cache): a second run of the same shapes reads the prefill and the round
from JAX's persistent cache instead of compiling them, with the same tokens; `off` keeps nothing; a folder that
cannot be used is bad input when named, a note when it is the default."""

import json
import pathlib

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

from jax_mtp import compile_cache, decode

ARGS = ["--json", "--random-tiny", "--prompt-ids", "5,6,7", "--max-new-tokens", "5"]


@pytest.fixture(autouse=True)
def _restore_jax_cache():
  """The suite's own cache (tests/conftest.py) is back after each test, whatever the test pointed JAX at."""
  saved = jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir
  yield
  jax.config.update("jax_enable_compilation_cache", saved[0])
  compilation_cache.set_cache_dir(saved[1])
  compilation_cache.reset_cache()


def _run(capsys, *flags) -> dict:
  assert decode.main([*ARGS, *flags]) == 0
  return json.loads(capsys.readouterr().out)


def test_a_second_run_reads_both_programs_from_the_folder_and_decodes_the_same_tokens(tmp_path, capsys):
  first = _run(capsys, "--compilation-cache", str(tmp_path))
  assert first["compilation_cache"] == {"folder": str(tmp_path), "programs_read": 0}
  written = {p.name.split("-")[0] for p in tmp_path.iterdir()}
  assert {"jit__prefill_per_shard", "jit__round_per_shard"} <= written, written
  second = _run(capsys, "--compilation-cache", str(tmp_path))
  assert second["compilation_cache"]["programs_read"] >= 2
  assert second["tokens"] == first["tokens"]


def test_off_keeps_nothing(tmp_path, capsys):
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))  # where JAX would write, were it on
  result = _run(capsys, "--compilation-cache", "off")
  assert result["compilation_cache"] == {"folder": None, "programs_read": 0}
  assert not any(tmp_path.iterdir())


def test_unset_takes_jaxs_own_folder_and_else_the_xdg_one(tmp_path):
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax's"))
  assert compile_cache.configure(None, environ={}) == (str(tmp_path / "jax's"), None)
  jax.config.update("jax_compilation_cache_dir", None)
  folder, note = compile_cache.configure(None, environ={"XDG_CACHE_HOME": str(tmp_path)})
  assert (folder, note) == (str(tmp_path / "jax_mtp" / "xla"), None) and pathlib.Path(folder).is_dir()
  assert compile_cache.default_dir(environ={}) == pathlib.Path.home() / ".cache" / "jax_mtp" / "xla"


def test_a_named_folder_that_is_a_file_is_bad_input(tmp_path, capsys):
  (tmp_path / "f").write_text("")
  assert decode.main([*ARGS, "--compilation-cache", str(tmp_path / "f")]) == 2
  out, err = capsys.readouterr()
  assert out == "" and err == (f"error: --compilation-cache: cannot use {str(tmp_path / 'f')!r} as the compilation "
                               "cache: it is a file, not a folder (give a writable folder, or `off`)\n")


def test_a_default_folder_that_cannot_be_made_is_a_note_and_the_run_goes_on(tmp_path):
  (tmp_path / "f").write_text("")
  jax.config.update("jax_compilation_cache_dir", None)
  folder, note = compile_cache.configure(None, environ={"XDG_CACHE_HOME": str(tmp_path / "f")})
  assert folder is None and not jax.config.jax_enable_compilation_cache
  assert note.startswith(f"note: cannot use {str(tmp_path / 'f' / 'jax_mtp' / 'xla')!r} as the compilation cache")


def test_several_cpu_processes_run_without_one_and_naming_a_folder_for_them_is_bad_input(tmp_path):
  """compile_cache's docstring: their programs' keys differ by process, and jax 0.12.1 hung on a half-read cache."""
  folder, note = compile_cache.configure(None, environ={"XDG_CACHE_HOME": str(tmp_path)}, processes=2, platform="cpu")
  assert (folder, note) == (None, f"note: no compilation cache: {compile_cache.SEVERAL_CPU_PROCESSES}")
  assert not jax.config.jax_enable_compilation_cache and not any(tmp_path.iterdir())
  with pytest.raises(decode.BadInput, match=r"^--compilation-cache .*: several CPU processes cannot share one"):
    compile_cache.configure(str(tmp_path), processes=2, platform="cpu")
  assert compile_cache.configure("off", processes=2, platform="cpu") == (None, None)
  on_gpus = compile_cache.configure(str(tmp_path), processes=2, platform="gpu")  # one key for every process there
  assert on_gpus == (str(tmp_path), None) and jax.config.jax_enable_compilation_cache


def test_jaxs_own_cache_is_turned_off_for_several_cpu_processes_with_a_note(tmp_path):
  compile_cache.configure(str(tmp_path))
  assert compile_cache.off_for_several_cpu_processes(processes=1, platform="cpu") is None
  assert compile_cache.off_for_several_cpu_processes(processes=2, platform="tpu") is None
  assert jax.config.jax_enable_compilation_cache
  note = compile_cache.off_for_several_cpu_processes(processes=2, platform="cpu")
  assert note == f"note: no compilation cache: {compile_cache.SEVERAL_CPU_PROCESSES}"
  assert not jax.config.jax_enable_compilation_cache
  assert compile_cache.off_for_several_cpu_processes(processes=2, platform="cpu") is None  # already off: no note


def test_jaxs_own_folder_that_cannot_be_used_is_a_note_not_a_cache_the_run_claims_to_read(tmp_path):
  """JAX only warns about such a folder; the CLI's compile line would have said "0 programs read from" it."""
  (tmp_path / "f").write_text("")
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "f"))
  folder, note = compile_cache.configure(None, environ={})
  assert folder is None and not jax.config.jax_enable_compilation_cache
  assert note == (f"note: cannot use {str(tmp_path / 'f')!r} (JAX's jax_compilation_cache_dir, e.g. "
                  "JAX_COMPILATION_CACHE_DIR) as the compilation cache: it is a file, not a folder; the programs will "
                  "not be kept (--compilation-cache DIR picks another folder)")


def test_a_url_goes_to_jax_unchecked(tmp_path):
  """JAX reads and writes gs://… folders through etils; a local check would have made a folder named `gs:`."""
  assert compile_cache.configure("gs://bucket/jax_mtp") == ("gs://bucket/jax_mtp", None)
  assert jax.config.jax_compilation_cache_dir == "gs://bucket/jax_mtp" and not pathlib.Path("gs:").exists()


def test_several_processes_use_only_a_folder_named_for_them(tmp_path):
  """The default folder is each host's own; only process 0 writes, so the others would compile where it reads."""
  jax.config.update("jax_compilation_cache_dir", None)
  folder, note = compile_cache.configure(None, environ={"XDG_CACHE_HOME": str(tmp_path)}, processes=2, platform="gpu")
  assert (folder, note) == (None, f"note: no compilation cache: {compile_cache.SEVERAL_PROCESSES_DEFAULT}")
  assert not jax.config.jax_enable_compilation_cache and not any(tmp_path.iterdir())
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "shared"))  # JAX's own setting: the user's choice
  jax.config.update("jax_enable_compilation_cache", True)  # JAX's default, as a fresh process has it
  assert compile_cache.configure(None, environ={}, processes=2, platform="gpu") == (str(tmp_path / "shared"), None)
