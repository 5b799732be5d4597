"""Workload generation: exact, stable token counts; reproducible by seed; shared only by design."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from llmbench.engine.tokenizer import Tokenizer
from llmbench.harness import workloads
from llmbench.harness.spec import AgenticWorkload, ChatWorkload, Dist, RagWorkload
from llmbench.harness.workloads import Tokens, build_sessions, draw, sessions_hash, tool_schemas

KINDS = {"chat": ChatWorkload, "rag": RagWorkload, "agentic": AgenticWorkload}


@pytest.fixture(scope="module", params=["byte_level", "smollm2"])
def tokens(request, smollm2_gguf_path):
    if request.param == "byte_level":
        tok = Tokenizer.byte_level()
    else:
        from gguf import GGUFReader

        tok = Tokenizer.from_gguf(GGUFReader(smollm2_gguf_path))
    return Tokens(tok.encode, tok.decode)


@pytest.mark.parametrize("num_tokens", [1, 2, 7, 64, 333])
def test_text_has_exact_token_count_stable_under_decode_encode(tokens, num_tokens):
    rng = random.Random(num_tokens)
    for _ in range(5):
        text = tokens.text(num_tokens, rng)
        ids = tokens.encode(text)
        assert len(ids) == num_tokens
        assert tokens.encode(tokens.decode(ids)) == ids


@pytest.mark.parametrize(
    "spec",
    [
        ChatWorkload(sessions=4, system_prompt_tokens=50, turns=Dist(dist="uniform", min=1, max=3)),
        RagWorkload(
            sessions=4,
            system_prompt_tokens=50,
            num_documents=10,
            document_tokens=Dist(dist="fixed", value=30),
        ),
        AgenticWorkload(sessions=4, system_prompt_tokens=50, tool_schema_tokens=40),
        AgenticWorkload(
            sessions=4, system_prompt_tokens=50, tool_schema_tokens=200, tools_as="api"
        ),
    ],
    ids=["chat", "rag", "agentic", "agentic-api"],
)
def test_same_spec_and_seed_give_the_same_sessions(tokens, spec):
    first = sessions_hash(build_sessions(spec, 7, tokens))
    assert first == sessions_hash(build_sessions(spec, 7, tokens))
    assert first != sessions_hash(build_sessions(spec, 8, tokens))
    assert first != sessions_hash(build_sessions(spec, 7, tokens, salt="warmup-"))


def test_agentic_sessions_share_only_the_prefix(tokens):
    spec = AgenticWorkload(
        sessions=3,
        system_prompt_tokens=50,
        tool_schema_tokens=40,
        tool_steps=Dist(dist="fixed", value=2),
        user_tokens=Dist(dist="fixed", value=20),
        output_tokens=Dist(dist="fixed", value=5),
        final_output_tokens=Dist(dist="fixed", value=9),
    )
    sessions = build_sessions(spec, 0, tokens)
    assert len({s.system_prompt for s in sessions}) == 1  # shared by design
    assert len({s.turns[0].content for s in sessions}) == 3  # the tasks differ
    for s in sessions:
        assert [t.max_tokens for t in s.turns] == [5, 5, 9]  # reason, tool step, final answer
        assert [t.is_tool_result for t in s.turns] == [False, True, True]
        assert s.turns[0].delay_s == 0.0 and all(t.delay_s > 0 for t in s.turns[1:])
        assert tokens.count(s.turns[0].content) == 20


def test_rag_prefers_popular_documents(tokens):
    spec = RagWorkload(
        sessions=200,
        system_prompt_tokens=5,
        num_documents=20,
        docs_per_query=1,
        document_tokens=Dist(dist="fixed", value=4),
        user_tokens=Dist(dist="fixed", value=3),
        zipf_s=1.5,
    )
    firsts = [s.turns[0].content.split(":", 1)[0] for s in build_sessions(spec, 0, tokens)]
    # Zipf(1.5) over 20 documents: document 0 has weight 1 / sum(1/(i+1)^1.5) = 0.43.
    assert 0.33 < firsts.count("Document 0") / 200 < 0.53


def test_distributions():
    rng = random.Random(0)
    assert draw(Dist(dist="fixed", value=3), rng) == 3
    samples = [draw(Dist(dist="lognormal", mean=100, sigma=0.5), rng) for _ in range(20000)]
    assert 97 < sum(samples) / len(samples) < 103  # parameterised by its own mean
    clipped = [draw(Dist(dist="normal", mean=10, std=50, min=5, max=20), rng) for _ in range(500)]
    assert min(clipped) >= 5 and max(clipped) <= 20
    values = {draw(Dist(dist="empirical", values=(1, 2, 3)), rng) for _ in range(100)}
    assert values == {1, 2, 3}


def test_turns_distribution_is_respected(tokens):
    spec = replace(
        ChatWorkload(sessions=30, system_prompt_tokens=5),
        turns=Dist(dist="uniform", min=1, max=3),
        user_tokens=Dist(dist="fixed", value=4),
    )
    counts = {len(s.turns) for s in build_sessions(spec, 0, tokens)}
    assert counts == {1, 2, 3}


@pytest.mark.parametrize("kind", ["chat", "rag", "agentic"])
def test_a_salt_changes_the_words_but_not_the_shape(tokens, kind):
    """Warm-up and each `--repeat` repetition: other texts, the same token counts, output
    lengths and delays, so repetitions differ only by the machine's noise."""
    common = {
        "sessions": 4,
        "system_prompt_tokens": 30,
        "user_tokens": Dist(dist="uniform", min=5, max=40),
    }
    spec = {
        "chat": ChatWorkload(**common, turns=Dist(dist="uniform", min=1, max=3)),
        "rag": RagWorkload(**common, num_documents=5, document_tokens=Dist(value=20)),
        "agentic": AgenticWorkload(**common, tool_steps=Dist(dist="uniform", min=1, max=4)),
    }[kind]

    plain, salted = build_sessions(spec, 3, tokens), build_sessions(spec, 3, tokens, salt="rep2-")
    for a, b in zip(plain, salted, strict=True):
        assert a.system_prompt == b.system_prompt  # shared by design
        assert len(a.turns) == len(b.turns)
        for x, y in zip(a.turns, b.turns, strict=True):
            assert (x.max_tokens, x.delay_s) == (y.max_tokens, y.delay_s)
            assert x.content != y.content
            # Each text has its exact count; where a RAG question follows "Question: ", a BPE
            # tokenizer may merge one pair across the join.
            assert abs(len(tokens.encode(x.content)) - len(tokens.encode(y.content))) <= 1


def test_api_tools_are_shared_definitions_and_each_step_names_its_call(tokens):
    spec = AgenticWorkload(
        sessions=3,
        system_prompt_tokens=50,
        tool_schema_tokens=600,
        tools_as="api",
        tool_steps=Dist(value=3),
        tool_result_tokens=Dist(value=25),
        user_tokens=Dist(value=20),
        output_tokens=Dist(value=5),
        final_output_tokens=Dist(value=9),
    )
    sessions = build_sessions(spec, 0, tokens)
    tools = sessions[0].tools
    assert all(s.tools == tools for s in sessions)  # shared by design, like the system prompt
    assert tokens.count(sessions[0].system_prompt) == 50  # no schema text in it
    names = [t["function"]["name"] for t in tools]
    assert len(set(names)) == len(names) >= 2
    for tool in tools:
        assert tool["type"] == "function"
        assert set(tool["function"]) == {"name", "description", "parameters"}
        assert tool["function"]["parameters"]["required"] == ["query"]
    call_ids = set()
    for s in sessions:
        task, *steps = s.turns
        assert task.tool_call is None and not task.is_tool_result
        assert [t.max_tokens for t in s.turns] == [5, 5, 5, 9]
        for step in steps:
            assert step.is_tool_result and step.tool_call.name in names
            assert set(json.loads(step.tool_call.arguments)) == {"query"}
            assert tokens.count(step.content) == 25  # the result itself, no "Tool result:" label
            call_ids.add(step.tool_call.call_id)
    assert len(call_ids) == 9  # one id per call


@pytest.mark.parametrize("num_tokens", [300, 600, 2000])  # above a byte-level skeleton
def test_tool_schema_json_has_the_asked_token_count(tokens, num_tokens):
    for seed in range(3):
        tools = tool_schemas(num_tokens, random.Random(seed), tokens)
        assert abs(tokens.count(json.dumps(list(tools))) - num_tokens) <= 1


def test_a_tool_budget_below_one_skeleton_gives_one_small_tool(tokens):
    (tool,) = tool_schemas(5, random.Random(0), tokens)
    assert tokens.count(tool["function"]["description"]) == 1


def test_a_drawn_count_or_delay_stays_within_the_limits():
    """A normal without a `max` (mean 64, std 10^9: most draws are in the millions or below
    0) is clipped to `MAX_TOKENS`, not made into a text of a billion tokens; turns to
    `MAX_TURNS`, delays to `MAX_DELAY_S`."""
    tail = Dist("normal", mean=64, std=1e9)
    rng = random.Random(0)
    counts = [workloads.draw_count(tail, rng) for _ in range(200)]
    assert max(counts) == workloads.MAX_TOKENS and min(counts) >= 1
    turns = [workloads.draw_count(tail, rng, workloads.MAX_TURNS) for _ in range(200)]
    assert max(turns) == workloads.MAX_TURNS
    delays = [workloads.draw_delay(tail, rng) for _ in range(200)]
    assert max(delays) == workloads.MAX_DELAY_S


def test_upper_bound_is_the_largest_value_drawn_or_the_mean_without_one():
    assert workloads.upper_bound(Dist.of_number(64)) == 64
    assert workloads.upper_bound(Dist("uniform", min=2, max=4)) == 4
    assert workloads.upper_bound(Dist("empirical", values=(8, 300, 20))) == 300
    assert workloads.upper_bound(Dist("normal", mean=64, std=24, min=8, max=160)) == 160
    assert workloads.upper_bound(Dist("lognormal", mean=50, sigma=1)) == 50


def test_workload_tokens_counts_the_text_a_workload_makes():
    """Shared texts once, each session's own once per session (`num_sessions`)."""
    chat = ChatWorkload(system_prompt_tokens=200, user_tokens=Dist("uniform", min=10, max=30))
    assert workloads.workload_tokens(chat, 5) == 200 + 5 * 3 * 30  # 3 turns of at most 30
    rag = RagWorkload(system_prompt_tokens=100, num_documents=40, user_tokens=Dist.of_number(40))
    assert workloads.workload_tokens(rag, 12) == 100 + 40 * 300 + 12 * 40
    agentic = AgenticWorkload(system_prompt_tokens=60, tool_schema_tokens=40)
    # the task (64), then 3 tool results of 300 tokens, each with an 8-token query
    assert workloads.workload_tokens(agentic, 2) == 60 + 40 + 2 * (64 + 3 * (300 + 8))


def test_document_draws_of_a_rag_query():
    """2 documents of 2 under zipf_s 1: weights 1 and 1/2 (total 3/2). The first draw is
    always new; the second is new with probability (1/2)/(3/2) = 1/3 once the first is taken,
    3 draws on average: 4 in all."""
    spec = RagWorkload(num_documents=2, docs_per_query=2, zipf_s=1.0)
    assert workloads.document_draws(spec) == pytest.approx(4.0)
    # The shipped rag workload: 3 of 40 under 1.2 is a handful.
    assert workloads.document_draws(RagWorkload(num_documents=40, zipf_s=1.2)) < 5
