"""`llmbench profile`'s text: a table per (batch, context) point from `profile.profile`'s data."""

from __future__ import annotations

from typing import Any

from llmbench.roofline.ceilings import threads_text

HEADER = (
    f"{'op':<14}{'calls':>7}{'ms/step':>9}{'share':>7}{'MB/step':>9}{'GB/s':>8}"
    f"{'GFLOP/s':>9}{'bound ms':>10}{'% roof':>8}{'lost ms':>9}"
)


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def subject(result: dict[str, Any]) -> str:
    """The model profiled: `smollm2-135m bfloat16`, `smollm2-135m bfloat16, int4 weights`."""
    quantize = result.get("quantize")  # absent from an older profile's JSON
    return f"{result['model']} {result['dtype']}" + (f", {quantize} weights" if quantize else "")


def phase_text(result: dict[str, Any]) -> str:
    """The phase profiled: `decode`, `prefill`, `verify (4 drafts a sequence)`."""
    drafts = result.get("num_drafts", 0)  # absent from an older profile's JSON
    return result["phase"] + (f" ({drafts} drafts a sequence)" if drafts else "")


def header_line(result: dict[str, Any]) -> str:
    """What was profiled, on which roofs, how busy the machine was."""
    roofs = result["roofs"]
    flops = roofs["flops_per_s"]
    matmul = f"{flops / 1e9:.0f} GFLOP/s" if flops else "no matmul roof"
    clocked = result.get("clocked_layers", False)  # absent from an older profile's JSON
    return (
        f"{subject(result)}, {phase_text(result)}, {result['num_steps']} steps "
        f"per point, {threads_text(result['threads'])}; roofs: read "
        f"{roofs['read_bytes_per_s'] / 1e9:.1f} GB/s ({roofs['sources']['read_bytes_per_s']}; "
        f"{roofs['sources']['read']}), matmul {result['dtype']} {matmul}; load average "
        f"{result['loadavg_1m_before']:.2f} before, {result['loadavg_1m_after']:.2f} after "
        f"({result['cpu_count']} cores)"
        + ("; the C++ decode layers' ops timed on their own clock" if clocked else "")
    )


def point_lines(point: dict[str, Any]) -> list[str]:
    """One point: a row per op, the attributed and unattributed time, the step's totals."""
    lines = [f"batch {point['batch']}, context {point['context']}", HEADER]
    for row in point["ops"]:
        fraction = row["roof_fraction"]
        gb = None if row["bytes_per_s"] is None else row["bytes_per_s"] / 1e9
        gflop = None if row["flops_per_s"] is None else row["flops_per_s"] / 1e9
        lines.append(
            f"{row['op']:<14}{row['calls_per_step']:>7.0f}{row['ms_per_step']:>9.3f}"
            f"{row['share']:>7.1%}{row['bytes'] / 1e6:>9.2f}{_number(gb, '.1f'):>8}"
            f"{_number(gflop, '.1f'):>9}{row['bound_ms']:>10.3f}"
            f"{'-' if fraction is None else f'{fraction:.0%}':>8}{row['lost_ms']:>9.3f}"
        )
    step_ms = point["step_ms"]
    lines.append(
        f"{'attributed':<14}{'':>7}{point['attributed_ms']:>9.3f}"
        f"{point['attributed_fraction']:>7.1%}"
    )
    lines.append(
        f"{'unattributed':<14}{'':>7}{point['unattributed_ms']:>9.3f}"
        f"{point['unattributed_ms'] / step_ms:>7.1%}  (Python, dispatch, the profiler's own)"
    )
    lines.append(
        f"step: {step_ms:.2f} ms under the profiler ({point['step_ms_unprofiled']:.2f} ms "
        f"without), {point['bytes'] / 1e6:.1f} MB and {point['flops'] / 1e9:.2f} GFLOP by the "
        f"cost model: {point['bytes_per_s'] / 1e9:.1f} GB/s; roofline bound "
        f"{point['bound_ms']:.2f} ms, {point['roof_fraction']:.0%} of the roof, "
        f"{point['lost_ms']:.2f} ms lost"
    )
    lines += [f"note: {line}" for line in point["warnings"]]
    return lines


def lines(result: dict[str, Any]) -> list[str]:
    """The whole text: the header and the profile's warnings (`result["warnings"]`: a machine
    busy with other work), then each point's table."""
    out = [header_line(result), *(f"warning: {line}" for line in result.get("warnings", ()))]
    for point in result["points"]:
        out += ["", *point_lines(point)]
    return out
