"""results.json: a run's typed, versioned result (`RunResult`), written and read here only.

`write_results` writes the file atomically, `read_results` reads it back and checks its
`schema_version`: the current version (4) is read strictly (a missing or unexpected key is an
error naming it), versions 3, 2 and 1 are migrated (`_migrate_v3`, ...: the keys a later
version added get the values an older run had), anything else is refused in one line that names
the file, the version found and the versions this llmbench reads. What each version holds is
docs/results-schema.md.

Provenance, roofline and telemetry are typed. `summary` stays a mapping, metric name → value:
its ~25 keys are made (each with its `Formula:`) by `metrics.summarize` and documented in
docs/results-schema.md, and typing them a second time here would be a second list to keep in
step with the first. `spec` is the `RunSpec` as a mapping (`RunSpec.to_dict`): the spec module
owns its fields. Mapping fields hold plain JSON values; "frozen" means no field is reassigned.
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from llmbench.errors import UserError
from llmbench.harness.spread import spread

SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)  # 1 to 3 are migrated on read
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class Device:
    """What ran the model: cpu/cuda (`name`, `threads`, `kernels`), or remote (`url`)."""

    type: str
    name: str | None = None
    threads: int | None = None
    kernels: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class MachineLoad:
    """How busy the machine was around the run (`provenance.LoadMonitor`)."""

    cpu_count: int
    loadavg_1m_before: float
    loadavg_1m_max_during: float
    other_processes_cores_before: float | None  # cores other processes used just before
    other_processes_cores: float | None  # mean cores other processes used during the run
    is_busy: bool
    own_pids: tuple[int, ...] = ()  # a local server under test: its CPU is the run's own


@dataclass(frozen=True)
class Probe:
    """One hardware probe as run: its size (bytes, or n of an n×n matmul), timed repeats, the
    seconds of the fastest repeat (the roof), and when it ran (wall clock, a label)."""

    size: int
    repeats: int
    seconds: float
    measured_unix_s: float
    note: str | None = None  # e.g. a matmul measured below full size: no fast path


@dataclass(frozen=True)
class HardwareCeilings:
    """The measured roofs of the device (`hardware.ceilings`), and where each came from."""

    device: str
    device_type: str
    threads: int
    torch: str
    copy_bytes_per_s: float  # read + write
    read_bytes_per_s: float
    matmul_flops_per_s: Mapping[str, float]  # dtype → FLOP/s; a dtype not measured is absent
    method: str
    notes: tuple[str, ...] = ()  # e.g. a dtype probed small (no fast path), or skipped
    probes: Mapping[str, Probe] = field(default_factory=dict)  # "bandwidth" and each dtype
    # "bandwidth" and each dtype → "measured now" or "cache <file> (measured <date>)"
    sources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Provenance:
    git_sha: str | None
    versions: Mapping[str, str | None]  # package → version (python, llmbench, torch, ...)
    host: str
    platform: str
    device: Device
    model: str
    dtype: str
    backend: str
    spec_hash: str
    workload_hash: str
    seed: int
    machine_load: MachineLoad
    created_unix_s: float
    hardware: HardwareCeilings | None = None  # the measured roofs used, when there are any


@dataclass(frozen=True)
class Roofs:
    """The roofs utilisation is measured against, and where each number came from
    ("measured now", "cache <file> (measured <date>)", "datasheet <name>")."""

    label: str
    read_bytes_per_s: float
    flops_per_s: float | None
    sources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    """A phase's steps together (`roofline.phase_utilization`)."""

    num_steps: float
    seconds: float
    bytes_per_s: float
    flops_per_s: float
    mbu: float | None
    mfu: float | None
    arithmetic_intensity: float | None


@dataclass(frozen=True)
class Roofline:
    is_estimated: bool
    method: str
    dtype: str
    weight_bytes_per_param: float
    kv_bytes_per_elem: float
    roofs: Roofs | None
    datasheet_roofs: Roofs | None
    phases: Mapping[str, Phase] = field(default_factory=dict)  # decode / prefill / mixed


@dataclass(frozen=True)
class TelemetryInfo:
    interval_s: float
    notes: tuple[str, ...] = ()
    summary: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # column → stats


@dataclass(frozen=True)
class RunResult:
    name: str
    interrupted: bool  # stopped before the workload finished: the numbers cover what ended
    stop_reason: str | None  # "SIGINT"/"SIGTERM"/"SIGHUP", or the engine's error; None: whole
    is_rebuilt: bool  # rebuilt by `llmbench report` from the record files of a killed run
    sweep_point: float | None
    spec: Mapping[str, Any]
    provenance: Provenance
    # metric name → value (`metrics.summarize` + run-level keys), pooled over the repetitions,
    # with `repetitions` (each one's own summary) and `spread` (between them)
    summary: Mapping[str, Any]
    roofline: Roofline | None
    telemetry: TelemetryInfo


def to_dict(result: RunResult) -> dict[str, Any]:
    """The result as results.json holds it, `schema_version` first."""
    return {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(result)}


def write_results(folder: Path, result: RunResult, name: str = RESULTS_FILE) -> Path:
    """Write `folder/name` atomically (a folder that has results.json is whole)."""
    path = folder / name
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_dict(result), indent=2) + "\n")
    tmp.replace(path)
    return path


def read_results(path: Path) -> RunResult:
    """Read a results file (a run folder's results.json when `path` is a folder).

    Every problem is a `UserError` naming the file: missing, not JSON, a schema version this
    llmbench does not read, a missing or unexpected key.
    """
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise UserError(f"{path}: no such file; pass a folder that `llmbench run` wrote")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read it ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not an llmbench results file (not a JSON object)")
    version = data.pop("schema_version", None)
    if version == 1:
        data = _migrate_v3(_migrate_v2(_migrate_v1(data, path)))
    elif version == 2:
        data = _migrate_v3(_migrate_v2(data))
    elif version == 3:
        data = _migrate_v3(data)
    elif version != SCHEMA_VERSION:
        readable = ", ".join(str(v) for v in READABLE_VERSIONS)
        found = "none" if version is None else repr(version)
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        hint = "upgrade llmbench to read it" if newer else "is it an llmbench results file?"
        raise UserError(
            f"{path}: results schema_version {found}; this llmbench reads {readable}: {hint}"
        )
    return from_plain(RunResult, data, str(path))


def _migrate_v1(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 1 → 2: the keys version 2 added, with what they meant in a version-1 run.

    `stop_reason`: "SIGINT" when interrupted (Ctrl-C was the only way to interrupt a run);
    `is_rebuilt`: false; the hardware block's `notes`, `probes`, `sources` and each roof's
    `sources`: empty (version 1 did not record them). A version-1 file from before the roofline
    was split by phase (`roofline` without `phases`) cannot be migrated: it is refused.
    """
    data = {**data}
    data.setdefault("stop_reason", "SIGINT" if data.get("interrupted") else None)
    data.setdefault("is_rebuilt", False)
    roofline = data.get("roofline")
    if isinstance(roofline, dict):
        if "phases" not in roofline:
            raise UserError(
                f"{path}: results schema_version 1 from before `roofline.phases`; this llmbench "
                "cannot migrate it: run the workload again"
            )
        data["roofline"] = roofline = {**roofline}
        for key in ("roofs", "datasheet_roofs"):
            if isinstance(roofline.get(key), dict):
                roofline[key] = {"sources": {}, **roofline[key]}
    provenance = data.get("provenance")
    if isinstance(provenance, dict) and isinstance(provenance.get("hardware"), dict):
        data["provenance"] = {**provenance}
        data["provenance"]["hardware"] = {"notes": [], "probes": {}, "sources": {}}
        data["provenance"]["hardware"].update(provenance["hardware"])
    return data


def _migrate_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 → 3: a version-2 run measured its workload once, so it is one repetition.

    `spec.repeat`: 1; a non-empty `summary` gets `repetitions` = [the summary itself, with
    `repetition` 1 and `is_partial` = `interrupted`] and `spread` over it (means only: no
    spread with one repetition; all null when that one is partial). Records without a
    `repetition` are read as repetition 1 (`record_log`).
    """
    data = {**data}
    if isinstance(data.get("spec"), dict):
        data["spec"] = {"repeat": 1, **data["spec"]}
    summary = data.get("summary")
    if isinstance(summary, dict) and summary:
        is_partial = bool(data.get("interrupted"))
        alone = {"repetition": 1, "is_partial": is_partial, **summary}
        data["summary"] = {
            **summary,
            "repetitions": [alone],
            "spread": spread([] if is_partial else [alone]),
        }
    return data


def _migrate_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 → 4: the keys version 4 added, with what they meant in a version-3 run."""
    return {**data}


def from_plain(cls: type, data: Any, where: str) -> Any:
    """`data` (plain JSON values) as `cls`, a dataclass of this module; strict: a missing,
    unexpected or mistyped key is a `UserError` naming `where` and the key path."""
    return _convert(cls, data, where, "")


def _convert(tp: Any, value: Any, where: str, key: str) -> Any:
    def bad(expected: str) -> UserError:
        return UserError(f"{where}: {key or 'the file'}: expected {expected}, got {value!r:.60}")

    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad("an object")
        hints = get_type_hints(tp)
        known = {f.name: f for f in dataclasses.fields(tp)}
        for name in value:
            if name not in known:
                raise UserError(f"{where}: {_join(key, name)}: not a key of this schema")
        kwargs = {}
        for name, f in known.items():
            if name in value:
                kwargs[name] = _convert(hints[name], value[name], where, _join(key, name))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise UserError(f"{where}: {_join(key, name)}: missing")
        return tp(**kwargs)
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(get_args(tp)):
            return None
        return _convert(args[0], value, where, key)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise bad("a list")
        return tuple(
            _convert(get_args(tp)[0], v, where, f"{key}[{i}]") for i, v in enumerate(value)
        )
    if origin is Mapping or origin is dict:
        if not isinstance(value, dict):
            raise bad("an object")
        item = get_args(tp)[1]
        return {k: _convert(item, v, where, _join(key, k)) for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        return value
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise bad(tp.__name__)
    return value


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name
