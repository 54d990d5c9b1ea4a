"""Speculative-decoding metrics, counted per (row, verification round) as vLLM counts them.

A row takes part in a round while it still needs tokens. In each such round it proposes k drafts,
accepts a ∈ [0, k] of them (the longest prefix the target agrees with) and emits a + 1 tokens
(the accepted drafts and the target's bonus token), cut at `max_new_tokens`.

    acceptance_length_mean        1 + accepted / rounds        tokens per target forward, ∈ [1, k + 1]
    acceptance_rate_per_position  [#rounds with a > i] / rounds for draft i = 0 .. k−1
    draft_tokens_proposed         k · rounds
    draft_tokens_accepted         Σ a
    tokens_per_second             generated tokens / decode seconds (compilation excluded)
    tokens_per_second_per_acceptance_length   tokens_per_second / acceptance_length_mean, i.e. target
                                  forwards per second: comparable across runs whose drafts differ
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SpecMetrics:
  """Counts of one `Speculator.generate` call; the rates are properties (None before any round)."""

  num_speculative_tokens: int
  rounds: int  # (row, round) pairs
  accepted_per_position: tuple[int, ...]  # rounds in which draft i was accepted, i = 0 .. k−1
  tokens_generated: int  # over all rows, including each row's first token (from the prefill)
  seconds: float  # prefill + rounds, compilation excluded

  @property
  def draft_tokens_proposed(self) -> int:
    return self.num_speculative_tokens * self.rounds

  @property
  def draft_tokens_accepted(self) -> int:
    return sum(self.accepted_per_position)

  @property
  def acceptance_length_mean(self) -> float | None:
    return 1.0 + self.draft_tokens_accepted / self.rounds if self.rounds else None

  @property
  def acceptance_rate_per_position(self) -> list[float] | None:
    return [n / self.rounds for n in self.accepted_per_position] if self.rounds else None

  @property
  def tokens_per_second(self) -> float:
    return self.tokens_generated / self.seconds if self.seconds > 0 else 0.0

  @property
  def tokens_per_second_per_acceptance_length(self) -> float | None:
    length = self.acceptance_length_mean
    return self.tokens_per_second / length if length else None

  def as_dict(self) -> dict:
    """The issue's JSON keys (besides `tokens` and `matches_target`, which the CLI adds)."""
    return {
        "acceptance_length_mean": self.acceptance_length_mean,
        "acceptance_rate_per_position": self.acceptance_rate_per_position,
        "draft_tokens_proposed": self.draft_tokens_proposed,
        "draft_tokens_accepted": self.draft_tokens_accepted,
        "tokens_per_second": self.tokens_per_second,
    }
