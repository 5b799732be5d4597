"""llama.cpp's perf blocks read from a server's log and matched to the run's requests.

The fixtures in `server_logs/` are real: llama-cpp-python 0.3.36's server (`python -m
llama_cpp.server --n_threads 1 --n_threads_batch 1 --n_ctx 4096 --interrupt_requests False`,
SmolLM2-135M Q4_1) on this machine.

- `curl_session.log`: five requests sent with curl to a fresh server, one at a time: "Tell me
  about the moon" (max_tokens 24) twice, "Say hi." (max_tokens 50; the model stopped after 23
  tokens), "Why is the sky blue? ..." (max_tokens 30; 7 tokens and EOS) streamed, then the same
  again unstreamed (its usage: 48 prompt, 7 completion tokens).
- `chat_c2.log` + `chat_c2.requests.jsonl`: `llmbench run chat` (3 sessions of 2 turns, 24
  tokens a reply) at concurrency 2 on a fresh server, without `backend.server_log`: the log from
  the run's start and the records as the run wrote them.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmbench.errors import UserError
from llmbench.harness.backends.server_log import (
    SOURCE,
    PerfBlock,
    ServerLog,
    attach,
    expected_runs,
    first_output_ns,
    merged,
    parse_blocks,
)
from llmbench.harness.record_log import request_record
from llmbench.harness.records import RequestRecord, ServerTimings

LOGS = Path(__file__).parent / "server_logs"


def chat_c2() -> tuple[str, list[RequestRecord]]:
    rows = (LOGS / "chat_c2.requests.jsonl").read_text().splitlines()
    return (LOGS / "chat_c2.log").read_text(), [request_record(json.loads(r)) for r in rows]


def by_id(records: list[RequestRecord]) -> dict[str, RequestRecord]:
    return {r.request_id: r for r in records}


# -- parsing ---------------------------------------------------------------------------------


def test_the_curl_session_s_five_blocks_as_printed():
    blocks = parse_blocks((LOGS / "curl_session.log").read_text())
    assert blocks == [
        # a fresh server: no prefix line; the first prompt pass's time is lost (0.03 ms)
        PerfBlock(0.03, 29, 173.67, 23, total_ms=372.04),
        # the same prompt again: all but its last token matched, that one a run
        PerfBlock(0.00, 1, 228.27, 24, num_cached=28, num_remaining=1, total_ms=253.27),
        PerfBlock(138.01, 26, 176.99, 23, num_cached=7, num_remaining=26, total_ms=339.66),
        PerfBlock(418.05, 24, 108.26, 7, num_cached=24, num_remaining=24, total_ms=587.07),
        PerfBlock(0.00, 1, 167.42, 8, num_cached=47, num_remaining=1, total_ms=170.70),
    ]
    assert [b.num_prompt_tokens for b in blocks] == [29, 29, 33, 48, 48]
    assert [b.num_prompt_evaluated for b in blocks] == [29, 0, 26, 24, 0]
    assert [b.is_prompt_time_lost for b in blocks] == [True, False, False, False, False]


def test_runs_follow_output_tokens_finish_and_a_single_prompt_token_left():
    """The curl session's replies: 24 tokens cut at max_tokens twice, 23 and 7 tokens ended by
    the model's EOS, and 7 again with one prompt token left to evaluate."""
    blocks = parse_blocks((LOGS / "curl_session.log").read_text())
    replies = [(24, "length"), (24, "length"), (23, "stop"), (7, "stop"), (7, "stop")]
    for block, (n_out, finish) in zip(blocks, replies, strict=True):
        record = RequestRecord("r", "s", 0, 0, 0, chunk_tokens=[n_out], finish_reason=finish)
        assert expected_runs(block, record) == block.num_eval_runs


def test_the_older_llama_print_timings_block_with_its_sample_line():
    """llama.cpp before its perf API printed `llama_print_timings:` with 8-wide columns and a
    `sample time ... runs` line, which is not an eval."""
    text = (
        "llama_print_timings:        load time =   210.43 ms\n"
        "llama_print_timings:      sample time =     6.11 ms /    16 runs   (    0.38 ms per "
        "token,  2618.66 tokens per second)\n"
        "llama_print_timings: prompt eval time =   412.50 ms /    33 tokens (   12.50 ms per "
        "token,    80.00 tokens per second)\n"
        "llama_print_timings:        eval time =   300.00 ms /    15 runs   (   20.00 ms per "
        "token,    50.00 tokens per second)\n"
        "llama_print_timings:       total time =   730.12 ms /    48 tokens\n"
    )
    assert parse_blocks(text) == [PerfBlock(412.50, 33, 300.00, 15, total_ms=730.12)]


def test_a_prompt_time_is_lost_below_half_a_run_or_without_runs_a_tenth_of_the_total():
    """The lost times seen here: 0.03 ms for 29 tokens beside 7.55 ms runs, 0.18 ms for 305
    beside 42.72 ms; a real pass of 2 tokens takes about a run. With one output token there is
    no run (printed: 0.00 ms / 1 runs): the block's total time is the yardstick."""
    assert PerfBlock(3.7, 2, 173.67, 23).is_prompt_time_lost is True  # 3.7 < 7.55 / 2
    assert PerfBlock(3.7, 1, 173.67, 23).is_prompt_time_lost is False  # no prompt pass
    assert PerfBlock(3.8, 2, 173.67, 23).is_prompt_time_lost is False
    assert PerfBlock(0.18, 305, 0.0, 1, total_ms=7400.0).is_prompt_time_lost is True
    assert PerfBlock(7100.0, 305, 0.0, 1, total_ms=7400.0).is_prompt_time_lost is False
    assert PerfBlock(0.18, 305, 0.0, 1).is_prompt_time_lost is False  # nothing to compare


def test_a_prefix_line_left_by_a_cut_stream_is_not_the_next_block_s():
    """A stream cut before its end prints its prefix line but no block; the next request
    (nothing in common with the one before) prints no prefix line: its block evaluated the
    whole prompt, which the stale line does not describe."""
    text = (
        "Llama.generate: 208 prefix-match hit, remaining 97 prompt tokens to eval\n"
        "disconnected\n"
        "llama_perf_context_print: prompt eval time =    2000.00 ms /   150 tokens (...)\n"
        "llama_perf_context_print:        eval time =     400.00 ms /    23 runs   (...)\n"
    )
    assert parse_blocks(text) == [PerfBlock(2000.0, 150, 400.0, 23)]


def test_a_whole_prompt_found_cached_has_no_prompt_pass_and_no_printed_length():
    text = (
        "Llama.generate: full prompt already cached, skipping reset\n"
        "llama_perf_context_print: prompt eval time =       0.00 ms /     1 tokens (...)\n"
        "llama_perf_context_print:        eval time =      90.00 ms /     9 runs   (...)\n"
    )
    (block,) = parse_blocks(text)
    assert (block.num_cached, block.num_remaining, block.num_prompt_tokens) == (None, 0, None)
    record = RequestRecord("r", "s", 0, 0, 0, chunk_tokens=[10], finish_reason="length")
    record.num_prompt_tokens = 40
    timings, _ = attach([record], [block])
    assert timings[0].server_timings == ServerTimings(
        SOURCE, None, 90.0, 10.0, prompt_tokens=40, cached_tokens=40
    )


def test_a_block_cut_by_the_end_of_the_text_is_skipped():
    text = (LOGS / "chat_c2.log").read_text()
    cut = text[: text.rindex("eval time =     591.18")]
    assert len(parse_blocks(cut)) == len(parse_blocks(text)) - 1 == 6


# -- matching --------------------------------------------------------------------------------


def test_the_chat_run_at_concurrency_2_gets_every_block_hand_checked():
    text, records = chat_c2()
    out, warnings = attach(records, parse_blocks(text))
    assert warnings == []  # the warm-up's lost prompt time counts for nothing measured
    timings = {r.request_id: r.server_timings for r in out}
    # request: (prompt ms, eval ms / runs, cached, prompt tokens), as the log printed them
    expected = {
        "warmup-s0-t0": (None, 982.63 / 23, 0, 305),  # 0.18 ms for 305 tokens: lost
        "s0-t0": (2637.28, 939.52 / 23, 208, 305),
        "s1-t0": (1963.80, 922.50 / 23, 208, 283),
        "s0-t1": (4445.34, 899.83 / 23, 208, 406),
        "s1-t1": (7217.76, 850.30 / 23, 208, 440),
        "s2-t0": (1197.78, 856.24 / 23, 208, 257),
        "s2-t1": (738.08, 591.18 / 15, 280, 307),  # 15 tokens and EOS: 15 runs
    }
    for request_id, (prompt_ms, per_token_ms, cached, prompt) in expected.items():
        t = timings[request_id]
        assert (t.source, t.prompt_ms, t.cached_tokens, t.prompt_tokens) == (
            SOURCE,
            prompt_ms,
            cached,
            prompt,
        )
        assert t.decode_ms_per_token == pytest.approx(per_token_ms, rel=1e-12)
        assert t.decode_tokens is None  # the log does not print the server's output count
    # the server's cached count becomes the request's (it reported none): a prefix hit rate
    assert [r.cached_tokens for r in out] == [0, 208, 208, 208, 208, 208, 280]


def test_blocks_pair_by_first_output_not_by_the_order_records_were_written():
    text, records = chat_c2()
    shuffled = [records[i] for i in (3, 6, 0, 5, 1, 4, 2)]
    out, warnings = attach(shuffled, parse_blocks(text))
    assert warnings == [] and [r.request_id for r in out] == [r.request_id for r in shuffled]
    assert by_id(out) == by_id(attach(records, parse_blocks(text))[0])


def test_first_output_is_the_earliest_of_chunk_reasoning_and_content_else_the_end():
    r = RequestRecord("r", "s", 0, 0, 0, end_ns=90, chunk_ns=[50, 60], first_content_ns=50)
    assert first_output_ns(r) == 50
    r.first_reasoning_ns = 40
    assert first_output_ns(r) == 40
    assert first_output_ns(RequestRecord("r", "s", 0, 0, 0, end_ns=90)) == 90


def test_a_request_that_did_not_finish_takes_no_block():
    """A request the server cut (or that failed) printed no block: it is left out of the
    pairing, and the others still pair."""
    text, records = chat_c2()
    failed = dataclasses.replace(
        records[3], request_id="s9-t0", finish_reason=None, error="dropped", chunk_ns=[1]
    )
    out, warnings = attach([*records, failed], parse_blocks(text))
    assert warnings == [] and out[-1].server_timings is None
    assert all(r.server_timings is not None for r in out[:-1])


def test_a_measured_request_whose_prompt_time_was_lost_is_left_out_and_said():
    text, records = chat_c2()
    records[0] = dataclasses.replace(records[0], is_warmup=False)  # the 0.18 ms one
    out, warnings = attach(records, parse_blocks(text))
    assert out[0].server_timings.prompt_ms is None
    assert out[0].server_timings.decode_ms_per_token == pytest.approx(982.63 / 23)
    assert warnings == [
        "backend.server_log: llama.cpp's prompt time of 1 of 7 requests reads ~0 ms (it "
        "misses a prompt batch larger than any before): left out; send the server one prompt "
        "over its batch (n_batch, 512 tokens) before the run"
    ]


def test_a_prompt_count_that_does_not_line_up_refuses_every_block():
    text, records = chat_c2()
    records[3] = dataclasses.replace(records[3], num_prompt_tokens=405)  # s0-t1, 4th served
    out, warnings = attach(records, parse_blocks(text))
    assert out == records  # nothing attached
    assert warnings == [
        "backend.server_log: no server timings attached: block 4 does not fit request s0-t1, "
        "served 4th: the server's prompt was 406 tokens (208 cached + 198 evaluated), the "
        "request's 405"
    ]


def test_runs_that_do_not_fit_the_output_refuse_every_block():
    """s2-t1 got 15 tokens and the EOS (15 runs): a record of 12 tokens is not its request;
    one token off is the client's re-tokenization and still fits."""
    text, records = chat_c2()
    blocks = parse_blocks(text)
    records[6] = dataclasses.replace(records[6], chunk_tokens=[1] * 14)
    assert attach(records, blocks)[1] == []
    records[6] = dataclasses.replace(records[6], chunk_tokens=[1] * 12)
    out, warnings = attach(records, blocks)
    assert out == records and warnings == [
        "backend.server_log: no server timings attached: block 7 does not fit request s2-t1, "
        "served 7th: the server made 15 decode runs, 12 expected for 12 output tokens "
        "(finish stop)"
    ]


def test_more_blocks_than_requests_refuses_and_so_does_a_log_without_any():
    text, records = chat_c2()
    blocks = parse_blocks(text)
    out, warnings = attach(records[1:], blocks)  # another client's block among them
    assert out == records[1:] and warnings == [
        "backend.server_log: no server timings attached: the log has 7 llama.cpp perf blocks "
        "for the 6 requests the server finished (another client of the server, or a stream "
        "cut after its reply was generated?)"
    ]
    assert attach(records, [])[1] == [
        "backend.server_log: no server timings attached: no llama.cpp perf blocks in what the "
        "log got during the run (is the server verbose, and its stderr in this file?)"
    ]
    assert attach([], []) == ([], [])


def test_the_curl_session_s_single_prompt_token_has_no_prompt_time():
    """The unstreamed "sky blue" request: its usage gave 48 prompt and 7 completion tokens;
    47 were cached and the one left was a run, so the server had no prompt pass."""
    block = parse_blocks((LOGS / "curl_session.log").read_text())[-1]
    record = RequestRecord(
        "r", "s", 0, 0, 0, num_prompt_tokens=48, server_prompt_tokens=48,
        server_completion_tokens=7, finish_reason="stop", chunk_ns=[5], chunk_tokens=[7],
    )  # fmt: skip
    (out,), warnings = attach([record], [block])
    assert warnings == []
    assert out.server_timings == ServerTimings(
        SOURCE, None, 167.42, 167.42 / 8, prompt_tokens=48, cached_tokens=47
    )


def test_a_reply_s_usage_and_the_log_make_one_timings():
    """A server that sent `usage` and logged its counters: the log's times, the usage's counts
    where the log has none, both sources named."""
    sent = ServerTimings("openai usage", prompt_tokens=48, decode_tokens=7, cached_tokens=None)
    logged = ServerTimings(SOURCE, None, 167.42, 20.93, prompt_tokens=48, cached_tokens=47)
    assert merged(sent, logged) == ServerTimings(
        "openai usage + llama.cpp log", None, 167.42, 20.93, 48, 7, 47
    )
    assert merged(None, logged) is logged


# -- the file --------------------------------------------------------------------------------


def test_only_what_the_server_wrote_after_the_start_is_read(tmp_path):
    text, records = chat_c2()
    path = tmp_path / "server.log"
    before = (LOGS / "curl_session.log").read_text()  # an earlier run's blocks
    path.write_text(before)
    log = ServerLog(path)
    assert log.offset == len(before.encode())
    with path.open("a") as f:
        f.write(text + "llama_perf_context_print: prompt eval")  # a line still being written
    assert log.read() == text
    out, warnings = log.attach(records, wait_s=0)
    assert warnings == [] and all(r.server_timings is not None for r in out)


def test_a_block_written_late_is_waited_for(tmp_path):
    text, records = chat_c2()
    last = text.index("Llama.generate: 280 prefix-match hit")
    path = tmp_path / "server.log"
    path.write_text("")
    log = ServerLog(path)
    path.write_text(text[:last])
    late = threading.Timer(0.3, lambda: path.write_text(text))
    late.start()
    out, warnings = log.attach(records, wait_s=5)
    late.join()
    assert warnings == [] and out[-1].server_timings.prompt_ms == 738.08


def test_a_log_that_cannot_be_read_is_one_line(tmp_path):
    with pytest.raises(UserError) as error:
        ServerLog(tmp_path / "missing.log")
    assert str(error.value) == (
        f"backend.server_log {tmp_path / 'missing.log'}: cannot read it (No such file or "
        "directory); give the file the server's stderr goes to (e.g. started with 2> server.log)"
    )
    path = tmp_path / "server.log"
    path.write_text("x" * 100)
    log = ServerLog(path)
    path.write_text("")  # truncated (rotated) during the run
    _, records = chat_c2()
    out, warnings = log.attach(records, wait_s=0)
    assert out == records and warnings == [
        f"backend.server_log {path}: no server timings attached: cannot read it at the end of "
        "the run (it is shorter than when the run started (truncated?))"
    ]


# -- a run -----------------------------------------------------------------------------------


def _serve_blocks(requests_file: Path, log: Path, running: subprocess.Popen, written: list):
    """Stand in for a llama.cpp server's log: for each record the run writes (in the order its
    requests ended: one at a time, they were also served in that order) append a perf block
    that fits it, with a prompt time of 100 ms + its position."""
    while running.poll() is None:
        text = requests_file.read_text() if requests_file.exists() else ""
        rows = text.split("\n")[:-1]  # whole lines only
        for row in rows[len(written) :]:
            r = request_record(json.loads(row))
            if r.server_timings is not None and SOURCE in r.server_timings.source:
                return  # the run's rewrite: it has read the log
            prompt = r.server_prompt_tokens or r.num_prompt_tokens
            prompt_ms = 100.0 + len(written)
            with log.open("a") as f:
                f.write(
                    f"llama_perf_context_print: prompt eval time = {prompt_ms:10.2f} ms / "
                    f"{prompt:5d} tokens (...)\n"
                    f"llama_perf_context_print:        eval time = {20.0 * 7:10.2f} ms / "
                    f"{r.num_output_tokens - 1:5d} runs   (...)\n"
                )
            written.append((r.request_id, prompt_ms, 140.0 / (r.num_output_tokens - 1)))
        time.sleep(0.02)


def test_a_run_with_backend_server_log_keeps_the_server_s_timings(tmp_path):
    """`llmbench run` against a streaming server whose "log" gets a fitting block per request:
    the records on disk, the summary, and report.md carry the server's numbers; what the log
    held before the run is not read."""
    log = tmp_path / "server.log"
    log.write_text((LOGS / "curl_session.log").read_text())
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.streaming_server", "--port", "0"]
        + ["--record", str(tmp_path / "record.jsonl"), "--ttft-ms", "5", "--tpot-ms", "1"],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    out = tmp_path / "run"
    written: list = []
    try:
        port = int(server.stdout.readline())
        run = subprocess.Popen(
            [sys.executable, "-m", "llmbench", "run", "chat"]
            + ["--set", "model=synthetic:tiny", "--set", "dtype=float32"]
            + ["--set", "workload.sessions=2", "--set", "workload.turns=2"]
            + ["--set", "workload.output_tokens=8", "--set", "workload.think_time_s=0"]
            + ["--set", "load={kind: concurrency, concurrency: 1}"]
            + ["--set", "backend.kind=openai", "--set", f"backend.url=http://127.0.0.1:{port}/v1"]
            + ["--set", f"backend.server_log={log}", "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        tail = threading.Thread(
            target=_serve_blocks, args=(out / "requests.jsonl", log, run, written)
        )
        tail.start()
        stdout, stderr = run.communicate(timeout=300)
        tail.join()
    finally:
        server.kill()
        server.wait()
    assert run.returncode == 0, stderr
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == len(written) == 5  # the warm-up and 2 sessions of 2 turns
    for r, (request_id, prompt_ms, per_token_ms) in zip(records, written, strict=True):
        assert r["request_id"] == request_id
        assert r["server_timings"]["source"] == f"openai usage + {SOURCE}"
        assert r["server_timings"]["decode_tokens"] == 8  # the usage's, the log has none
        assert r["server_timings"]["prompt_ms"] == prompt_ms
        assert r["server_timings"]["decode_ms_per_token"] == pytest.approx(per_token_ms)
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["server_prompt_ms"]["p50"] == pytest.approx(102.5)  # 101 .. 104, measured
    assert not any("server_log" in w for w in summary["warnings"])
    assert (
        "server vs client (ms)" in stdout
        and "## Server vs client" in (out / "report.md").read_text()
    )
