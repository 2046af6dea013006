"""Hot reload of a mounted directory: ConfigMap ..data symlink swaps, broken updates refused."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from admission_helpers import configmap_version

from webhook.admission.metrics import Metrics
from webhook.admission.reload import PolicyStore, digest


class Broken(Exception):
    pass


def _load(paths: Sequence[Path]) -> dict[str, object]:
    """A stand-in loader: every visible *.json file must parse (the policy loader's contract)."""
    out: dict[str, object] = {}
    for root in paths:
        for f in sorted(root.iterdir()):
            if f.name.startswith("."):
                continue
            try:
                out[f.name] = json.loads(f.read_text())
            except ValueError as exc:
                raise Broken(f"{f.name}: {exc}") from exc
    return out


def _value(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("muster_policy_reloads_total", {"result": result})
    return value or 0.0


async def test_configmap_swap_reloads_and_broken_update_is_refused(tmp_path: Path) -> None:
    refused: list[str] = []

    async def on_refused(message: str) -> None:
        refused.append(message)

    metrics = Metrics()
    store = PolicyStore([tmp_path], _load, error_types=(Broken,), metrics=metrics, count=len,
                        on_refused=on_refused)
    configmap_version(tmp_path, "v1", {"a.json": '{"v": 1}'})
    assert await store.reload()
    assert store.current == {"a.json": {"v": 1}}
    assert not await store.reload()  # nothing changed: no reload, no metric
    assert _value(metrics, "success") == 1

    configmap_version(tmp_path, "v2", {"a.json": '{"v": 2'})
    assert not await store.reload()
    assert store.current == {"a.json": {"v": 1}}  # the last good set stays active
    assert store.last_error is not None and "a.json" in store.last_error
    assert refused == [store.last_error]
    assert _value(metrics, "error") == 1
    assert not await store.reload()  # the same broken content is reported once
    assert len(refused) == 1

    configmap_version(tmp_path, "v3", {"a.json": '{"v": 3}'})
    assert await store.reload()
    assert store.current == {"a.json": {"v": 3}}
    assert store.last_error is None
    gauge = metrics.registry.get_sample_value("muster_policies_loaded")
    assert gauge == 1


def test_digest_ignores_hidden_entries_and_follows_symlinks(tmp_path: Path) -> None:
    configmap_version(tmp_path, "v1", {"a.json": "1"})
    before = digest([tmp_path])
    (tmp_path / ".swp").write_text("editor noise")
    assert digest([tmp_path]) == before
    configmap_version(tmp_path, "v2", {"a.json": "2"})
    assert digest([tmp_path]) != before


def test_missing_path_has_a_digest(tmp_path: Path) -> None:
    assert digest([tmp_path / "absent"]) != digest([tmp_path])
