"""The aiohttp application: routes, HTTP-level errors as JSON, never a 5xx on admission paths."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from webhook import keys
from webhook.admission.admit import Admitter
from webhook.admission.deadline import budget_for_query
from webhook.admission.limits import BodyBudget, Handler
from webhook.admission.metrics import CONTENT_TYPE_LATEST, Metrics
from webhook.admission.review import (
    AdmissionReview,
    BadReview,
    parse_pod_review,
    parse_review,
    response,
)

log = logging.getLogger(__name__)

ReviewFn = Callable[[AdmissionReview, float], Awaitable[tuple[dict[str, Any], str]]]
ParseFn = Callable[[bytes], AdmissionReview]

MiB = 1024 * 1024


@dataclass(frozen=True)
class BodyLimits:
    """How request bodies are read (`muster serve --max-body-bytes --body-timeout
    --max-inflight-body-bytes`)."""

    #: a larger body gets 413 unread (kube-apiserver's own request limit is 3 MiB; real
    #: AdmissionReviews stay under 1.5 MiB)
    max_bytes: int = 3 * MiB
    #: seconds a body has to arrive once its headers have, waiting for `in_flight` included
    timeout: float = 10.0
    #: bytes that the bodies being read hold together; the others wait their turn
    in_flight: int = 16 * MiB


def _json(status: int, body: dict[str, Any]) -> web.Response:
    # msgspec: about a tenth of json.dumps' time for an answer with a patch
    return web.Response(status=status, body=msgspec.json.encode(body),
                        content_type="application/json")


def _error(status: int, message: str, details: list[str] | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message, "code": status}
    if details:
        body["details"] = details
    return _json(status, body)


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason)
    except Exception:
        # Admission handlers catch their own failures (and fail open); this is the last resort
        # for anything else, which still must not surface as a 500 with a traceback.
        log.exception("unhandled error", extra={"path": request.path})
        return _error(400, "request could not be processed")


def build_app(admitter: Admitter, metrics: Metrics, limits: BodyLimits, *,
              track: Middleware) -> web.Application:
    """`track`: the connection guard's middleware (which connections serve a request)."""
    app = web.Application(client_max_size=limits.max_bytes,
                          middlewares=[track, _errors_as_json])
    bodies = _Bodies(limits, BodyBudget(limits.in_flight))

    def review_route(endpoint: str, parse: ParseFn, decide: ReviewFn, *,
                     fail_closed: bool = False) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            start = time.perf_counter()
            resp, outcome = await _review(request, parse, decide, bodies=bodies,
                                          margin=admitter.config.deadline_margin, metrics=metrics,
                                          fail_closed=fail_closed)
            metrics.observe_request(endpoint, outcome, time.perf_counter() - start)
            return resp
        return handle

    async def validate(review: AdmissionReview, _budget: float) -> tuple[dict[str, Any], str]:
        return await admitter.validate_policies(review)

    async def healthz(_: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.StreamResponse:
        if admitter.ready():
            return web.Response(text="ok")
        reasons = ["shutting down"] if admitter.draining else []
        if admitter.policies.current is None:
            reasons.append("policies not loaded" + (
                f": {admitter.policies.last_error}" if admitter.policies.last_error else ""))
        if admitter.context is not None and not admitter.context.ready():
            reasons.append("cluster caches not synced")
        return web.Response(status=503, text="; ".join(reasons) + "\n")

    def mutate_route(fail_closed: bool) -> Handler:
        """The pods' path: its decisions and its last-resort answer both fail open, or both
        closed (the namespaces of `webhook.failClosedNamespaceLabel`)."""
        return review_route("mutate", parse_pod_review, functools.partial(
            admitter.mutate, fail_closed=fail_closed), fail_closed=fail_closed)

    app.router.add_post("/mutate/pods", mutate_route(fail_closed=False))
    app.router.add_post(keys.FAIL_CLOSED_PATH, mutate_route(fail_closed=True))
    app.router.add_post("/validate/policies", review_route("validate", parse_review, validate))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    # no /metrics here: the admission port is reachable by whatever reaches the API server's
    # webhooks; metrics are served on their own plain-HTTP port (build_metrics_app)
    return app


def build_metrics_app(metrics: Metrics, *, track: Middleware) -> web.Application:
    """`muster serve --metrics-port`: /metrics (Prometheus) and /healthz over plain HTTP, apart
    from the TLS admission port."""
    async def metrics_page(_: web.Request) -> web.StreamResponse:
        resp = web.Response(body=metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def healthz(_: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    app = web.Application(middlewares=[track])
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/healthz", healthz)
    return app


@dataclass(frozen=True, slots=True)
class _Bodies:
    limits: BodyLimits
    budget: BodyBudget

    async def read(self, request: web.Request) -> bytes | tuple[web.Response, str]:
        """The whole body, or the answer when it is too large or too slow."""
        limits = self.limits
        size = request.content_length
        if size is not None and size > limits.max_bytes:
            return _error(413, f"body of {size} bytes exceeds the limit of "
                               f"{limits.max_bytes}"), "too_large"
        try:
            if request.content.is_eof():  # all here already (the usual small review)
                return await request.read()
            async with asyncio.timeout(limits.timeout), \
                    self.budget.hold(limits.max_bytes if size is None else size):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:  # a chunked body, found too large as it came
            return _error(413, f"body exceeds the limit of {limits.max_bytes} bytes"), \
                "too_large"
        except TimeoutError:
            resp = _error(408, f"body not received within {limits.timeout:g} s")
            resp.force_close()
            return resp, "body_timeout"
        except ConnectionError:  # the client went away mid-body: nobody to answer, no traceback
            return _error(400, "connection lost"), "disconnected"


async def _review(
    request: web.Request, parse: ParseFn, decide: ReviewFn, *, bodies: _Bodies,
    margin: float, metrics: Metrics, fail_closed: bool = False,
) -> tuple[web.Response, str]:
    content_type = request.headers.get("Content-Type", "")
    if content_type.partition(";")[0].strip().lower() != "application/json":
        return _error(415, f"content type must be application/json, got "
                           f"{content_type!r}"), "unsupported_media"
    body = await bodies.read(request)
    if not isinstance(body, bytes):
        return body
    try:
        review = parse(body)
    except BadReview as exc:
        # one line, no traceback: a malformed body says nothing about the server
        metrics.bad_requests.labels(exc.reason).inc()
        log.warning("malformed admission request refused", extra={
            "path": request.path, "reason": exc.reason, "error": str(exc)[:200]})
        return _error(400, "not an admission.k8s.io/v1 AdmissionReview request",
                      exc.errors), "bad_request"
    try:
        answer, outcome = await decide(review, budget_for_query(request.query_string, margin))
    except Exception:
        log.exception("admission handler failed; " + (
            "refusing the pod (fail-closed)" if fail_closed else "admitting unchanged"),
            extra={"uid": review.request.uid})
        if fail_closed:
            answer = response(review, allowed=False, status_code=503, message=(
                "muster: internal error, and this namespace admits no pod without its policies "
                "(fail-closed); retry"))
            outcome = "denied"
            metrics.fail_closed.labels("error").inc()
        else:
            answer = response(review, allowed=True, warnings=[
                "muster: internal error; pod admitted unchanged"])
            outcome = "fail_open"
            metrics.fail_open.labels("error").inc()
    return _json(200, answer), outcome
