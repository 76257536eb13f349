"""What speculation gave: per verification, how many drafts were proposed and how many accepted."""

from dataclasses import dataclass, field


@dataclass
class SpecMetrics:
    num_speculative_tokens: int
    num_proposals: int = 0  # verifications of at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Position j: how many proposals had a draft there, and how many had it accepted.
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.proposed_at = [0] * self.num_speculative_tokens
        self.accepted_at = [0] * self.num_speculative_tokens

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.num_proposals += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for j in range(num_draft):
            self.proposed_at[j] += 1
        for j in range(num_accepted):
            self.accepted_at[j] += 1

    def summary(self) -> dict:
        """The counts, the acceptance rate (accepted / proposed drafts), the mean accepted length
        (tokens emitted per verification: accepted drafts + the target's own token) and, per
        position, the share of proposals that reached it with the draft accepted."""
        return {
            "num_proposals": self.num_proposals,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None,
            "mean_accepted_length": 1 + self.num_accepted_tokens / self.num_proposals if self.num_proposals else None,
            "proposed_at_position": list(self.proposed_at),
            "accepted_at_position": list(self.accepted_at),
            "acceptance_by_position": [a / p if p else None for a, p in zip(self.accepted_at, self.proposed_at)],
        }
