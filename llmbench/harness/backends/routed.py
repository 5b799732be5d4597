"""Several OpenAI-compatible endpoints behind one backend, as a gateway puts replicas behind one
model name: each request goes to the endpoint a routing policy (`routing`) chooses, and says
which (a first event carrying `endpoint`, so a request that fails still names it).

An endpoint that cannot be reached — refused at `start`, or refusing a request's connection —
is skipped for `routing.Endpoints.down_s` and then tried again; the requests it failed are
recorded as failed, with its address in the reason. At least one endpoint must answer at
`start`. The endpoints serve one model: the first that answers names it (and its identity is the
run's device, "× N endpoints" after it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from llmbench.harness.backends.openai import (
    BackendError,
    OpenAIBackend,
    ServedModel,
    UnreachableError,
)
from llmbench.harness.records import GenerationRequest, StreamEvent
from llmbench.harness.routing import Endpoints, Policy, Routed


class RoutedBackend:
    name = "openai"

    def __init__(self, backends: Sequence[OpenAIBackend], policy: Policy, down_s: float = 5.0):
        if not backends:
            raise ValueError("RoutedBackend needs at least one endpoint")
        self.backends = list(backends)
        self.policy = policy
        self.endpoints = Endpoints(len(self.backends), down_s)
        self.unreachable_at_start: list[str] = []  # "url: reason", for the run's notes

    async def start(self) -> None:
        """Start every endpoint at once; those that do not answer are skipped for a while
        (they are tried again later) and listed in `unreachable_at_start`. None answering is a
        `BackendError` naming each."""
        results = await asyncio.gather(*(b.start() for b in self.backends), return_exceptions=True)
        now = time.perf_counter_ns()
        for i, (backend, result) in enumerate(zip(self.backends, results, strict=True)):
            if isinstance(result, BaseException):
                if not isinstance(result, BackendError):
                    raise result
                self.endpoints.fail(i, now)
                self.unreachable_at_start.append(f"{backend.url}: {result}")
        answering = [b for b, r in zip(self.backends, results, strict=True) if r is None]
        if not answering:
            raise BackendError("no endpoint answered: " + "; ".join(self.unreachable_at_start))
        for backend, result in zip(self.backends, results, strict=True):
            if result is not None:  # its pool, asking for the model the others serve: tried
                backend.model = answering[0].model  # again once it is no longer skipped
                await backend.start()  # with a model given, start does not need the server

    def identity(self, hardware: str | None) -> str | None:
        """The first answering endpoint's identity, with the number of endpoints."""
        first = next((b for b in self.backends if b.served is not None), self.backends[0])
        identity = first.identity(hardware)
        return None if identity is None else f"{identity} × {len(self.backends)} endpoints"

    async def describe(self) -> ServedModel | None:
        for backend in self.backends:
            served = await backend.describe()
            if served is not None:
                return served
        return None

    async def reset_prefix_cache(self) -> None:
        """Empty every endpoint's prefix cache, all at once; the first failure is raised,
        naming its endpoint."""
        await asyncio.gather(*(b.reset_prefix_cache() for b in self.backends))

    async def close(self) -> None:
        await asyncio.gather(*(b.close() for b in self.backends))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """Route `request`, say where (a first event with no tokens), then stream from there."""
        routed = Routed(request.session_id, request.prompt_ids or ())
        now = time.perf_counter_ns()
        i = self.policy.choose(routed, self.endpoints, now)
        self.endpoints.start(i)
        try:
            yield StreamEvent(t_ns=now, num_tokens=0, endpoint=i)
            async for event in self.backends[i].generate(request):
                yield event
        except UnreachableError:
            self.endpoints.fail(i, time.perf_counter_ns())
            raise
        finally:
            self.endpoints.end(i)
