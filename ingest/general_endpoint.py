"""``POST /webhooks/general/{name}``: verify, read, append, and only then answer 200.

Order matters: the signature is checked over the exact raw bytes before anything is parsed;
the answer is 200 only after the event's transaction committed (the provider never
retries, so a 200 for something not durable would lose it for good).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import structlog
from psycopg_pool import AsyncConnectionPool
from starlette.responses import JSONResponse, Response

from ingest import general_signature, responses
from ingest.accepting import Envelope, append_and_answer
from ingest.appender import BatchingAppender
from ingest.body import BODY_TIMEOUT_S, read_limited
from ingest.errors import BodyError, BodyIncomplete, BodyTooLarge, BodyTooSlow
from ingest.general_body import (
    MALFORMED_EVENT_TYPE,
    read_general_or_malformed,
    unstorable_general,
)
from ingest.headers import mask_needles, mask_text, masked, safe_headers
from ingest.incoming import DeliveryRequest, path_label
from ingest.json_body import parse_object
from ingest.metrics import IngestMetrics
from ingest.rejections import Refusal, RejectionLog
from ingest.text_repair import general_identifying, repaired_object, with_repairs
from ingest.unstorable import is_unstorable, placeholder_payload

SYSTEM = "general"
SIGNATURE_HEADER = "x-service-signature"

log = structlog.get_logger("hookledger.ingest")


class GeneralEndpoint:
    """Receives system A deliveries for up to three named webhooks, each with its secret."""

    def __init__(self, *, secrets: Mapping[str, bytes], zone: ZoneInfo, max_body_bytes: int,
                 appender: BatchingAppender, pool: AsyncConnectionPool,
                 metrics: IngestMetrics, rejected_keep: int = 100_000,
                 body_timeout_s: float = BODY_TIMEOUT_S,
                 answer_within_s: float | None = None,
                 known_secrets: Sequence[bytes] = ()) -> None:
        # every secret this process was given (the other endpoint's, the API key,
        # the admin token): masked in any refusal here, wherever a sender put it
        self._known_secrets = list(known_secrets)
        self._known_needles = mask_needles(self._known_secrets)  # once, not per request
        self._secrets = dict(secrets)
        self._zone = zone
        self._max_body = max_body_bytes
        self._body_timeout_s = body_timeout_s
        self._appender = appender
        self._pool = pool
        self._rejections = RejectionLog(pool, keep=rejected_keep,
                                        answer_within_s=answer_within_s)
        self._metrics = metrics
        self._outcomes = metrics.outcomes(SYSTEM)

    async def __call__(self, request: DeliveryRequest) -> Response | responses.Accepted:
        received_at = datetime.now(UTC)
        name = request.path_params["name"]
        endpoint = mask_text(f"general/{path_label(name, 1024)}", self._known_needles)
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(endpoint=endpoint)
        headers = safe_headers(request.headers.items())
        encoding = request.headers.get("content-encoding", "identity").strip().lower()

        def refusal(status: int, reason: str, detail: str | None, body: bytes, size: int,
                    verified: bool) -> Refusal:
            client = request.client.host if request.client else None
            return Refusal(received_at, endpoint, reason, detail, verified, status, body, size,
                           masked(headers, [*self._known_secrets, *self._secrets.values()]),
                           client)

        try:
            body = await read_limited(request, self._max_body, self._body_timeout_s)
        except BodyTooLarge as exc:
            return await self._refuse(refusal(413, exc.reason, exc.detail, exc.head, exc.size,
                                              False))
        except BodyTooSlow as exc:
            return await self._refuse(refusal(408, exc.reason, exc.detail, b"", 0, False))
        except BodyIncomplete as exc:
            return await self._refuse(refusal(400, exc.reason, exc.detail, exc.received,
                                              len(exc.received), False))

        secret = self._secrets.get(name)
        if secret is None:
            return await self._refuse(
                refusal(401, "unknown_endpoint", None, body, len(body), False))
        try:
            general_signature.verify(body, request.headers.get(SIGNATURE_HEADER), secret)
        except general_signature.GeneralSignatureError as exc:
            return await self._refuse(refusal(401, exc.reason, None, body, len(body), False))
        # after the signature (over the bytes as sent): a forged body hears 401 whatever
        # its encoding, as the contract has it; an authentic one we cannot read, 415
        if encoding not in ("identity", ""):
            return await self._refuse(refusal(415, "unsupported_content_encoding",
                                              encoding[:64], body, len(body), True))

        try:
            parsed, text = parse_object(body)
        except BodyError as exc:
            if not is_unstorable(exc):  # not a JSON object: the one 400 when signed
                return await self._refuse(
                    refusal(400, exc.reason, exc.detail, body, len(body), True))
            # a JSON object jsonb cannot hold: read with its describing text mended, or
            # else kept by its raw bytes; never refused
            if (repaired := repaired_object(body, exc, general_identifying)) is not None:
                delivery, text = with_repairs(
                    read_general_or_malformed(repaired.body, self._zone), repaired), \
                    repaired.text
            else:
                delivery, text = unstorable_general(body, exc), placeholder_payload(exc)
        else:
            delivery = read_general_or_malformed(parsed, self._zone)
        if delivery.event_type == MALFORMED_EVENT_TYPE:
            log.warning("delivery.malformed", reason=delivery.facts["reason"],
                        detail=delivery.facts["detail"])

        # not ``event``: that is each log line's own name, and a bound value under it is
        # dropped (structlog keeps the line's)
        structlog.contextvars.bind_contextvars(
            reference=delivery.facts.get("reference"),
            delivery_event=delivery.facts.get("event"))

        envelope = Envelope(SYSTEM, received_at, body, headers, endpoint, name)
        return await append_and_answer(
            self._appender.append, envelope, delivery, text,
            lambda refused: unstorable_general(body, refused),
            metrics=self._metrics, outcomes=self._outcomes)

    async def _refuse(self, refusal: Refusal) -> JSONResponse:
        self._metrics.refused.labels(SYSTEM, refusal.reason).inc()
        log.warning("delivery.refused", reason=refusal.reason, detail=refusal.detail,
                    status=refusal.http_status)
        try:
            await self._rejections.record(refusal)
        except Exception as exc:  # noqa: BLE001 - a refusal is answered even if not recorded
            log.error("delivery.refusal_not_recorded", reason=refusal.reason,
                      error=type(exc).__name__)
        return responses.refused(refusal.http_status, refusal.reason)
