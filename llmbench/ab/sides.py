"""BASE and NEW of `llmbench ab`: what each side changes of the one benchmark both run.

A side is a list of items, each one of:

    KEY.PATH=VALUE   a spec field, as `--set` takes it (engine.quantize=int8, dtype=bfloat16)
    http(s)://URL    a server: backend.kind=openai and backend.url=URL
    git:REF          llmbench itself at a git ref, built into its own virtual environment

A side with no items is the spec as it is, run by this llmbench: `--base git:HEAD~1` alone
against the working tree is a self-gate, and two empty sides an A/A run (the noise alone).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from llmbench.errors import UserError
from llmbench.harness.spec import RunSpec

SIDE_NAMES = ("BASE", "NEW")
URL_SCHEMES = ("http://", "https://")
GIT_PREFIX = "git:"
CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Side:
    """One side of an A/B run: its name, the `--set` overrides it applies after the common
    ones, and the git ref of llmbench that runs it (None: the llmbench running `ab`)."""

    name: str  # "BASE" or "NEW"
    overrides: tuple[str, ...]
    ref: str | None = None
    given: tuple[str, ...] = ()  # the items as typed

    @property
    def items(self) -> str:
        """The side as the user gave it, for people: `git:HEAD~1 dtype=bfloat16`."""
        return " ".join(self.given) or "the spec as it is"

    @property
    def given_overrides(self) -> str:
        """The items other than its git ref, as typed (what a build runs with)."""
        return " ".join(i for i in self.given if not i.startswith(GIT_PREFIX))


def parse_side(name: str, items: Sequence[str]) -> Side:
    """A side from its items (see the module docstring); a mistake is one line naming the
    option and the item."""
    option = f"--{name.lower()}"
    overrides: list[str] = []
    ref = None
    for item in items:
        if item.startswith(URL_SCHEMES):
            overrides += ["backend.kind=openai", f"backend.url={item}"]
        elif item.startswith(GIT_PREFIX):
            if ref is not None:
                raise UserError(f"{option} {item}: {name} already runs git:{ref}; give one ref")
            ref = item.removeprefix(GIT_PREFIX).strip()
            if not ref:
                raise UserError(f"{option} {item}: name a ref after git: (git:HEAD~1, git:main)")
        elif "=" in item and item.partition("=")[0].strip():
            overrides.append(item)
        else:
            raise UserError(
                f"{option} {item!r}: expected KEY.PATH=VALUE (a spec field), http(s)://URL "
                "(a server) or git:REF (a build of llmbench)"
            )
    return Side(name, tuple(overrides), ref, tuple(items))


def check_one_run(side: Side, spec: RunSpec) -> None:
    """A round runs each side once and judges one run against one: a side that sweeps loads
    (or searches them) is one line before any round, not an error after the first."""
    for key, value in (("load.sweep", spec.load.sweep), ("load.search", spec.load.search)):
        if value:
            raise UserError(
                f"ab: {side.name} ({side.items}): not with "
                f"{key}; a round is one run of each side: run one load, or compare two sweeps "
                "with `llmbench compare`"
            )


def check_reachable(side: Side, spec: RunSpec) -> None:
    """One line and no rounds when a side's server does not answer: a TCP connection to its
    `backend.url` (or any of `backend.urls`), refused or timed out, is a `UserError`."""
    if spec.backend.kind != "openai":
        return
    for url in spec.backend.addresses:
        _connect(side, url)


def _connect(side: Side, url: str) -> None:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise UserError(
            f"{side.name} ({side.items}): {url}: {reason}; start the server there or fix the URL"
        ) from None
