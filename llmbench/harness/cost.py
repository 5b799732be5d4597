"""What a run's tokens cost under a price sheet (`prices`): per request, per session, per run,
and what they would have cost with no prompt cache; and what they cost on a machine rented by
the hour (`gpu_hour_price`, `self_hosted_summary`), beside the sheet's price.

Formula, per completed request (a failed one is not billed), prices per million tokens:
    prompt    = the server's prompt count when it gave one, else the client's
    hit       = min(cached tokens, prompt)     (the server's count; the engine's own for the
                                                engine backend; 0 where none was reported)
    uncached  = prompt − hit, priced at `cache_write` when the sheet has one (every prompt token
                the cache did not hold is written to it, as an agent marking its whole growing
                conversation cacheable has it), else at `input`
    reasoning = min(reasoning tokens, output), priced at `reasoning` (else `output`)
    reply     = output − reasoning, priced at `output`
    cost      = (uncached · write_or_input + hit · cache_hit + reply · output
                 + reasoning · reasoning_price) / 1e6
    no_cache  = (prompt · input + reply · output + reasoning · reasoning_price) / 1e6
A session's cost is its requests' sum; the run's, all of them; the cache discount is
1 − cost / no_cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmbench.harness.prices import PriceSheet
from llmbench.harness.records import RequestRecord
from llmbench.roofline.machine_cost import PER, SECONDS_PER_HOUR, per_million_tokens


@dataclass(frozen=True)
class RequestBill:
    """The tokens of one completed request by kind, and their price."""

    request_id: str
    session_id: str
    uncached_tokens: int
    cache_hit_tokens: int
    reply_tokens: int
    reasoning_tokens: int
    cost: float
    no_cache_cost: float


def bill_request(record: RequestRecord, sheet: PriceSheet) -> RequestBill:
    """One completed request's bill (the module docstring's formula)."""
    p = sheet.per_million_tokens
    prompt = (
        record.server_prompt_tokens
        if record.server_prompt_tokens is not None
        else record.num_prompt_tokens
    )
    hit = min(record.cached_tokens or 0, prompt)
    uncached = prompt - hit
    output = record.num_output_tokens
    reasoning = min(record.reasoning_tokens or 0, output)
    reply = output - reasoning
    write_price = p.cache_write if p.cache_write is not None else p.input
    hit_price = p.cache_hit if p.cache_hit is not None else p.input
    reasoning_price = p.reasoning if p.reasoning is not None else p.output
    output_cost = reply * p.output + reasoning * reasoning_price
    return RequestBill(
        record.request_id,
        record.session_id,
        uncached,
        hit,
        reply,
        reasoning,
        (uncached * write_price + hit * hit_price + output_cost) / PER,
        (prompt * p.input + output_cost) / PER,
    )


def cost_summary(records: Sequence[RequestRecord], sheet: PriceSheet) -> dict:
    """The run's bill over its measured requests, for `summary.cost` (results-schema.md): the
    sheet, tokens by kind, total, what no cache would have cost, the discount, and the mean per
    request and per session (of the sessions that completed a request)."""
    measured = [r for r in records if not r.is_warmup]
    bills = [bill_request(r, sheet) for r in measured if r.ok]
    total = sum(b.cost for b in bills)
    no_cache = sum(b.no_cache_cost for b in bills)
    sessions: dict[str, float] = {}
    for b in bills:
        sessions[b.session_id] = sessions.get(b.session_id, 0.0) + b.cost
    return {
        "sheet": sheet.label,
        "currency": sheet.currency,
        "is_example": sheet.is_example,
        "num_billed": len(bills),
        "num_not_billed": len(measured) - len(bills),  # failed: not billed
        "uncached_tokens": sum(b.uncached_tokens for b in bills),
        "cache_hit_tokens": sum(b.cache_hit_tokens for b in bills),
        "reply_tokens": sum(b.reply_tokens for b in bills),
        "reasoning_tokens": sum(b.reasoning_tokens for b in bills),
        "writes_uncached_to_cache": sheet.per_million_tokens.cache_write is not None,
        "total": total,
        "no_cache_total": no_cache,
        "cache_discount": 1 - total / no_cache if no_cache > 0 else None,
        "per_request": total / len(bills) if bills else None,
        "per_session": total / len(sessions) if sessions else None,
    }


def self_hosted_summary(price_per_hour: float, currency: str, summary: dict) -> dict:
    """The run's tokens on a machine at `price_per_hour`, for `summary.self_hosted`
    (results-schema.md), from the run's measured throughput (`machine_cost`): per million
    output tokens, per million tokens in and out, the run's window; beside it the price sheet's
    cost per million output tokens when the run was priced (`summary.cost`).

    Formula: per_million_output_tokens = price_per_hour / 3600 / output_tok_per_s · 1e6;
    per_million_tokens the same over input_tok_per_s + output_tok_per_s; run_total =
    price_per_hour · duration_s / 3600; api_per_million_output_tokens = cost.total /
    (cost.reply_tokens + cost.reasoning_tokens) · 1e6.
    """
    output_rate = summary.get("output_tok_per_s")
    all_rate = (summary.get("input_tok_per_s") or 0) + (output_rate or 0)
    cost = summary.get("cost")
    api = None
    if cost:
        billed_output = cost["reply_tokens"] + cost["reasoning_tokens"]
        api = cost["total"] / billed_output * PER if billed_output else None
    return {
        "price_per_hour": price_per_hour,
        "currency": currency,
        "per_million_output_tokens": per_million_tokens(price_per_hour, output_rate),
        "per_million_tokens": per_million_tokens(price_per_hour, all_rate),
        "run_total": price_per_hour * (summary.get("duration_s") or 0) / SECONDS_PER_HOUR,
        "api_per_million_output_tokens": api,
    }
