"""experts.json: snapshot differences by hand, the file a run writes per repetition, its
reader, and the MoE keys of a summary."""

from __future__ import annotations

import json

import pytest

from llmbench.errors import UserError
from llmbench.harness.expert_stats_file import (
    EXPERTS_FILE,
    ExpertSnapshots,
    experts_file,
    moe_summary,
    read_experts,
    subtract,
)


def snapshot(prefill_tokens, decode_tokens, weight_scale=0.5):
    """An `expert_stats.to_dict()` of 1 layer, 2 experts, top-1: tokens as given, each token's
    routing weight `weight_scale`, co-activation on the diagonal (top-1: no pairs)."""

    def phase(tokens):
        return {
            "tokens": [list(tokens)],
            "weight": [[weight_scale * t for t in tokens]],
            "coactivation": [[[tokens[0], 0], [0, tokens[1]]]],
        }

    return {
        "num_layers": 1,
        "num_experts": 2,
        "top_k": 1,
        "phases": {"prefill": phase(prefill_tokens), "decode": phase(decode_tokens)},
    }


def test_subtract_nested_lists_and_dicts():
    assert subtract([[5, 3], [2, 0]], [[1, 1], [2, 0]]) == [[4, 2], [0, 0]]
    assert subtract({"a": [1.5, 2.0]}, {"a": [0.5, 0.5]}) == {"a": [1.0, 1.5]}
    assert subtract({"a": [4, 4]}, None) == {"a": [4, 4]}  # from the engine's start


def test_experts_file_leaves_the_warm_up_out_and_splits_repetitions():
    # Cumulative: 3 warm-up prefill tokens on expert 0; repetition 1 adds prefill (10, 4) and
    # decode (6, 2); repetition 2 adds prefill (1, 9) and decode (0, 5).
    snapshots = [
        snapshot((3, 0), (0, 0)),  # repetition 1 starts
        snapshot((13, 4), (6, 2)),  # repetition 2 starts
        snapshot((14, 13), (6, 7)),  # the end
    ]
    data = experts_file(snapshots, num_whole=1)
    assert (data["num_layers"], data["num_experts"], data["top_k"]) == (1, 2, 1)
    pooled = data["phases"]
    assert pooled["prefill"]["tokens"] == [[11, 13]]  # 14 − 3, 13 − 0: no warm-up
    assert pooled["decode"]["tokens"] == [[6, 7]]
    assert pooled["decode"]["weight"] == [[3.0, 3.5]]
    assert pooled["prefill"]["coactivation"] == [[[11, 0], [0, 13]]]
    first, second = data["repetitions"]
    assert first == {
        "repetition": 1,
        "is_partial": False,
        "phases": {
            "prefill": {"tokens": [[10, 4]], "weight": [[5.0, 2.0]]},
            "decode": {"tokens": [[6, 2]], "weight": [[3.0, 1.0]]},
        },
    }
    assert second["repetition"] == 2 and second["is_partial"] is True  # num_whole = 1
    assert second["phases"]["prefill"]["tokens"] == [[1, 9]]
    assert "coactivation" not in second["phases"]["decode"]  # pooled only


def test_snapshots_write_each_ended_repetition_then_the_whole_run(tmp_path):
    states = iter([snapshot((3, 0), (0, 0)), snapshot((13, 4), (6, 2)), snapshot((14, 13), (6, 7))])
    log = ExpertSnapshots(lambda: next(states), tmp_path)
    log.start_repetition(1)
    assert not (tmp_path / EXPERTS_FILE).exists()  # nothing has ended yet
    log.start_repetition(2)
    # Repetition 1 ended: on disk at once, so a run killed in repetition 2 keeps it.
    kept = read_experts(tmp_path)
    assert [r["repetition"] for r in kept["repetitions"]] == [1]
    assert kept["phases"]["prefill"]["tokens"] == [[10, 4]]
    log.write(num_whole=2)
    final = read_experts(tmp_path)
    assert [(r["repetition"], r["is_partial"]) for r in final["repetitions"]] == [
        (1, False),
        (2, False),
    ]
    assert final["phases"]["prefill"]["tokens"] == [[11, 13]]
    with pytest.raises(ValueError):
        log.start_repetition(5)


def test_a_run_stopped_in_the_warm_up_has_no_routing_counted(tmp_path):
    log = ExpertSnapshots(lambda: snapshot((3, 0), (1, 0)), tmp_path)
    log.write(num_whole=0)
    data = read_experts(tmp_path)
    assert data["repetitions"] == []
    assert data["phases"]["prefill"]["tokens"] == [[0, 0]]


def test_read_experts_absent_or_damaged(tmp_path):
    assert read_experts(tmp_path) is None  # a dense model's folder
    (tmp_path / EXPERTS_FILE).write_text("{cut")
    with pytest.raises(UserError, match="experts.json: cannot read it"):
        read_experts(tmp_path)
    (tmp_path / EXPERTS_FILE).write_text(json.dumps({"num_layers": 1}))
    with pytest.raises(UserError, match="not an llmbench experts file"):
        read_experts(tmp_path)


def test_moe_summary_by_hand():
    points = [
        {"phase": "prefill", "experts_touched": [8, 8], "expert_load_max_over_mean": 1.5},
        {"phase": "decode", "experts_touched": [2, 4], "expert_load_max_over_mean": 4.0},
        {"phase": "decode", "experts_touched": [3, 3], "expert_load_max_over_mean": 2.5},
        {"phase": "decode", "experts_touched": [], "expert_load_max_over_mean": None},  # dense
    ]
    # Decode steps: mean over layers 3 and 3 -> 3; loads (1.5 + 4 + 2.5) / 3.
    assert moe_summary(points) == {
        "moe_decode_experts_touched": 3.0,
        "moe_load_max_over_mean": pytest.approx(8 / 3),
    }
    assert moe_summary([{"phase": "decode", "num_seqs": 1}]) == {}  # a dense run: no keys


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    """An agentic run of the tiny MoE model (8 experts, top-2, 2 layers), repeated twice."""
    from tests.harness.test_run import SMALL, llmbench

    out = tmp_path_factory.mktemp("moe") / "run"
    model = ["--set", "model=synthetic:tiny-moe", "--set", "dtype=float32"]
    result = llmbench(
        "run", "agentic", *model, "--set", "warmup_requests=1", *SMALL["agentic"],
        "--repeat", "2", "--no-report", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


def test_a_moe_run_writes_the_routing_of_each_repetition_without_the_warm_up(moe_run):
    """Every routed token is counted once, in its own repetition: per layer, the tokens routed
    in a phase are top-k × that phase's rows of the repetition's engine steps."""
    from llmbench.harness.record_log import read_steps

    data = read_experts(moe_run)
    assert (data["num_layers"], data["num_experts"], data["top_k"]) == (2, 8, 2)
    steps = read_steps(moe_run)
    assert {s["repetition"] for s in steps} == {0, 1, 2}  # the warm-up ran steps too
    for entry in data["repetitions"]:
        own = [s for s in steps if s["repetition"] == entry["repetition"]]
        prefill_rows = sum(s["num_prefill_tokens"] for s in own)
        decode_rows = sum(sum(s["query_lens"]) - s["num_prefill_tokens"] for s in own)
        for phase, rows in (("prefill", prefill_rows), ("decode", decode_rows)):
            for layer in entry["phases"][phase]["tokens"]:
                assert sum(layer) == 2 * rows, (entry["repetition"], phase)
        assert entry["is_partial"] is False
    measured = [s for s in steps if s["repetition"] >= 1]
    for phase in ("prefill", "decode"):
        pooled = data["phases"][phase]
        first, second = (r["phases"][phase]["tokens"] for r in data["repetitions"])
        assert pooled["tokens"] == [
            [a + b for a, b in zip(x, y, strict=True)] for x, y in zip(first, second, strict=True)
        ]
        # Co-activation's diagonal is the tokens routed (a token picks distinct experts).
        for layer, matrix in zip(pooled["tokens"], pooled["coactivation"], strict=True):
            assert [matrix[e][e] for e in range(8)] == layer
    summary = json.loads((moe_run / "results.json").read_text())["summary"]
    assert (
        summary["moe_decode_experts_touched"] == moe_summary(measured)["moe_decode_experts_touched"]
    )
    assert 1 <= summary["moe_decode_experts_touched"] <= 8
    for alone in summary["repetitions"]:
        own = [s for s in measured if s["repetition"] == alone["repetition"]]
        assert alone["moe_load_max_over_mean"] == pytest.approx(
            moe_summary(own)["moe_load_max_over_mean"]
        )


def test_a_moe_runs_steps_are_costed_with_the_experts_they_touched(moe_run):
    from llmbench.engine.presets import PRESETS
    from llmbench.harness.record_log import read_steps
    from llmbench.roofline.cost_model import StepShape, step_cost

    config = PRESETS["tiny-moe"]
    decode = [s for s in read_steps(moe_run) if s["phase"] == "decode"]
    assert decode
    for step in decode[:20]:
        shape = StepShape(
            prefill=tuple(
                (c - q, q) for c, q in zip(step["context_lens"], step["query_lens"], strict=True)
            ),
            weight_bytes_per_param=4,
            kv_bytes_per_elem=4,
            experts_touched=tuple(step["experts_touched"]),
        )
        assert step["bytes"] == step_cost(config, shape).bytes
        # 2 to 8 experts per layer read; exactly 2 at batch 1.
        assert all(2 <= n <= 8 for n in step["experts_touched"])
        if step["num_seqs"] == 1 and sum(step["query_lens"]) == 1:
            assert step["experts_touched"] == [2, 2]


def test_compare_gates_a_moe_runs_routing(moe_run, tmp_path):
    """The summary's MoE keys are per-repetition metrics a gates file can name."""
    from tests.harness.test_run import llmbench

    gates = tmp_path / "gates.yaml"
    gates.write_text(
        "moe_decode_experts_touched: {max_increase: 5%, max: 8}\n"
        "moe_load_max_over_mean: {max_increase: 10%}\n"
    )
    result = llmbench(
        "compare", str(moe_run), str(moe_run), "--gates", str(gates), "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    verdicts = {(g["metric"], g["rule"]): g["verdict"] for g in json.loads(result.stdout)["gates"]}
    assert verdicts == {
        ("moe_decode_experts_touched", "max_increase"): "within noise",  # the same run: +0%
        ("moe_decode_experts_touched", "max"): "pass",  # at most all 8 experts
        ("moe_load_max_over_mean", "max_increase"): "within noise",
    }
