"""The build modules `e2e.node.gobuild` writes: pure text, checked without building anything."""

from __future__ import annotations

import pytest

from e2e.node.gobuild import Replace, build_module_text, kubernetes_build_module

_UPSTREAM = [
    Replace("k8s.io/api", "", "k8s.io/api", "v0.34.7"),
    Replace("k8s.io/csi-translation-lib", "", "k8s.io/csi-translation-lib", "v0.34.7"),
    Replace("github.com/x/y", "v1.0.0", "github.com/z/y", "v1.2.0"),
]


def test_the_modules_own_replaces_are_kept() -> None:
    text = build_module_text("plug", "sigs.k8s.io/scheduler-plugins", "v0.34.7", "1.24.0",
                             _UPSTREAM)
    assert text.splitlines()[:2] == ["module muster.local/plugbuild", ""]
    assert "\tsigs.k8s.io/scheduler-plugins v0.34.7" in text
    assert "\tk8s.io/api => k8s.io/api v0.34.7" in text
    assert "\tgithub.com/x/y v1.0.0 => github.com/z/y v1.2.0" in text
    assert "go 1.24.0" in text


def test_a_pin_overrides_a_replace_and_adds_one() -> None:
    text = build_module_text("plug", "m", "v1", "1.26", _UPSTREAM,
                             pin={"k8s.io/csi-translation-lib": "v0.34.4", "k8s.io/new": "v0.1.0"},
                             require={"k8s.io/extra": "v0.2.0"})
    assert "\tk8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.34.4" in text
    assert "csi-translation-lib v0.34.7" not in text
    assert "\tk8s.io/new => k8s.io/new v0.1.0" in text
    assert "\tk8s.io/extra v0.2.0" in text


def test_a_local_path_replace_must_be_pinned() -> None:
    local = [Replace("volcano.sh/apis", "", "./staging/src/volcano.sh/apis", "")]
    with pytest.raises(RuntimeError, match=r"volcano.sh/apis with the local path"):
        build_module_text("vc", "volcano.sh/volcano", "v1.13.0", "1.24", local)
    text = build_module_text("vc", "volcano.sh/volcano", "v1.13.0", "1.24", local,
                             pin={"volcano.sh/apis": "v1.13.0"})
    assert "\tvolcano.sh/apis => volcano.sh/apis v1.13.0" in text


def test_kubernetes_staging_modules_go_to_their_published_versions() -> None:
    text = kubernetes_build_module("v1.37.2", ["k8s.io/api", "k8s.io/kubelet"], "1.25.0")
    assert "\tk8s.io/kubelet => k8s.io/kubelet v0.37.2" in text
    assert "require k8s.io/kubernetes v1.37.2" in text
