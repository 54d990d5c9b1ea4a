"""How greedy draft tokens leave a drafter: the explicit capability protocol (docs/design.md §2, Opt-2).

A drafter class that sets `supports_local_argmax = True` promises a `get_top_tokens(hidden,
spec_step_idx=0)` that reduces (value, index) pairs across vocab shards; otherwise the speculator
takes `compute_logits` (full-vocab all-gather) and an argmax. vLLM probes a method name and
silently takes the slow path when it is missing; here a class that claims the capability without
the method is rejected when the speculator is built.
"""

from __future__ import annotations

LOCAL_ARGMAX = "top_tokens"
FULL_LOGITS = "logits"


def greedy_draft_path(drafter_cls: type) -> str:
  """`"top_tokens"` for a drafter with the local-argmax capability, else `"logits"`.

  Raises TypeError when the class claims the capability but has no callable `get_top_tokens`,
  or offers neither path.
  """
  name = drafter_cls.__name__
  if getattr(drafter_cls, "supports_local_argmax", False):
    if not callable(getattr(drafter_cls, "get_top_tokens", None)):
      raise TypeError(f"{name} sets supports_local_argmax=True but has no callable get_top_tokens")
    return LOCAL_ARGMAX
  if not callable(getattr(drafter_cls, "compute_logits", None)):
    raise TypeError(f"{name} has neither get_top_tokens (with supports_local_argmax) nor compute_logits")
  return FULL_LOGITS
