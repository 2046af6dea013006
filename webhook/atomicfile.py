"""Files written whole: a reader polling for a file (a client waiting for `ca.crt`, a server
reloading its pair, a restarted kubelet reading its checkpoint) never reads one half written."""

from __future__ import annotations

import os
from pathlib import Path


def write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
