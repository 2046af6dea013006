"""Shared pytest configuration. Area-specific fixtures live in tests/<area>/conftest.py.

Fixtures for everything that talks to Kubernetes:
- `apiserver`: a started `webhook.doubles.emulator.ApiServerEmulator` with the shared upstream CRDs
  installed (Volcano and coscheduling PodGroups, Volcano Queues, MPIJobs) and namespace "team-a".
- `kubeconfig`: path of a kubeconfig pointing at it; `kube`: a `webhook.kube.KubeApi` on it.
- `tls_webhook`: starts HTTPS admission webhooks (self-signed CA) with a handler of the test's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from e2e.node.yamldocs import documents
from webhook.demo import scenario
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.webhooks import TlsCerts, WebhookServers, make_certs
from webhook.kube import KubeApi, make_api_client

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout: DESIGN.md, real admission fixtures, upstream CRDs."""
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: CI clones the repo with ../shared beside it")
    return SHARED


@pytest.fixture(scope="session")
def shared_crds(shared_dir: Path) -> list[dict[str, Any]]:
    """The upstream CRDs in ../shared/crds, parsed once per session."""
    return [d for path in sorted((shared_dir / "crds").glob("*.yaml"))
            for d in documents(path.read_text())]


@pytest.fixture
async def apiserver(shared_crds: list[dict[str, Any]]) -> AsyncIterator[ApiServerEmulator]:
    api = ApiServerEmulator(crds=shared_crds)
    api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    for queue in scenario.QUEUES:  # Volcano's, as on a cluster where it is installed
        api.seed(scenario.volcano_queue(queue))
    async with api:
        yield api


@pytest.fixture
def kubeconfig(apiserver: ApiServerEmulator, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def kube(kubeconfig: Path) -> AsyncIterator[KubeApi]:
    client = await make_api_client(str(kubeconfig))
    try:
        yield KubeApi(client)
    finally:
        await client.close()


@pytest.fixture(scope="session")
def webhook_certs() -> TlsCerts:
    return make_certs(["localhost", "muster-webhook.muster-system.svc"])


@pytest.fixture
async def tls_webhook(webhook_certs: TlsCerts) -> AsyncIterator[WebhookServers]:
    """`hook = await tls_webhook.start(handler, path="/mutate")`: an HTTPS admission webhook
    (see webhook.doubles.webhooks); every server started stops at teardown."""
    servers = WebhookServers(webhook_certs)
    yield servers
    await servers.stop()
