"""One worker process of a run sharded with `load.workers`: it runs its shard into its folder
and meets the other workers at a common start before each repetition.

    python -m llmbench.harness.worker SHARD_FOLDER

The parent (`run_workers`) writes `worker.json` into the folder (the spec, the sweep point,
the shard) and starts the worker with a pipe on stdin and one on stdout; everything the run
prints goes to stderr, which the parent points at the folder's `worker.log`. The two talk in
JSON lines: before each repetition (its first requests prepared) the worker says
`{"event": "ready"}` and waits for `{"start_monotonic_ns": t}`, the common start on
CLOCK_MONOTONIC, which it turns into its own perf_counter (`shards.perf_ns_of_monotonic`); at
the end it says `done`, `interrupted` (with the signal) or `error` (with the one line).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from llmbench.errors import BackendFailure, UserError
from llmbench.harness import shards

JOB_FILE = "worker.json"
LOG_FILE = "worker.log"


class Channel:
    """JSON lines to the parent (`send`) and, inside the event loop, from it (`receive`)."""

    def __init__(self, in_fd: int, out_fd: int):
        self.in_fd, self.out_fd = in_fd, out_fd
        self._buffer = b""

    def send(self, **message: Any) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.out_fd, data) :]

    async def receive(self) -> dict[str, Any]:
        """The next line from the parent; a `UserError` when the parent has gone."""
        loop = asyncio.get_running_loop()
        while b"\n" not in self._buffer:
            readable = loop.create_future()
            loop.add_reader(self.in_fd, _set_once, readable)
            try:
                await readable
            finally:
                loop.remove_reader(self.in_fd)
            chunk = os.read(self.in_fd, 4096)
            if not chunk:
                raise UserError("the parent process of this worker has gone")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    async def start_at(self) -> int:
        """Meet the other workers: the common start of the next repetition, on this process's
        perf_counter."""
        self.send(event="ready")
        message = await self.receive()
        return shards.perf_ns_of_monotonic(message["start_monotonic_ns"])


def _set_once(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def main(folder: Path) -> int:
    """Run the shard `worker.json` in `folder` describes; the exit code of `llmbench run`."""
    from llmbench.harness import run_point
    from llmbench.harness.run_signals import RunInterrupted, StopSignals
    from llmbench.harness.spec_load import spec_from_dict

    channel = Channel(0, os.dup(1))
    os.dup2(2, 1)  # what the run prints goes to the log with the rest
    sys.stdout = sys.stderr
    try:
        job = json.loads((folder / JOB_FILE).read_text())
        spec = spec_from_dict(job["spec"], str(folder / JOB_FILE))
        shard = shards.Shard(job["index"], job["count"], start_at=channel.start_at)
        with StopSignals() as stop:
            run_point.execute_point(
                spec, folder, job["point"], lambda _: None, stop, is_strict=False, shard=shard
            )
    except RunInterrupted as e:
        channel.send(event="interrupted", signum=e.signum)
        return e.exit_code
    except (UserError, BackendFailure) as e:
        print(f"error: {e}", file=sys.stderr)
        channel.send(event="error", message=str(e))
        return 2 if isinstance(e, UserError) else 1
    except Exception as e:  # noqa: BLE001 — a bug: its traceback goes to the log, a line up
        traceback.print_exc()
        channel.send(event="error", message=f"{type(e).__name__}: {e} (see {LOG_FILE})")
        return 1
    channel.send(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
