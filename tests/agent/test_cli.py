"""`muster agent discover` and the fake kubelet as processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from agent_helpers import NODE, ListedPods, make_pod

from webhook.agent.deviceplugin.plugin import GpuDevicePlugin, PluginConfig
from webhook.agent.nvmlrecord import NvmlRecord
from webhook.cli import build_parser, main
from webhook.topology import builtin, topology_class
from webhook.topology.model import Topology

REPO = Path(__file__).resolve().parents[2]


def test_discover_record_and_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "node.json"
    assert main(["agent", "discover", "--fake-nvml", "dgx1-v100", "--record", str(record)]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["class"] == topology_class(builtin("dgx1-v100"))
    assert first["topology"]["name"] == "dgx1-v100" and first["degraded"] is False
    saved = NvmlRecord.model_validate_json(record.read_text())
    assert len(saved.devices) == 8
    # anonymised by default: no UUID of the machine is in the file
    assert not {g.uuid for g in builtin("dgx1-v100").gpus} & {d.uuid for d in saved.devices}
    assert main(["agent", "discover", "--fake-nvml", str(record)]) == 0
    replay = json.loads(capsys.readouterr().out)
    assert replay["class"] == first["class"]
    assert replay["topology"]["nvlinks"] == first["topology"]["nvlinks"]


def test_discover_keep_uuids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "node.json"
    assert main(["agent", "discover", "--fake-nvml", "hgx-a100", "--record", str(record),
                 "--keep-uuids"]) == 0
    capsys.readouterr()
    saved = NvmlRecord.model_validate_json(record.read_text())
    assert [d.uuid for d in saved.devices] == [g.uuid for g in builtin("hgx-a100").gpus]


def test_discover_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "discover", "--fake-nvml", "no-such-profile"]) == 2
    assert "neither a profile" in capsys.readouterr().err
    assert main(["agent", "discover", "--node-type", "dgx1-v100", "--record",
                 str(tmp_path / "x.json")]) == 2
    assert "--record needs NVML" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"v": 1, "gpus": []}')
    assert main(["agent", "discover", "--topology-file", str(bad)]) == 2
    assert "topology" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "message"), [
    (b'{"v": 1, "deviceCount": 0}', "format v=1; this Muster reads v=2: record it again"),
    (b"\x8f\x00 not text", "not an NVML recording: document: Invalid JSON"),
    (b'{"v": 2, "deviceCount": "eight"}', "not an NVML recording: deviceCount"),
    (b'{"v": 2, "deviceCount": 1, "devices": [{"memoryAffinity": "0"}]}',
     "not an NVML recording: devices.0.memoryAffinity"),
])
def test_a_recording_that_cannot_be_replayed_is_named_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str) -> None:
    path = tmp_path / "node.json"
    path.write_bytes(content)
    assert main(["agent", "discover", "--fake-nvml", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: " in err and message in err and len(err.splitlines()) == 1, err


def test_a_static_topology_without_uuids_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the device plugin hands GPUs out by UUID: a parsed topo -m needs `nvidia-smi -L` with it
    smi = REPO / "tests" / "topology" / "smi"
    parsed = tmp_path / "parsed.json"
    args = ["topology", "parse", str(smi / "dgxh100-tty.txt"), "--pcie-gen", "5",
            "--nvlink-gbps", "25"]
    assert main(args) == 0
    parsed.write_text(capsys.readouterr().out)
    assert main(["agent", "discover", "--topology-file", str(parsed)]) == 2
    err = capsys.readouterr().err
    assert "have no UUID" in err and "--gpu-list" in err and len(err.splitlines()) == 1
    assert main([*args, "--gpu-list", str(smi / "dgxh100-list.txt")]) == 0
    parsed.write_text(capsys.readouterr().out)
    assert main(["agent", "discover", "--topology-file", str(parsed)]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["class"] == topology_class(builtin("hgx-h100"))
    assert all(g["uuid"].startswith("GPU-") for g in found["topology"]["gpus"])


def test_agent_needs_a_node_name(monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["agent", "--fake-nvml"]) == 2
    assert "--node-name" in capsys.readouterr().err


async def test_fake_kubelet_process_admits_through_the_plugin(
        sock_dir: Path, dgx1: Topology) -> None:
    pods = ListedPods()
    pods.items.append(make_pod("p", assign={"main": [0, 2, 3, 4]}, topology=dgx1))
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir, kubelet_check_s=0.05,
                                          assignment_wait_s=0.3, poll_s=0.05), dgx1, pods)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "webhook.doubles.fakekubelet", "--dir", str(sock_dir),
        "--admit", "4", "--admit", "1", cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    run = asyncio.create_task(plugin.run())
    events: list[dict[str, object]] = []
    try:
        assert proc.stdout is not None
        while len([e for e in events if e["event"] in ("admitted", "refused")]) < 2:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            events.append(json.loads(line))
    finally:
        proc.terminate()
        await proc.wait()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    admitted = next(e for e in events if e["event"] == "admitted")
    envs = admitted["envs"]
    assert isinstance(envs, dict)
    assert sorted(envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(
        dgx1.gpus[i].uuid for i in (0, 2, 3, 4))
    refused = next(e for e in events if e["event"] == "refused")
    assert refused["code"] == "FAILED_PRECONDITION"


def test_agent_without_api_credentials_exits_cleanly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\n")
    assert main(["agent", "--node-name", NODE, "--fake-nvml", "--kubeconfig", str(bad)]) == 2
    assert f"kubeconfig {bad} is not a kubeconfig" in capsys.readouterr().err


def test_agent_refuses_to_serve_no_gpu_at_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--node-name", NODE, "--fake-nvml", "--no-device-plugin"]) == 2
    assert "give --dra" in capsys.readouterr().err


def test_agent_with_an_unreadable_dra_checkpoint_stops(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "checkpoint.json").write_text('{"version": 9}')
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {}}]}))
    assert main(["agent", "--node-name", NODE, "--fake-nvml", "--kubeconfig", str(kubeconfig),
                 "--dra", "--dra-plugin-dir", str(tmp_path / "plugin"),
                 "--dra-registry-dir", str(tmp_path / "reg")]) == 1
    err = capsys.readouterr().err
    assert "checkpoint.json is unreadable" in err and "which GPUs it prepared" in err


def test_agent_names_its_pod_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's POD_NAMESPACE, POD_NAME and POD_UID make the record the binder waits on."""
    for name, value in (("POD_NAMESPACE", "muster"), ("POD_NAME", "agent-x"), ("POD_UID", "u1")):
        monkeypatch.setenv(name, value)
    assert build_parser().parse_args(["agent"]).pod == "muster/agent-x/u1"
    monkeypatch.delenv("POD_UID")
    assert build_parser().parse_args(["agent"]).pod is None  # not all set: no record


def test_agent_refuses_a_pod_it_cannot_record(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--node-name", NODE, "--fake-nvml", "--pod", "agent-x"]) == 2
    assert "--pod 'agent-x': give NAMESPACE/NAME/UID" in capsys.readouterr().err
