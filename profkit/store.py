"""Writing artifacts atomically: a temporary file in the same folder, then rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from profkit.errors import OutputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader never sees a half-written file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OutputError(f"{path}: cannot write ({e.strerror})", hint="check the folder exists, is writable and has space") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; artifacts are meant to be shared
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputError(f"{path}: cannot write ({e.strerror})", hint="check free space and permissions") from None


def json_text(obj: Any) -> str:
    """Indented JSON (one space) ending in a newline; NaN and infinities are refused, as json.dumps(allow_nan=False) does."""
    try:
        import msgspec
    except ImportError:  # a GPU box recording with --capture-only has no msgspec: the stdlib writes the manifest
        return json.dumps(obj, indent=1, allow_nan=False) + "\n"
    try:
        body = msgspec.json.encode(obj)
    except (TypeError, msgspec.EncodeError):
        return json.dumps(obj, indent=1, allow_nan=False) + "\n"  # types msgspec does not know: the stdlib's error
    # msgspec writes NaN/inf as null: when the text reads back as obj, it held none (a NaN or inf
    # reads back as None); else (tuples read back as lists) the values are walked
    if msgspec.json.decode(body) != obj:
        _refuse_non_finite(obj)
    return msgspec.json.format(body, indent=1).decode() + "\n"


def _refuse_non_finite(obj: Any) -> None:
    """ValueError on a NaN or infinity anywhere in obj, as json.dumps(allow_nan=False) raises."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, float):
            if x != x or x in (float("inf"), float("-inf")):
                raise ValueError(f"Out of range float values are not JSON compliant: {x!r}")
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, json_text(obj).encode())
