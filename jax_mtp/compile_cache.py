"""The CLI's persistent compilation cache: XLA's compiled prefill and round kept on disk, so a second run of the same
request shape does not compile them again.

Why: before its first token a request waits for its two programs. For V3.2's 61 layers their lowering (jax → MLIR)
takes ~10 s, and XLA's compile on a GPU (fusion, GEMM autotuning, each Mosaic GPU kernel's PTX) comes on top. JAX's
persistent cache keys a compiled program by its lowered module, the jax / jaxlib versions, the devices and XLA's
flags, so a run with the same model, flags, batch and capacity reads XLA's work back; the lowering still runs (it
makes the key). On a GPU JAX also keeps XLA's per-fusion autotuning results in the same folder, which helps programs
that differ. vLLM keeps its compiled graphs the same way (~/.cache/vllm).

`--compilation-cache`: unset, JAX's own setting where one was made (JAX_COMPILATION_CACHE_DIR, or a notebook's
`jax.config`), else `$XDG_CACHE_HOME/jax_mtp/xla` (~/.cache when unset); a folder; or `off`. JAX writes a program
only when it compiled for ≥ 1 s (`jax_persistent_cache_min_compile_time_secs`), so the embedded default's small
prefill is not written. Entries are never evicted: delete the folder to reclaim its space. With several processes
(`--num-processes`) JAX writes from process 0 only, so the others read only from a folder they share with it: there
the default folder (each host's own home) is not used, only one the flag or JAX's setting names (a note says so).
Whether GPU or TPU processes that disagree on reading a program (one reads, another compiles) run on is untested.

Several CPU processes run without a cache (a note; naming a folder is bad input). JAX keys a CPU program by its
process's devices (on GPUs it strips them from the key), so only process 0 ever reads one, and the others compile
anyway: no run gets shorter. And on jax 0.12.1 the processes hang in a program's first run when one read it from the
cache and another compiled it (two CPU processes over gloo, reproduced 2026-12-07; 0.11.2 ran them).
"""

from __future__ import annotations

import os
import pathlib

import jax
from jax.experimental.compilation_cache import compilation_cache

from jax_mtp.decode_flags import BadInput

OFF = "off"
_HIT = "/jax/compilation_cache/cache_hits"
_hits = 0


def _count(event: str, **_) -> None:
  global _hits
  if event == _HIT:
    _hits += 1


jax.monitoring.register_event_listener(_count)  # once, at import: JAX has no call to list its listeners


def default_dir(environ=os.environ) -> pathlib.Path:
  return pathlib.Path(environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "jax_mtp" / "xla"


SEVERAL_CPU_PROCESSES = ("several CPU processes cannot share one: JAX keys a CPU program by its process's devices, "
                         "so the others would compile anyway, and on jax 0.12.1 the processes hang when one reads a "
                         "program from the cache and another compiles it")
SEVERAL_PROCESSES_DEFAULT = ("several processes use only a folder named for them (--compilation-cache DIR, or JAX's "
                             "own setting), one they all see: JAX writes from process 0 only, so in a folder of each "
                             "host's own (the default, under the home) the other hosts would compile while process 0 "
                             "read, which hung on CPUs")


def configure(choice: str | None, environ=os.environ, processes: int | None = None,
              platform: str | None = None) -> tuple[str | None, str | None]:
  """Points JAX's persistent cache where `--compilation-cache` says (module docstring): (the folder, or None for
  none; a note for stderr, or None). A folder named by the flag that cannot be made is bad input; JAX's own or the
  default one is skipped with a note instead (a read-only home must not stop a run). A URL (`gs://…`) goes to JAX
  unchecked. `processes` and `platform` default to JAX's (after `jax.distributed.initialize`)."""
  if choice == OFF:
    _use(None)
    return None, None
  if _several_cpu_processes(processes, platform):
    if choice is not None:
      raise BadInput(f"--compilation-cache {choice}: {SEVERAL_CPU_PROCESSES} (give `off`)")
    _use(None)
    return None, f"note: no compilation cache: {SEVERAL_CPU_PROCESSES}"
  jaxs_own = choice is None and jax.config.jax_compilation_cache_dir and jax.config.jax_enable_compilation_cache
  if choice is None and not jaxs_own and _process_count(processes) > 1:
    _use(None)
    return None, f"note: no compilation cache: {SEVERAL_PROCESSES_DEFAULT}"
  # the user's JAX setting wins over our default; it is checked as the default is (JAX only warns about a folder it
  # cannot use, and the run would have reported reading from it)
  folder = choice if choice is not None else (jax.config.jax_compilation_cache_dir if jaxs_own
                                             else default_dir(environ))
  if _is_url(str(folder)):  # gs://…: JAX reads and writes it through etils' epath, unchecked here
    _use(folder)
    return folder, None
  path = pathlib.Path(folder).expanduser()
  kept = folder if jaxs_own else str(path)  # JAX's own setting stays as the user wrote it
  why = _unusable(path)
  if why:
    whose = " (JAX's jax_compilation_cache_dir, e.g. JAX_COMPILATION_CACHE_DIR)" if jaxs_own else ""
    why = f"cannot use {kept!r}{whose} as the compilation cache: {why}"
    if choice is not None:
      raise BadInput(f"--compilation-cache: {why} (give a writable folder, or `off`)")
    _use(None)
    return None, f"note: {why}; the programs will not be kept (--compilation-cache DIR picks another folder)"
  _use(kept)
  return kept, None


def _is_url(folder: str) -> bool:
  return "://" in folder


def _unusable(folder: pathlib.Path) -> str | None:
  """Why `folder` cannot hold the cache (made if missing), or None."""
  try:
    if folder.exists() and not folder.is_dir():
      return "it is a file, not a folder"
    folder.mkdir(parents=True, exist_ok=True)
    if not os.access(folder, os.W_OK | os.X_OK):
      return "not writable"
  except OSError as e:
    return e.strerror or str(e)
  return None


def off_for_several_cpu_processes(processes: int | None = None, platform: str | None = None) -> str | None:
  """JAX's own cache turned off where several CPU processes run (module docstring), for the commands without
  `--compilation-cache` (`jax_mtp.convert`): the note saying so where it was on, else None."""
  if not _several_cpu_processes(processes, platform):
    return None
  was_on = bool(jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir)
  _use(None)
  return f"note: no compilation cache: {SEVERAL_CPU_PROCESSES}" if was_on else None


def _several_cpu_processes(processes: int | None, platform: str | None) -> bool:
  return _process_count(processes) > 1 and (jax.default_backend() if platform is None else platform) == "cpu"


def _process_count(processes: int | None) -> int:
  return jax.process_count() if processes is None else processes


def _use(folder: str | None) -> None:
  """JAX's cache at `folder`, or none. JAX opens its cache and decides whether it is used once per process, so a
  change (a test's, a notebook's second run) resets it to be opened again."""
  if (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir) == (folder is not None, folder):
    return
  jax.config.update("jax_enable_compilation_cache", folder is not None)
  if folder is not None:
    compilation_cache.set_cache_dir(folder)
  compilation_cache.reset_cache()


def programs_read() -> int:
  """Programs read from the persistent cache instead of compiled, so far in this process."""
  return _hits
