"""Tiny JSON-over-HTTP client for the server under test (stdlib only: it runs where torch does). A ground
module: the capture (server health, the profiler window) and the workload driver both speak it."""

from __future__ import annotations

import json
import random
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


_HANDED: set[int] = set()  # ports this process has handed out: never twice (a server may not have bound its port yet)
PORT_FLOOR = 10000  # the lowest port handed out (above the well-known and most registered services' ports)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, for a server to bind in a moment: picked at random below the kernel's
    ephemeral range. A port the kernel hands out as free (bind to port 0) comes from that range, where every
    outgoing connection on the machine takes its local port too, so any client (a workload's request, another
    test's) can take it before the server binds it ("Address already in use", seen on a busy test run); below
    the range only a server binding it on purpose can. Never the same port twice in one process."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    if low - PORT_FLOOR >= 1000:
        for _ in range(500):
            port = rng.randrange(PORT_FLOOR, low)
            if port not in _HANDED and port_free(host, port):
                _HANDED.add(port)
                return port
    for _ in range(100):  # no room below the range (an odd ip_local_port_range), or all taken: the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED:
            _HANDED.add(port)
            return port
    raise OSError(f"no free TCP port on {host}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux: /proc/sys/net/ipv4/ip_local_port_range; else
    the IANA range's 49152)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:  # closed at once, not left to the collector
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152
