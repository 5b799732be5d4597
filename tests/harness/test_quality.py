"""llmbench.harness.quality: the metrics by hand, and a whole run on a tiny checkpoint whose
perplexity is recomputed here from the engine's own `score` logits."""

from __future__ import annotations

import math

import pytest
import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.kv_dtype import KVCacheDtype
from llmbench.harness import quality as q
from tests.engine.helpers import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny")))


# A text of the tiny checkpoint's word-level vocabulary: w0 .. w296, deterministic.
TEXT = q.EvalText("words", "test", " ".join(f"w{(i * 37 + i // 5) % 297}" for i in range(90)))


def settings(folder: str, **kwargs) -> q.QualitySettings:
    base = dict(model=folder, device="cpu", context=32, num_tokens=80, generate=6)
    return q.QualitySettings(**{**base, **kwargs})


# --- pure parts -------------------------------------------------------------------------------


def test_windows_cut_the_first_tokens_and_drop_a_one_token_tail():
    ids = list(range(10))
    assert q.windows(ids, 4, 10) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert q.windows(ids, 4, 9) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # [8] alone scores nothing
    assert q.windows(ids, 20, 100) == [ids]


def test_nll_and_perplexity_by_hand():
    # Two rows over a 3-token vocabulary; targets 0 then 2.
    probs = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
    log_probs = probs.log()
    values = q.nll(log_probs, torch.tensor([0, 2]))
    torch.testing.assert_close(values, torch.tensor([math.log(2), -math.log(0.8)]))
    assert q.perplexity(values.sum().item(), 2) == pytest.approx(math.sqrt(2 / 0.8))


def test_kl_by_hand_and_against_itself():
    p = torch.tensor([[0.5, 0.25, 0.25]])
    r = torch.tensor([[0.25, 0.25, 0.5]])
    expected = 0.5 * math.log(2) + 0.25 * math.log(0.5)  # Σ p log(p / r)
    assert q.kl_divergence(p.log(), r.log()).item() == pytest.approx(expected)
    log_probs = torch.log_softmax(
        torch.randn(4, 50, generator=torch.Generator().manual_seed(0)), -1
    )
    assert q.kl_divergence(log_probs, log_probs).tolist() == [0.0] * 4


@pytest.mark.parametrize(
    ("reference", "tokens", "expected"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], 1.0),
        ([1, 2, 3, 4], [1, 2, 9, 4], 0.5),  # agreeing again after a difference does not count
        ([1, 2, 3, 4], [9, 2, 3, 4], 0.0),
        ([], [], 1.0),
    ],
)
def test_greedy_agreement_is_the_common_prefix(reference, tokens, expected):
    assert q.greedy_agreement(reference, tokens) == expected


def test_configurations_are_the_product_with_the_reference_first_and_once():
    int8, pair = KVCacheDtype("int8", "int8"), KVCacheDtype("int8", "int4")
    configs = q.configurations([None, "int8"], [KVCacheDtype(), int8, pair])
    assert configs == [
        q.QualityConfig(None, KVCacheDtype()),
        q.QualityConfig(None, int8),
        q.QualityConfig(None, pair),
        q.QualityConfig("int8", KVCacheDtype()),
        q.QualityConfig("int8", int8),
        q.QualityConfig("int8", pair),
    ]
    assert [c.is_reference for c in configs] == [True] + [False] * 5


def test_builtin_texts_are_the_stdlib_prose_and_source():
    prose, source = q.builtin_texts()
    assert prose.name == "pydoc-topics" and source.name == "stdlib-source"
    assert len(prose.text) > 100_000 and "assert" in prose.text[:200]
    assert source.text.startswith('"""Text wrapping and filling.')  # textwrap.py comes first
    assert "class Fraction" in source.text


# --- a whole run ------------------------------------------------------------------------------


def test_reference_perplexity_is_exp_of_the_mean_nll_of_the_score_logits(tiny_folder):
    result = q.run_quality(
        settings(tiny_folder), q.configurations([], []), [TEXT], progress=lambda line: None
    )
    (row,) = result["rows"]
    # By hand: the same windows through a fresh engine's `score`, NLL in float64.
    engine = LLMEngine(EngineConfig(model=tiny_folder, device="cpu", kv_cache_memory=1 << 20))
    ids = engine.tokenizer.encode(TEXT.text)
    assert len(ids) == 90
    total, count = 0.0, 0
    for start in range(0, 80, 32):  # windows [0, 32), [32, 64), [64, 80)
        window = ids[start : min(start + 32, 80)]
        logits = engine.score(window).double()
        for i in range(len(window) - 1):
            row_logits = logits[i]
            log_z = math.log(sum(math.exp(x) for x in (row_logits - row_logits.max()).tolist()))
            total += -(row_logits[window[i + 1]] - row_logits.max()).item() + log_z
            count += 1
    assert count == 31 + 31 + 15 == row["num_tokens_scored"]
    assert row["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-6)
    assert row["perplexity_by_text"] == {"words": row["perplexity"]}
    assert (row["mean_kl"], row["top1_agreement"], row["greedy_agreement"]) == (0.0, 1.0, 1.0)
    assert result["texts"][0]["num_tokens"] == 80 and result["texts"][0]["num_tokens_total"] == 90


def test_no_greedy_tokens_leave_the_agreement_blank(tiny_folder):
    """--generate 0: scores only; no greedy agreement, "-" in its column."""
    configs = q.configurations([None], [KVCacheDtype("int8", "int8")])
    result = q.run_quality(settings(tiny_folder, generate=0), configs, [TEXT])
    assert [row["greedy_agreement"] for row in result["rows"]] == [None, None]
    assert result["rows"][1]["mean_kl"] > 0
    greedy_column = [line.split()[-2] for line in q.format_table(result).splitlines()[2:]]
    assert greedy_column == ["-", "-"]


def test_a_configuration_equal_to_the_reference_has_kl_0_and_full_agreement(tiny_folder):
    """float32 K/V on a float32 model is the reference itself, named differently."""
    configs = q.configurations(
        [None], [KVCacheDtype("float32", "float32"), KVCacheDtype("int4", "int4")]
    )
    result = q.run_quality(settings(tiny_folder), configs, [TEXT])
    reference, same, int4 = result["rows"]
    assert same["kv_cache_dtype"] == reference["kv_cache_dtype"] == {"k": "float32", "v": "float32"}
    assert same["mean_kl"] == 0.0
    assert same["top1_agreement"] == same["greedy_agreement"] == 1.0
    assert same["perplexity"] == reference["perplexity"]
    # int4 K/V does move the distributions; its cache is 80 bytes a token instead of 512.
    assert int4["mean_kl"] > 0 and int4["perplexity"] != reference["perplexity"]
    assert (reference["kv_bytes_per_token"], int4["kv_bytes_per_token"]) == (512, 80)
    lines = q.format_table(result).splitlines()
    assert lines[0].startswith("llmbench quality: ") and "words 80 tokens" in lines[0]
    assert lines[1].split()[:3] == ["weights", "kv", "cache"]
    assert len({len(line) for line in lines[1:]}) == 1  # aligned: every row as wide
    assert [line.split()[2] for line in lines[2:]] == ["float32", "float32", "int4"]  # "as loaded"
