"""The admission webhook server (`muster serve`): policies applied to every pod, safely.

Public API: `ServeOptions`, `WebhookServer` (start/stop or `async with`), `run(options)`,
`parse_review`/`response` (AdmissionReview v1), `Admitter`/`AdmissionConfig` (the decision
path without HTTP). Loaded lazily so that `muster --help` does not import the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.lazy import lazy_getattr

if TYPE_CHECKING:
    from webhook.admission.admit import AdmissionConfig, Admitter
    from webhook.admission.review import BadReview, parse_review, response
    from webhook.admission.server import ServeOptions, WebhookServer, run

_EXPORTS = {
    "AdmissionConfig": "webhook.admission.admit",
    "Admitter": "webhook.admission.admit",
    "BadReview": "webhook.admission.review",
    "parse_review": "webhook.admission.review",
    "response": "webhook.admission.review",
    "ServeOptions": "webhook.admission.server",
    "WebhookServer": "webhook.admission.server",
    "run": "webhook.admission.server",
}

__all__ = [
    "AdmissionConfig",
    "Admitter",
    "BadReview",
    "ServeOptions",
    "WebhookServer",
    "parse_review",
    "response",
    "run",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
