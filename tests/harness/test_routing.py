"""The routing policies on seeded request streams: the endpoint each request goes to, by hand."""

from __future__ import annotations

import random

import pytest

from llmbench.harness.routing import (
    POLICIES,
    Endpoints,
    LeastLoaded,
    PrefixAffinity,
    RoundRobin,
    Routed,
    SessionSticky,
    make_policy,
    prefix_keys,
)

S = 1_000_000_000  # ns


def route(policy, requests, endpoints, now_ns=0, end_each=False):
    """The endpoint of each request in turn, started (and ended at once with `end_each`)."""
    chosen = []
    for request in requests:
        i = policy.choose(request, endpoints, now_ns)
        endpoints.start(i)
        if end_each:
            endpoints.end(i)
        chosen.append(i)
    return chosen


def anon(n: int) -> list[Routed]:
    return [Routed(f"s{k}", (k,)) for k in range(n)]


def test_round_robin_goes_in_turn_and_skips_a_failed_endpoint():
    endpoints = Endpoints(3)
    policy = RoundRobin()
    assert route(policy, anon(5), endpoints) == [0, 1, 2, 0, 1]
    endpoints.fail(2, now_ns=0)  # down for 5 s
    assert route(policy, anon(3), endpoints, now_ns=1 * S) == [0, 1, 0]
    assert route(policy, anon(3), endpoints, now_ns=6 * S) == [1, 2, 0]  # up again
    assert endpoints.failed == [0, 0, 1]


def test_all_down_tries_the_one_down_longest():
    endpoints = Endpoints(2)
    endpoints.fail(1, now_ns=0)
    endpoints.fail(0, now_ns=1 * S)
    assert endpoints.up(2 * S) == [1]
    assert LeastLoaded().choose(Routed("s", ()), endpoints, 2 * S) == 1


def test_least_loaded_takes_the_fewest_in_flight_then_the_fewest_sent():
    endpoints = Endpoints(3)
    policy = LeastLoaded()
    assert route(policy, anon(4), endpoints) == [0, 1, 2, 0]  # in flight 2, 1, 1
    endpoints.end(0)
    endpoints.end(0)  # in flight 0, 1, 1; sent 2, 1, 1
    assert route(policy, anon(1), endpoints) == [0]
    endpoints.end(0)
    endpoints.end(1)  # in flight 0, 0, 1; sent 3, 1, 1: the fewest sent breaks the tie
    assert route(policy, anon(1), endpoints) == [1]


def test_prefix_keys_name_whole_prefixes():
    a = prefix_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)  # two whole blocks; 9 is left over
    b = prefix_keys([1, 2, 3, 4, 0, 0, 0, 0], 4)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    assert prefix_keys([5, 6, 7, 8], 4) != a[1:]  # block 1 alone is not the prefix 0..1
    assert prefix_keys([1, 2, 3], 4) == []


def test_prefix_affinity_follows_the_longest_known_prefix():
    a = Routed("a", (1, 2, 3, 4, 5, 6, 7, 8))
    b = Routed("b", (1, 2, 3, 4, 9, 9, 9, 9))  # shares a's first block
    c = Routed("c", (5, 5, 5, 5))  # shares nothing
    endpoints = Endpoints(2)
    policy = PrefixAffinity(block_tokens=4, max_imbalance=100)
    # a: nothing known → least loaded 0; b: its first block is 0's; c: new → least loaded 1;
    # a again: its whole prompt is 0's.
    assert route(policy, [a, b, c, a], endpoints) == [0, 0, 1, 0]


def test_the_load_cap_moves_a_hot_prefix():
    a = Routed("a", (1, 2, 3, 4, 5, 6, 7, 8))
    endpoints = Endpoints(2)
    policy = PrefixAffinity(block_tokens=4, max_imbalance=2)
    # In flight after each: [1,0] [2,0]; the third finds 0 two above 1: capped, to 1 [2,1], and
    # a's blocks are 1's now; the fourth follows them to 1 [2,2]; the fifth stays on 1 (1 is
    # not 2 above the least loaded).
    assert route(policy, [a] * 5, endpoints) == [0, 0, 1, 1, 1]


def test_prefix_affinity_keeps_a_session_on_one_replica_of_four():
    """A chat session's every turn extends its previous prompt: all go where the first did,
    while requests end (no load cap reached); sessions spread over the replicas."""
    rng = random.Random(0)
    sessions = {f"s{k}": [rng.randrange(1000) for _ in range(32)] for k in range(8)}
    endpoints = Endpoints(4)
    policy = PrefixAffinity(block_tokens=16)
    homes: dict[str, set[int]] = {}
    for turn in range(3):
        for sid, prompt in sessions.items():
            prompt += [rng.randrange(1000) for _ in range(20)]  # the reply and the next turn
            i = policy.choose(Routed(sid, tuple(prompt)), endpoints, turn * S)
            endpoints.start(i)
            endpoints.end(i)
            homes.setdefault(sid, set()).add(i)
    assert all(len(h) == 1 for h in homes.values())
    assert sorted(endpoints.sent) == [6, 6, 6, 6]


def test_session_sticky_keeps_a_session_until_its_endpoint_fails():
    endpoints = Endpoints(2)
    policy = SessionSticky()
    requests = [Routed(s, ()) for s in ("s1", "s2", "s1", "s3", "s2")]
    assert route(policy, requests, endpoints) == [0, 1, 0, 1, 1]  # s3: in flight [2, 1] → 1
    endpoints.fail(1, now_ns=0)
    assert route(policy, [Routed("s2", ()), Routed("s2", ())], endpoints, now_ns=S) == [0, 0]


def test_make_policy_knows_every_name():
    assert [make_policy(name).name for name in POLICIES] == list(POLICIES)
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        make_policy("random")


def test_prefix_affinity_routes_only_by_a_match_of_min_match_of_the_prompt():
    """Block 4 tokens. A = system (4) + its own 12; B = the same system + its own 12: B shares
    1 block of 16 tokens, under half. With min_match 0.5 B goes to the least loaded endpoint
    (1), not to the system prompt's (0); A's next turn (A + 8 more: 24 tokens, 4 blocks = 16
    known, 2/3 of it) goes home to 0. With min_match 0 any match counts: B follows the system
    prompt to 0."""
    system = (1, 2, 3, 4)
    a = Routed("a", system + tuple(range(100, 112)))
    b = Routed("b", system + tuple(range(200, 212)))
    a2 = Routed("a", a.prompt_ids + tuple(range(300, 308)))
    assert route(PrefixAffinity(4, max_imbalance=9), [a, b, a2], Endpoints(2), end_each=True) == [
        0,
        1,
        0,
    ]
    everything = PrefixAffinity(4, max_imbalance=9, min_match=0.0)
    assert route(everything, [a, b], Endpoints(2), end_each=True) == [0, 0]
