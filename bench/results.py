"""A bench's figures as JSON (`--json FILE`), for bench/plots.py: what it measured, and on which
commit, command and load, so that a plot can say which run it shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The short commit measured, `+uncommitted` when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, text=True, check=False,
                              capture_output=True).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("+uncommitted" if dirty else "")


def write(path: Path, bench: str, load_before: float, data: dict[str, Any]) -> None:
    """`data` with the run's context; the command is this process's own arguments."""
    command = " ".join([f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    doc = {"bench": bench, "commit": commit(), "command": command,
           "load": [round(load_before, 1), round(os.getloadavg()[0], 1)], **data}
    path.write_text(json.dumps(doc, indent=1) + "\n")
