"""Tiny JSON-over-HTTP client for the server under test (stdlib only: it runs where torch does). A ground
module: the capture (server health, the profiler window) and the workload driver both speak it."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any


class HTTPFailure(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def request(url: str, body: Any = None, *, timeout: float = 30.0, method: str | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, OSError) as e:
        raise HTTPFailure(f"{url}: {getattr(e, 'reason', e)}") from None


def get_json(url: str, *, timeout: float = 30.0) -> Any:
    status, body = request(url, timeout=timeout)
    if status != 200:
        raise HTTPFailure(f"{url}: HTTP {status}: {body[:200]!r}", status)
    return json.loads(body)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # like the servers themselves: a port in TIME_WAIT after the previous run is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
