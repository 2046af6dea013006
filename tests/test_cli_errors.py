"""Every command fails like a tool: the inputs people get wrong, one line on stderr that names
the input, exit 2 for usage and 1 for runtime, no traceback (unless --log-level debug)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import pkgutil
import socket
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from webhook import cli
from webhook.certs import generate_ca, issue_serving_cert, write_pair
from webhook.cli import build_parser, main
from webhook.demo import EXAMPLE_POLICIES

REPO = Path(__file__).resolve().parents[1]
POLICIES = str(EXAMPLE_POLICIES)
#: what `notyaml` gets, in one line: file:line:column, the cause first
NOT_YAML = ("notyaml:1:11: '[' opened here is not closed: expected ',' or ']', but got "
            "'<stream end>' at line 2, column 1")
#: the same file as the objects `muster policy` reads are read (as policies are, yamlpos)
NOT_YAML_OBJECT = ("notyaml:1:11: '[' opened here is not closed: did not find expected ',' or "
                   "']' at line 2, column 1")
WORKER = str(EXAMPLE_POLICIES / "tests/objects/worker-team-a.yaml")
CLOSED_PORT_KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: c
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
"""


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Files as people get them wrong; the working directory is the tmp dir."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    # `serve --self-signed` keeps its certificates in a temp dir for the user: here, in tmp_path
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "adir").mkdir()
    (tmp_path / "notyaml").write_text("clusters: [unclosed\n")
    (tmp_path / "badpolicy.yaml").write_text(
        "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: a}\n"
        "spec: {gang: {backend: slurm}, istio: {optOut: all}}\n")
    (tmp_path / "noname.yaml").write_text("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\n"
                                          "metadata: {namespace: a}\n")
    (tmp_path / "nopods.yaml").write_text("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\n"
                                          "metadata: {name: j}\nspec: {pytorchReplicaSpecs: "
                                          "{Worker: {replicas: 0}}}\n")
    (tmp_path / "notkc").write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    (tmp_path / "closedkc").write_text(CLOSED_PORT_KUBECONFIG % closed)
    ca = generate_ca("test-ca", days=1)
    write_pair(issue_serving_cert(ca, ["localhost"], [], days=1), tmp_path / "tls.crt",
               tmp_path / "tls.key")
    (tmp_path / "other.key").write_bytes(issue_serving_cert(ca, ["x"], [], days=1).key_pem)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield {"busy": str(busy.getsockname()[1])}


CASES = [
    # (argv, exit code, what the line must say)
    (["policy", "check", POLICIES, "missing.yaml"], 2,
     "no such file or directory: missing.yaml"),
    (["policy", "explain", "-p", POLICIES, "missing.yaml"], 2,
     "pod missing.yaml: No such file"),
    (["policy", "explain", "-p", POLICIES, "adir"], 2, "pod adir: Is a directory"),
    (["policy", "explain", "-p", POLICIES, "empty.yaml"], 2, "expected a Kubernetes object"),
    (["policy", "explain", "-p", POLICIES, "--owner", "notyaml", "empty.yaml"], 2,
     "--owner notyaml is not valid YAML: " + NOT_YAML_OBJECT),
    (["policy", "explain", "-p", "missing.yaml", WORKER], 2,
     "--policies missing.yaml: no such file or directory"),
    (["policy", "explain", "-p", "badpolicy.yaml", WORKER], 2,
     "--policies: badpolicy.yaml:4:24: spec.gang.backend: Input should be 'volcano', "
     "'coscheduling', 'muster' or 'kubernetes' (document 1, policy a) (and 1 more problem: "
     "muster policy check lists them)"),
    (["policy", "explain", "-p", POLICIES, "--namespace-labels", "team", WORKER], 2,
     "--namespace-labels: 'team' is not key=value"),
    (["policy", "test", "-p", POLICIES, WORKER, "--owner", "missing.yaml"], 2,
     "--owner missing.yaml: No such file"),
    (["policy", "test", "-p", "missing.yaml", WORKER], 2,
     "--policies missing.yaml: no such file or directory"),
    (["policy", "test", "-p", POLICIES, "missing.yaml"], 2,
     "no such file or directory: missing.yaml"),
    (["policy", "test", "-p", POLICIES, "notyaml"], 2, "pod notyaml is not valid YAML"),
    (["policy", "explain", "-p", POLICIES, "noname.yaml"], 2,
     "noname.yaml: the kubeflow.org/PyTorchJob has no metadata.name"),
    (["policy", "test", "-p", POLICIES, "nopods.yaml"], 2,
     "nopods.yaml: the PyTorchJob j creates no pods"),
    (["policy", "test", "-p", POLICIES, "--namespace-labels", "=a", WORKER], 2,
     "--namespace-labels: '=a' is not key=value"),
    (["serve", "--policies", POLICIES, "--tls-cert-file", "missing.pem", "--tls-key-file",
      "k.pem"], 2, "--tls-cert-file missing.pem: no such file"),
    (["serve", "--policies", "missing", "--self-signed"], 2, "--policies missing: no such"),
    (["serve", "--policies", POLICIES, "--tls-cert-file", "tls.key", "--tls-key-file",
      "tls.crt"], 2, "tls.key is a private key, not a certificate: are --tls-cert-file and "
     "--tls-key-file swapped?"),
    (["serve", "--policies", POLICIES, "--tls-cert-file", "tls.crt", "--tls-key-file",
      "other.key"], 2, "the key in other.key does not match the certificate in tls.crt"),
    (["serve", "--policies", POLICIES, "--tls-cert-file", "tls.crt", "--tls-key-file",
      "empty.yaml"], 2, "empty.yaml holds no usable private key"),
    (["serve", "--policies", POLICIES], 2, "give --tls-cert-file and --tls-key-file"),
    (["serve", "--policies", POLICIES, "--self-signed", "--max-connections", "8",
      "--reserved-connections", "8"], 2,
     "the reserved connections (8) must be fewer than the maximum (8)"),
    (["serve", "--policies", POLICIES, "--self-signed", "--host", "127.0.0.1", "--port",
      "{busy}"], 1, "already in use"),
    (["bind"], 2, "kubeconfig"),  # none anywhere
    (["bind", "--kubeconfig", "missing"], 2, "kubeconfig missing: No such file"),
    (["bind", "--kubeconfig", "adir"], 2, "kubeconfig adir: Is a directory"),
    (["bind", "--kubeconfig", "empty.yaml"], 2, "kubeconfig empty.yaml is not a kubeconfig"),
    (["bind", "--kubeconfig", "notyaml"], 2, "kubeconfig notyaml is not valid YAML: " + NOT_YAML),
    (["bind", "--kubeconfig", "notkc"], 2, "kubeconfig notkc is not a kubeconfig"),
    (["bind", "--kubeconfig", "closedkc"], 1, "cannot reach the Kubernetes API server"),
    (["bind", "--leader-elect", "--retry-period", "20"], 2, "--retry-period 20, "
     "--renew-deadline 10, --lease-duration 15: need 0 < --retry-period < --renew-deadline < "
     "--lease-duration"),
    (["agent", "--node-type", "nosuch", "discover"], 2, "unknown node type 'nosuch'"),
    (["agent", "discover", "--node-type", "nosuch"], 2, "unknown node type 'nosuch'"),
    (["agent", "discover", "--topology-file", "missing.json"], 2, "missing.json"),
    (["agent", "discover", "--fake-nvml", "nosuch"], 2, "nosuch"),
    (["agent", "--node-name", "n", "--node-type", "dgx1-v100", "--kubeconfig", "notyaml"], 2,
     "kubeconfig notyaml is not valid YAML: " + NOT_YAML),
    (["topology", "show", "nosuch"], 2, "unknown node type 'nosuch'"),
    (["topology", "parse", "missing.txt"], 2, "missing.txt: no such file"),
    (["topology", "parse", "adir"], 2, "adir: is a directory"),
    (["topology", "choose", "nosuch", "-k", "2"], 2, "unknown node type 'nosuch'"),
    (["topology", "choose", "dgx1-v100", "-k", "2", "--free", "a,b"], 2, "--free 'a,b'"),
    (["topology", "choose", "dgx1-v100", "-k", "9"], 1, "fewer than 9 healthy GPUs"),
    (["topology", "choose", "dgx1-v100", "-k", "0"], 2, "-k 0: give how many GPUs to place, "
     "1 or more"),
    (["topology", "choose", "dgx1-v100", "-k", "2", "--free", "0,9"], 2,
     "--free '0,9': dgx1-v100 has no GPU 9 (its GPUs are 0-7)"),
    (["topology", "choose", "dgx1-v100", "-k", "4", "--free", "0,1,2,7", "--min-ring-gbps",
      "100"], 1, "--min-ring-gbps 100 not met: the best 4 free GPUs on dgx1-v100 (GPUs 0,1,2,7) "
     "give 6 GB/s of allreduce bus bandwidth"),
    (["certs", "ensure", "--kubeconfig", "notkc", "--namespace", "x", "--service-name", "y"],
     2, "kubeconfig notkc is not a kubeconfig"),
    (["demo", "--policies", "missing"], 2, "missing"),
    # ports and addresses: checked or explained before anything listens
    (["serve", "--policies", POLICIES, "--self-signed", "--port", "99999"], 2,
     "--port 99999: a port is 0 to 65535 (0: any free port)"),
    (["serve", "--policies", POLICIES, "--self-signed", "--port", "-1"], 2,
     "--port -1: a port is 0 to 65535"),
    (["serve", "--policies", POLICIES, "--self-signed", "--metrics-port", "70000"], 2,
     "--metrics-port 70000: a port is 0 to 65535"),
    (["bind", "--metrics-port", "70000"], 2, "--metrics-port 70000: a port is 0 to 65535"),
    (["agent", "--node-name", "n", "--node-type", "dgx1-v100", "--metrics-port", "-5"], 2,
     "--metrics-port -5: a port is 0 to 65535"),
    # TEST-NET-1 (RFC 5737): no interface has it, so binding fails before anything is sent
    (["serve", "--policies", POLICIES, "--self-signed", "--host", "192.0.2.1", "--port", "0"],
     2, "no interface of this machine has that address; give --host"),
    (["serve", "--policies", POLICIES, "--self-signed", "--self-signed-dir", "empty.yaml"], 2,
     "--self-signed-dir empty.yaml: is a file, not a directory"),
    (["certs", "init", "--out", "empty.yaml"], 2,
     "--out empty.yaml: is a file, not a directory"),
    (["bind", "--network-levels", "@missing"], 2,
     "--network-levels @missing: No such file or directory"),
    (["bind", "--network-levels", "@notyaml"], 2,
     "--network-levels notyaml:1:11: '[' opened here is not closed"),
    (["bind", "--network-levels", "@badpolicy.yaml"], 2, "--network-levels @badpolicy.yaml: "
     "expected a Kueue (kueue.x-k8s.io/v1beta2) or KAI (kai.scheduler/v1) Topology"),
]


def _lines(err: str) -> list[str]:
    """stderr without the log lines ("I webhook.x: ...") a command may write before failing."""
    return [line for line in err.splitlines()
            if line.strip() and not (len(line) > 2 and line[1] == " " and line[0] in "DIWE")]


@pytest.mark.parametrize(("argv", "code", "says"), CASES,
                         ids=[" ".join(a[:3]) + f" [{i}]" for i, (a, _, _) in enumerate(CASES)])
def test_a_wrong_input_gets_one_line_and_the_right_exit_code(
        argv: list[str], code: int, says: str, inputs: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(**inputs) for a in argv]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = _lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"muster {argv[0]}"), lines[0]
    assert says in lines[0], lines[0]


def test_the_self_signed_key_is_removed_when_the_server_fails_to_start(
        inputs: dict[str, str], tmp_path: Path) -> None:
    """`serve --self-signed` keeps its key in a temporary directory only while it runs."""
    argv = ["serve", "--policies", POLICIES, "--self-signed", "--host", "192.0.2.1"]
    assert main(argv) == 2
    assert not list(tmp_path.glob("muster-serve-*"))


def test_ctrl_c_while_the_commands_load_ends_quietly(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`muster demo` then Ctrl-C at once: the interrupt meets the imports of build_parser."""
    def interrupted(name: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert main(["demo"]) == 130
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


def test_debug_keeps_the_traceback(inputs: dict[str, str]) -> None:
    with pytest.raises(FileNotFoundError):
        main(["--log-level", "debug", "topology", "parse", "missing.txt"])


def test_a_wrong_type_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--policies", POLICIES, "--port", "abc"])
    assert exited.value.code == 2
    assert "argument --port: invalid int value: 'abc'" in capsys.readouterr().err


def test_an_area_that_does_not_import_fails_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug, not a smaller CLI: `muster` never starts without one of its commands."""
    monkeypatch.setitem(sys.modules, "webhook.analyze.cli", None)
    with pytest.raises(ModuleNotFoundError, match=r"webhook\.analyze\.cli"):
        build_parser()


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`muster topology show dgx2 | head -c1`: the pipe closes before the command writes."""
    proc = subprocess.Popen([sys.executable, "-m", "webhook", "topology", "show", "dgx2"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has even imported the CLI
    err = proc.stderr.read().decode()
    assert proc.wait(30) == 141
    assert err == ""


def test_version_is_the_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"muster {importlib.metadata.version('muster')}\n"


def test_bind_help_says_what_each_option_does_and_its_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bind", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices["bind"]._actions:
        if action.default not in (None, False, argparse.SUPPRESS):
            assert action.help and "(default: " in action.help, action.option_strings
    # the binder writes each member's Binding once, carrying the assignment (docs/binder.md)
    assert "then bind" not in text
    assert "Binding, each carrying the pod's muster.io/gpu-assignment and the gang's" in text


def test_bind_flags_default_to_the_binders_own_defaults() -> None:
    from webhook.binder.controller import BinderConfig  # noqa: PLC0415 (loaded when bind runs)

    args = build_parser().parse_args(["bind"])
    config = BinderConfig()
    for flag in ("starvation_seconds", "backoff_max", "allocation_wait_seconds",
                 "event_interval", "members_event_after", "scheduler_name"):
        assert getattr(args, flag) == getattr(config, flag), flag
    given = build_parser().parse_args(["bind", "--event-interval", "5",
                                       "--members-event-after", "2"])
    assert (given.event_interval, given.members_event_after) == (5.0, 2.0)


#: what only the webhook, the binder, the agent or `muster certs` need: never loaded to parse a
#: command, nor by `muster policy`
CLUSTER_CLIENTS = ("kubernetes_asyncio", "aiohttp", "grpc", "prometheus_client", "pynvml",
                   "cryptography")


def test_policy_check_loads_no_cluster_client() -> None:
    # a fresh interpreter: this one has loaded them all already
    code = ("import sys\nfrom webhook.cli import main\n"
            f"rc = main(['policy', 'check', {POLICIES!r}])\n"
            f"print(rc, *sorted(m for m in {CLUSTER_CLIENTS!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0"


@pytest.mark.parametrize("package", ["webhook", "webhook.admission", "webhook.agent",
                                     "webhook.binder", "webhook.certs", "webhook.policy",
                                     "webhook.topology"])
def test_a_lazy_package_gives_every_name_it_exports(package: str) -> None:
    module = importlib.import_module(package)
    for sub in pkgutil.iter_modules(module.__path__):  # each sets its name on the package
        if sub.name != "__main__":  # `python -m webhook`: it runs the CLI
            importlib.import_module(f"{package}.{sub.name}")
    for name in module.__all__:  # a name mapped to the wrong module raises AttributeError
        assert not isinstance(getattr(module, name), types.ModuleType), name
    with pytest.raises(AttributeError) as raised:
        module.nothing_of_that_name  # noqa: B018
    assert str(raised.value) == f"module {package!r} has no attribute 'nothing_of_that_name'"


#: what the commands load when they run, never to build the parser (`muster --help`)
ENGINES = ("pydantic", "webhook.policy.engine", "webhook.topology.hierarchy")


def test_the_parser_loads_no_engine_nor_client() -> None:
    code = ("import sys\nfrom webhook.cli import build_parser\nbuild_parser()\n"
            f"print(*sorted(m for m in {(*CLUSTER_CLIENTS, *ENGINES)!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "\n"
