"""`llmbench serve`: an OpenAI-compatible HTTP server over the built-in engine.

`app` holds the routes and the server's lifecycle, `generate` the two generation endpoints,
`protocol` the request checks and OpenAI's reply shapes, `tool_calls` the Hermes tool-call
parser, `metrics` the Prometheus registry, `recorder` the `--record` step writer. The engine
runs behind `llmbench.engine.client.EngineClient`.
"""

from llmbench.serve.app import ServeConfig, build_app, run_server

__all__ = ["ServeConfig", "build_app", "run_server"]
