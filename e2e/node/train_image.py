"""The training image: real ranks that talk to each other, from Debian bookworm packages only.

The way `e2e.node.image` builds Muster's: a root filesystem made by `mmdebstrap` from
`PACKAGES` (OpenMPI, OpenSSH, Python with mpi4py, NumPy and PyTorch 1.13, whose gloo backend
runs collectives over TCP on CPUs), then `buildah` adds the rank programs of `e2e/train` at
`PROGRAMS` and the SSH settings mpi-operator's launcher needs, and writes a docker-archive that
`ctr images import` loads into each node's containerd (a cluster plan's "images" list,
`Images.extra`). Cached outside the checkout in `~/.cache/muster/images` (`MUSTER_CACHE`), keyed
on the packages and the programs; build time and size are recorded next to the archive.

    .venv/bin/python -m e2e.node.train_image    # builds (or finds) it, prints where and how big
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.node.assets import CACHE, REPO
from e2e.node.gobuild import cache_root
from e2e.node.image import buildah, debian_rootfs

TRAIN_IMAGE = "localhost/muster-train:bookworm"
PACKAGES = ("python3,python3-numpy,python3-mpi4py,python3-torch,openmpi-bin,openssh-server,"
            "openssh-client")
SOURCES = REPO / "e2e" / "train"
#: where the rank programs are in the image
PROGRAMS = "/opt/muster-train"
#: ssh as mpi-operator's launcher uses it: the workers' host keys are new to it, and the keys it
#: mounts (a Secret volume) are not root's own files as sshd's StrictModes wants them
SSH_SETUP = (
    "printf 'Host *\\n  StrictHostKeyChecking no\\n  UserKnownHostsFile /dev/null\\n"
    "  LogLevel ERROR\\n' > /etc/ssh/ssh_config.d/muster-train.conf"
    " && printf 'StrictModes no\\n' > /etc/ssh/sshd_config.d/muster-train.conf"
    " && ssh-keygen -A && mkdir -p /run/sshd")
#: what no rank loads, about 350 MB of the 1.36 GB the packages install: docs, the tests of
#: libtorch and SymPy, and Mesa's GL drivers with the LLVM they alone link (libtorch needs
#: OpenCV, whose GUI needs Qt, whose GL needs Mesa; nothing here draws)
TRIM = ("/usr/share/doc /usr/share/man /usr/share/locale /usr/share/info"
        " /usr/lib/python3/dist-packages/torch/bin/test_*"
        " /usr/lib/python3/dist-packages/sympy/*/tests"
        " /usr/lib/python3/dist-packages/sympy/*/*/tests"
        " /usr/lib/python3/dist-packages/sympy/integrals/rubi/rubi_tests"
        " /usr/lib/x86_64-linux-gnu/dri"
        " /usr/lib/x86_64-linux-gnu/libLLVM-15.so* /usr/lib/x86_64-linux-gnu/libz3.so*")


@dataclass(frozen=True)
class TrainImage:
    archive: Path  # docker-archive of TRAIN_IMAGE
    build_seconds: float
    size_bytes: int


def _digest(text: str, *files: Path) -> str:
    h = hashlib.sha256(text.encode())
    for f in files:
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _programs() -> list[Path]:
    return sorted(p for p in SOURCES.glob("*.py") if p.name != "__init__.py")


def _rootfs(out: Path) -> Path:
    return debian_rootfs(out / f"train-rootfs-{_digest(PACKAGES)[:8]}.tar", PACKAGES,
                         within=1800)


def _commit(store: Path, rootfs: Path) -> None:
    ctr = buildah(store, "from", "scratch")
    try:
        buildah(store, "add", ctr, str(rootfs), "/")
        buildah(store, "run", "--isolation", "chroot", ctr, "--", "/bin/sh", "-c",
                 f"{SSH_SETUP} && rm -rf {TRIM}")
        buildah(store, "add", ctr, *map(str, _programs()), f"{PROGRAMS}/")
        buildah(store, "config", "--env", f"PYTHONPATH={PROGRAMS}", "--workingdir", PROGRAMS,
                 "--cmd", "/bin/sh", ctr)
        buildah(store, "commit", "--rm", ctr, TRAIN_IMAGE)
    except BaseException:
        subprocess.run(["buildah", "--root", str(store / "root"), "--runroot",
                        str(store / "run"), "--storage-driver", "vfs", "rm", ctr],
                       capture_output=True, check=False)
        raise


def build() -> TrainImage:
    """The image's archive, built unless the cache holds it for these packages and programs."""
    # outside the checkout, beside the cluster's binaries: it depends on no source of Muster's,
    # so a fresh clone (CI) reuses it
    out = cache_root() / "images"
    out.mkdir(parents=True, exist_ok=True)
    digest = _digest(PACKAGES, *_programs())[:16]
    archive, record = out / f"train-{digest}.tar", out / f"train-build-{digest}.json"
    if archive.exists() and record.exists():
        meta = json.loads(record.read_text())
        return TrainImage(archive, meta["build_seconds"], meta["size_bytes"])
    store = CACHE / "buildah"
    started = time.monotonic()
    _commit(store, _rootfs(out))
    tmp = out / "train.tmp"
    tmp.unlink(missing_ok=True)
    buildah(store, "push", TRAIN_IMAGE, f"docker-archive:{tmp}:{TRAIN_IMAGE}")
    build_seconds = time.monotonic() - started
    size = int(json.loads(buildah(store, "inspect", "--type", "image", TRAIN_IMAGE))
               .get("ImageSize", 0) or tmp.stat().st_size)
    for old in out.glob("train-*.tar"):
        if not old.name.startswith("train-rootfs-"):
            old.unlink()
    tmp.rename(archive)
    record.write_text(json.dumps({"build_seconds": round(build_seconds, 1), "size_bytes": size}))
    return TrainImage(archive, build_seconds, size)


if __name__ == "__main__":
    image = build()
    print(json.dumps({"image": TRAIN_IMAGE, "archive": str(image.archive),
                      "build_seconds": round(image.build_seconds, 1),
                      "size_mb": round(image.size_bytes / 2**20, 1)}))
