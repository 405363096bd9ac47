"""`cospec-local serve`: an OpenAI-compatible HTTP server and a web chat (the `server` extra).

    from cospec_local.server import CospecServer, ServerSettings
    app = CospecServer([engine], GenerationParams(), ServerSettings("demo-target", ...)).app()

`serve()` runs it with uvicorn on a socket it binds first, so port 0 (any free port) works and
the address it prints is the real one.
"""
from __future__ import annotations

import socket
import sys

from .app import CospecServer, ServerSettings

__all__ = ["CospecServer", "ServerSettings", "serve"]


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(server: CospecServer, sock: socket.socket, log_level: str = "warning") -> None:
    import uvicorn

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {server.settings.model_id} on http://{shown}:{port} (web chat: /, API: /v1)", file=sys.stderr,
          flush=True)
    config = uvicorn.Config(server.app(), log_level=log_level, timeout_graceful_shutdown=5, access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
