"""What tokens cost: a model's prices per million input and output tokens, and costs kept as
integers of nano-units (a billionth of the prices' currency), so that sums over millions of
requests stay exact."""

from __future__ import annotations

from dataclasses import dataclass

NANO = 1_000_000_000
"""Nano-units in one unit of currency."""


@dataclass(frozen=True, slots=True)
class Price:
    input_per_million: float = 0.0
    output_per_million: float = 0.0

    def cost(self, input_tokens: int, output_tokens: int) -> int:
        """The cost of so many tokens, in nano-units (a million tokens at 1.0 cost 10^9)."""
        return round(
            input_tokens * self.input_per_million * 1000
            + output_tokens * self.output_per_million * 1000
        )


def units(nanos: int) -> float:
    """Nano-units as units of currency, as the API shows them."""
    return round(nanos / NANO, 9)


def nanos(amount: float) -> int:
    return round(amount * NANO)
