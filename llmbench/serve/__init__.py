"""`llmbench serve`: an OpenAI-compatible HTTP server over the built-in engine.

`app` holds the routes and the server's lifecycle, `generate` the two generation endpoints,
`protocol` the request checks and OpenAI's reply shapes, `tool_calls` the Hermes tool-call
parser, `metrics` the Prometheus registry, `recorder` the `--record` step writer, `limits` the
defaults a client meets. The engine runs behind `llmbench.engine.client.EngineClient`.

`app`'s names load with it when first asked for (aiohttp alone takes ~0.3 s to import), so
that importing `limits` for the CLI's defaults does not start the server's imports.
"""

from typing import Any

__all__ = ["ServeConfig", "build_app", "run_server"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from llmbench.serve import app

        return getattr(app, name)
    raise AttributeError(f"module 'llmbench.serve' has no attribute {name!r}")
