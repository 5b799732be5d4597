"""`llmbench roofline`: what-if bounds from a model's shapes and a device's roofs."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import assert_user_error, llmbench


def test_roofline_what_if_without_weights(tmp_path):
    html = tmp_path / "whatif.html"
    result = llmbench(
        "roofline",
        "--model",
        "synthetic:llama-3.1-8b",
        "--hardware",
        "h100",
        "--batch",
        "1,64",
        "--context",
        "1k",
        "--json",
        "--html",
        str(html),
    )
    assert result.returncode == 0, result.stderr
    points = json.loads(result.stdout)["points"]
    # The plots: a point per (context, batch) on the roofline, curves against the batch.
    page = html.read_text()
    for key in ("whatif-roofline", "whatif-decode_tok_per_s", "whatif-tpot_ms_bound"):
        assert f'<figure id="{key}">' in page
    start = page.index('<figure id="whatif-roofline">')
    roofline = page[start : page.index("</figure>", start)]
    assert roofline.count('class="tip"') == 2  # a point with its hover text per step
    assert [(p["context"], p["batch"]) for p in points] == [(1024, 1), (1024, 64)]
    one = points[0]
    # Batch 1 is memory-bound: ~15 GB of bf16 weights (the untied embedding gathers one row)
    # plus 1,024 tokens x 128 KiB of KV, at the datasheet's 3.35 TB/s.
    assert one["bound"] == "memory"
    assert one["decode_step_ms"] == pytest.approx(one["bytes_per_step"] / 3.35e12 * 1e3)
    assert 4.4 < one["decode_step_ms"] < 4.6
    assert one["kv_bytes_per_seq"] == 1024 * 2 * 32 * 8 * 128 * 2
    assert points[1]["decode_tok_per_s"] > 30 * one["decode_tok_per_s"]  # batching amortises


def test_a_device_price_gives_each_row_its_least_cost_per_million_tokens():
    args = ["--model", "synthetic:llama-3.1-8b", "--hardware", "h100", "--context", "1k"]
    result = llmbench("roofline", *args, "--batch", "1,64", "--gpu-hour-price", "2.5", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["gpu_hour_price"] == 2.5
    for p in data["points"]:  # 2.5 an hour over the tokens of an hour, per million
        hour_tokens = p["decode_tok_per_s"] * 3600
        assert p["cost_per_million_tokens_bound"] == pytest.approx(2.5 / hour_tokens * 1e6)
    # Batch 1 at ~4.5 ms a step (~221 tok/s): about 3.1 an hour's million tokens.
    assert 3.0 < data["points"][0]["cost_per_million_tokens_bound"] < 3.2
    table = llmbench("roofline", *args, "--batch", "1", "--gpu-hour-price", "2.5")
    assert "$/Mtok" in table.stdout and "$/Mtok: at 2.5 an hour" in table.stdout
    refused = llmbench("roofline", *args, "--gpu-hour-price", "0")
    assert refused.returncode == 2 and "--gpu-hour-price" in refused.stderr
    assert "must be > 0" in refused.stderr and "Traceback" not in refused.stderr


def test_roofline_on_the_measured_roofs_of_this_machine():
    from llmbench.roofline import ceilings

    result = llmbench(
        "roofline", "-m", "smollm2-135m", "--hardware", "measured", "--batch", "1", "--json"
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    measured = ceilings.ceilings("cpu")  # the cache the command filled or read
    assert out["peak_bytes_per_s"] == measured["read_bytes_per_s"]
    assert out["peak_flops_per_s"] == measured["matmul_flops_per_s"]["bfloat16"]
    assert out["hardware"].startswith("measured")


def test_roofline_unknown_hardware_is_one_line():
    assert_user_error(
        llmbench("roofline", "--model", "tiny", "--hardware", "abacus"), "unknown hardware 'abacus'"
    )


def test_roofline_of_a_moe_model_counts_the_experts_its_batch_reaches(tmp_path):
    """Mixtral 8x7B from its shapes alone (no weights): batch 1 reads 2 of 8 experts per layer,
    batch 64 nearly all; the table and the JSON say how many and the bytes they cost."""
    html = tmp_path / "whatif.html"
    args = ["--hardware", "h100", "--batch", "1,64", "--context", "1024"]
    result = llmbench("roofline", "--model", "synthetic:mixtral-8x7b", *args, "--html", str(html))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("8 experts per layer, top-2: a decode step of B sequences reads")
    header, one, sixty_four = lines[2].split(), lines[3].split(), lines[4].split()
    assert header[7:9] == ["GB/step", "experts"]  # after "step ms", "tok/s", "bound", "AI"
    # 2.95 GB read every step (attention, routers, norms, lm_head) + 2 experts x 32 layers x
    # 352 MB, KV 134 MB: 25.632 GB; at batch 64 E(1 - (1 - 2/8)^64) = 8.00 experts per layer.
    assert one[6:8] == ["25.632", "2.00"]
    assert sixty_four[6:8] == ["101.742", "8.00"]
    assert "<th>experts / layer</th>" in html.read_text()
    # The preset's name without `synthetic:` is the same model.
    plain = llmbench("roofline", "--model", "mixtral-8x7b", *args, "--json")
    points = json.loads(plain.stdout)["points"]
    assert [p["experts_touched_per_layer"] for p in points] == pytest.approx(
        [2.0, 8 * (1 - 0.75**64)]
    )
    assert points[0]["bytes_per_step"] == 25_632_063_488


@pytest.mark.parametrize(
    ("kv_dtype", "bytes_per_token"),
    [
        # SmolLM2: 30 layers, 3 KV heads, head_dim 64; per layer and head, K + V bytes with a
        # float16 scale per token and head for int8/int4 (as the built-in engine stores them).
        ("bfloat16", 30 * 3 * (128 + 128)),
        ("int8", 30 * 3 * (66 + 66)),
        ("k=bfloat16,v=int4", 30 * 3 * (128 + 34)),
        ("k=int8,v=int4", 30 * 3 * (66 + 34)),
    ],
)
def test_roofline_kv_dtype_keys_and_values_apart(kv_dtype, bytes_per_token):
    result = llmbench(
        "roofline",
        *("--model", "synthetic:smollm2-135m", "--hardware", "h100", "--batch", "1"),
        *("--context", "1k", "--kv-dtype", kv_dtype, "--json"),
    )
    assert result.returncode == 0, result.stderr
    (point,) = json.loads(result.stdout)["points"]
    assert point["kv_bytes_per_seq"] == pytest.approx(1024 * bytes_per_token)


def test_roofline_refuses_an_unknown_kv_dtype_in_one_line():
    result = llmbench(
        "roofline", "--model", "synthetic:tiny", "--hardware", "h100", "--kv-dtype", "k=int3,v=int8"
    )
    assert_user_error(result, "--kv-dtype k=int3,v=int8: give a storage name or k=NAME,v=NAME")


def test_roofline_tensor_parallel_replicates_kv_heads_past_their_count():
    """Llama-3.1-8B (32 query heads, 8 KV heads, head_dim 128, 32 layers) over 8 devices holds
    one KV head a device; over 16 or 32, still one (replicated): a sequence's K/V a device stops
    shrinking at 8, as Megatron and vLLM shard them."""
    per_seq = {}
    for tp in (1, 8, 16, 32):
        result = llmbench(
            "roofline",
            *("--model", "synthetic:llama-3.1-8b", "--hardware", "h100", "--batch", "1"),
            *("--context", "1k", "--tp", str(tp), "--json"),
        )
        assert result.returncode == 0, result.stderr
        (point,) = json.loads(result.stdout)["points"]
        per_seq[tp] = point["kv_bytes_per_seq"]
    whole = 1024 * 32 * 8 * 2 * 128 * 2  # positions · layers · KV heads · (K, V) · d · bytes
    assert per_seq == {1: whole, 8: whole / 8, 16: whole / 8, 32: whole / 8}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "3"], "roofline: --tp 3: does not divide the model's 32 attention heads"),
        (["--tp", "64"], "roofline: --tp 64: does not divide the model's 32 attention heads"),
        (["--batch", "99999999999"], "--batch 99999999999: values must be 1 .. 16,777,216"),
        (["--html", "/no/such/folder/w.html"], "--html /no/such/folder/w.html: the folder"),
    ],
)
def test_roofline_refuses_what_no_machine_runs_in_one_line(args, message):
    result = llmbench("roofline", "--model", "synthetic:llama-3.1-8b", "--hardware", "h100", *args)
    assert_user_error(result, message)


def test_hardware_prints_every_probe_with_best_median_and_spread(tmp_path):
    """From a cache entry written by hand (nothing measured): a row per probe, the read roof
    and which probe it is, and the notes."""
    import torch

    from llmbench.kernels.cpu_info import this_cpu_flags
    from llmbench.roofline import ceilings

    def probe(name, method, unit, best, median, spread, converged=True):
        return {
            "size": 256 << 20,
            "repeats": 6,
            "seconds": (256 << 20) / best,
            "measured_unix_s": 0.0,
            "note": None,
            "method": method,
            "threads": 1 if name.endswith("1thread") else 2,
            "unit": unit,
            "best_per_s": best,
            "median_per_s": median,
            "spread": spread,
            "converged": converged,
        }

    quiet = {
        "is_busy": False,
        "cpu_count": 2,
        "other_processes_cores_before": 0.01,
        "other_processes_cores": 0.03,
    }
    # named as this CPU's probe names it (one without bfloat16 products multiplies in float32)
    bf16_method = "matmul bfloat16 2048x2048"
    if ceilings.multiplies_in_float32("bfloat16", "cpu", this_cpu_flags()):
        bf16_method += ceilings.FLOAT32_PRODUCTS
    probes = {
        "read": probe("read", "read-only sum", "B/s", 19.0e9, 18.1e9, 0.08),
        "read_1thread": probe("read_1thread", "read-only sum", "B/s", 12.5e9, 12.0e9, 0.5, False),
        "bfloat16": probe("bfloat16", bf16_method, "FLOP/s", 330e9, 300e9, 0.1),
    }
    entry = {
        "device": "cpu0",
        "device_type": "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "copy_bytes_per_s": 16.6e9,
        "read_bytes_per_s": 19.0e9,
        "matmul_flops_per_s": {"bfloat16": 330e9},
        "method": "best of hand-written runs",
        "notes": [],
        "probes": probes,
        "unsupported": ["float32", "float16", "int8"],
        # Measured on a quiet machine (a busy one would be measured again when quiet).
        "probe_loads": dict.fromkeys(probes, quiet),
        "format": ceilings.CACHE_FORMAT,
    }
    key = f"cpu-{torch.get_num_threads()}threads-torch{torch.__version__}"
    path = ceilings._cache_path(key).relative_to(ceilings._cache_path(key).parents[1])
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(json.dumps(entry))
    result = llmbench("hardware", cache=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split() == [
        "probe", "threads", "best", "median", "spread", "runs", "unit", "source"
    ]  # fmt: skip
    assert lines[2].split()[:7] == ["read", "2", "19.0", "18.1", "8%", "6", "GB/s"]
    assert lines[3].split()[:7] == ["read_1thread", "1", "12.5", "12.0", "50%", "6", "GB/s"]
    assert lines[4].split()[:7] == ["bfloat16", "2", "330.0", "300.0", "10%", "6", "GFLOP/s"]
    assert lines[2].endswith("(measured 1970-01-01 00:00)") or "(measured 19" in lines[2]
    assert lines[5] == (
        "  read roof: 19.0 GB/s, probe read: the best read-only sum over 2 threads, of 6 runs"
    )
    assert "  note: not settled (their best 3 runs were not within 3%" in result.stdout
    as_json = json.loads(llmbench("hardware", "--json", cache=tmp_path).stdout)
    assert as_json["probe_loads"]["read"] == quiet and as_json["sources"]["read"].startswith(
        "cache"
    )


def test_the_hardware_table_says_how_steady_each_bandwidth_held():
    """A bandwidth probe's fresh buffers' bests, min / median / max, and how far apart: 28.4,
    29.3, 29.7 GB/s → 1 − 28.4 / 29.7 = 4.4%, shown as 4%; a matmul (no allocations) adds no
    line."""
    from llmbench.cli.roofline import hardware_table

    probe = {"unit": "B/s", "best_per_s": 29.7e9, "median_per_s": 29.0e9, "spread": 0.02}
    probe |= {"repeats": 10, "threads": 2, "allocation_best_per_s": [29.3e9, 28.4e9, 29.7e9]}
    matmul = {"unit": "FLOP/s", "best_per_s": 1e12, "repeats": 5, "allocation_best_per_s": None}
    table = hardware_table({"probes": {"read": probe, "float32": matmul}})
    assert table.splitlines()[-1] == (
        "  read: the best of each fresh buffer 28.4 / 29.3 / 29.7 GB/s (min / median / max), "
        "4% apart"
    )
    assert "float32:" not in table
