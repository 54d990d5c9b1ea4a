"""Training state on disk: orbax checkpoints of (params, optimizer state) by step, for resuming.

Orbax writes each step into a temporary directory and renames it into place when complete, so a
run killed mid-save leaves every earlier step readable; `restore_latest` reads the newest complete
one into the structure (and placement) of the state the run starts from. The two newest steps are kept.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from jax_mtp.errors import first_line


class DamagedState(ValueError):
  """The newest saved step cannot be read; the message names it and the steps before it."""


class StateCheckpoints:
  def __init__(self, directory: str, keep: int = 2):
    options = ocp.CheckpointManagerOptions(create=True, max_to_keep=keep, enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)

  def save(self, step: int, params: dict, opt_state) -> None:
    self._manager.save(step, args=ocp.args.StandardSave({"params": params, "opt_state": opt_state}))
    self._manager.wait_until_finished()

  def restore_latest(self, params: dict, opt_state) -> tuple[int, dict, object]:
    """(step, params, opt_state) of the newest checkpoint, or (0, the given ones) when there is none."""
    step = self._manager.latest_step()
    if step is None:
      return 0, params, opt_state
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, {"params": params, "opt_state": opt_state})
    try:
      state = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
    except Exception as e:  # noqa: BLE001 (a damaged step: orbax raises what its layers raise)
      earlier = [s for s in self._manager.all_steps() if s < step]
      first = first_line(e)[:200]
      hint = (f"move it aside to resume from step {max(earlier)}" if earlier else "no earlier step is saved")
      raise DamagedState(f"step {step} in {self._manager.directory} cannot be read ({type(e).__name__}: {first}); "
                         f"{hint}") from e
    return step, state["params"], state["opt_state"]
