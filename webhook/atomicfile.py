"""Files written whole: a reader polling for a file (a client waiting for `ca.crt`, a server
reloading its pair, a restarted kubelet reading its checkpoint) never reads one half written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a new temporary file beside `path`, flush it to disk, then rename it over
    `path`. The temporary name is random and created with O_EXCL | O_NOFOLLOW (mkstemp), so a
    file or symlink planted at a predictable name is never written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
            fh.flush()
            os.fsync(fh.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
