"""Price sheets and bills: a three-turn agent session with cache writes and hits, by hand."""

from __future__ import annotations

import pytest

from llmbench.errors import UserError
from llmbench.harness.cost import bill_request, cost_summary, self_hosted_summary
from llmbench.harness.prices import PriceSheet, TokenPrices, load_prices, shipped_names
from llmbench.harness.records import RequestRecord

# Claude-Sonnet-4-like prices: input 3, cache write 3.75, cache hit 0.30, output 15 per Mtok.
SHEET = PriceSheet("test", TokenPrices(input=3.0, output=15.0, cache_write=3.75, cache_hit=0.3))


def turn(n: int, prompt: int, cached: int, output: int, reasoning: int, **kw) -> RequestRecord:
    return RequestRecord(
        request_id=f"agent-t{n}",
        session_id="agent",
        turn=n,
        scheduled_ns=0,
        sent_ns=0,
        num_prompt_tokens=prompt,
        cached_tokens=cached,
        server_completion_tokens=output,
        reasoning_tokens=reasoning,
        **kw,
    )


# Each turn's prompt is the last one, its reply and a new tool result; the cache holds what the
# turn before wrote.
SESSION = [
    turn(0, prompt=2000, cached=0, output=100, reasoning=40),
    turn(1, prompt=2600, cached=2100, output=200, reasoning=0),
    turn(2, prompt=3300, cached=2800, output=50, reasoning=10),
]


def test_each_turn_is_billed_by_kind_of_token():
    """turn 0: 2000 written · 3.75 + 60 reply · 15 + 40 reasoning · 15 = 9000 → $0.009000
    turn 1: 500 · 3.75 + 2100 hit · 0.30 + 200 · 15 = 1875 + 630 + 3000 = 5505 → $0.005505
    turn 2: 500 · 3.75 + 2800 · 0.30 + 40 · 15 + 10 · 15 = 1875 + 840 + 600 + 150 → $0.003465
    With no cache: 2000 · 3 + 1500 = 7500; 2600 · 3 + 3000 = 10800; 3300 · 3 + 750 = 10650."""
    bills = [bill_request(r, SHEET) for r in SESSION]
    assert [b.cost for b in bills] == pytest.approx([0.009, 0.005505, 0.003465])
    assert [b.no_cache_cost for b in bills] == pytest.approx([0.0075, 0.0108, 0.01065])
    assert [(b.uncached_tokens, b.cache_hit_tokens) for b in bills] == [
        (2000, 0),
        (500, 2100),
        (500, 2800),
    ]
    assert [(b.reply_tokens, b.reasoning_tokens) for b in bills] == [(60, 40), (200, 0), (40, 10)]


def test_the_run_bill_totals_sessions_and_the_cache_discount():
    failed = turn(3, prompt=3500, cached=3300, output=0, reasoning=0, error="HTTP 500")
    summary = cost_summary([*SESSION, failed], SHEET)
    assert summary["total"] == pytest.approx(0.01797)
    assert summary["no_cache_total"] == pytest.approx(0.02895)
    assert summary["cache_discount"] == pytest.approx(1 - 0.01797 / 0.02895)  # 37.9%
    assert summary["per_request"] == pytest.approx(0.01797 / 3)
    assert summary["per_session"] == pytest.approx(0.01797)
    assert (summary["num_billed"], summary["num_not_billed"]) == (3, 1)
    assert summary["cache_hit_tokens"] == 4900 and summary["uncached_tokens"] == 3000
    assert summary["writes_uncached_to_cache"] is True


def test_without_a_cache_write_price_uncached_input_is_input_and_no_hit_price_no_discount():
    """GPT-4.1-like: input 2, cache hit 0.5, output 8. Turn 1: 500 · 2 + 2100 · 0.5 + 200 · 8
    = 1000 + 1050 + 1600 = 3650 → $0.00365; with no cache price at all, no discount."""
    sheet = PriceSheet("b", TokenPrices(input=2.0, output=8.0, cache_hit=0.5))
    assert bill_request(SESSION[1], sheet).cost == pytest.approx(0.00365)
    flat = PriceSheet("c", TokenPrices(input=2.0, output=8.0))
    assert cost_summary(SESSION, flat)["cache_discount"] == pytest.approx(0.0)


def test_the_server_prompt_count_wins_and_a_hit_never_exceeds_the_prompt():
    record = turn(0, prompt=90, cached=150, output=10, reasoning=20, server_prompt_tokens=100)
    bill = bill_request(record, SHEET)
    assert (bill.uncached_tokens, bill.cache_hit_tokens) == (0, 100)
    assert (bill.reply_tokens, bill.reasoning_tokens) == (0, 10)


def test_shipped_sheets_are_examples_with_dates():
    assert shipped_names() == ["claude-sonnet-4", "deepseek-chat", "gpt-4.1"]
    for name in shipped_names():
        sheet = load_prices(name)
        assert sheet.is_example and sheet.as_of and sheet.currency == "USD"
        assert "an example, not a quote" in sheet.label
    claude = load_prices("claude-sonnet-4").per_million_tokens
    assert (claude.input, claude.cache_write, claude.cache_hit, claude.output) == (
        3.0,
        3.75,
        0.3,
        15.0,
    )


def test_a_bad_sheet_is_one_line_naming_file_line_and_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: x\nper_million_tokens:\n  input: 1.0\n")
    with pytest.raises(UserError, match=r"p.yaml:2: per_million_tokens.output: missing"):
        load_prices(str(path))
    path.write_text("name: x\nper_million_tokens:\n  input: -1\n  output: 2\n")
    with pytest.raises(UserError, match=r"per_million_tokens.input: must be >= 0, got -1"):
        load_prices(str(path))
    with pytest.raises(UserError, match="no such price sheet file, nor a shipped example"):
        load_prices("no-such-sheet")


def test_self_hosted_cost_by_hand():
    """3.6 an hour is 0.001 a second: at 100 output tok/s a million output tokens take 10,000 s
    (10.0); with 400 input tok/s, a million tokens in and out take 2,000 s (2.0); a 50 s window
    costs 0.05; a sheet's 0.02 for 150 reply + 50 reasoning tokens is 100 per million."""
    summary = {"output_tok_per_s": 100.0, "input_tok_per_s": 400.0, "duration_s": 50.0}
    summary["cost"] = {"total": 0.02, "reply_tokens": 150, "reasoning_tokens": 50}
    assert self_hosted_summary(3.6, "EUR", summary) == pytest.approx(
        {
            "price_per_hour": 3.6,
            "currency": "EUR",
            "per_million_output_tokens": 10.0,
            "per_million_tokens": 2.0,
            "run_total": 0.05,
            "api_per_million_output_tokens": 100.0,
        }
    )
    nothing = self_hosted_summary(3.6, "USD", {"output_tok_per_s": None, "duration_s": 0})
    assert nothing["per_million_output_tokens"] is None and nothing["run_total"] == 0
    assert nothing["api_per_million_output_tokens"] is None  # no sheet: no API price
