"""Which endpoint serves a request, when a run drives several (`backend.urls`): the routing
policies a gateway in front of model replicas uses, each a small class.

    round_robin      the next endpoint in turn
    least_loaded     the endpoint with the fewest requests in flight (then the fewest sent)
    prefix_affinity  the endpoint that served the longest leading part of this prompt, as
                     vLLM's production-stack router and SGLang's cache-aware router route: a
                     replica that holds a prefix in its KV cache does not compute it again.
                     Only a match of `min_match` of the prompt or more counts (SGLang's cache
                     threshold): a new conversation that shares no more than a system prompt
                     goes to the least loaded endpoint, not to wherever that prompt went
                     first. A load cap keeps one hot prefix from pinning one replica: an
                     endpoint with `max_imbalance` or more requests in flight above the least
                     loaded one is passed over for the least loaded.
    session_sticky   every request of a session to the endpoint its first request went to

A prompt's leading blocks are `block_tokens` token ids each (the client tokenizer's ids of the
rendered prompt); block k's key hashes blocks 0..k (a chain, like a paged KV cache's block
hashes), so a key names a whole prefix. `prefix_affinity` remembers the endpoint of every key
it routed (the `max_keys` most recent), and a later prompt goes where its longest known prefix
went. An endpoint that failed (`Endpoints.fail`) is skipped until `down_s` has passed; when all
are down, the one that has been down longest is tried.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

RoutingPolicy = Literal["round_robin", "least_loaded", "prefix_affinity", "session_sticky"]
POLICIES: tuple[RoutingPolicy, ...] = (
    "round_robin",
    "least_loaded",
    "prefix_affinity",
    "session_sticky",
)


@dataclass(frozen=True)
class Routed:
    """What a policy sees of a request: its session and its prompt's token ids."""

    session_id: str
    prompt_ids: tuple[int, ...]


@dataclass
class Endpoints:
    """The endpoints' state as the router keeps it: requests in flight, sent, failed, and until
    when each is skipped after a failure (perf_counter ns; 0: up)."""

    count: int
    down_s: float = 5.0
    in_flight: list[int] = field(init=False)
    sent: list[int] = field(init=False)
    failed: list[int] = field(init=False)
    down_until_ns: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.in_flight = [0] * self.count
        self.sent = [0] * self.count
        self.failed = [0] * self.count
        self.down_until_ns = [0] * self.count

    def up(self, now_ns: int) -> list[int]:
        """The endpoints to choose from: those not down; all down, the one down longest."""
        up = [i for i in range(self.count) if self.down_until_ns[i] <= now_ns]
        return up or [min(range(self.count), key=lambda i: (self.down_until_ns[i], i))]

    def least_loaded(self, among: Sequence[int]) -> int:
        """The fewest in flight, then the fewest sent, then the lowest index."""
        return min(among, key=lambda i: (self.in_flight[i], self.sent[i], i))

    def start(self, i: int) -> None:
        self.in_flight[i] += 1
        self.sent[i] += 1

    def end(self, i: int) -> None:
        self.in_flight[i] -= 1

    def fail(self, i: int, now_ns: int) -> None:
        """Endpoint i could not serve a request (it refused the connection, or broke off): it
        is skipped for `down_s`."""
        self.failed[i] += 1
        self.down_until_ns[i] = now_ns + round(self.down_s * 1e9)


class Policy(Protocol):
    name: RoutingPolicy

    def choose(self, request: Routed, endpoints: Endpoints, now_ns: int) -> int: ...


class RoundRobin:
    name: RoutingPolicy = "round_robin"

    def __init__(self) -> None:
        self.next = 0

    def choose(self, request: Routed, endpoints: Endpoints, now_ns: int) -> int:
        up = set(endpoints.up(now_ns))
        for step in range(endpoints.count):
            i = (self.next + step) % endpoints.count
            if i in up:
                self.next = (i + 1) % endpoints.count
                return i
        raise AssertionError("Endpoints.up is never empty")


class LeastLoaded:
    name: RoutingPolicy = "least_loaded"

    def choose(self, request: Routed, endpoints: Endpoints, now_ns: int) -> int:
        return endpoints.least_loaded(endpoints.up(now_ns))


def prefix_keys(prompt_ids: Sequence[int], block_tokens: int) -> list[int]:
    """The chained keys of a prompt's whole leading blocks: key k = hash(key k−1, block k).
    Token ids are ints, whose hashes Python does not randomise: the keys are the same in every
    process."""
    keys, key = [], 0
    for start in range(0, len(prompt_ids) - block_tokens + 1, block_tokens):
        key = hash((key, tuple(prompt_ids[start : start + block_tokens])))
        keys.append(key)
    return keys


class PrefixAffinity:
    name: RoutingPolicy = "prefix_affinity"

    def __init__(
        self,
        block_tokens: int = 16,
        max_imbalance: int = 2,
        min_match: float = 0.5,
        max_keys: int = 100_000,
    ):
        self.block_tokens = block_tokens
        self.max_imbalance = max_imbalance
        self.min_match = min_match  # the share of the prompt a known prefix must cover
        self.max_keys = max_keys
        self.owner: OrderedDict[int, int] = OrderedDict()  # prefix key → endpoint, LRU order

    def choose(self, request: Routed, endpoints: Endpoints, now_ns: int) -> int:
        up = endpoints.up(now_ns)
        least = endpoints.least_loaded(up)
        keys = prefix_keys(request.prompt_ids, self.block_tokens)
        chosen = least
        num_tokens = max(len(request.prompt_ids), 1)
        for k in range(len(keys) - 1, -1, -1):  # the longest known prefix first
            if (k + 1) * self.block_tokens < self.min_match * num_tokens:
                break  # too short a match to be worth its endpoint's load
            owner = self.owner.get(keys[k])
            if owner is not None and owner in up:
                is_capped = (
                    endpoints.in_flight[owner] - endpoints.in_flight[least] >= self.max_imbalance
                )
                chosen = least if is_capped else owner
                break
        for key in keys:  # the chosen endpoint now holds every block of this prompt
            self.owner[key] = chosen
            self.owner.move_to_end(key)
        while len(self.owner) > self.max_keys:
            self.owner.popitem(last=False)
        return chosen


class SessionSticky:
    name: RoutingPolicy = "session_sticky"

    def __init__(self) -> None:
        self.home: dict[str, int] = {}

    def choose(self, request: Routed, endpoints: Endpoints, now_ns: int) -> int:
        up = endpoints.up(now_ns)
        home = self.home.get(request.session_id)
        if home is None or home not in up:
            home = self.home[request.session_id] = endpoints.least_loaded(up)
        return home


def make_policy(
    name: RoutingPolicy, block_tokens: int = 16, max_imbalance: int = 2, min_match: float = 0.5
) -> Policy:
    """The policy called `name` (one of `POLICIES`)."""
    if name == "round_robin":
        return RoundRobin()
    if name == "least_loaded":
        return LeastLoaded()
    if name == "prefix_affinity":
        return PrefixAffinity(block_tokens, max_imbalance, min_match)
    if name == "session_sticky":
        return SessionSticky()
    raise ValueError(f"unknown routing policy {name!r}; one of {', '.join(POLICIES)}")
