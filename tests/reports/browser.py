"""Open a local HTML file in a real headless Chromium, networking off, and report what it did.

    report = open_in_chromium(Path("report.html"), "figure svg", tmp_path / "shot.png")
    assert report.requests == [] and report.console_errors == []

Talks to Chromium over the DevTools protocol (CDP) with aiohttp's websocket client: one page
target, commands matched to replies by id, events collected as they come. Networking is off
because every http(s) request goes to a proxy on a closed port (127.0.0.1:9, loopback included);
such requests still show up in `PageReport.requests`, which is how a test proves a report is
self-contained. Everything runs under deadlines, so a hung browser fails a test, not CI: the
browser's start (a stalled start is retried once, fresh), then the page's load and answers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

DEBIAN_CHROMIUM = Path("/usr/bin/chromium")  # when PATH lacks it (a bare `env -i` run)
# Each start's deadline for the DevTools port: a start stalled on a busy 2-core machine is
# ended and tried again, fresh, with the next (longer) one.
START_TIMEOUTS_S = (60.0, 120.0)
VIEWPORT_WIDTH = 1280
VIEWPORT_HEIGHT = 900

# data: and blob: URLs fire Network.requestWillBeSent too, but never leave the page.
LOCAL_SCHEMES = ("data:", "blob:")

# Expression run in the page once it has loaded; %s is the selector as a JSON string.
# Each element is named by its id, else by tag and index among the matches: "svg[1]".
MEASURE_JS = """(() => {
  const els = Array.from(document.querySelectorAll(%s));
  return {
    sizes: els.map((el, i) => {
      const r = el.getBoundingClientRect();
      return [el.id || `${el.tagName.toLowerCase()}[${i}]`, r.width, r.height];
    }),
    pageHeight: document.documentElement.getBoundingClientRect().height,
    title: document.title,
  };
})()"""


@dataclass(frozen=True)
class PageReport:
    """What a page did in Chromium: its errors, its outside requests, its layout, its screenshot."""

    console_errors: list[str]  # console.error, uncaught exceptions, browser log errors
    requests: list[str]  # URLs the page tried to fetch, other than itself and data:/blob:
    element_sizes: list[tuple[str, float, float]]  # (id or "tag[i]", width_px, height_px)
    screenshot_bytes: int  # size of the full-page PNG written to screenshot_path
    page_height: float  # <html>'s rendered height in CSS px at a 1280 px wide viewport
    title: str
    evaluated: Any = None  # the value of the `expression` passed in, if any


def find_chromium() -> str:
    """Path of the Chromium binary, or a RuntimeError that says how to install it."""
    path = shutil.which("chromium") or (str(DEBIAN_CHROMIUM) if DEBIAN_CHROMIUM.exists() else None)
    if path is None:
        raise RuntimeError(
            f"chromium not found on PATH nor at {DEBIAN_CHROMIUM}: "
            "install it with `apt-get install -y chromium`"
        )
    return path


def open_in_chromium(
    html_path: Path,
    selector: str,
    screenshot_path: Path,
    timeout_s: float = 60,
    expression: str | None = None,
) -> PageReport:
    """Load `html_path` in headless Chromium; measure `selector`'s elements; evaluate the
    JavaScript `expression` (a value JSON can carry) in the loaded page; save a PNG.

    A browser that does not open its DevTools port within its START_TIMEOUTS_S deadline (a
    start stalled on a busy machine) is ended and started again, fresh. Raises TimeoutError,
    naming the stage it stalled in, if the page does not load and answer within `timeout_s`.
    """
    html_path = Path(html_path).resolve()
    if not html_path.is_file():
        raise FileNotFoundError(f"no HTML file at {html_path}")
    binary = find_chromium()
    page = _Page(html_path, selector, screenshot_path, expression)
    for start_timeout_s in START_TIMEOUTS_S:
        with contextlib.suppress(_StartTimeout):
            return _open_once(binary, page, start_timeout_s, timeout_s)
    waits = " s, ".join(f"{t:g}" for t in START_TIMEOUTS_S)
    raise TimeoutError(
        f"chromium did not open its DevTools port in {waits} s ({len(START_TIMEOUTS_S)} starts)"
    )


class _StartTimeout(Exception):
    """The browser did not open its DevTools port in time (it is started again)."""


@dataclass(frozen=True)
class _Page:
    """What to do with the page: load `html_path`, measure `selector`, evaluate `expression`,
    save the screenshot at `screenshot_path`."""

    html_path: Path
    selector: str
    screenshot_path: Path
    expression: str | None


def _open_once(binary: str, page: _Page, start_timeout_s: float, timeout_s: float) -> PageReport:
    user_data_dir = Path(tempfile.mkdtemp(prefix="llmbench-chromium-"))
    stderr_path = user_data_dir / "chromium-stderr.log"
    args = [
        binary,
        "--headless",
        "--no-sandbox",  # we run as root in CI containers, where the sandbox cannot start
        "--disable-gpu",
        "--disable-quic",
        "--disable-dev-shm-usage",  # shared memory in /tmp: a container's /dev/shm may be tiny
        "--no-first-run",
        "--no-default-browser-check",
        # Without these Chromium phones home for updates and variations: refused connections.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--hide-scrollbars",  # a scrollbar would take ~15 px off the 1280 px layout width
        "--remote-debugging-port=0",  # any free port; Chromium writes it to DevToolsActivePort
        f"--user-data-dir={user_data_dir}",
        # Networking off: all http(s) goes to a closed port; "<-loopback>" means 127.0.0.1 too.
        "--proxy-server=127.0.0.1:9",
        "--proxy-bypass-list=<-loopback>",
        "about:blank",
    ]
    with open(stderr_path, "wb") as stderr:
        # Own session, so the renderer/GPU/zygote children can be ended with the browser.
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, start_new_session=True
        )
    stage = ["starting"]  # what the page was doing, for the timeout's message
    try:
        return asyncio.run(_drive(process, user_data_dir, page, start_timeout_s, timeout_s, stage))
    except asyncio.TimeoutError:
        raise TimeoutError(
            f"chromium did not load {page.html_path} within {timeout_s} s (stalled {stage[0]}); "
            f"its log: {_tail(stderr_path)}"
        ) from None
    finally:
        _stop(process)
        shutil.rmtree(user_data_dir, ignore_errors=True)


async def _drive(
    process: subprocess.Popen[bytes],
    user_data_dir: Path,
    page: _Page,
    start_timeout_s: float,
    timeout_s: float,
    stage: list[str],
) -> PageReport:
    try:
        port = await asyncio.wait_for(_devtools_port(process, user_data_dir), start_timeout_s)
    except asyncio.TimeoutError:
        raise _StartTimeout() from None
    return await asyncio.wait_for(_load(port, page, stage), timeout_s)


async def _load(port: int, page: _Page, stage: list[str]) -> PageReport:
    stage[0] = "connecting to DevTools"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page_ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        # max_msg_size=0: a full-page screenshot arrives as one base64 message of many MB.
        async with http.ws_connect(page_ws_url, max_msg_size=0) as ws:
            cdp = _Cdp(ws)
            try:
                return await _inspect(cdp, page, stage)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(cdp.send("Browser.close"), 2)
                await cdp.close()


async def _inspect(cdp: _Cdp, page: _Page, stage: list[str]) -> PageReport:
    stage[0] = "setting up the page"
    for domain in ("Page", "Runtime", "Log", "Network"):
        await cdp.send(f"{domain}.enable")
    await cdp.send(
        "Emulation.setDeviceMetricsOverride",
        {
            "width": VIEWPORT_WIDTH,
            "height": VIEWPORT_HEIGHT,
            "deviceScaleFactor": 1,
            "mobile": False,
        },
    )
    page_url = page.html_path.as_uri()
    stage[0] = "loading the page"
    loaded = cdp.expect("Page.loadEventFired")  # before navigating: the event can beat the reply
    navigation = await cdp.send("Page.navigate", {"url": page_url})
    if "errorText" in navigation:
        raise RuntimeError(f"chromium could not open {page_url}: {navigation['errorText']}")
    await loaded

    stage[0] = "measuring the page"
    measured = await cdp.send(
        "Runtime.evaluate",
        {"expression": MEASURE_JS % json.dumps(page.selector), "returnByValue": True},
    )
    if "exceptionDetails" in measured:
        raise ValueError(
            f"measuring {page.selector!r} failed: {_exception_text(measured['exceptionDetails'])}"
        )
    value = measured["result"]["value"]
    evaluated = None
    if page.expression is not None:
        reply = await cdp.send(
            "Runtime.evaluate", {"expression": page.expression, "returnByValue": True}
        )
        if "exceptionDetails" in reply:
            raise ValueError(f"evaluating failed: {_exception_text(reply['exceptionDetails'])}")
        evaluated = reply["result"].get("value")

    stage[0] = "taking the screenshot"
    shot = await cdp.send(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    png = base64.b64decode(shot["data"])
    page.screenshot_path.write_bytes(png)

    # CDP delivers messages in order, so every event the page caused up to the reply above is in.
    return PageReport(
        console_errors=_console_errors(cdp.events),
        requests=[
            url
            for event in cdp.events
            if event["method"] == "Network.requestWillBeSent"
            and (url := event["params"]["request"]["url"]) != page_url
            and not url.startswith(LOCAL_SCHEMES)
        ],
        element_sizes=[
            (name, float(width), float(height)) for name, width, height in value["sizes"]
        ],
        screenshot_bytes=len(png),
        page_height=float(value["pageHeight"]),
        title=value["title"],
        evaluated=evaluated,
    )


def _console_errors(events: list[dict[str, Any]]) -> list[str]:
    errors = []
    for event in events:
        method, params = event["method"], event["params"]
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            errors.append(" ".join(_remote_object_text(arg) for arg in params["args"]))
        elif method == "Runtime.exceptionThrown":
            errors.append(_exception_text(params["exceptionDetails"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            errors.append(
                f"{entry['text']} ({entry['url']})" if entry.get("url") else entry["text"]
            )
    return errors


def _remote_object_text(obj: dict[str, Any]) -> str:
    if "value" in obj:
        return str(obj["value"])
    return str(obj.get("description", obj.get("type", "?")))


def _exception_text(details: dict[str, Any]) -> str:
    # "description" holds "Error: kaput\n    at ..."; "text" alone is just "Uncaught".
    exception = details.get("exception", {})
    return str(exception.get("description") or exception.get("value") or details.get("text", "?"))


class _Cdp:
    """One CDP websocket: `send` awaits the reply with the same id; events pile up in `events`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiters: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        reply = asyncio.get_running_loop().create_future()
        self._replies[self._next_id] = reply
        await self.ws.send_json({"id": self._next_id, "method": method, "params": params or {}})
        return await reply

    def expect(self, method: str) -> asyncio.Future[dict[str, Any]]:
        """A future for the next event named `method`; call it before the command that causes it."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(method, []).append(waiter)
        return waiter

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.ws.close()

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            if "id" in data:
                reply = self._replies.pop(data["id"], None)
                if reply is None or reply.done():
                    continue
                if "error" in data:
                    reply.set_exception(RuntimeError(f"CDP error: {data['error']}"))
                else:
                    reply.set_result(data.get("result", {}))
            else:
                self.events.append(data)
                for waiter in self._waiters.pop(data["method"], []):
                    if not waiter.done():
                        waiter.set_result(data["params"])
        # The browser hung up: fail whoever still waits, rather than leave them to the deadline.
        closed = ConnectionError("chromium closed the DevTools connection")
        for future in [*self._replies.values(), *(w for ws in self._waiters.values() for w in ws)]:
            if not future.done():
                future.set_exception(closed)


async def _devtools_port(process: subprocess.Popen[bytes], user_data_dir: Path) -> int:
    # Chromium writes "<port>\n<browser ws path>" once it listens; poll for it (a few 100 ms).
    # Waiting for both lines means the port line is not caught half-written.
    port_file = user_data_dir / "DevToolsActivePort"
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"chromium exited with code {process.returncode} before DevTools started; "
                f"its log: {_tail(user_data_dir / 'chromium-stderr.log')}"
            )
        with contextlib.suppress(FileNotFoundError, ValueError):
            port_line, _browser_path = port_file.read_text().splitlines()[:2]
            return int(port_line)
        await asyncio.sleep(0.05)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End Chromium and its children (its own process group): politely, then for sure."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        # Signal the group even when the browser itself has exited: a renderer stuck in a
        # script can outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)


def _tail(path: Path, num_chars: int = 2000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-num_chars:]
    return "(no log)"
