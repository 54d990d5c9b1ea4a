"""Copies the weights of the HF reference modules (tests/hf_reference.py) into jax_mtp's params.

HF linears are [out, in]; ours are [in, out]. HF fuses experts (`gate_up_proj` [E, 2F, D] with the
gate rows first, `down_proj` [E, D, F]); ours are stacked `w_gate_EDF`, `w_up_EDF`, `w_down_EFD`.
"""

import numpy as np

_NORMS = ("layernorm", "norm", "enorm", "hnorm")


def _set(tree: dict, path: list[str], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def block_params(sd: dict[str, np.ndarray], prefix: str = "") -> dict:
  """Decoder-block params from HF names under `prefix` (e.g. "mtp_block.")."""
  params: dict = {}
  for name, value in sd.items():
    if not name.startswith(prefix):
      continue
    parts = name[len(prefix):].split(".")
    if parts[:2] == ["mlp", "experts"]:
      _set_experts(params, parts[2], value)
    elif parts[:2] == ["mlp", "gate"]:
      _set(params, parts, value)  # router: [E, D] and the bias, same layout as ours
    elif parts[-1] == "bias" or _is_norm(parts):
      _set(params, parts, value)
    else:
      assert parts[-1] == "weight" and value.ndim == 2, name
      _set(params, parts[:-1] + ["kernel"], value.T)
  return params


def _is_norm(parts: list[str]) -> bool:
  return parts[-1] == "weight" and any(parts[-2].endswith(n) for n in _NORMS)


def _set_experts(params: dict, leaf: str, value: np.ndarray) -> None:
  if leaf == "gate_up_proj":  # [E, 2F, D]
    f = value.shape[1] // 2
    _set(params, ["mlp", "w_gate_EDF"], value[:, :f].transpose(0, 2, 1))
    _set(params, ["mlp", "w_up_EDF"], value[:, f:].transpose(0, 2, 1))
  else:
    assert leaf == "down_proj", leaf  # [E, D, F]
    _set(params, ["mlp", "w_down_EFD"], value.transpose(0, 2, 1))


def mtp_layer_params(sd: dict[str, np.ndarray]) -> dict:
  """MtpLayer params: HF `post_norm` is the checkpoint's `shared_head.norm`."""
  return {
      "enorm": {"weight": sd["enorm.weight"]},
      "hnorm": {"weight": sd["hnorm.weight"]},
      "eh_proj": {"kernel": sd["eh_proj.weight"].T},
      "mtp_block": block_params(sd, "mtp_block."),
      "shared_head_norm": {"weight": sd["post_norm.weight"]},
  }
