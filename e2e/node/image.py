"""Builds Muster's image from the project's own Dockerfile with no Docker daemon and no registry.

1. A Debian bookworm root filesystem from Debian packages (`mmdebstrap`), committed as the
   base image `localhost/muster-base:bookworm` (python3, venv, CA certificates, useradd).
2. `buildah bud --isolation chroot` (vfs) of the Dockerfile with `--build-arg PYTHON=<that base>`:
   the same recipe `docker build` runs on the official Python image. The machine's CA bundle is
   mounted for the build only (pip's `PIP_CERT`), never copied into the image.
3. A pause image for the pod sandboxes, from the same base (`sleep infinity`).
4. Both written as docker-archive files that `ctr images import` loads into containerd.

Results are cached in `.cache/images`, keyed on what goes into them, so a second run reuses them.
Build time and image size are recorded in `build.json` next to the archives.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.node.assets import CACHE, REPO

BASE = "localhost/muster-base:bookworm"
PAUSE = "localhost/muster-pause:bookworm"
IMAGE_REPOSITORY, IMAGE_TAG = "localhost/muster", "dev"
#: what python:3.11-slim has that Muster needs: libstdc++ for grpcio's native module
BASE_PACKAGES = "python3,python3-venv,ca-certificates,passwd,libstdc++6"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class Images:
    muster: Path  # docker-archive of localhost/muster:dev
    pause: Path
    build_seconds: float
    size_bytes: int
    #: more docker-archives every node imports (a multi-node cluster's training image)
    extra: tuple[Path, ...] = ()


def buildah(store: Path, *args: str, timeout: float = 900) -> str:
    out = subprocess.run(
        ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"),
         "--storage-driver", "vfs", *args], capture_output=True, text=True, timeout=timeout,
        check=False)
    if out.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args[:2])} failed:\n{out.stderr[-4000:]}")
    return out.stdout.strip()


def _base_digest() -> str:
    return hashlib.sha256(BASE_PACKAGES.encode()).hexdigest()[:8]


def _source_digest() -> str:
    h = hashlib.sha256(BASE_PACKAGES.encode())
    files = [REPO / "Dockerfile", REPO / "pyproject.toml", REPO / "requirements-image.txt",
             REPO / ".dockerignore",
             *sorted((REPO / "webhook").rglob("*"))]
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def debian_rootfs(rootfs: Path, packages: str, *, within: float) -> Path:
    """A Debian bookworm root filesystem of `packages` (mmdebstrap's essential variant) as a
    tar at `rootfs`, unless one is there: written aside and renamed, so a cut build leaves
    none."""
    if not rootfs.exists():
        tmp = rootfs.with_suffix(".tmp")
        subprocess.run(["mmdebstrap", "--variant=essential", "--format=tar", "--quiet",
                        f"--include={packages}", "bookworm", str(tmp)],
                       check=True, capture_output=True, timeout=within)
        tmp.rename(rootfs)
    return rootfs


def _base(store: Path, out: Path) -> None:
    """The Debian root filesystem as a base image, and the pause image on it."""
    rootfs = debian_rootfs(out / f"rootfs-{_base_digest()}.tar", BASE_PACKAGES, within=900)
    for name, entry in ((BASE, None), (PAUSE, '["/bin/sleep", "infinity"]')):
        ctr = buildah(store, "from", "scratch")
        buildah(store, "add", ctr, str(rootfs), "/")
        if entry:
            buildah(store, "config", "--entrypoint", entry, ctr)
        buildah(store, "commit", "--rm", ctr, name)


def build() -> Images:
    """The images, built unless the cache holds them for the current sources."""
    out = CACHE / "images"
    out.mkdir(parents=True, exist_ok=True)
    digest = _source_digest()
    muster, pause = out / f"muster-{digest}.tar", out / f"pause-{_base_digest()}.tar"
    record = out / f"build-{digest}.json"
    if muster.exists() and pause.exists() and record.exists():
        meta = json.loads(record.read_text())
        return Images(muster, pause, meta["build_seconds"], meta["size_bytes"])
    store = CACHE / "buildah"
    started = time.monotonic()
    if not pause.exists():
        _base(store, out)
        buildah(store, "push", PAUSE, f"docker-archive:{out / 'pause.tmp'}:{PAUSE}")
        (out / "pause.tmp").rename(pause)
    elif BASE not in buildah(store, "images", "--format", "{{.Name}}:{{.Tag}}"):
        _base(store, out)
    args = ["bud", "--isolation", "chroot", "--layers=false",
            "--build-arg", f"PYTHON={BASE}", "-t", f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"]
    if HOST_CA.exists():
        args += ["-v", f"{HOST_CA}:/etc/host-ca.crt:ro", "--build-arg", "PIP_CERT=/etc/host-ca.crt"]
    buildah(store, *args, str(REPO))
    build_seconds = time.monotonic() - started
    tmp = out / "muster.tmp"
    tmp.unlink(missing_ok=True)
    buildah(store, "push", f"{IMAGE_REPOSITORY}:{IMAGE_TAG}",
             f"docker-archive:{tmp}:{IMAGE_REPOSITORY}:{IMAGE_TAG}")
    size = int(json.loads(buildah(store, "inspect", "--type", "image",
                                   f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"))
               .get("ImageSize", 0) or os.path.getsize(tmp))
    for old in out.glob("muster-*.tar"):
        old.unlink()
    tmp.rename(muster)
    record.write_text(json.dumps({"build_seconds": round(build_seconds, 1), "size_bytes": size}))
    return Images(muster, pause, build_seconds, size)


if __name__ == "__main__":
    images = build()
    print(json.dumps({"muster": str(images.muster), "pause": str(images.pause),
                      "build_seconds": round(images.build_seconds, 1),
                      "size_mb": round(images.size_bytes / 2**20, 1)}))
