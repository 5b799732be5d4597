"""BASE and NEW of `llmbench compare`, read from their files into `RunSamples` and paired: two
runs, or two sweeps point by point, checked to be the same benchmark.

A side is a run folder (`results.json` + `requests.jsonl` + `steps.jsonl`), a sweep folder (its
`point-<value>/` run folders) or a results file. A file named `results.json` takes its records
from the folder it is in; a results file under another name stands alone, so its latency gates
have no data (the per-request samples live in `requests.jsonl`).

Per-request latencies come from `metrics`' per-request functions over the measured (non-warm-up)
requests, grouped by the repetition each belongs to; one value per repetition comes from
`summary.repetitions` (a file without it is one repetition: its pooled summary). A repetition cut
short (`is_partial`) is left out when a whole one exists. Two runs are the same benchmark when
model, dtype, workload_hash and the spec match (its name, output_dir and repeat aside). Anything
that cannot be read is a `UserError` of one line naming the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbench.compare.gates import Gate, default_gates, metric_info
from llmbench.compare.verdict import RunSamples
from llmbench.errors import UserError
from llmbench.harness import metrics, record_log
from llmbench.harness.metrics import LATENCY_FAMILIES
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import RESULTS_FILE, Device, RunResult, read_results
from llmbench.harness.run_summary import can_rebuild
from llmbench.harness.spec import NOT_THE_BENCHMARK, RunSpec
from llmbench.harness.sweep_folders import point_folders

# Spec keys that name a run and its folder: they may differ (so may `spec.NOT_THE_BENCHMARK`).
LABEL_KEYS = ("name", "output_dir")
# Provenance keys that must match, named first when they differ (spec_hash then says where).
SAME_BENCHMARK_KEYS = ("model", "dtype", "workload_hash")
# What a roofline point needs to be drawn (`steps.jsonl`).
STEP_KEYS = ("t_start_ns", "t_end_ns", "phase", "flops", "bytes")


@dataclass(frozen=True)
class LoadedRun:
    """One run as compared: its result, measured requests, roofline points and samples."""

    path: Path  # its results file
    result: RunResult
    requests: tuple[RequestRecord, ...]  # measured requests; empty without requests.jsonl
    steps: tuple[dict[str, Any], ...]  # roofline points of steps.jsonl (warm-up included)
    samples: RunSamples
    has_records: bool  # requests.jsonl was found beside the results file
    num_repetitions: int  # repetitions compared (whole ones of `summary.repetitions`; or 1)


@dataclass(frozen=True)
class RunPair:
    """BASE and NEW of one comparison; `point` names the sweep point ("point-4"), None for
    two single runs."""

    point: str | None
    baseline: LoadedRun
    new: LoadedRun


# -- one run's samples ---------------------------------------------------------------------------


def latency_samples(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Every latency family's per-request samples of measured requests, as `metrics.summarize`
    takes them: over completed requests (one value each; one per token or chunk gap for itl /
    icl), except queue_ms, over every measured request."""
    completed = [r for r in records if r.ok]

    def values(fn: Callable[[RequestRecord], float | None]) -> list[float]:
        return [v for v in map(fn, completed) if v is not None]

    def pooled(fn: Callable[[RequestRecord], list[float]]) -> list[float]:
        return [x for r in completed for x in fn(r)]

    samples = {
        "ttft_ms": values(metrics.ttft_ms),
        "ttft_from_send_ms": values(metrics.ttft_from_send_ms),
        "tpot_ms": values(metrics.tpot_ms),
        "itl_ms": pooled(metrics.itl_samples_ms),
        "icl_ms": pooled(metrics.icl_samples_ms),
        "e2e_ms": values(metrics.e2e_ms),
        "queue_ms": [metrics.queue_ms(r) for r in records],
    }
    return samples


def _repetition_summaries(result: RunResult, where: str) -> list[Mapping[str, Any]]:
    """The summaries of the repetitions compared: `summary.repetitions` without those cut
    short (`is_partial`) when a whole one exists; the pooled summary as the only repetition in
    a file without them."""
    repetitions = result.summary.get("repetitions")
    if repetitions is None or repetitions == []:
        return [result.summary]
    if not isinstance(repetitions, list) or not all(isinstance(r, dict) for r in repetitions):
        raise UserError(f"{where}: summary.repetitions: expected a list of objects")
    whole = [r for r in repetitions if not r.get("is_partial")]
    return whole or repetitions


def _number(value: Any, where: str, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{where}: {key}: expected a number or null, got {value!r:.60}")
    return float(value)


def per_repetition_values(result: RunResult, where: str) -> dict[str, list[float | None]]:
    """One value per repetition of every per-repetition metric a gate may name.

    Formula: metric[k] = summary.repetitions[k][metric]; output_tok_per_s_per_gb_s[k] =
    output_tok_per_s[k] / (provenance.hardware.read_bytes_per_s / 1e9), absent without
    measured roofs. A metric a repetition lacks is None there.
    """
    summaries = _repetition_summaries(result, where)
    names: list[str] = []
    for summary in summaries:
        for name in summary:
            info = metric_info(name)
            if info is not None and not info.is_per_request and name not in names:
                names.append(name)
    values: dict[str, list[float | None]] = {name: [] for name in names}
    for k, summary in enumerate(summaries):
        number = summary.get("repetition", k + 1)
        prefix = (
            "summary" if summary is result.summary else f"summary.repetitions[repetition {number}]"
        )
        for name in names:
            values[name].append(_number(summary.get(name), where, f"{prefix}.{name}"))
    hardware = result.provenance.hardware
    rates = values.get("output_tok_per_s")
    if hardware is not None and hardware.read_bytes_per_s > 0 and rates is not None:
        gb_per_s = hardware.read_bytes_per_s / 1e9
        values["output_tok_per_s_per_gb_s"] = [
            None if rate is None else rate / gb_per_s for rate in rates
        ]
    return values


def default_gates_of(runs: Sequence[LoadedRun]) -> tuple[tuple[Gate, ...], list[str]]:
    """The shipped gates for `runs` judged together (`gates.default_gates`): the first run's
    backend, raw latency and rates when every run is on one device, goodput when every spec
    sets SLOs; the latency gates only when every run kept its requests (a results file alone has
    none). Returns (gates, the names of the latency gates left out)."""
    gates = default_gates(
        runs[0].result.provenance.backend,
        is_same_device=len({r.samples.device for r in runs}) == 1,
        has_slo=all(bool(r.result.spec.get("slo")) for r in runs),
    )
    if all(r.has_records for r in runs):
        return gates, []
    left_out = [g.name for g in gates if g.info.is_per_request]
    return tuple(g for g in gates if not g.info.is_per_request), left_out


def device_label(device: Device) -> str:
    """What ran the model, as raw numbers depend on it: "cpu: <name> (2 threads)", or the
    server's identity ("remote: vllm 0.6.3: <model> on h100-sxm")."""
    if device.type == "remote":  # the server's identity, not its address (older runs: the URL)
        return f"remote: {device.name or device.url}"
    threads = f" ({device.threads} threads)" if device.threads else ""
    return f"{device.type}: {device.name or 'unknown'}{threads}"


def run_samples(result: RunResult, requests: Sequence[RequestRecord], where: str) -> RunSamples:
    """The samples of one run: per-request latencies by repetition (in repetition order, only
    the repetitions compared: see `_repetition_summaries`), one value per repetition, the device
    and whether the machine was busy."""
    numbers = {summary.get("repetition") for summary in _repetition_summaries(result, where)}
    by_repetition: dict[int, list[RequestRecord]] = {}
    for record in requests:
        if None in numbers or record.repetition in numbers:
            by_repetition.setdefault(record.repetition, []).append(record)
    groups = [latency_samples(by_repetition[k]) for k in sorted(by_repetition)]
    return RunSamples(
        per_request={family: [g[family] for g in groups] for family in LATENCY_FAMILIES},
        per_repetition=per_repetition_values(result, where),
        device=device_label(result.provenance.device),
        is_busy=result.provenance.machine_load.is_busy,
    )


# -- reading a side ------------------------------------------------------------------------------


def _records_folder(results_path: Path) -> Path | None:
    return results_path.parent if results_path.name == RESULTS_FILE else None


def _read_steps(folder: Path) -> tuple[dict[str, Any], ...]:
    path = folder / record_log.STEPS_FILE
    steps = record_log.read_steps(folder)
    for number, step in enumerate(steps, 1):
        missing = [k for k in STEP_KEYS if not isinstance(step, dict) or k not in step]
        if missing:
            raise UserError(
                f"{path}: line {number}: not a roofline point (no {', '.join(missing)})"
            )
    return tuple(steps)


def _unreadable(path: Path, e: Exception) -> UserError:
    if isinstance(e, OSError):
        return UserError(f"{path}: cannot read it ({e.strerror or e})")
    return UserError(f"{path}: not records as llmbench writes them ({type(e).__name__}: {e})")


# A damaged record file raises these from the readers and the per-request metrics.
_DAMAGE = (TypeError, ValueError, AttributeError, KeyError, OSError)


def load_run(results_path: Path) -> LoadedRun:
    """A run from its results file (and the records beside a `results.json`)."""
    result = read_results(results_path)
    where = str(results_path)
    folder = _records_folder(results_path)
    num_repetitions = len(_repetition_summaries(result, where))
    if folder is None:
        samples = run_samples(result, (), where)
        return LoadedRun(results_path, result, (), (), samples, False, num_repetitions)
    requests_path = folder / record_log.REQUESTS_FILE
    try:
        requests = tuple(r for r in record_log.read_requests(folder) if not r.is_warmup)
        samples = run_samples(result, requests, where)
    except _DAMAGE as e:
        raise _unreadable(requests_path, e) from None
    try:
        steps = _read_steps(folder)
    except _DAMAGE as e:
        raise _unreadable(folder / record_log.STEPS_FILE, e) from None
    has_records = requests_path.is_file()
    return LoadedRun(results_path, result, requests, steps, samples, has_records, num_repetitions)


def load_side(path: Path) -> dict[str | None, LoadedRun]:
    """A side's runs: {None: run} for a run folder or results file, {"point-<v>": run} for a
    sweep folder, in sweep order."""
    if path.is_file():
        return {None: load_run(path)}
    if not path.exists():
        raise UserError(
            f"{path}: no such file or folder; pass a run folder, a sweep folder or a results.json"
        )
    if (path / RESULTS_FILE).is_file():
        return {None: load_run(path / RESULTS_FILE)}
    points = point_folders(path)
    for folder in (*points, path):
        if can_rebuild(folder):
            raise UserError(
                f"{folder}: no results.json: the run did not finish (killed, or still going); "
                f"`llmbench report {folder}` rebuilds it from its records"
            )
    if not points:
        raise UserError(
            f"{path}: no results.json and no sweep points (point-*/) here; pass a folder that "
            "`llmbench run` wrote"
        )
    for folder in points:
        if not (folder / RESULTS_FILE).is_file():
            raise UserError(f"{folder}: no results.json in this sweep point")
    return {folder.name: load_run(folder / RESULTS_FILE) for folder in points}


# -- the same benchmark? -------------------------------------------------------------------------


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {"a.b.c": leaf}; lists are leaves."""
    if not isinstance(value, Mapping) or (prefix and not value):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


_ABSENT = object()


def _short(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:39] + "…"


def spec_differences(
    baseline: Mapping[str, Any], new: Mapping[str, Any], skip: Sequence[str] = ()
) -> list[str]:
    """`key.path: base vs new` for every spec leaf that differs, labels (`LABEL_KEYS`), what
    is not the benchmark (`spec.NOT_THE_BENCHMARK`: the server's address, headers, ...) and
    `skip` aside. A key one side lacks (a run of an llmbench from before that key) is no
    difference when the other side holds its default."""
    defaults = _flatten(RunSpec().to_dict())
    a, b = _flatten(baseline), _flatten(new)
    for one, other in ((a, b), (b, a)):
        for key, value in other.items():
            if key not in one and key in defaults and value == defaults[key]:
                one[key] = value
    ignored = (*LABEL_KEYS, *NOT_THE_BENCHMARK, *skip)

    def is_ignored(key: str) -> bool:
        return any(key == i or key.startswith(f"{i}.") for i in ignored)

    keys = [k for k in (*a, *(k for k in b if k not in a)) if not is_ignored(k)]
    return [
        f"{k}: {_short(a.get(k, _ABSENT))} vs {_short(b.get(k, _ABSENT))}"
        for k in keys
        if a.get(k, _ABSENT) != b.get(k, _ABSENT)
    ]


def differences(baseline: RunResult, new: RunResult, max_keys: int = 3) -> list[str]:
    """What makes two runs different benchmarks: model, dtype, workload_hash, and the spec
    (spec_hash, with the keys that differ); [] when they are the same benchmark."""
    a, b = baseline.provenance, new.provenance
    found = [
        f"{key} {getattr(a, key)} vs {getattr(b, key)}"
        for key in SAME_BENCHMARK_KEYS
        if getattr(a, key) != getattr(b, key)
    ]
    if a.spec_hash != b.spec_hash:
        keys = spec_differences(baseline.spec, new.spec, skip=("model", "dtype"))
        if keys:
            more = f", and {len(keys) - max_keys} more" if len(keys) > max_keys else ""
            shown = "; ".join(keys[:max_keys])
            found.append(f"spec_hash {a.spec_hash} vs {b.spec_hash} (spec {shown}{more})")
    return found


def _describe(runs: Mapping[str | None, LoadedRun]) -> str:
    return "a single run" if None in runs else f"a sweep of {len(runs)} points"


def pair_runs(baseline: Path, new: Path, *, force: bool = False) -> list[RunPair]:
    """BASE and NEW read and paired (two runs, or two sweeps point by point), or a one-line
    `UserError` when they cannot be compared: a sweep against a single run, sweeps of other
    points, or different benchmarks (model, dtype, workload, spec). `force` compares different
    benchmarks anyway, and sweeps on the points they share."""
    base_runs, new_runs = load_side(baseline), load_side(new)
    if (None in base_runs) != (None in new_runs):
        raise UserError(
            f"BASE {baseline} is {_describe(base_runs)} but NEW {new} is {_describe(new_runs)}; "
            "compare a sweep with a sweep, or a run with a run (a sweep point is a run folder)"
        )
    shared = [point for point in base_runs if point in new_runs]
    only_base = [point for point in base_runs if point not in new_runs]
    only_new = [point for point in new_runs if point not in base_runs]
    if only_base or only_new:
        found = "; ".join(
            f"only {side} has {', '.join(points)}"
            for side, points in (("BASE", only_base), ("NEW", only_new))
            if points
        )
        if not force or not shared:
            hint = "pass --force to compare the points they share" if shared else ""
            raise UserError(
                f"the sweeps' points differ: {found}; compare sweeps of the same points"
                + (f", or {hint}" if hint else "")
            )
    pairs = [RunPair(point, base_runs[point], new_runs[point]) for point in shared]
    if not force:
        for pair in pairs:
            found = differences(pair.baseline.result, pair.new.result)
            if found:
                where = f"{pair.point}: " if pair.point else ""
                raise UserError(
                    f"{where}BASE and NEW are not the same benchmark: {'; '.join(found)}; "
                    "pass --force to compare them anyway"
                )
    return pairs
