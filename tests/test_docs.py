"""The docs as a user meets them: every runnable command block runs, every relative link leads
somewhere, and the README stays a front door.

A command block fenced as ```` ```bash runnable ```` in README.md or docs/**/*.md is run as
written with `bash -euo pipefail`, each in a fresh working folder that holds links to the repo's
`workloads/` and `benchmarks/`, and must exit 0 within `BLOCK_TIMEOUT_S` (a block meant to fail
says so itself: `... || test $? -eq 1`). A block that starts a server stops it itself: whatever a
block leaves running fails it. All blocks share one temporary `LLMBENCH_CACHE`, so the machine's
roofs are measured once per session; the CPU C++ extension is built once into the session's cache
and linked in (`tests.fresh_cache`: a build is per machine, not what a doc shows). Blocks get
`PIP_NO_INDEX=1`: one that needs a download (the default model) fails instead of fetching it;
and one compute thread (`OMP_NUM_THREADS=1`, see `block_env`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fresh_cache import fresh_cache

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 200
BLOCK_TIMEOUT_S = 240  # the first engine block also measures the roofs (60 s budget)
LEFTOVER_GRACE_S = 10  # a stopped server's own shutdown, after the block's shell has exited

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<info>.*)$")
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"(?P<id>[^\"]+)\"")


def _fenced(path: Path) -> list[tuple[int, str, list[str]]]:
    """The fenced blocks of a Markdown file: (line of the opening fence, info string, lines)."""
    blocks, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != fence:
            text = lines[j]
            body.append(text[indent:] if text[:indent].strip() == "" else text.lstrip())
            j += 1
        blocks.append((i + 1, opening["info"].strip(), body))
        i = j + 1
    return blocks


def _runnable_blocks() -> list:
    params = []
    for path in DOC_FILES:
        for line, info, body in _fenced(path):
            if info.split() == ["bash", "runnable"]:
                name = f"{path.relative_to(ROOT)}:{line}"
                params.append(pytest.param(path, line, "\n".join(body) + "\n", id=name))
    return params


def _unfenced(path: Path) -> str:
    """The file without its fenced blocks."""
    fenced = {n for line, _, body in _fenced(path) for n in range(line, line + len(body) + 2)}
    kept = [t for n, t in enumerate(path.read_text().splitlines(), 1) if n not in fenced]
    return "\n".join(kept)


def _prose(path: Path) -> str:
    """The file without its fenced blocks and inline code, where links are not links."""
    return INLINE_CODE.sub("", _unfenced(path))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file (and explicit `<a id=...>` ones): the
    heading's text lowercased, punctuation (backticks too) dropped, spaces as hyphens."""
    text, seen = _unfenced(path), {}
    anchors = {m["id"] for m in HTML_ANCHOR.finditer(_prose(path))}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.fixture(scope="session")
def block_env(tmp_path_factory) -> dict[str, str]:
    """The environment every block runs in: this interpreter's scripts first on PATH, one shared
    temporary llmbench cache, no package index, and nothing of the test run's own."""
    cache = fresh_cache(tmp_path_factory.mktemp("llmbench-cache"))
    env = dict(os.environ)
    for name in ("TRITON_INTERPRET", "GITHUB_STEP_SUMMARY", "PYTEST_CURRENT_TEST"):
        env.pop(name, None)  # the conftest's Triton interpreter; CI's job summary
    env.update(
        LLMBENCH_CACHE=str(cache),
        PIP_NO_INDEX="1",
        # One compute thread: on a shared 2-core machine, two OpenMP threads with the other core
        # busy wait on each other at every barrier (a tiny model decoded 42 tok/s with 2 threads
        # and 3,900 with 1 while another process held a core). The blocks test commands, not speed.
        OMP_NUM_THREADS="1",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    return env


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(("path", "line", "code"), _runnable_blocks())
def test_runnable_block(path: Path, line: int, code: str, tmp_path: Path, block_env) -> None:
    for folder in ("workloads", "benchmarks"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    process = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=tmp_path,
        env=block_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the block's own process group: anything it starts is in it
    )
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{path.name}:{line} ran past {BLOCK_TIMEOUT_S} s:\n{code}\n{output[-4000:]}")
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left_running = _group_alive(process.pid)
    if left_running:
        os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, (
        f"{path.name}:{line} exited {process.returncode}:\n{code}\n--- output (tail) ---\n"
        f"{output[-4000:]}"
    )
    assert not left_running, f"{path.name}:{line} left processes running (stop servers it starts)"


def test_there_are_runnable_blocks() -> None:
    assert len(_runnable_blocks()) >= 10


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move some to docs/"


def test_readme_has_the_ci_command() -> None:
    """.ci/run runs the README's set-up-and-test command, byte for byte."""
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert command in (ROOT / "README.md").read_text().splitlines()


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(path: Path) -> None:
    broken = []
    for match in LINK.finditer(_prose(path)):
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading '#{anchor}' in {linked.name}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)
