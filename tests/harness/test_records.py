"""The request record's own derived numbers."""

from __future__ import annotations

from llmbench.harness.records import RequestRecord


def test_output_tokens_are_the_servers_count_when_it_gave_one():
    """The client counted 3 tokens in the text and never saw the EOS token: the server's usage
    says what it generated; the chunks keep the client's split, which timing needs."""
    record = RequestRecord("r", "s", 0, scheduled_ns=0, sent_ns=0, chunk_tokens=[1, 2])
    assert record.num_output_tokens == 3
    record.server_completion_tokens = 4
    assert record.num_output_tokens == 4
    assert sum(record.chunk_tokens) == 3
