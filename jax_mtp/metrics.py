"""Speculative-decoding metrics: what vLLM's spec-decode metrics (`SpecDecodingStats`) mean, counted per
(row, verification round) as vLLM counts them per (request, step).

A row takes part in a round while it still needs tokens (fewer than `max_new_tokens`, no stop id yet).
In each such round it proposes k drafts, the target accepts a ∈ [0, k] of them (the longest prefix it
agrees with; rejection sampling at temperature > 0), and the row emits the a accepted drafts and the
target's bonus token, cut at `max_new_tokens` and just after a stop id (EOS).

The draft counters count what the target ACCEPTED, not what the row emitted: the last round of a row
can accept drafts that fall past `max_new_tokens` or past a stop id, and those count as accepted
although they are cut from the output. So does vLLM: its scheduler observes a step's drafts
(accepted = sampled tokens − 1) before it appends the step's tokens and trims them at max_tokens or a
stop token, and it never schedules fewer than k drafts near max_tokens (only near max_model_len).

    key (JSON)                    here                    vLLM
    draft_tokens_proposed         k · rounds              num_draft_tokens (rounds: num_drafts)
    draft_tokens_accepted         Σ a                     num_accepted_tokens
    acceptance_rate_per_position  [#rounds with a > i] / rounds, draft i = 0 .. k−1
                                                          num_accepted_tokens_per_pos[i] / num_drafts
    acceptance_length_mean        1 + accepted / rounds   mean acceptance length, ∈ [1, k + 1]: tokens per
                                  target forward, except that a row's last round may count drafts it cut
    tokens_per_second             emitted tokens / decode seconds (compilation excluded); only this counts
                                  emitted tokens (`tokens_generated`, each row's first token included)
    tokens_per_second_per_acceptance_length   tokens_per_second / acceptance_length_mean, i.e. target
                                  forwards per second: comparable across runs whose drafts differ

    compile_seconds               seconds this call spent compiling its prefill and round (0 where they were
                                  compiled before, for the same shapes): the first request's wait before its prefill

One rule of ours has no vLLM counterpart: a round in which a row fails (a non-finite target hidden,
`DecodeState.failed_B`) counts only the drafts judged on finite hiddens before the first bad one.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SpecMetrics:
  """Counts of one `Speculator.generate` call; the rates are properties (None before any round)."""

  num_speculative_tokens: int
  rounds: int  # (row, round) pairs: vLLM's num_drafts
  accepted_per_position: tuple[int, ...]  # rounds in which the target accepted draft i (emitted or not), i < k
  tokens_generated: int  # over all rows, including each row's first token (from the prefill)
  seconds: float  # prefill + rounds, compilation excluded
  compile_seconds: float = 0.0  # compiling this call's programs (0 where cached), before the prefill

  @property
  def draft_tokens_proposed(self) -> int:
    return self.num_speculative_tokens * self.rounds

  @property
  def draft_tokens_accepted(self) -> int:
    """vLLM's num_accepted_tokens: every accepted draft, also those a row's last round cut (module docstring)."""
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
    """The CLI's JSON keys (besides `tokens`, `finish_reasons` and the others the CLI adds); their meaning,
    vLLM's, is the module docstring's table."""
    return {
        "acceptance_length_mean": self.acceptance_length_mean,
        "acceptance_rate_per_position": self.acceptance_rate_per_position,
        "draft_tokens_proposed": self.draft_tokens_proposed,
        "draft_tokens_accepted": self.draft_tokens_accepted,
        "tokens_per_second": self.tokens_per_second,
        "compile_seconds": self.compile_seconds,
    }
