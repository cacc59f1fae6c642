"""Reading a verified chat (system B) body into normalised facts. Pure.

Branch first on the top-level ``type``: ``message`` (an inbound customer message) or
``status`` (what became of a message we sent). Either way the ledger stream is
``chat-message:{id}``: the inbound message's id, or ``status.id``, which is the id of the
sent message, so every status of one message lands in one stream.

* The 95xxx code is derived (the body carries none): sent 95000, delivered 95001, read
  95002, inbound 95003, failed 95050 unless ``errors[0].code`` is a known platform error
  (:data:`PLATFORM_ERROR_CAUSES`, replaceable by the caller). ``errors`` is read where the
  spec puts it (top level), else inside ``status``, where the platform itself puts it.
* A verified delivery is never dropped: an unknown top-level ``type`` or an unknown status
  value is kept as ``chat.unrecognised`` (``recognised: false``), so no projection applies
  it blindly. An inbound message of a kind the spec does not show (e.g. ``location``) is
  still an inbound message (it opens the 24-hour window) and is kept as received, flagged
  ``message_type_known: false``.
* A known type whose fields have the wrong JSON types, or that lacks the id it is filed
  under, is a :class:`BodyError` naming the field; :func:`read_chat_or_malformed` keeps it
  as ``chat.malformed`` (never projected, reported as a discrepancy), because the platform
  would send the same body five times and then give up on it. That is only for what a
  state is decided on: the ids (``message.id``, ``status.id``, ``phoneNumberId``, and the
  customer's ``contactWaId`` / ``message.from``, which key the thread and its 24-hour
  window), ``type``, ``status.status`` and the times. What only explains or describes
  (``errors``, ``wabaId``, ``profileName``, ``status.recipient_id``, the message's text or
  media id) is read leniently instead: a shape not expected costs that detail (named in
  ``unread_fields``), never the message or its status. A ``phoneNumberId`` that is
  not the number of the URL (whose secret verified it) is ``phone_number_mismatch``: that
  one is refused (400), as a delivery meant for another number.

The dedupe key
--------------
``chat:`` + ``X-Service-Delivery-Id`` when the header is there. The spec names it as the
stable id of the event, the same on every retry, and tells receivers to deduplicate on it;
it does not depend on how the body is serialised, and the body is "the chat platform's own
message object, forwarded as-is", whose fields we do not control and may not all be stable
between attempts. The header is not covered by the signature: someone replaying a captured
delivery inside the signature tolerance with a new id adds a second copy of a genuine event
to the ledger. That is bounded (the tolerance window), never loses anything, and harmless
downstream because projections key on ``message.id`` / ``status.id`` and statuses never move
backwards; ``content_sha256`` in the facts lets such copies be recognised.

Without the header (a proxy stripped it, or a hand-made test delivery) the key is the
SHA-256 of the body's canonical form (keys sorted, numbers normalised) without
:data:`VOLATILE_FIELDS`: re-sent copies of one event still fold into one, whatever their
whitespace or key order, and two different events never do. The spec puts everything
per-attempt (attempt number, delivery id) in headers, so no body field is known to be
volatile; the set exists so that one found later can be added without changing the key's
form. The two key forms never collide (``chat:delivery:`` / ``chat:body:``) and never fold a
copy with the header into one without it, which costs at worst one extra ledger event.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from ingest.codes import CODES, is_failure_code
from ingest.errors import BodyError
from ingest.json_body import number_text, whole_number
from ingest.unstorable import lenient_object, raw_digest, storable_text

SOURCE = "chat"
UNRECOGNISED_EVENT_TYPE = "chat.unrecognised"
MALFORMED_EVENT_TYPE = "chat.malformed"
RECEIVED_EVENT_TYPE = "chat.message.received"
MESSAGE_KINDS = frozenset({"text", "image", "document", "audio", "video"})
MEDIA_KINDS = frozenset({"image", "document", "audio", "video"})
VOLATILE_FIELDS: frozenset[str] = frozenset()
MAX_ID = 512
MAX_TEXT = 64 * 1024  # a chat text body is far shorter; the request limit bounds it anyway
MAX_TIMESTAMP_DIGITS = 11  # up to year 5138: datetime can hold it
MAX_DELIVERY_ID = 256
MAX_USER_AGENT = 256

INBOUND_CODE = 95003
FAILED_CODE = 95050
# the provider's listed chat failure causes (95050-95099)
CHAT_FAILURE_CODES = frozenset(code for code in CODES if code // 1000 == 95
                                and is_failure_code(code))
# status value -> (event type, code)
STATUSES: dict[str, tuple[str, int]] = {
    "sent": ("chat.message.sent", 95000),
    "delivered": ("chat.message.delivered", 95001),
    "read": ("chat.message.read", 95002),
    "failed": ("chat.message.failed", FAILED_CODE),
}

PLATFORM_ERROR_CAUSES: Mapping[str, int] = {
    # the chat platform's error codes (errors[0].code) -> the provider's 95xxx cause.
    # Number cannot receive chat messages
    "131026": 95057,  # message undeliverable (not on the platform, old client, ...)
    # Chat platform rate limit reached
    "4": 95058, "80007": 95058, "130429": 95058, "131048": 95058, "131056": 95058,
    # Account locked or restricted
    "368": 95059, "131031": 95059,
    # 24-hour service window closed
    "131047": 95063,
    # Recipient opted out, or the platform withheld it
    "130472": 95064, "131049": 95064, "131050": 95064,
    # Template rejected, missing, paused, or parameters mismatched
    "132000": 95065, "132001": 95065, "132005": 95065, "132007": 95065, "132012": 95065,
    "132015": 95065, "132016": 95065,
    # Billing problem on the business account
    "131042": 95066,
}
"""Default mapping; callers pass their own to follow the platform's table."""


@dataclass(frozen=True, slots=True)
class DeliveryMeta:
    """What the request says about a delivery outside its body (headers, URL)."""

    phone_number_id: str
    delivery_id: str | None = None
    attempt: int | None = None
    user_agent: str | None = None
    delivery_id_unusable: bool = False  # sent but unusable: keyed by the body instead


@dataclass(frozen=True, slots=True)
class ChatDelivery:
    """A verified chat delivery, read."""

    event_type: str
    stream: str
    dedupe_key: str
    occurred_at: datetime | None
    facts: dict[str, Any]


# -- header values --------------------------------------------------------------------------

def delivery_id_of(raw: str | None) -> str | None:
    """The ``X-Service-Delivery-Id``, or None when blank, unprintable or over-long.

    An unusable id is not refused: the platform would resend the same header five times and
    then give up, losing a signed event. The key falls back to the body's digest instead
    (copies still fold into one) and :func:`delivery_id_unusable` flags it in the facts.
    """
    if raw is None:
        return None
    value = raw.strip()
    if not value or len(value) > MAX_DELIVERY_ID or not value.isascii() \
            or not value.isprintable():
        return None
    return value


def delivery_id_unusable(raw: str | None) -> bool:
    """A header was sent, not blank, yet :func:`delivery_id_of` could not use it."""
    return raw is not None and raw.strip() != "" and delivery_id_of(raw) is None


def attempt_of(raw: str | None) -> int | None:
    """``X-Service-Attempt`` as a number; anything else is recorded as unknown, not refused."""
    if raw is None:
        return None
    value = raw.strip()
    if 0 < len(value) <= 4 and value.isascii() and value.isdigit():
        return int(value)
    return None


def user_agent_of(raw: str | None) -> str | None:
    return None if raw is None else raw[:MAX_USER_AGENT]


# -- the dedupe key -------------------------------------------------------------------------

def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | Decimal):
        return {"#n": number_text(value)}
    return value


def content_sha256(body: Mapping[str, Any]) -> str:
    """SHA-256 of the body's canonical form without :data:`VOLATILE_FIELDS`."""
    significant = {k: v for k, v in body.items() if k not in VOLATILE_FIELDS}
    text = json.dumps(_canonical(significant), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def dedupe_key(delivery_id: str | None, digest: str) -> str:
    if delivery_id is not None:
        return f"chat:delivery:{delivery_id}"
    return f"chat:body:{digest}"


# -- typed field readers: each raises BodyError naming the field ---------------------------

def _text(block: Mapping[str, Any], key: str, where: str, *, required: bool = False,
          limit: int = MAX_ID) -> str | None:
    value = block.get(key)
    if value is None:
        if required:
            raise BodyError("missing_field", f"{where}{key} is required")
        return None
    if not isinstance(value, str):
        raise BodyError("invalid_field", f"{where}{key} must be a string")
    if len(value) > limit:
        raise BodyError("invalid_field", f"{where}{key} is longer than {limit}")
    if required and not value.strip():
        raise BodyError("invalid_field", f"{where}{key} must not be empty")
    return value


def _object(block: Mapping[str, Any], key: str, where: str, *,
            required: bool = False) -> dict[str, Any] | None:
    value = block.get(key)
    if value is None:
        if required:
            raise BodyError("missing_field", f"{where}{key} is required")
        return None
    if not isinstance(value, dict):
        raise BodyError("invalid_field", f"{where}{key} must be an object")
    return value


def parse_unix_seconds(raw: str, field: str) -> datetime:
    """Unix seconds as text (the platform's form) -> an aware UTC datetime."""
    if not 0 < len(raw) <= MAX_TIMESTAMP_DIGITS or not (raw.isascii() and raw.isdigit()):
        raise BodyError("invalid_field", f"{field} must be Unix seconds as digits")
    return datetime.fromtimestamp(int(raw), UTC)


def _timestamp(block: Mapping[str, Any], where: str) -> tuple[str | None, datetime | None]:
    raw = _text(block, "timestamp", where)
    if raw is None:
        return None, None
    return raw, parse_unix_seconds(raw, f"{where}timestamp")


def _error_code(value: Any) -> str | None:
    """``errors[0].code``: the spec says "code"; the platform sends a number. Kept as text,
    a whole number written with a fraction (``131047.0``) as the whole number."""
    if value is None:
        return None
    value = whole_number(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BodyError("invalid_field", "errors[0].code must be a number or a string")
    text = str(value).strip()
    if len(text) > 64:
        raise BodyError("invalid_field", "errors[0].code is longer than 64")
    return text or None


def _first_error(body: Mapping[str, Any]) -> tuple[str | None, str | None]:
    errors = body.get("errors")
    if errors is None:
        return None, None
    if not isinstance(errors, list):
        raise BodyError("invalid_field", "errors must be a list")
    if not errors:
        return None, None
    first = errors[0]
    if not isinstance(first, dict):
        raise BodyError("invalid_field", "errors[0] must be an object")
    title = first.get("title")
    readable_title = title if isinstance(title, str) and len(title) <= MAX_TEXT else None
    return _error_code(first.get("code")), readable_title


def _status_error(body: Mapping[str, Any],
                  status: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The spec's ``errors`` (top level), else the chat platform's own place for them,
    inside the status object it forwards as-is. Without that second look a failure the
    platform explained there is filed as 95050, "no detail", and a closed 24-hour window
    (95063) or an opted-out customer goes unseen.

    Both are read leniently: they explain a status, they do not decide it. A shape we did
    not expect costs its detail (the cause is then 95050), never the delivery: kept as
    malformed, a ``failed`` status, which is terminal, was never projected, and the
    message stayed ``sent``."""
    for holder in (body, status):
        try:
            found = _first_error(holder)
        except BodyError:
            continue
        if found != (None, None):
            return found
    return None, None


def failure_code(error_code: str | None, causes: Mapping[str, int]) -> int:
    """95050 unless the platform's error code maps to a known 95xxx cause, or already is a
    listed chat failure code (the provider's own, passed on as the cause)."""
    if error_code is None:
        return FAILED_CODE
    if error_code in causes:
        return causes[error_code]
    if error_code.isascii() and error_code.isdigit() and int(error_code) in CHAT_FAILURE_CODES:
        return int(error_code)
    return FAILED_CODE


# -- reading --------------------------------------------------------------------------------

def _check_phone_number(body: Mapping[str, Any], meta: DeliveryMeta) -> None:
    claimed = body.get("phoneNumberId")
    # a number sent as a JSON number is still compared: another number is refused, the
    # same one only has the wrong type (and is kept, malformed)
    if isinstance(claimed, str | int) and not isinstance(claimed, bool) \
            and str(claimed) != meta.phone_number_id:
        raise BodyError("phone_number_mismatch",
                        "body phoneNumberId is not the number of the URL")
    _text(body, "phoneNumberId", "")


def _described(block: Mapping[str, Any], key: str, where: str, unread: list[str], *,
               limit: int = MAX_ID) -> str | None:
    """A field that only describes and decides no state: text as it is, a number as its
    text; anything else (an object, a list, a boolean, text past ``limit``) left out and
    named in ``unread``. Read strictly, it turned the whole delivery into ``chat.malformed``,
    which is never projected: a ``failed`` status lost, a 24-hour window never opened."""
    value = block.get(key)
    if value is None:
        return None
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        value = number_text(value)
    if isinstance(value, str) and len(value) <= limit:
        return value
    unread.append(f"{where}{key}")
    return None


def _common(body: Mapping[str, Any], meta: DeliveryMeta, digest: str,
            unread: list[str] | None = None) -> dict[str, Any]:
    """Facts every chat delivery carries. ``wabaId`` only names the business account: read
    leniently into ``unread`` for a delivery being read; for one kept unread (malformed,
    unrecognised, unstorable), only text ``jsonb`` can hold is taken."""
    waba_id = (_described(body, "wabaId", "", unread) if unread is not None
               else storable_text(body.get("wabaId"), MAX_ID))
    return {
        "waba_id": waba_id,
        "phone_number_id": meta.phone_number_id,
        "delivery_id": meta.delivery_id,
        "delivery_id_unusable": meta.delivery_id_unusable,
        "attempt": meta.attempt,
        "user_agent": meta.user_agent,
        "content_sha256": digest,
    }


def read_chat(body: Mapping[str, Any], meta: DeliveryMeta, *,
              error_causes: Mapping[str, int] = PLATFORM_ERROR_CAUSES) -> ChatDelivery:
    """Normalise a verified body; raise :class:`BodyError` when a known type is malformed."""
    digest = content_sha256(body)
    key = dedupe_key(meta.delivery_id, digest)
    _check_phone_number(body, meta)
    kind = body.get("type")
    if kind == "message":
        return _message(body, meta, digest, key)
    if kind == "status":
        return _status(body, meta, digest, key, error_causes)
    return _unrecognised(body, meta, digest, key, kind if isinstance(kind, str) else None)


def read_chat_or_malformed(body: Mapping[str, Any], meta: DeliveryMeta, *,
                           error_causes: Mapping[str, int] = PLATFORM_ERROR_CAUSES
                           ) -> ChatDelivery:
    """Like :func:`read_chat`, but a known type whose fields cannot be read is kept as
    ``chat.malformed``; only a body meant for another number is still refused."""
    try:
        return read_chat(body, meta, error_causes=error_causes)
    except BodyError as exc:
        if exc.reason == "phone_number_mismatch":
            raise
        return _malformed(body, meta, exc)


def _malformed(body: Mapping[str, Any], meta: DeliveryMeta, error: BodyError) -> ChatDelivery:
    kind = body.get("type")
    return _kept_malformed(body, meta, error, content_sha256(body),
                           kind[:64] if isinstance(kind, str) else None,
                           _findable_message_id(body))


def unstorable_chat(raw: bytes, meta: DeliveryMeta, error: BodyError) -> ChatDelivery:
    """A signed JSON object strict reading refused (:mod:`ingest.unstorable`), kept as
    ``chat.malformed`` with only text ``jsonb`` can hold in its facts; a body naming
    another number is still refused."""
    body = lenient_object(raw)
    try:
        _check_phone_number(body, meta)
    except BodyError as exc:
        if exc.reason == "phone_number_mismatch":
            raise
    return _kept_malformed(body, meta, error, raw_digest(raw),
                           storable_text(body.get("type"), 64),
                           storable_text(_findable_message_id(body), MAX_ID),
                           unstorable=True)


def _kept_malformed(body: Mapping[str, Any], meta: DeliveryMeta, error: BodyError,
                    digest: str, kind: str | None, message_id: str | None, *,
                    unstorable: bool = False) -> ChatDelivery:
    """A ``chat.malformed`` event, filed with its message when its id can be found."""
    facts = {
        **_common(body, meta, digest),
        "recognised": False,
        "malformed": True,
        **({"unstorable": True} if unstorable else {}),
        "reason": error.reason,
        "detail": error.detail,
        "subject": "chat",
        "kind": kind,
        "message_id": message_id,
    }
    stream = (f"chat-message:{message_id}" if message_id
              else f"chat-malformed:{meta.phone_number_id}")
    return ChatDelivery(MALFORMED_EVENT_TYPE, stream, dedupe_key(meta.delivery_id, digest),
                        None, facts)


def _findable_message_id(body: Mapping[str, Any]) -> str | None:
    for block_name in ("message", "status"):
        block = body.get(block_name)
        candidate = block.get("id") if isinstance(block, dict) else None
        if isinstance(candidate, str) and candidate.strip() and len(candidate) <= MAX_ID:
            return candidate
    return None


def _described_in(message: Mapping[str, Any], block_name: str, field: str, limit: int,
                  unread: list[str]) -> str | None:
    """``message.<block_name>.<field>`` when it is text within ``limit``; else None, and its
    name in ``unread`` when something unreadable stood there."""
    block = message.get(block_name)
    if block is None:
        return None
    if not isinstance(block, dict):
        unread.append(f"message.{block_name}")
        return None
    value = block.get(field)
    if value is None or (isinstance(value, str) and len(value) <= limit):
        return value
    unread.append(f"message.{block_name}.{field}")
    return None


def _message(body: Mapping[str, Any], meta: DeliveryMeta, digest: str,
             key: str) -> ChatDelivery:
    message = _object(body, "message", "", required=True)
    assert message is not None
    where = "message."
    message_id = _text(message, "id", where, required=True)
    message_type = _text(message, "type", where, required=True)
    assert message_id is not None and message_type is not None
    timestamp_raw, occurred_at = _timestamp(message, where)
    # strict: the customer's id (contactWaId, else message.from) keys the thread, whose
    # 24-hour window this message opens; read loosely, a message could open another's
    sender = _text(message, "from", where)
    # what the message says (its text, its media's id) and who sent it by name describe
    # it: an odd shape there is left out and named in unread_fields, never the message
    # (kept as malformed, it opened no 24-hour window and started no thread although the
    # customer had written)
    unread: list[str] = []
    text_body: str | None = None
    media_id: str | None = None
    if message_type == "text":
        text_body = _described_in(message, "text", "body", MAX_TEXT, unread)
    else:  # the platform's shape: message.image.id, message.document.id, ...; a kind the
        # spec does not show likewise, when it is there. What the customer wrote under a
        # photo or a file is its caption, beside the id: what such a message says (left
        # out, chat_messages showed a captioned receipt with no body at all)
        media_id = _described_in(message, message_type, "id", MAX_ID, unread)
        if isinstance(message.get(message_type), dict):  # else named once, above
            text_body = _described_in(message, message_type, "caption", MAX_TEXT, unread)
    facts = {
        **_common(body, meta, digest, unread),
        "recognised": True,
        "kind": "message",
        "direction": "inbound",
        "message_id": message_id,
        "contact_wa_id": _text(body, "contactWaId", "") or sender,
        "profile_name": _described(body, "profileName", "", unread),
        "from": sender,
        "message_type": message_type,
        "message_type_known": message_type in MESSAGE_KINDS,
        "body": text_body,
        "media_id": media_id,
        "status": "received",
        "code": INBOUND_CODE,
        "error_code": None,
        "error_title": None,
        "timestamp_raw": timestamp_raw,
        "occurred_at": occurred_at.isoformat() if occurred_at else None,
    }
    if unread:
        facts["unread_fields"] = unread
    return ChatDelivery(RECEIVED_EVENT_TYPE, f"chat-message:{message_id}", key, occurred_at,
                        facts)


def _status(body: Mapping[str, Any], meta: DeliveryMeta, digest: str, key: str,
            causes: Mapping[str, int]) -> ChatDelivery:
    status = _object(body, "status", "", required=True)
    assert status is not None
    where = "status."
    message_id = _text(status, "id", where, required=True)
    value = _text(status, "status", where, required=True)
    assert message_id is not None and value is not None
    if value not in STATUSES:
        return _unrecognised(body, meta, digest, key, "status", message_id=message_id,
                             status=value)
    event_type, code = STATUSES[value]
    timestamp_raw, occurred_at = _timestamp(status, where)
    error_code, error_title = _status_error(body, status)
    if value == "failed":
        code = failure_code(error_code, causes)
    # a status opens no thread: its recipient only describes the message (lenient)
    unread: list[str] = []
    facts = {
        **_common(body, meta, digest, unread),
        "recognised": True,
        "kind": "status",
        "direction": "outbound",
        "message_id": message_id,
        "contact_wa_id": _described(status, "recipient_id", where, unread),
        "message_type": None,
        "body": None,
        "media_id": None,
        "status": value,
        "code": code,
        "error_code": error_code,
        "error_title": error_title,
        "timestamp_raw": timestamp_raw,
        "occurred_at": occurred_at.isoformat() if occurred_at else None,
    }
    if unread:
        facts["unread_fields"] = unread
    return ChatDelivery(event_type, f"chat-message:{message_id}", key, occurred_at, facts)


def _unrecognised(body: Mapping[str, Any], meta: DeliveryMeta, digest: str, key: str,
                  kind: str | None, *, message_id: str | None = None,
                  status: str | None = None) -> ChatDelivery:
    """Kept, flagged, and filed under the message when an id can be found, never dropped."""
    if message_id is None:
        message_id = _findable_message_id(body)
    facts = {
        **_common(body, meta, digest),
        "recognised": False,
        "kind": kind[:64] if kind is not None else None,
        "message_id": message_id,
        "status": status,
    }
    stream = (f"chat-message:{message_id}" if message_id
              else f"chat-unrecognised:{meta.phone_number_id}")
    return ChatDelivery(UNRECOGNISED_EVENT_TYPE, stream, key, None, facts)
