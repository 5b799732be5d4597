"""`moe prune` end to end on tiny-moe: the workload driven through the engine, the identity when
every expert is kept, a smaller checkpoint that reloads, and the report."""

from __future__ import annotations

import json

import pytest

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.errors import UserError
from llmbench.harness.moe_prune_study import (
    PRUNING_FILE,
    PruneSettings,
    check_out,
    drive_workload,
    format_report,
    prune,
)
from llmbench.harness.spec_load import load_spec
from llmbench.harness.workloads import Tokens, build_sessions

TINY_MOE = "synthetic:tiny-moe"


def _spec(tmp_path, prefix_caching: bool = True):
    path = tmp_path / "w.yaml"
    path.write_text(
        f"""name: tiny
model: {TINY_MOE}
engine: {{prefix_caching: {str(prefix_caching).lower()}, kv_cache_memory: 4000000}}
workload:
  kind: chat
  sessions: 3
  system_prompt_tokens: 20
  turns: {{dist: empirical, values: [1, 2]}}
  user_tokens: {{dist: fixed, value: 8}}
  output_tokens: {{dist: fixed, value: 4}}
"""
    )
    return load_spec(path)


def test_drive_workload_runs_every_turn_with_the_replies_fed_back(tmp_path):
    spec = _spec(tmp_path, prefix_caching=False)
    engine = LLMEngine(EngineConfig(model=TINY_MOE, device="cpu", enable_prefix_caching=False))
    num_requests, num_tokens = drive_workload(engine, spec)
    tok = engine.tokenizer
    sessions = build_sessions(spec.workload, spec.seed, Tokens(tok.encode, tok.decode))
    assert num_requests == sum(len(s.turns) for s in sessions)
    # Every token but each request's last generated one ran through the routers once (no
    # prefix cache): prompt + 4 output tokens - 1 per request.
    routed = engine.expert_stats.tokens["prefill"] + engine.expert_stats.tokens["decode"]
    assert int(routed[0].sum()) // 2 == num_tokens - num_requests


def _settings(tmp_path, keep: int) -> PruneSettings:
    return PruneSettings(
        model=TINY_MOE,
        spec=_spec(tmp_path),
        keep=keep,
        out=tmp_path / f"pruned-{keep}",
        device="cpu",
        eval_tokens=48,
        context=24,
        decode_tokens=4,
    )


def test_keeping_every_expert_changes_no_number_of_quality(tmp_path):
    result = prune(_settings(tmp_path, 8), lambda line: None)
    before, after = result["before"], result["after"]
    assert after["perplexity"] == before["perplexity"]
    assert after["mean_kl"] == 0.0 and after["top1_agreement"] == 1.0
    assert after["num_params"] == before["num_params"]
    assert result["kept"] == [list(range(8))] * 2
    assert result["pruned_weight_share"] == 0.0


def test_pruning_to_three_writes_a_smaller_checkpoint_that_reloads(tmp_path):
    settings = _settings(tmp_path, 3)
    lines = []
    result = prune(settings, lines.append)
    assert len(lines) == 5 and lines[0].startswith("moe prune: measuring")
    assert all(len(ids) == 3 for ids in result["kept"])
    # Expert parameters: 2 layers × 5 experts fewer × 3·64·32, and 5 router rows of 64.
    assert result["before"]["num_params"] - result["after"]["num_params"] == 2 * 5 * (
        3 * 64 * 32 + 64
    )
    assert 0.0 < result["pruned_weight_share"] < 1.0
    written = json.loads((settings.out / PRUNING_FILE).read_text())
    assert written["kept"] == result["kept"]
    config = json.loads((settings.out / "config.json").read_text())
    assert config["num_experts"] == 3
    engine = LLMEngine(EngineConfig(model=str(settings.out), device="cpu"))
    assert engine.model_config.num_experts == 3
    report = format_report(result)
    assert "3 of 8 experts per layer kept (top-2)" in report
    assert "perplexity" in report and "decode tok/s (batch 1)" in report


def test_errors_before_any_work(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(UserError, match="not an empty folder"):
        check_out(tmp_path / "full")
    dense = PruneSettings("synthetic:tiny", _spec(tmp_path), 2, tmp_path / "o")
    with pytest.raises(UserError, match="has no experts"):
        prune(dense, lambda line: None)
    for keep, fragment in [(9, "more than the model's 8"), (1, "fewer than the 2 experts")]:
        settings = PruneSettings(TINY_MOE, _spec(tmp_path), keep, tmp_path / "o")
        with pytest.raises(UserError, match=fragment):
            prune(settings, lambda line: None)
