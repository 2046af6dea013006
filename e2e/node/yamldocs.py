"""The documents of upstream YAML manifests (CRDs of up to 1.4 MB a file), read with libyaml's
parser where PyYAML has it: ten times faster than the pure-Python one (0.6 s, not 6, for the
CRDs in ../shared/crds), and the same documents."""

from __future__ import annotations

from typing import Any

import yaml

from webhook.yamlpos import SafeLoader


def documents(text: str) -> list[dict[str, Any]]:
    """Every mapping document of `text` (empty documents and others skipped)."""
    return [d for d in yaml.load_all(text, Loader=SafeLoader) if isinstance(d, dict)]
