"""How a command fails: one line that names the input and what to do, and an exit code.

Commands raise `UsageError` (exit 2: an input the user gave is wrong) or `CommandFailed` (exit 1:
the work could not be done). `explain` also turns the usual mistakes that surface as library
exceptions (a missing file, an address in use, a kubeconfig that is not one, an API server that
does not answer) into such a line. Anything else is a bug and keeps its traceback; so does
everything under `--log-level debug`.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

USAGE = 2
RUNTIME = 1
MAX_PORT = 65535


class UsageError(Exception):
    """An input is wrong: the message names it and says what to give instead."""


class CommandFailed(Exception):
    """The command could not do its work: the message says why and what to check."""


def check_port(flag: str, port: int | None) -> None:
    """A TCP port given on the command line: 0 (any free one) to 65535, else a UsageError
    (checked before anything starts, rather than met as the socket's OverflowError)."""
    if port is not None and not 0 <= port <= MAX_PORT:
        raise UsageError(f"{flag} {port}: a port is 0 to {MAX_PORT} (0: any free port)")


def check_directory(flag: str, path: Path | None) -> None:
    """A directory a command writes into may be missing (it is made) but not another file."""
    if path is not None and path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a directory: give a directory "
                         "(made if missing)")


_FILE_ERRORS = {
    errno.ENOENT: "no such file or directory",
    errno.EISDIR: "is a directory, not a file",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EACCES: "permission denied",
}


def explain(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for a failure a user can fix, None for a bug."""
    if isinstance(exc, UsageError):
        return USAGE, str(exc)
    if isinstance(exc, CommandFailed):
        return RUNTIME, str(exc)
    if isinstance(exc, OSError):
        return _os_error(exc)
    kind = type(exc).__name__
    if kind == "ConfigException":  # kubernetes-asyncio's, raised while loading a kubeconfig
        return USAGE, (f"the kubeconfig is not usable: {exc}; give a valid --kubeconfig, set "
                       "$KUBECONFIG, or run in a cluster")
    if kind == "ApiError":
        return _api_error(exc)
    return None


def _os_error(exc: OSError) -> tuple[int, str] | None:
    if exc.errno == errno.EADDRINUSE:
        return RUNTIME, (f"the address is already in use ({exc.strerror}): another process "
                         "listens there; stop it or choose another --port / --host")
    if exc.errno == errno.EADDRNOTAVAIL:  # asyncio's message names the address
        return USAGE, (f"{exc.strerror}: no interface of this machine has that address; give "
                       "--host (or --metrics-host) one it has, such as 0.0.0.0 or 127.0.0.1")
    what = _FILE_ERRORS.get(exc.errno or 0)
    if what is not None and exc.filename:
        return USAGE, f"{exc.filename}: {what}"
    if isinstance(exc, FileNotFoundError):  # raised with a message of our own
        return USAGE, str(exc)
    return None


def _api_error(exc: Any) -> tuple[int, str]:
    if getattr(exc, "status", None) == 0:
        return RUNTIME, (f"cannot reach the Kubernetes API server ({exc.message}); check "
                         "--kubeconfig and that the server is up")
    return RUNTIME, f"the Kubernetes API server refused: {exc}"
