"""The kubelet's ConfigMap volume, for the local cluster: what `kubectl edit cm` changes in the API
shows up in the webhook's policies directory the way the kubelet's atomic writer does it.

Layout written (as kubelet's AtomicWriter): `..<timestamp>/` holds the files, `..data` is a symlink
to it swapped with a rename, and each key is a symlink `name -> ..data/name`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from webhook.kube import CONFIGMAPS, ApiError, KubeApi


def write_atomically(directory: Path, data: Mapping[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir()
    for name, text in data.items():
        (stamp / name).write_text(text)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    tmp_link = directory / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp_link.unlink()
    tmp_link.symlink_to(stamp.name)
    tmp_link.rename(directory / "..data")
    for name in data:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    for entry in directory.iterdir():
        if not entry.name.startswith("..") and entry.name not in data:
            entry.unlink()
    if old is not None:
        shutil.rmtree(directory / old, ignore_errors=True)


async def project(kube: KubeApi, namespace: str, name: str, directory: Path) -> None:
    """Keep `directory` in step with the ConfigMap until cancelled (the kubelet's sync loop)."""
    seen: dict[str, str] | None = None
    while True:
        try:
            cm = await kube.get(CONFIGMAPS, name, namespace=namespace)
            data = dict(cm.get("data") or {})
            if data != seen:
                write_atomically(directory, data)
                seen = data
        except ApiError:
            pass  # not created yet, or the API is briefly away: the kubelet retries too
        await asyncio.sleep(0.2)
