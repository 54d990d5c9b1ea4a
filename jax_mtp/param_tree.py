"""The params trees a config's models take (abstract: `jax.eval_shape` of their init, once per config), and the
check that a tree a user hands in is one (`Speculator.shard`, `TargetDecoder.shard`, `ShardedMtp.shard`,
`MtpDrafter.shard`). The abstract trees also give the drafters' param specs; they are shared, so never changed in
place (`checkpoint_names.abstract_params`, whose callers do change theirs, makes its own).

Flax reads the params a module asks for and ignores the rest, so a tree of another config ran without a word: a
3-layer target's params under a 1-layer config decoded with layer 0 alone. A wrapped tree ({"params": ...}), the
target and MTP trees swapped, or another hidden size failed deep inside a trace instead. The check compares the
tree with the abstract one `init` gives (`jax.eval_shape`: no weight is made): every key, and every leaf's shape.
An FP8 weight kept as stored (jax_mtp.fp8) has the same shape as the weight and a `_scale_inv` sibling, which is
not an extra key.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax

from jax_mtp import fp8
from jax_mtp.config import MtpConfig


@functools.cache
def expected_target_tree(cfg: MtpConfig):
  """The abstract params tree of `cfg`'s target model (`init_target_params`)."""
  from jax_mtp.model import init_target_params  # noqa: PLC0415 (the model imports the modules this one serves)
  return jax.eval_shape(lambda key: init_target_params(cfg, key), jax.random.key(0))


@functools.cache
def expected_mtp_tree(cfg: MtpConfig):
  """The abstract params tree of `cfg`'s MTP layers with the embedding and head (`init_params`; the drafter checks
  its own layers only: it takes the embedding and head from the target)."""
  from jax_mtp.mtp import init_params  # noqa: PLC0415
  return jax.eval_shape(lambda key: init_params(cfg, key), jax.random.key(0))


def check_param_tree(params, expected, what: str, path: tuple[str, ...] = ()) -> None:
  """A ValueError naming the first place `params` differs from `expected`: not a dict, a key missing or extra, or
  a leaf's shape. `what` names the tree for the message ("target params")."""
  where = "/".join(path) or "the top level"
  if not isinstance(params, Mapping):
    raise ValueError(f"{what}: {where} is a {type(params).__name__}, not a dict of params as init gives")
  missing = [key for key in expected if key not in params]
  extra = [key for key in params if key not in expected
           and not (key.endswith(fp8.SCALE_SUFFIX) and key[:-len(fp8.SCALE_SUFFIX)] in expected)]
  if missing or extra:
    raise ValueError(f"{what} do not fit this config at {where}: missing {sorted(missing)[:4]}, extra "
                     f"{sorted(extra)[:4]} (params of another config, or another tree: the target's and the MTP "
                     f"layers' are separate, as init_target_params and init_params give them)")
  for key, want in expected.items():
    got = params[key]
    if isinstance(want, Mapping):
      check_param_tree(got, want, what, (*path, key))
    elif tuple(getattr(got, "shape", ())) != tuple(want.shape):
      raise ValueError(f"{what}: {'/'.join((*path, key))} has shape {tuple(getattr(got, 'shape', ()))}, this "
                       f"config's model takes {tuple(want.shape)}")
