"""Expert offloading: each MoE layer keeps N experts resident in device memory and fetches the
others from a host tier when its router picks them, keeping the C most recently fetched on the
device (an LRU per layer); the bytes every fetch moves over the host link are counted per step.

Two kinds of link:
- simulated (`link_bytes_per_s` given; the only kind on a CPU, where host and device are one
  memory): no weight moves; a fetch is counted, charged bytes / link_bytes_per_s seconds
  (`StepRecord.link_s_simulated`), and waited out as well when `sleep` is on (a spin on the
  clock), so that wall time shows it (off by default: the step times stay the engine's own);
- real (`link_bytes_per_s` None, CUDA only): the host tier lives in pinned host memory and a
  fetch is a copy to the device on the compute stream, whose time is inside the step's. This
  path has not run on a GPU yet.

The matmul an expert runs holds the same numbers whichever tier it came from: outputs are
identical with and without offloading; only link bytes and time differ.

Resident experts: per layer, the N with the most tokens routed in a usage profile (an
`experts.json` of an earlier run, or `ExpertStats.to_dict()`: `phases.*.tokens` [L][E] summed
over the phases; ties go to the lower id); without a profile, experts 0 to N-1.
Within a step a layer fetches the touched experts it lacks in ascending id order, and they
become the most recently used in that order.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmbench.engine.model import LlamaModel, held_bytes
from llmbench.engine.moe import Matmul
from llmbench.errors import UserError


@dataclass(frozen=True)
class MoEOffloadConfig:
    num_resident: int  # experts per MoE layer kept in device memory
    num_cached: int = 0  # per layer: fetched experts kept on the device afterwards (LRU)
    # Simulated host link, bytes/s (e.g. PCIe 4.0 x16: 32e9); None: real copies (CUDA only).
    link_bytes_per_s: float | None = None
    usage_profile: str | None = None  # experts.json of an earlier run; None: experts 0..N-1
    sleep: bool = False  # simulated link: also sleep each fetch's time, so wall time shows it

    def __post_init__(self) -> None:
        if self.num_resident < 0 or self.num_cached < 0:
            raise UserError(
                f"moe offload: resident and cache must be >= 0, got {self.num_resident} and "
                f"{self.num_cached}"
            )
        if self.link_bytes_per_s is not None and not self.link_bytes_per_s > 0:
            raise UserError(f"moe offload: link must be > 0 bytes/s, got {self.link_bytes_per_s}")
        if self.sleep and self.link_bytes_per_s is None:
            raise UserError("moe offload: sleep needs a simulated link (a bandwidth)")

    @property
    def is_simulated(self) -> bool:
        return self.link_bytes_per_s is not None


class ExpertLRU:
    """Which experts one layer has on the device: its resident ones, and up to `capacity`
    fetched ones, least recently used first."""

    def __init__(self, resident: frozenset[int], capacity: int):
        self.resident = resident
        self.capacity = capacity
        self.cached: OrderedDict[int, None] = OrderedDict()

    def touch(self, experts: Sequence[int]) -> list[int]:
        """A step's touched experts (ascending ids) → those it must fetch (neither resident nor
        cached); afterwards the cache holds the `capacity` most recently used fetched ones."""
        misses = [e for e in experts if e not in self.resident and e not in self.cached]
        for e in experts:
            if e not in self.resident:
                self.cached[e] = None
                self.cached.move_to_end(e)
        while len(self.cached) > self.capacity:
            self.cached.popitem(last=False)
        return misses


class LinkMeter:
    """Bytes fetched over the host link since the last `take`, and their simulated seconds."""

    def __init__(self, bytes_per_s: float | None, sleep: bool):
        self.bytes_per_s = bytes_per_s
        self.sleep = sleep
        self.num_bytes = 0
        self.seconds = 0.0

    def add(self, num_bytes: int) -> None:
        """Formula: simulated seconds = num_bytes / bytes_per_s (0 on a real link)."""
        self.num_bytes += num_bytes
        if self.bytes_per_s is not None and num_bytes:
            seconds = num_bytes / self.bytes_per_s
            self.seconds += seconds
            if self.sleep:
                _wait(seconds)

    def take(self) -> tuple[int, float]:
        """(bytes, simulated seconds) since the last call; both back to zero."""
        taken = self.num_bytes, self.seconds
        self.num_bytes, self.seconds = 0, 0.0
        return taken


def _wait(seconds: float) -> None:
    """Hold the thread for `seconds` on the clock, as a blocking copy would: a spin, since
    `time.sleep` of microseconds gives the core away and, on a busy machine, oversleeps by a
    scheduler tick (milliseconds)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class OffloadedExperts:
    """One MoE layer's `MoEMLP.fetch`: resident experts as they are, the others from the host
    tier through the layer's LRU, each miss counted on the link."""

    def __init__(
        self,
        gate_up: Sequence[Matmul],
        down: Sequence[Matmul],
        lru: ExpertLRU,
        link: LinkMeter,
        copy_to: torch.device | None,
    ):
        """`gate_up`/`down`: every expert's matmuls, resident ones on the device and (real link)
        the others in host memory; `copy_to`: the device a real fetch copies to (None:
        simulated, nothing is copied)."""
        self.gate_up, self.down = gate_up, down
        self.lru, self.link, self.copy_to = lru, link, copy_to
        self.expert_bytes = held_bytes(gate_up[0]) + held_bytes(down[0])
        self.fetched: dict[int, tuple[Matmul, Matmul]] = {}  # real link: cached device copies

    def __call__(
        self, tokens_per_expert: tuple[int, ...]
    ) -> tuple[Mapping[int, Matmul], Mapping[int, Matmul]]:
        touched = [e for e, n in enumerate(tokens_per_expert) if n]
        misses = self.lru.touch(touched)
        self.link.add(len(misses) * self.expert_bytes)
        if self.copy_to is None:  # simulated: every expert is where it was loaded
            return self.gate_up, self.down
        device = self.copy_to
        step = {e: (self.gate_up[e], self.down[e]) for e in touched if e in self.lru.resident}
        for e in touched:
            if e in misses:
                step[e] = (to_device(self.gate_up[e], device), to_device(self.down[e], device))
            elif e not in step:
                step[e] = self.fetched[e]
        self.fetched = {e: step.get(e) or self.fetched[e] for e in self.lru.cached}
        return {e: g for e, (g, _) in step.items()}, {e: d for e, (_, d) in step.items()}


class MoEOffload:
    """Every MoE layer of a model offloaded (`offload_experts`); the engine reads each step's
    link traffic with `take_step`."""

    def __init__(
        self,
        config: MoEOffloadConfig,
        resident: list[frozenset[int]],
        layers: list[OffloadedExperts],
        link: LinkMeter,
    ):
        self.config = config
        self.resident = resident  # per MoE layer
        self.layers = layers
        self.link = link

    def take_step(self) -> tuple[int, float]:
        """(link bytes, simulated link seconds) since the last call."""
        return self.link.take()

    @property
    def expert_bytes(self) -> int:
        """Bytes one expert moves over the link (gate, up and down matrices as held)."""
        return self.layers[0].expert_bytes if self.layers else 0

    def describe(self) -> str:
        """`experts offloaded: 4 of 8 resident per layer (most routed in runs/x/experts.json),
        LRU of 2, 0.20 MiB an expert, link 32.0 GB/s simulated (recorded, not slept)`."""
        c = self.config
        num_experts = len(self.layers[0].down) if self.layers else 0
        chosen = f"ids 0-{c.num_resident - 1}" if c.num_resident else "none"
        if c.usage_profile and c.num_resident:
            chosen = f"most routed in {c.usage_profile}"
        if c.link_bytes_per_s is None:
            link = "link real (pinned host memory, copies timed in the step)"
        else:
            slept = "recorded and slept" if c.sleep else "recorded, not slept"
            link = f"link {c.link_bytes_per_s / 1e9:.1f} GB/s simulated ({slept})"
        return (
            f"experts offloaded: {c.num_resident} of {num_experts} resident per layer "
            f"({chosen}), LRU of {c.num_cached}, {self.expert_bytes / 2**20:.2f} MiB an expert, "
            f"{link}"
        )


def offload_experts(
    model: LlamaModel, config: MoEOffloadConfig, device: torch.device
) -> MoEOffload:
    """Offload the experts of every MoE layer of `model` (its `layers` are rewritten in place:
    each `MoEMLP` gets a `fetch`); on a real link the non-resident experts move to pinned host
    memory."""
    mc = model.config
    if not mc.is_moe:
        raise UserError("moe offload: the model has no experts (it is dense)")
    if config.num_resident > mc.num_experts:
        raise UserError(
            f"moe offload: resident={config.num_resident} is more than the model's "
            f"{mc.num_experts} experts per layer"
        )
    if config.link_bytes_per_s is None and device.type != "cuda":
        raise UserError(
            f"moe offload: a {device.type} device has no host link to copy over; give a link "
            "bandwidth to simulate one"
        )
    usage = None
    if config.usage_profile is not None:
        usage = read_usage_profile(Path(config.usage_profile), mc.num_layers, mc.num_experts)
    resident = resident_experts(usage, mc.num_layers, mc.num_experts, config.num_resident)
    link = LinkMeter(config.link_bytes_per_s, config.sleep)
    copy_to = None if config.is_simulated else device
    layers = []
    for i, layer in enumerate(model.layers):
        moe = layer.moe
        gate_up, down = list(moe.expert_gate_up), list(moe.expert_down)
        if copy_to is not None:
            for e in range(len(down)):
                if e not in resident[i]:
                    gate_up[e], down[e] = to_host(gate_up[e]), to_host(down[e])
        fetch = OffloadedExperts(
            tuple(gate_up), tuple(down), ExpertLRU(resident[i], config.num_cached), link, copy_to
        )
        layers.append(fetch)
        model.layers[i] = dataclasses.replace(
            layer,
            moe=dataclasses.replace(
                moe, expert_gate_up=fetch.gate_up, expert_down=fetch.down, fetch=fetch
            ),
        )
    if copy_to is not None:
        torch.cuda.empty_cache()  # give the moved experts' device memory back
    return MoEOffload(config, resident, layers, link)


def resident_experts(
    usage: Sequence[Sequence[int]] | None, num_layers: int, num_experts: int, num_resident: int
) -> list[frozenset[int]]:
    """Per layer, the experts kept resident.

    Formula: the num_resident experts with the most tokens routed in `usage` [L][E] (ties: the
    lower id); without usage, ids 0 .. num_resident - 1.
    """
    if usage is None:
        return [frozenset(range(num_resident))] * num_layers
    return [
        frozenset(sorted(range(num_experts), key=lambda e: (-row[e], e))[:num_resident])
        for row in usage
    ]


def read_usage_profile(path: Path, num_layers: int, num_experts: int) -> list[list[int]]:
    """Tokens routed per layer and expert [L][E], summed over the phases of an experts.json
    (`ExpertStats.to_dict()` layout); a missing, damaged or mis-shaped file is a `UserError`."""
    try:
        data: Any = json.loads(path.read_text())
        phases = data["phases"].values()
        tables = [phase["tokens"] for phase in phases]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"moe offload: usage profile {path}: cannot read it ({e})") from None
    except (KeyError, TypeError, AttributeError):
        raise UserError(
            f"moe offload: usage profile {path}: not an experts.json (needs phases.*.tokens)"
        ) from None
    shape_ok = all(
        len(t) == num_layers and all(len(row) == num_experts for row in t) for t in tables
    )
    if not tables or not shape_ok:
        raise UserError(
            f"moe offload: usage profile {path}: its tokens are not {num_layers} layers x "
            f"{num_experts} experts, this model's shape"
        )
    return [
        [sum(int(t[layer][e]) for t in tables) for e in range(num_experts)]
        for layer in range(num_layers)
    ]


def to_host(part: Any) -> Any:
    """A matmul (a dataclass of tensors) with every tensor in pinned host memory."""
    return _map_tensors(part, lambda t: t.to("cpu").pin_memory())


def to_device(part: Any, device: torch.device) -> Any:
    """A matmul with every tensor copied to `device` (asynchronous from pinned memory: the copy
    is ordered before the matmul on the same stream)."""
    return _map_tensors(part, lambda t: t.to(device, non_blocking=True))


def _map_tensors(part: Any, fn: Any) -> Any:
    if isinstance(part, torch.Tensor):
        return fn(part)
    if dataclasses.is_dataclass(part):
        changes = {
            f.name: _map_tensors(getattr(part, f.name), fn)
            for f in dataclasses.fields(part)
            if isinstance(getattr(part, f.name), torch.Tensor)
            or dataclasses.is_dataclass(getattr(part, f.name))
        }
        return dataclasses.replace(part, **changes)
    return part
