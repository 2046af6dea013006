"""Builds the cluster's server binaries from the Go module proxy, at pinned releases, into a cache
outside the checkout (`~/.cache/muster/<what>/<version>/`, or `$MUSTER_CACHE`).

Nothing upstream is kept in the project: a build module is written at build time into a
temporary directory, `go build` resolves every module through GOPROXY, and only the binaries
land in the cache.

- Kubernetes: `k8s.io/kubernetes`'s go.mod replaces each `k8s.io/*` staging module with a
  local path, so `go install k8s.io/kubernetes/cmd/...@vX.Y.Z` refuses it. Our build module
  requires `k8s.io/kubernetes vX.Y.Z` and replaces each staging module (read from that go.mod)
  with its published `v0.Y.Z`. The version is stamped with the same `-X` flags as upstream's
  `hack/lib/version.sh`, so `/version` and the kubelet report the release.
- etcd: `go.etcd.io/etcd/server/v3` has no replaces; a build module pins it and builds its
  `etcdmain`-based command (`go.etcd.io/etcd/server/v3` holds no main, the server is in
  `go.etcd.io/etcd/v3`, whose go.mod does replace: so the same build-module trick).

- Any other Go program (schedulers, operators, containerd): `build_module` requires the module at
  its release and copies the versioned `replace` directives of the module's own go.mod into our
  build module, which is what `go install mod@version` refuses to do. A replace that points at a
  local path inside the upstream repository cannot be followed from the proxy: the caller pins it
  to a published version (`pin=`) or the build says which one it could not follow.

Run as `python -m e2e.node.gobuild [kubernetes VERSION | etcd VERSION | containerd VERSION |
coredns VERSION | all]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.node.versions import CONTAINERD, COREDNS, ETCD, KUBERNETES

SERVER_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
                   "kube-proxy")
#: the node runtime's binaries (binary -> package of github.com/containerd/containerd/v2): the
#: daemon, the runc shim it starts per pod, and the ctr client the launcher imports images with
CONTAINERD_BINARIES = {name: f"github.com/containerd/containerd/v2/cmd/{name}"
                       for name in ("containerd", "containerd-shim-runc-v2", "ctr")}


def cache_root() -> Path:
    """Where built binaries live: `$MUSTER_CACHE`, else `$XDG_CACHE_HOME/muster`, else
    `~/.cache/muster`."""
    if os.environ.get("MUSTER_CACHE"):
        return Path(os.environ["MUSTER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "muster"


def _go(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 3600
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"go {' '.join(args)} failed in {cwd}:\n{done.stderr[-4000:]}")
    return done


def _go_env() -> dict[str, str]:
    if shutil.which("go") is None:
        raise RuntimeError("building cluster binaries needs Go (1.26 or newer) on PATH, or set "
                           "MUSTER_K8S_BIN to a directory of prebuilt binaries")
    # the binaries are linked without DWARF (-w), so the compiler need not write it either:
    # a cold build takes about 9 % less CPU (lws v0.9.0: 5 min 4 s -> 4 min 38 s user)
    return {**os.environ, "CGO_ENABLED": "0",
            "GOFLAGS": "-mod=mod -trimpath -buildvcs=false -gcflags=all=-dwarf=false",
            "GOTOOLCHAIN": "local"}


def staging_modules(replaces: list[Replace]) -> list[str]:
    """The `k8s.io/*` modules that `k8s.io/kubernetes`'s go.mod replaces with staging paths."""
    mods = [r.old for r in replaces if not r.new_version and r.new.startswith("./staging/")]
    if not mods:
        raise RuntimeError("k8s.io/kubernetes's go.mod names no staging replaces")
    return mods


def kubernetes_build_module(version: str, staging: list[str], go_version: str) -> str:
    """The go.mod text of our build module for `k8s.io/kubernetes@version`."""
    staging_version = "v0." + version.removeprefix("v1.")
    lines = ["module muster.local/k8sbuild", "", f"go {go_version}", "",
             f"require k8s.io/kubernetes {version}", "", "replace ("]
    lines += [f"\t{mod} => {mod} {staging_version}" for mod in staging]
    lines += [")", ""]
    return "\n".join(lines)


def _version_ldflags(version: str) -> str:
    major, minor = version.removeprefix("v").split(".")[:2]
    stamp = {"gitVersion": version, "gitMajor": major, "gitMinor": minor,
             "gitTreeState": "clean", "gitCommit": "0000000000000000000000000000000000000000",
             "buildDate": "1970-01-01T00:00:00Z"}
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X '{pkg}.{k}={v}'" for k, v in stamp.items()]
    return " ".join(["-s", "-w", *flags])


def _install(built: Path, dest: Path, names: tuple[str, ...]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        tmp = dest / f".{name}.tmp"
        shutil.copy2(built / name, tmp)
        tmp.chmod(0o755)
        tmp.replace(dest / name)


def build_kubernetes(version: str = KUBERNETES,
                     names: tuple[str, ...] = SERVER_BINARIES) -> Path:
    """The directory holding the server binaries `names` of `version`; those missing are built
    (once: the cache keeps them)."""
    dest = cache_root() / "k8s" / version
    missing = tuple(n for n in names if not (dest / n).exists())
    if not missing:
        return dest
    env = _go_env()
    with tempfile.TemporaryDirectory(prefix="muster-k8sbuild-") as tmp:
        work = Path(tmp)
        (work / "go.mod").write_text("module muster.local/probe\n\ngo 1.26\n")
        go_version, replaces = module_gomod("k8s.io/kubernetes", version, env, work)
        staging = staging_modules(replaces)
        (work / "go.mod").write_text(kubernetes_build_module(version, staging, go_version))
        out = work / "bin"
        pkgs = [f"k8s.io/kubernetes/cmd/{n}" for n in missing]
        _go(["build", "-ldflags", _version_ldflags(version), "-o", f"{out}/", *pkgs], work, env)
        _install(out, dest, missing)
    return dest


def build_etcd(version: str = ETCD) -> Path:
    """The path of an etcd server binary of `version`, built once."""
    dest = cache_root() / "etcd" / version
    if (dest / "etcd").exists():
        return dest / "etcd"
    env = _go_env()
    with tempfile.TemporaryDirectory(prefix="muster-etcdbuild-") as tmp:
        work = Path(tmp)
        (work / "go.mod").write_text(
            f"module muster.local/etcdbuild\n\ngo 1.26\n\n"
            f"require go.etcd.io/etcd/server/v3 {version}\n")
        # etcd's own main (go.etcd.io/etcd/v3) replaces its sibling modules by path; the
        # server module's etcdmain package is the same entry point, so a two-line main does
        (work / "main.go").write_text(
            'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
            "func main() { etcdmain.Main(os.Args) }\n")
        _go(["build", "-ldflags", "-s -w", "-o", str(work / "etcd"), "."], work, env)
        _install(work, dest, ("etcd",))
    return dest / "etcd"


@dataclass(frozen=True)
class Replace:
    """One `replace` directive of a go.mod: `old[@old_version] => new[@new_version]`; a `new`
    without a version is a local path."""

    old: str
    old_version: str
    new: str
    new_version: str

    def line(self) -> str:
        old = f"{self.old} {self.old_version}".strip()
        return f"\t{old} => {self.new} {self.new_version}".rstrip()


def module_gomod(module: str, version: str, env: dict[str, str], work: Path
                 ) -> tuple[str, list[Replace]]:
    """The `go` version and the replace directives of `module@version`'s go.mod, read through
    the proxy (`go mod download`, then `go mod edit -json`)."""
    out = _go(["mod", "download", "-json", f"{module}@{version}"], work, env)
    gomod = json.loads(out.stdout)["GoMod"]
    parsed = json.loads(_go(["mod", "edit", "-json", gomod], work, env).stdout)
    replaces = [Replace(r["Old"]["Path"], r["Old"].get("Version", ""), r["New"]["Path"],
                        r["New"].get("Version", "")) for r in parsed.get("Replace") or []]
    return parsed.get("Go") or "1.26", replaces


def build_module_text(name: str, module: str, version: str, go_version: str,
                      replaces: list[Replace], *, pin: dict[str, str] | None = None,
                      require: dict[str, str] | None = None) -> str:
    """The go.mod text of our build module for `module@version`: the module's own replaces, with
    `pin` (module path -> published version) overriding or adding a replace; a local-path
    replace that `pin` does not map is refused (the proxy cannot serve it). Pinning also moves a
    replace off a version the proxy refuses (the upstream go.mod names a patch it does not hold)."""
    pin = dict(pin or {})
    lines = [f"module muster.local/{name}build", "", f"go {go_version}", "", "require ("]
    lines += [f"\t{m} {v}" for m, v in {module: version, **(require or {})}.items()]
    lines += [")", ""]
    kept: list[str] = []
    for r in replaces:
        if r.old in pin:
            kept.append(Replace(r.old, r.old_version, r.old, pin.pop(r.old)).line())
        elif r.new_version:
            kept.append(r.line())
        else:
            raise RuntimeError(
                f"{module}@{version} replaces {r.old} with the local path {r.new}, which the "
                f"module proxy does not serve: pin it to a published version")
    kept += [Replace(old, "", old, v).line() for old, v in pin.items()]
    if kept:
        lines += ["replace (", *kept, ")", ""]
    return "\n".join(lines)


def build_module(name: str, module: str, version: str, packages: dict[str, str], *,
                 pin: dict[str, str] | None = None, require: dict[str, str] | None = None,
                 tags: tuple[str, ...] = (), ldflags: str = "-s -w", cgo: bool = False) -> Path:
    """The directory `<cache>/<name>/<version>/` holding one binary per entry of `packages`
    (binary name -> import path), built from `module@version` through the module proxy with the
    module's own replaces (see `build_module_text`); built once, the cache keeps them."""
    dest = cache_root() / name / version
    missing = {b: pkg for b, pkg in packages.items() if not (dest / b).exists()}
    if not missing:
        return dest
    env = _go_env() | ({"CGO_ENABLED": "1"} if cgo else {})
    with tempfile.TemporaryDirectory(prefix=f"muster-{name}build-") as tmp:
        work = Path(tmp)
        (work / "go.mod").write_text("module muster.local/probe\n\ngo 1.26\n")
        go_version, replaces = module_gomod(module, version, env, work)
        (work / "go.mod").write_text(
            build_module_text(name, module, version, go_version, replaces, pin=pin,
                              require=require))
        out = work / "bin"
        for binary, pkg in missing.items():
            args = ["build", "-ldflags", ldflags, "-o", str(out / binary)]
            _go([*args, *(["-tags", ",".join(tags)] if tags else []), pkg], work, env)
        _install(out, dest, tuple(missing))
    return dest


def build_containerd(version: str = CONTAINERD) -> Path:
    """The directory holding containerd, its runc shim and ctr at `version`, built once.

    Without cgo the btrfs snapshotter drops out by its own build constraint (the tier uses
    overlayfs); the version is stamped as upstream's Makefile does, so `containerd --version`
    and the kubelet's node status name the release."""
    return build_module("containerd", "github.com/containerd/containerd/v2", version,
                        CONTAINERD_BINARIES,
                        ldflags=f"-s -w -X github.com/containerd/containerd/v2/version.Version="
                                f"{version}")


def build_coredns(version: str = COREDNS) -> Path:
    """The directory holding CoreDNS at `version` (a multi-node cluster's DNS), built once."""
    return build_module("coredns", "github.com/coredns/coredns", version,
                        {"coredns": "github.com/coredns/coredns"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.node.gobuild", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("kubernetes", "etcd", "containerd", "coredns", "all"),
                        nargs="?", default="all")
    parser.add_argument("version", nargs="?", help="a release tag (default: the pinned one)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        if args.what in ("kubernetes", "all"):
            print(build_kubernetes(args.version or KUBERNETES))
        if args.what in ("etcd", "all"):
            print(build_etcd(args.version if args.what == "etcd" and args.version else ETCD))
        if args.what in ("containerd", "all"):
            print(build_containerd(args.version if args.what == "containerd" and args.version
                                   else CONTAINERD))
        if args.what in ("coredns", "all"):
            print(build_coredns(args.version if args.what == "coredns" and args.version
                                else COREDNS))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
