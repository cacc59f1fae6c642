"""``POST /webhooks/chat/{phoneNumberId}``: verify, read, append, and only then answer 200.

The provider waits 15 s and retries a failure at 1m, 5m, 30m, 2h, 12h. So the request path
does only what must precede the answer: one secret lookup (through the store's TTL cache),
verification over the exact raw bytes, reading the body, and one group-committed append.
The answer is 200 only after the event's transaction committed; a retry of a delivery
already kept is answered 200 with ``"duplicate": true`` so the provider stops retrying.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

import structlog
from psycopg_pool import AsyncConnectionPool
from starlette.responses import JSONResponse, Response

from ingest import chat_signature, responses
from ingest.accepting import Envelope, append_and_answer
from ingest.appender import BatchingAppender
from ingest.body import BODY_TIMEOUT_S, read_limited
from ingest.chat_body import (
    MALFORMED_EVENT_TYPE,
    PLATFORM_ERROR_CAUSES,
    SOURCE,
    DeliveryMeta,
    attempt_of,
    delivery_id_of,
    delivery_id_unusable,
    read_chat_or_malformed,
    unstorable_chat,
    user_agent_of,
)
from ingest.chat_secrets import MAX_PHONE_NUMBER_ID, ChatSecretStore
from ingest.errors import BodyError, BodyIncomplete, BodyTooLarge, BodyTooSlow
from ingest.headers import mask_needles, mask_text, masked, safe_headers
from ingest.incoming import DeliveryRequest, path_label
from ingest.json_body import parse_object
from ingest.metrics import IngestMetrics
from ingest.rejections import Refusal, RejectionLog
from ingest.text_repair import chat_identifying, repaired_object, with_repairs
from ingest.unstorable import is_unstorable, placeholder_payload
from ledger import LedgerError

SYSTEM = SOURCE
SIGNATURE_HEADER = "x-service-signature"
DELIVERY_ID_HEADER = "x-service-delivery-id"
ATTEMPT_HEADER = "x-service-attempt"
STALE_KEPT = 4096  # stale bodies remembered as kept whole, per process

log = structlog.get_logger("hookledger.ingest")


class ChatEndpoint:
    """Receives system B deliveries, each number verified with its own secret(s)."""

    def __init__(self, *, secrets: ChatSecretStore, tolerance_s: int, max_body_bytes: int,
                 appender: BatchingAppender, pool: AsyncConnectionPool,
                 metrics: IngestMetrics, rejected_keep: int = 100_000,
                 body_timeout_s: float = BODY_TIMEOUT_S,
                 error_causes: Mapping[str, int] = PLATFORM_ERROR_CAUSES,
                 answer_within_s: float | None = None,
                 known_secrets: Sequence[bytes] = ()) -> None:
        # every secret this process was given (the other endpoint's, the API key,
        # the admin token): masked in any refusal here, wherever a sender put it
        self._known_secrets = list(known_secrets)
        self._known_needles = mask_needles(self._known_secrets)  # once, not per request
        self._secrets = secrets
        self._tolerance_s = tolerance_s
        self._max_body = max_body_bytes
        self._body_timeout_s = body_timeout_s
        self._appender = appender
        self._pool = pool
        self._rejections = RejectionLog(pool, keep=rejected_keep,
                                        answer_within_s=answer_within_s)
        self._metrics = metrics
        self._outcomes = metrics.outcomes(SYSTEM)
        self._error_causes = dict(error_causes)
        # the digests of stale bodies kept whole lately (see the stale refusal below)
        self._stale_kept: OrderedDict[bytes, None] = OrderedDict()

    def _first_stale(self, body: bytes) -> bool:
        """Whether ``body`` is the first stale copy of itself among the last
        :data:`STALE_KEPT` this process kept whole."""
        digest = hashlib.sha256(body).digest()
        if digest in self._stale_kept:
            self._stale_kept.move_to_end(digest)
            return False
        self._stale_kept[digest] = None
        if len(self._stale_kept) > STALE_KEPT:
            self._stale_kept.popitem(last=False)
        return True

    async def __call__(self, request: DeliveryRequest) -> Response | responses.Accepted:
        received_at = datetime.now(UTC)
        phone_number_id = request.path_params["phone_number_id"]
        endpoint = mask_text(f"chat/{path_label(phone_number_id, MAX_PHONE_NUMBER_ID * 2)}",
                             self._known_needles)
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(endpoint=endpoint)
        headers = safe_headers(request.headers.items())
        encoding = request.headers.get("content-encoding", "identity").strip().lower()

        secrets: list[tuple[str, bytes]] = []

        def refusal(status: int, reason: str, detail: str | None, body: bytes, size: int,
                    verified: bool) -> Refusal:
            client = request.client.host if request.client else None
            return Refusal(received_at, endpoint, reason, detail, verified, status, body, size,
                           masked(headers, [*self._known_secrets,
                                            *(secret for _, secret in secrets)]), client)

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

        try:
            secrets = await self._secrets.valid_secrets(phone_number_id, received_at)
        except LedgerError as exc:
            log.error("delivery.unavailable", error=str(exc), stage="secrets")
            return responses.unavailable()
        if not secrets:
            return await self._refuse(
                refusal(401, "unknown_phone_number", None, body, len(body), False))
        try:
            label = chat_signature.verify(
                body, request.headers.get(SIGNATURE_HEADER), secrets,
                now=received_at.timestamp(), tolerance_s=self._tolerance_s)
        except chat_signature.ChatSignatureError as exc:
            # a stale signature is raised only once it matched: the bytes are authentic,
            # and kept as a verified body is (64 KiB, not a 1 KiB prefix), so that a
            # delivery refused six times over a skewed clock can still be recovered. Only
            # its first copy lately: anyone holding one genuine delivery can replay it
            # stale for ever, and each copy kept whole grew the table 64 times as fast
            authentic = exc.reason == "stale_timestamp"
            refused = refusal(401, exc.reason, None, body, len(body), authentic)
            if authentic and not self._first_stale(body):
                refused = replace(refused, short=True)
            return await self._refuse(refused)
        # after the signature, as for general deliveries (see there)
        if encoding not in ("identity", ""):
            return await self._refuse(refusal(415, "unsupported_content_encoding",
                                              encoding[:64], body, len(body), True))

        raw_delivery_id = request.headers.get(DELIVERY_ID_HEADER)
        meta = DeliveryMeta(
            phone_number_id=phone_number_id,
            delivery_id=delivery_id_of(raw_delivery_id),
            attempt=attempt_of(request.headers.get(ATTEMPT_HEADER)),
            user_agent=user_agent_of(request.headers.get("user-agent")),
            delivery_id_unusable=delivery_id_unusable(raw_delivery_id),
        )
        if meta.delivery_id_unusable:
            log.warning("delivery.unusable_delivery_id",
                        detail="keyed by the body's digest instead")
        try:
            try:
                parsed, text = parse_object(body)
            except BodyError as exc:
                if not is_unstorable(exc):
                    raise
                # a JSON object jsonb cannot hold: read with its describing text mended,
                # or else kept by its raw bytes; never refused
                if (repaired := repaired_object(body, exc, chat_identifying)) is not None:
                    delivery, text = with_repairs(read_chat_or_malformed(
                        repaired.body, meta, error_causes=self._error_causes), repaired), \
                        repaired.text
                else:
                    delivery, text = unstorable_chat(body, meta, exc), placeholder_payload(exc)
            else:
                delivery = read_chat_or_malformed(parsed, meta, error_causes=self._error_causes)
        except BodyError as exc:
            return await self._refuse(refusal(400, exc.reason, exc.detail, body, len(body), True))
        if delivery.event_type == MALFORMED_EVENT_TYPE:
            log.warning("delivery.malformed", reason=delivery.facts["reason"],
                        detail=delivery.facts["detail"])

        structlog.contextvars.bind_contextvars(
            delivery_id=meta.delivery_id, attempt=meta.attempt,
            message_id=delivery.facts.get("message_id"), event_type=delivery.event_type,
            verified_by=label)

        envelope = Envelope(SOURCE, received_at, body, headers, endpoint, label)
        return await append_and_answer(
            self._appender.append, envelope, delivery, text,
            lambda refused: unstorable_chat(body, meta, refused),
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
