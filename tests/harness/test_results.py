"""results.json: the typed `RunResult` round trip, the schema version check, v2 and v1
migration."""

from __future__ import annotations

import dataclasses
import json

import pytest

from llmbench.compare.runs import spec_differences
from llmbench.errors import UserError
from llmbench.harness import results
from llmbench.harness.results import (
    ClientLoad,
    ClientProcess,
    Device,
    HardwareCeilings,
    MachineLoad,
    Phase,
    Probe,
    Provenance,
    Roofline,
    Roofs,
    RunResult,
    TelemetryInfo,
)
from llmbench.harness.shards import ClockAnchor
from llmbench.harness.spec import RunSpec


def a_result() -> RunResult:
    """A result with every block filled, nested values included."""
    load = MachineLoad(2, 0.5, 0.75, 0.1, 0.2, False, (4242,))
    hardware = HardwareCeilings(
        device="AMD EPYC",
        device_type="cpu",
        threads=2,
        torch="2.13.0+cpu",
        copy_bytes_per_s=16.6e9,
        read_bytes_per_s=19e9,
        matmul_flops_per_s={"float32": 98e9, "float16": 2.5e9},
        method="median of up to 5 runs",
        notes=("matmul float16: measured at 512x512",),
        probes={
            "read": Probe(268435456, 5, 0.014, 1_795_000_000.5),
            "float16": Probe(512, 5, 0.1, 1_795_000_001.0, "matmul float16: measured at 512x512"),
        },
        sources={"read": "measured now", "float16": "cache /c/x.json (measured 2026-11-22 10:00)"},
    )
    roofs = Roofs("measured AMD EPYC", 19e9, 98e9, {"read_bytes_per_s": "measured now"})
    return RunResult(
        name="chat",
        interrupted=True,
        stop_reason="SIGTERM",
        is_rebuilt=False,
        sweep_point=4.0,
        spec={"name": "chat", "slo": {"ttft_ms": 200}, "load": {"sweep": [1, 2]}},
        provenance=Provenance(
            git_sha="abc-dirty",
            versions={"python": "3.11.7", "torch": None},
            host="vm",
            platform="Linux",
            device=Device("cpu", "AMD EPYC", 2, "torch reference ops"),
            model="synthetic:tiny",
            dtype="float32",
            backend="engine",
            spec_hash="0123",
            workload_hash="4567",
            seed=0,
            machine_load=load,
            created_unix_s=1_795_000_000.25,
            hardware=hardware,
        ),
        summary={"ttft_ms": {"mean": 1.5, "p50": None, "count": 3}, "num_completed": 3},
        roofline=Roofline(
            is_estimated=False,
            method="every engine step costed by the cost model",
            dtype="float32",
            weight_bytes_per_param=4,
            kv_bytes_per_elem=4,
            roofs=roofs,
            datasheet_roofs=None,
            phases={"decode": Phase(10, 0.5, 1e9, 2e9, 0.05, 0.02, 2.0)},
        ),
        telemetry=TelemetryInfo(0.1, ("no NVML",), {"rss_bytes": {"mean": 1.0, "max": 2}}),
    )


def test_round_trip_write_read_equal(tmp_path):
    result = a_result()
    path = results.write_results(tmp_path, result)
    assert path == tmp_path / "results.json"
    assert json.loads(path.read_text())["schema_version"] == results.SCHEMA_VERSION == 9
    assert results.read_results(tmp_path) == result
    assert results.read_results(path) == result  # the file or its folder
    assert not (tmp_path / "results.json.tmp").exists()  # written atomically


def test_a_result_without_roofline_or_hardware_round_trips(tmp_path):
    result = a_result()
    bare = RunResult(
        **{
            **vars(result),
            "roofline": None,
            "provenance": Provenance(**{**vars(result.provenance), "hardware": None}),
        }
    )
    results.write_results(tmp_path, bare)
    assert results.read_results(tmp_path) == bare


def _write(tmp_path, data) -> None:
    (tmp_path / "results.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "version, found, hint",
    [
        (10, "10", "upgrade llmbench to read it"),
        (99, "99", "upgrade llmbench to read it"),
        (0, "0", "is it an llmbench results file?"),
        ("2", "'2'", "is it an llmbench results file?"),
        (None, "none", "is it an llmbench results file?"),
    ],
)
def test_an_unknown_schema_version_is_refused_in_one_line(tmp_path, version, found, hint):
    data = results.to_dict(a_result())
    if version is None:
        del data["schema_version"]
    else:
        data["schema_version"] = version
    _write(tmp_path, data)
    with pytest.raises(UserError) as error:
        results.read_results(tmp_path)
    path = tmp_path / "results.json"
    assert str(error.value) == (
        f"{path}: results schema_version {found}; this llmbench reads 1, 2, 3, 4, 5, 6, 7, 8, 9: "
        f"{hint}"
    )


def test_a_missing_or_unexpected_key_is_named(tmp_path):
    data = json.loads(json.dumps(results.to_dict(a_result())))
    del data["provenance"]["machine_load"]["is_busy"]
    _write(tmp_path, data)
    with pytest.raises(UserError, match=r"results.json: provenance.machine_load.is_busy: missing"):
        results.read_results(tmp_path)
    data["provenance"]["machine_load"]["is_busy"] = "yes"
    _write(tmp_path, data)
    with pytest.raises(UserError, match=r"machine_load.is_busy: must be true or false, got 'yes'"):
        results.read_results(tmp_path)
    data["provenance"]["machine_load"]["is_busy"] = True
    data["roofline"]["colour"] = "red"
    _write(tmp_path, data)
    with pytest.raises(UserError, match=r"roofline.colour: unknown key; known keys here: "):
        results.read_results(tmp_path)


def test_not_json_and_no_file_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        results.read_results(tmp_path)
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        results.read_results(tmp_path)


def version_2(result: RunResult) -> dict:
    """What a schema_version 2 writer wrote for the same run (`a_result` has no repetition keys,
    as version 2 had none: the summary is its pooled one)."""
    data = json.loads(json.dumps(results.to_dict(result)))
    data["schema_version"] = 2
    return data


def test_version_2_is_migrated_as_one_repetition(tmp_path):
    whole = dataclasses.replace(a_result(), interrupted=False, stop_reason=None)
    _write(tmp_path, version_2(whole))
    migrated = results.read_results(tmp_path)
    summary = {"ttft_ms": {"mean": 1.5, "p50": None, "count": 3}, "num_completed": 3}
    assert migrated.spec["repeat"] == 1
    assert {k: migrated.summary[k] for k in summary} == summary
    assert migrated.summary["repetitions"] == [{"repetition": 1, "is_partial": False, **summary}]
    spread = migrated.summary["spread"]
    assert spread["ttft_ms.mean"] == {"mean": 1.5, "stdev": None, "cv": None}
    assert (
        spread["ttft_ms.p50"] == spread["decode_mbu"] == {"mean": None, "stdev": None, "cv": None}
    )
    assert migrated.provenance == whole.provenance and migrated.roofline == whole.roofline
    # Written back, it is a version-3 file that reads the same.
    results.write_results(tmp_path, migrated)
    assert json.loads((tmp_path / "results.json").read_text())["schema_version"] == 9
    assert results.read_results(tmp_path) == migrated


def test_version_2_interrupted_is_one_partial_repetition_and_no_spread(tmp_path):
    _write(tmp_path, version_2(a_result()))  # interrupted by SIGTERM
    summary = results.read_results(tmp_path).summary
    assert [r["is_partial"] for r in summary["repetitions"]] == [True]
    assert all(v == {"mean": None, "stdev": None, "cv": None} for v in summary["spread"].values())


def test_version_2_run_start_keeps_its_empty_summary(tmp_path):
    _write(tmp_path, version_2(dataclasses.replace(a_result(), summary={})))
    assert results.read_results(tmp_path).summary == {}


def version_1(result: RunResult) -> dict:
    """What a schema_version 1 writer wrote for the same run."""
    data = json.loads(json.dumps(results.to_dict(result)))
    data["schema_version"] = 1
    for key in ("stop_reason", "is_rebuilt"):
        del data[key]
    for key in ("notes", "probes", "sources"):
        del data["provenance"]["hardware"][key]
    del data["roofline"]["roofs"]["sources"]
    return data


def test_version_1_is_migrated(tmp_path):
    result = a_result()
    _write(tmp_path, version_1(result))
    migrated = results.read_results(tmp_path)
    assert migrated.stop_reason == "SIGINT"  # interrupted, and Ctrl-C was v1's only way
    assert migrated.is_rebuilt is False
    hardware = migrated.provenance.hardware
    assert (hardware.notes, hardware.probes, hardware.sources) == ((), {}, {})
    assert hardware.matmul_flops_per_s == result.provenance.hardware.matmul_flops_per_s
    assert migrated.roofline.roofs.sources == {}
    assert migrated.roofline.phases == result.roofline.phases
    # ... and on through version 2: one repetition (partial: the run was interrupted).
    assert {k: migrated.summary[k] for k in result.summary} == result.summary
    assert [r["is_partial"] for r in migrated.summary["repetitions"]] == [True]
    assert migrated.spec["repeat"] == 1


def test_version_1_from_before_phases_is_refused(tmp_path):
    data = version_1(a_result())
    data["roofline"]["decode"] = data["roofline"].pop("phases")["decode"]
    _write(tmp_path, data)
    with pytest.raises(UserError, match="schema_version 1 from before `roofline.phases`"):
        results.read_results(tmp_path)


@pytest.mark.parametrize("is_estimated, weights", [(False, "float32"), (True, None)])
def test_version_3_weights_and_shared_prefix_as_a_version_3_run_had_them(
    tmp_path, is_estimated, weights
):
    """An engine's roofline ran its own dtype; a server's storage was not known; no version-3
    run measured the prefix its prompts share."""
    result = a_result()
    data = json.loads(json.dumps(results.to_dict(result)))
    data["schema_version"] = 3
    del data["provenance"]["shared_prefix_tokens"], data["roofline"]["weights"]
    data["roofline"]["is_estimated"] = is_estimated
    _write(tmp_path, data)
    migrated = results.read_results(tmp_path)
    assert migrated.roofline.weights == weights
    assert migrated.provenance.shared_prefix_tokens is None


def test_version_3_has_no_kv_cache_record(tmp_path):
    """A version-3 engine kept K/V in the model's dtype and recorded nothing about the cache."""
    data = json.loads(json.dumps(results.to_dict(a_result())))
    data["schema_version"] = 3
    del data["provenance"]["kv_cache"]
    _write(tmp_path, data)
    assert results.read_results(tmp_path).provenance.kv_cache is None
    data["schema_version"] = 4  # version 4 may leave it out too: null when not an engine run
    _write(tmp_path, data)
    assert results.read_results(tmp_path).provenance.kv_cache is None


def test_a_version_3_spec_reads_with_the_fields_version_4_added_at_their_defaults(tmp_path):
    """A version-3 run's spec lacks the keys version 4 added; they are what that run did (the
    defaults), so `compare` sees the same benchmark where only the version changed."""
    spec = RunSpec(name="gate")
    data = json.loads(json.dumps(results.to_dict(dataclasses.replace(a_result(), spec={}))))
    data["schema_version"] = 3
    old_spec = spec.to_dict()
    del old_spec["backend"]["headers"], old_spec["engine"]["quantize"], old_spec["quality"]
    data["spec"] = old_spec
    _write(tmp_path, data)
    migrated = results.read_results(tmp_path)
    assert migrated.spec == spec.to_dict()
    assert spec_differences(migrated.spec, spec.to_dict()) == []


def test_a_bandwidth_probes_allocations_round_trip_and_a_version_4_file_reads_them_as_null(
    tmp_path,
):
    """Version 5 added `allocation_best_per_s` (each fresh buffer's best read rate); a version-4
    probe lacks it and reads as null."""
    result = a_result()
    read = dataclasses.replace(
        result.provenance.hardware.probes["read"],
        best_per_s=30.2e9,
        allocation_best_per_s=(29.8e9, 30.2e9, 12.6e9),
    )
    hardware = dataclasses.replace(
        result.provenance.hardware, probes={**result.provenance.hardware.probes, "read": read}
    )
    result = dataclasses.replace(
        result, provenance=dataclasses.replace(result.provenance, hardware=hardware)
    )
    results.write_results(tmp_path, result)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["provenance"]["hardware"]["probes"]["read"]["allocation_best_per_s"] == [
        29.8e9,
        30.2e9,
        12.6e9,
    ]
    assert data["provenance"]["hardware"]["probes"]["float16"]["allocation_best_per_s"] is None
    back = results.read_results(tmp_path)
    assert back == result
    assert back.provenance.hardware.probes["read"].allocation_best_per_s == (29.8e9, 30.2e9, 12.6e9)
    data["schema_version"] = 4
    for probe in data["provenance"]["hardware"]["probes"].values():
        del probe["allocation_best_per_s"]
    _write(tmp_path, data)
    old = results.read_results(tmp_path)
    assert old.provenance.hardware.probes["read"].allocation_best_per_s is None
    assert old.provenance.hardware.probes["read"].best_per_s == 30.2e9


def test_a_version_5_client_process_reads_without_its_start_and_clock(tmp_path):
    """Version 6 added a client process's host, schedule start and clock state; a version-5
    process lacks them and reads them as not known."""
    anchor = ClockAnchor(1, 2, 3, "vm", None)
    process = ClientProcess(0, 11, (0,), 1.0, 0.2, 0.1, 0.3, host="vm", start_offset_s=0.002)
    client = ClientLoad(shard=None, num_shards=1, clock=anchor, processes=(process,))
    data = json.loads(json.dumps(results.to_dict(dataclasses.replace(a_result(), client=client))))
    _write(tmp_path, data)
    assert results.read_results(tmp_path).client == client
    data["schema_version"] = 5
    for key in ("host", "schedule_start_unix_s", "start_offset_s", "clock_synced"):
        del data["client"]["processes"][0][key]
    del data["client"]["processes"][0]["clock_max_error_s"]
    del data["client"]["start_spread_s"]
    _write(tmp_path, data)
    (read,) = results.read_results(tmp_path).client.processes
    assert (read.host, read.start_offset_s, read.clock_synced) == (None, None, None)


def test_weights_on_huge_pages_round_trip_and_a_version_6_file_reads_them_as_not_known(tmp_path):
    """Version 7 added the share of the engine's weights on 2 MiB pages; a version-6 device
    lacks it and reads it as not known."""
    result = a_result()
    device = dataclasses.replace(result.provenance.device, weights_on_huge_pages=0.992)
    result = dataclasses.replace(
        result, provenance=dataclasses.replace(result.provenance, device=device)
    )
    results.write_results(tmp_path, result)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["provenance"]["device"]["weights_on_huge_pages"] == 0.992
    assert results.read_results(tmp_path) == result
    data["schema_version"] = 6
    del data["provenance"]["device"]["weights_on_huge_pages"]
    _write(tmp_path, data)
    assert results.read_results(tmp_path).provenance.device.weights_on_huge_pages is None


def test_a_version_7_file_reads_as_8_its_spec_without_a_load_search(tmp_path):
    """Version 8 added `spec.load.search`; a version-7 spec lacks it (it ran no search) and
    the file reads as it is, its spec as a spec without a search."""
    from llmbench.harness.spec import RunSpec
    from llmbench.harness.spec_load import spec_from_dict

    result = dataclasses.replace(a_result(), spec=RunSpec().to_dict())
    results.write_results(tmp_path, result)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["spec"]["load"]["search"] is None
    data["schema_version"] = 7
    del data["spec"]["load"]["search"]
    _write(tmp_path, data)
    read = results.read_results(tmp_path)
    assert read.spec == data["spec"]
    assert spec_from_dict(dict(read.spec), "v7").load.search is None


def test_a_version_8_file_reads_as_9_its_spec_verifying_every_draft(tmp_path):
    """Version 9 added `spec.engine.speculative.adaptive`; a version-8 spec lacks it (every
    draft was verified) and the file reads as it is, its spec as one that is not adaptive."""
    from llmbench.harness.spec import RunSpec
    from llmbench.harness.spec_load import spec_from_dict

    result = dataclasses.replace(a_result(), spec=RunSpec().to_dict())
    results.write_results(tmp_path, result)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["spec"]["engine"]["speculative"]["adaptive"] is False
    data["schema_version"] = 8
    del data["spec"]["engine"]["speculative"]["adaptive"]
    _write(tmp_path, data)
    read = results.read_results(tmp_path)
    assert read.spec == data["spec"]
    assert spec_from_dict(dict(read.spec), "v8").engine.speculative.adaptive is False
