"""What `llmbench serve` allows a client by default: how long a request's head and body may
take, and how many connections may be open. Free of aiohttp, so that the CLI names them as its
defaults without loading the server (`llmbench --help` and every other command start faster).
"""

# Longer than the idle time of aiohttp's (15 s) and httpx's (5 s) client pools: a pooled
# connection is closed by its client first, never by the server as a request goes out on it.
DEFAULT_HEADER_TIMEOUT_S = 20.0
DEFAULT_BODY_TIMEOUT_S = 30.0  # ≈ 40 KB/s for the largest body of a 4,096-token window
DEFAULT_MAX_CONNECTIONS = 1000
