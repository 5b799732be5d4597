"""results.json: a run's typed, versioned result (`RunResult`), written and read here only.

`write_results` writes the file atomically, `read_results` reads it back and checks its
`schema_version`: the current version (9) is read strictly (a missing or unexpected key is an
error naming it), versions 8, 7, 6, 5 and 4 read as it (the keys they lack have defaults: null, or
what an older run did), versions 3, 2 and 1 are migrated (`_migrate_v3`, ...: the keys a later
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmbench.errors import UserError
from llmbench.harness import plain_data
from llmbench.harness.run_folder import write_failed
from llmbench.harness.shards import ClockAnchor
from llmbench.harness.spread import spread
from llmbench.harness.yaml_source import SpecError

SCHEMA_VERSION = 9
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9)  # 1 to 3 are migrated on read; 4 to 8 read as 9
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class Device:
    """What ran the model: cpu/cuda (`name`, `threads`, `kernels`), or remote (`url`)."""

    type: str
    name: str | None = None
    threads: int | None = None
    kernels: str | None = None
    url: str | None = None
    # The share of the engine's weights the OS backed with 2 MiB pages (`engine.huge_pages`);
    # None: not a CPU engine, not asked, not known (or a file from before version 7).
    weights_on_huge_pages: float | None = None


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
    # How the probe ran and what its runs said (null in files from before they were recorded):
    method: str | None = None  # "read-only sum", "copy, read + write", "matmul bfloat16 ..."
    threads: int | None = None
    unit: str | None = None  # of the rates: "B/s" or "FLOP/s"
    best_per_s: float | None = None  # the fastest run's rate (the roof)
    median_per_s: float | None = None
    spread: float | None = None  # 1 − fastest / slowest run's time
    converged: bool | None = None  # its best runs agreed (`hardware.has_converged`)
    # A bandwidth probe's best rate on each fresh allocation (`ceilings.allocation_spread`);
    # null for a matmul, and in files from before version 5.
    allocation_best_per_s: tuple[float, ...] | None = None


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
    # The most prompt tokens a first turn of the run shares with another of its prompts (warm-up
    # included): what the run itself can have cached for a first turn. openai backend only.
    shared_prefix_tokens: int | None = None
    kv_cache: KVCacheInfo | None = None  # the engine's K/V cache (engine backend only)
    # The engine's weight-only quantization of its linear layers (`int8`, `int4:32`, ...);
    # None: the weights ran in `dtype` (and for other backends).
    quantize: str | None = None
    # The engine's expert offloading (mixture of experts; None: every expert resident).
    moe_offload: MoEOffloadInfo | None = None


@dataclass(frozen=True)
class MoEOffloadInfo:
    """Expert offloading as the engine ran it: `num_resident` experts per layer in device
    memory, the others fetched over the host link through an LRU of `num_cached` per layer.
    A simulated link (`is_simulated`; always on a CPU) moves nothing: each fetch is charged
    `expert_bytes` / `link_bytes_per_s` (steps' `link_s_simulated`), slept too when `is_slept`."""

    num_resident: int
    num_cached: int
    is_simulated: bool
    link_bytes_per_s: float | None  # the simulated link's; None for a real one
    is_slept: bool
    expert_bytes: int  # what one fetch moves
    usage_profile: str | None  # the experts.json that chose the resident experts; None: ids 0..N-1


@dataclass(frozen=True)
class KVCacheInfo:
    """The built-in engine's K/V cache as it ran: storage of keys and values, real bytes per
    token (scales included) and how many tokens the cache held at its memory budget."""

    k_dtype: str  # float32, bfloat16, float16, int8, int4
    v_dtype: str
    kv_bytes_per_token: int  # K + V of one token over all layers
    kv_cache_tokens: int  # num_blocks · block_size
    kv_cache_bytes: int


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
    # How the weights are stored, as the bytes assume: a storage name ("bfloat16", "q4_1"),
    # "<n> bytes/param", or None when unknown (a server's: the bytes then assume `dtype`).
    weights: str | None = None
    # The lm_head's bytes per weight when stored apart from the layers (a quantised engine
    # model); None: `weight_bytes_per_param`.
    lm_head_bytes_per_param: float | None = None


@dataclass(frozen=True)
class TelemetryInfo:
    interval_s: float
    notes: tuple[str, ...] = ()
    summary: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # column → stats


@dataclass(frozen=True)
class ClientProcess:
    """One load-generating process over the measured window (`client_load.ClientMeter`)."""

    shard: int  # 0 in an unsharded run
    pid: int
    cpu_affinity: tuple[int, ...]  # the CPUs it may run on
    wall_s: float
    user_s: float
    system_s: float
    busy_fraction: float  # (user_s + system_s) / wall_s: 1.0 = one core busy the whole time
    threads: Mapping[str, float] = field(default_factory=dict)  # thread → CPU s in the window
    # A shard's start: when its schedule's offset 0 was, by its host's wall clock, and how far
    # that was from the start every shard was given (`--start-at`; > 0: it began late and its
    # schedule ran that much behind the others'). None: no common start (one process).
    host: str | None = None
    schedule_start_unix_s: float | None = None
    start_offset_s: float | None = None
    # Its host's wall clock as the kernel sees it (`shards.clock_sync`): synchronized (NTP or
    # PTP), and its maximum error from true time; None: not known.
    clock_synced: bool | None = None
    clock_max_error_s: float | None = None


@dataclass(frozen=True)
class ClientLoad:
    """The load generator's own load (openai backend), and which shard of a run a folder is."""

    shard: int | None  # the folder holds shard `shard` of `num_shards` only; None: the whole run
    num_shards: int
    clock: ClockAnchor  # the clock of the folder's records (a merge: the one they were put on)
    processes: tuple[ClientProcess, ...] = ()  # empty in run-start.json
    cpu_s: float | None = None  # Σ user + system over the processes
    max_busy_fraction: float | None = None
    is_saturated: bool = False  # a process was busy >= client_load.SATURATED_BUSY of a core
    server_pids: tuple[int, ...] = ()  # the server listening on the loopback URL's port
    server_cpu_affinity: tuple[int, ...] | None = None  # None: no local server, or unreadable
    server_cpu_s: float | None = None  # its user + system CPU in the measured window
    shares_cores_with_server: bool | None = None  # None: no local server, or unreadable
    clock_alignment: str | None = None  # a merge: how each shard's records were put on `clock`
    # A merge: max − min of the shards' `schedule_start_unix_s` (by their hosts' own clocks).
    start_spread_s: float | None = None
    warnings: tuple[str, ...] = ()  # also appended to `summary.warnings`


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
    client: ClientLoad | None = None  # openai backend: the client's own CPU, its shard


def to_dict(result: RunResult) -> dict[str, Any]:
    """The result as results.json holds it, `schema_version` first."""
    return {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(result)}


def write_results(folder: Path, result: RunResult, name: str = RESULTS_FILE) -> Path:
    """Write `folder/name` atomically (a folder that has results.json is whole); a write that
    fails (a full disk) is a `run_folder.WriteFailed` naming the file, with nothing left aside."""
    path = folder / name
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(to_dict(result), indent=2) + "\n")
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_failed(path, e) from None
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
    # 4: `Probe.allocation_best_per_s` reads as null; 4 and 5: a client process's start and
    # clock fields read as null (not known); 4 to 6: `Device.weights_on_huge_pages` as null;
    # 7: as 8 (8 added `spec.load.search`, which a version-7 spec lacks: no search); 8: as 9
    # (9 added `spec.engine.speculative.adaptive`, which a version-8 spec lacks: every draft
    # verified, and the step key `num_withheld_tokens`: read as 0).
    elif version not in (4, 5, 6, 7, 8, SCHEMA_VERSION):
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
    """Version 3 → 4: the keys version 4 added, with what they meant in a version-3 run.

    `spec`: the spec fields version 4 added, at their defaults (`_spec_with_defaults`);
    `provenance.shared_prefix_tokens` and `provenance.kv_cache`: null (not recorded; a
    version-3 engine kept K/V in the model's dtype); `roofline.weights`: the `dtype` for
    an engine's roofline (it ran its own weights), null for an estimated one (a server's
    storage was not known); `client`: null (the client's CPU was not measured);
    `provenance.quantize` and `roofline.lm_head_bytes_per_param`: null (a version-3 engine
    ran every weight in its dtype); `provenance.moe_offload`: null (nothing was offloaded).
    """
    data = {**data}
    if isinstance(data.get("spec"), dict):
        data["spec"] = _spec_with_defaults(data["spec"])
    if isinstance(data.get("provenance"), dict):
        data["provenance"] = {
            "shared_prefix_tokens": None,
            "kv_cache": None,
            "quantize": None,
            "moe_offload": None,
            **data["provenance"],
        }
    roofline = data.get("roofline")
    if isinstance(roofline, dict):
        weights = None if roofline.get("is_estimated") else roofline.get("dtype")
        data["roofline"] = {"weights": weights, "lm_head_bytes_per_param": None, **roofline}
    data.setdefault("client", None)
    return data


def _spec_with_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """An older run's spec with the fields later versions added at their defaults (what that
    run did), so that `compare` sees the same benchmark where nothing but the version changed;
    as it was when it no longer reads as a spec."""
    from llmbench.harness.spec_load import spec_from_dict

    try:
        filled = spec_from_dict(spec, "spec").to_dict()
    except UserError:
        return spec
    return json.loads(json.dumps(filled))  # as the file holds it: lists, not tuples


def from_plain(cls: type, data: Any, where: str) -> Any:
    """`data` (plain JSON values) as `cls`, a dataclass of this module; strict (`plain_data`):
    a missing, unexpected or mistyped key is a `UserError` naming `where` and the key path."""
    try:
        return plain_data.from_plain(cls, data)
    except SpecError as e:
        raise UserError(f"{where}: {e}") from None
