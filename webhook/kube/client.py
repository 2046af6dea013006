"""kubernetes-asyncio ApiClient construction: a kubeconfig, or in-cluster credentials."""

from __future__ import annotations

import os

from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import load_incluster_config, load_kube_config


async def make_api_client(kubeconfig: str | None = None,
                          context: str | None = None) -> ApiClient:
    """An ApiClient for `kubeconfig` (and `context`); without one, the in-cluster service
    account when running in a pod (KUBERNETES_SERVICE_HOST set), else $KUBECONFIG or
    ~/.kube/config as kubectl would use. The caller closes it (`await client.close()`)."""
    config = Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        await load_kube_config(config_file=path, context=context,
                               client_configuration=config, persist_config=False)
    return ApiClient(configuration=config)
