"""What an hour of a machine buys: a throughput at a price per hour as a price per million
tokens, the unit API prices are quoted in, so that self-hosting and an API compare.

Formula: per_million = price_per_hour / 3600 / tok_per_s · 1e6.

At a run's measured throughput this is what the run's load cost on the machine (an idle
machine still costs its hour: a light load is dear per token); at the what-if roofline's
tokens/s bound it is the least any engine can make that machine's tokens cost.
"""

from __future__ import annotations

SECONDS_PER_HOUR = 3600.0
PER = 1e6  # per million tokens


def per_million_tokens(price_per_hour: float, tok_per_s: float | None) -> float | None:
    """The price of a million tokens made at `tok_per_s` (None: no throughput)."""
    if not tok_per_s or tok_per_s <= 0:
        return None
    return price_per_hour / SECONDS_PER_HOUR / tok_per_s * PER
