"""kubernetes-asyncio ApiClient construction: a kubeconfig, or in-cluster credentials."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import yaml
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import load_incluster_config, load_kube_config
from kubernetes_asyncio.config.config_exception import ConfigException

from webhook.failures import UsageError
from webhook.yamlpos import problem_of


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
        _check_kubeconfig(path, kubeconfig is None)
        try:
            await load_kube_config(config_file=path, context=context,
                                   client_configuration=config, persist_config=False)
        except ConfigException as exc:
            raise UsageError(f"kubeconfig {path or '~/.kube/config'}: {exc}") from exc
    client = ApiClient(configuration=config)
    _without_env_lookups(client)
    return client


def _check_kubeconfig(given: str | None, implicit: bool) -> None:
    """A clear UsageError for a kubeconfig that is missing or not one (the library answers
    with a KeyError or a TypeError from deep inside)."""
    path = given or os.path.expanduser("~/.kube/config")
    where = f"kubeconfig {path}" + (" (no --kubeconfig given)" if implicit else "")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        hint = ("give --kubeconfig, set $KUBECONFIG, or run in a cluster" if implicit
                else "check the path")
        raise UsageError(f"{where}: {exc.strerror or exc}; {hint}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{where} is not valid YAML: {problem_of(exc, text).at(path)}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("clusters"), list) or \
            not doc.get("clusters"):
        raise UsageError(f"{where} is not a kubeconfig (no clusters): give the file kubectl "
                         "uses, e.g. ~/.kube/config")


def _without_env_lookups(client: ApiClient) -> None:
    """kubernetes-asyncio's session has trust_env=True: aiohttp then looks up ~/.netrc in a
    worker thread on every request, which cost about 0.9 ms of CPU per API call (the webhook
    makes one per job, the agent one per Allocate). The API server is never reached through an
    environment proxy or netrc credentials, so the same connector gets a session without them."""
    rest = client.rest_client
    old: aiohttp.ClientSession = rest.pool_manager
    connector = old.connector
    old.detach()  # the connector moves to the new session, not closed with the old one
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False,
                                              read_bufsize=2**21)
