"""The provider's chat API calls: rotate a number's secret, set its webhook URL, fetch media.

Every JSON answer is the envelope ``{success, code, message, data}``, read strictly: a body
that is not that shape is :class:`ChatApiMalformed`, ``success: false`` is
:class:`ChatApiRefused`; neither ever surfaces as a ``KeyError`` or a JSON error.

    ChatApiError               (an IngestError: ``reason`` + ``detail``)
    ├── ChatApiUnavailable     no usable answer: connection, timeout, 429, 5xx (retryable)
    ├── ChatApiRefused         the API answered ``success: false`` (carries ``code``)
    └── ChatApiMalformed       an answer that is not the envelope (or lacks the asked field)
        └── SecretFieldMissing a successful rotation whose answer lacks the secret's field

The API key travels in the ``apiToken`` header only. Error messages are built from our own
words, the HTTP status, and the provider's ``code``/``message`` with the key masked: never
from the request (headers) or from a transport exception's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ingest.bounded_read import ACCEPT_ENCODING, read_at_most
from ingest.errors import BodyError, IngestError
from ingest.hosts import is_loopback_host
from ingest.json_body import object_of_distinct_keys
from ledger.jsonenc import jsonb_safe

API_TOKEN_HEADER = "apiToken"
DEFAULT_TIMEOUT_S = 10.0
# the chat platform's largest media (a document) is 100 MB: nothing larger is one of its
MAX_MEDIA_BYTES = 100 * 1024 * 1024
MEDIA_DEADLINE_FACTOR = 6  # a media fetch's whole answer: this many timeouts at most
# a rotate or set-webhook answer is a few hundred bytes: read no further than this, and
# whole (connecting included) within this many timeouts
MAX_ANSWER_BYTES = 1024 * 1024
ANSWER_DEADLINE_FACTOR = 3
MAX_MESSAGE = 300
MASK = "[redacted]"


class ChatApiError(IngestError):
    """A chat API call did not do what was asked."""

    retryable = False

    def __init__(self, reason: str, detail: str | None = None, *, status: int | None = None,
                 code: int | None = None) -> None:
        super().__init__(reason, detail)
        self.status = status
        self.code = code


class ChatApiUnavailable(ChatApiError):
    """The API gave no usable answer (connection, timeout, 429 or 5xx); worth retrying."""

    retryable = True


class ChatApiRefused(ChatApiError):
    """The API answered ``success: false``."""


class ChatApiMalformed(ChatApiError):
    """The API answered something that is not the documented envelope."""


class SecretFieldMissing(ChatApiMalformed):
    """The provider rotated (``success: true``), but its answer has no string in the field
    the secret was looked for in. The spec does not name that field, so the setting may be
    wrong: the answer's ``data`` still holds the new secret, which the provider never
    shows again, so it travels out of here for the edge to keep (never in the message,
    args or repr)."""

    def __init__(self, field: str, data: dict[str, Any], *, code: int | None) -> None:
        self.fields = sorted(data)
        super().__init__(
            "no_secret_in_answer",
            f"the provider rotated, but its answer has no string data.{field} (fields: "
            f"{', '.join(self.fields)[:200]})", code=code)
        self.__data = data  # name-mangled, outside args: no repr/str/log shows it

    def reveal_data(self) -> dict[str, Any]:
        """The answer's ``data``, for the one place that keeps it for the operator."""
        return self.__data


@dataclass(frozen=True, slots=True)
class Envelope:
    """A successful API answer."""

    code: int
    message: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Media:
    content: bytes
    content_type: str


def _clean(text: str, api_key: str | None) -> str:
    """Provider text with the key masked (an echo must not leak it), shortened, and with
    what ``jsonb`` refuses escaped. Masked before it is cut: cut first, a key across the
    cut kept its first characters in clear. Escaped: a NUL or half an emoji in it made the
    ``chat.media.failed`` event that carries it unwritable, and every later fetch waited."""
    if api_key and len(api_key) >= 4:
        text = text.replace(api_key, MASK)
    return jsonb_safe(text[:MAX_MESSAGE])


def _json(body: bytes) -> Any:
    """``body`` as JSON, or None when it is none. Nested past the reader's depth is none
    too: RecursionError is no ValueError, and escaped as itself (a traceback from the
    commands, an admin route's 500, a media fetch failed as ``internal``). Pure."""
    try:  # a key named twice is no answer either: its last value would be a guess
        return json.loads(body, object_pairs_hook=object_of_distinct_keys)
    except (ValueError, RecursionError, BodyError):  # UnicodeDecodeError is a ValueError
        return None


def parse_envelope(status: int, body: bytes, *, api_key: str | None = None) -> Envelope:
    """Read an answer strictly; raise the error the answer amounts to. Pure."""
    parsed = _json(body)
    if not isinstance(parsed, dict):
        if status == 429 or status >= 500:
            raise ChatApiUnavailable("http_error", f"HTTP {status}", status=status)
        raise ChatApiMalformed("not_an_envelope", f"HTTP {status}, body is not a JSON object",
                               status=status)
    success, code, message = parsed.get("success"), parsed.get("code"), parsed.get("message")
    shaped = (isinstance(success, bool) and isinstance(code, int)
              and not isinstance(code, bool) and isinstance(message, str))
    if shaped and success is False:
        assert isinstance(message, str)
        kind: type[ChatApiError] = (ChatApiUnavailable if status == 429 or status >= 500
                                    else ChatApiRefused)
        raise kind("refused" if kind is ChatApiRefused else "unavailable",
                   f"HTTP {status}, code {code}: {_clean(message, api_key)}",
                   status=status, code=code)
    if not shaped or not isinstance(parsed.get("data"), dict):
        if status == 429 or status >= 500:
            raise ChatApiUnavailable("http_error", f"HTTP {status}", status=status)
        raise ChatApiMalformed("malformed_envelope",
                               f"HTTP {status}, envelope lacks success/code/message/data",
                               status=status)
    if not 200 <= status < 300:
        raise ChatApiMalformed("malformed_envelope",
                               f"HTTP {status} with success: true", status=status, code=code)
    assert isinstance(code, int) and isinstance(message, str)
    return Envelope(code, _clean(message, api_key), parsed["data"])


def _successful(status: int, body: bytes) -> dict[str, Any] | None:
    """The answer as a JSON object when it is a 2xx saying ``success: true``, whatever else
    its envelope holds or lacks; else None."""
    if not 200 <= status < 300:
        return None
    parsed = _json(body)
    return parsed if isinstance(parsed, dict) and parsed.get("success") is True else None


@contextlib.contextmanager
def _transport_errors(method: str, path: str) -> Iterator[None]:
    """httpx's failures to get an answer, as :class:`ChatApiUnavailable` (an outage)."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise ChatApiUnavailable("timeout", f"{method} {path}: {type(exc).__name__}") \
            from None
    except httpx.HTTPError as exc:  # the exception text may carry the request: not used
        raise ChatApiUnavailable("transport", f"{method} {path}: {type(exc).__name__}") \
            from None


def _is_json_type(content_type: str) -> bool:
    kind = content_type.split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


class ChatApi:
    """The three chat calls over one ``httpx.AsyncClient`` (explicit timeouts)."""

    def __init__(self, base_url: str, api_key: str | None, *,
                 rotate_secret_field: str = "secret", webhook_field: str = "webhookUrl",
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._base = base_url.rstrip("/")
        self._key = api_key
        self._secret_field = rotate_secret_field
        self._webhook_field = webhook_field
        headers = {"Accept-Encoding": ACCEPT_ENCODING}
        if api_key:
            headers[API_TOKEN_HEADER] = api_key
        self._timeout_s = timeout_s
        self._client = httpx.AsyncClient(
            headers=headers, transport=transport, follow_redirects=False,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)))

    async def __aenter__(self) -> ChatApi:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _read(self, method: str, path: str, *, limit: int, deadline_factor: int,
                    **kwargs: Any) -> tuple[int, httpx.Headers, bytes | None]:
        """Status, headers and body of an answer, the body read as it streams in, never
        past ``limit`` (None beyond it: decoded, each layer of its encoding within it as it
        is undone), and the whole answer within ``deadline_factor`` timeouts (the timeout
        bounds each wait for a byte only: one trickled a byte at a time held the caller for
        as long as the provider liked)."""
        deadline_s = self._timeout_s * deadline_factor
        try:
            with _transport_errors(method, path):
                async with asyncio.timeout(deadline_s):
                    async with self._client.stream(method, self._base + path,
                                                   **kwargs) as response:
                        return (response.status_code, response.headers,
                                await read_at_most(response, limit))
        except TimeoutError:
            raise ChatApiUnavailable("timeout", f"{method} {path}: not all sent within "
                                     f"{deadline_s:g} s") from None

    async def _send(self, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
        """The status and body of an envelope answer, read no further than
        :data:`MAX_ANSWER_BYTES` and within :data:`ANSWER_DEADLINE_FACTOR` timeouts in all:
        read whole, a huge answer (or a small gzip body that decodes to one) was held in
        memory, and one trickled a byte at a time held the command, and a rotation its
        number's lock, for as long as the provider liked."""
        status, _, content = await self._read(method, path, limit=MAX_ANSWER_BYTES,
                                              deadline_factor=ANSWER_DEADLINE_FACTOR,
                                              **kwargs)
        if content is None:
            raise ChatApiMalformed("too_large", f"HTTP {status}: an answer over "
                                   f"{MAX_ANSWER_BYTES} bytes", status=status)
        return status, content

    async def _call(self, method: str, path: str, **kwargs: Any) -> Envelope:
        status, content = await self._send(method, path, **kwargs)
        return parse_envelope(status, content, api_key=self._key)

    async def rotate_secret(self, phone_number_id: str) -> str:
        """Ask for a new secret. It is shown this once: the caller must keep it at once."""
        if not self._key:
            raise ChatApiRefused("no_api_key", "HOOKLEDGER_API_KEY is not set")
        path = f"/api/v1/waba/webhook-secrets/{quote(phone_number_id, safe='')}/rotate"
        status, content = await self._send("POST", path)
        try:
            envelope = parse_envelope(status, content, api_key=self._key)
        except ChatApiMalformed:
            answer = _successful(status, content)
            if answer is None:
                raise
            # the provider says it rotated, in an envelope not quite as documented (no
            # code, a null message): the secret in it is shown this once, so it is read
            # or kept all the same, never thrown away with the answer
            data = answer.get("data")
            kept = data if isinstance(data, dict) else answer
            secret = kept.get(self._secret_field) if isinstance(data, dict) else None
            if isinstance(secret, str) and secret:
                return secret
            raise SecretFieldMissing(self._secret_field, kept, code=None) from None
        secret = envelope.data.get(self._secret_field)
        if not isinstance(secret, str) or not secret:
            raise SecretFieldMissing(self._secret_field, envelope.data, code=envelope.code)
        return secret

    async def set_webhook(self, phone_number_id: str, url: str) -> Envelope:
        """Point the number's chat webhook at ``url``; the answer's message is for people."""
        path = f"/api/v1/waba/phone-numbers/{quote(phone_number_id, safe='')}"
        return await self._call("PATCH", path, json={self._webhook_field: url})

    async def fetch_media(self, media_id: str) -> Media:
        """The bytes of an inbound message's media and their content type.

        Read as it streams in, never past :data:`MAX_MEDIA_BYTES` (decoded, and each layer
        of its encoding within it as it is undone: a small gzip body once grew to gigabytes
        in memory, in the process that answers webhooks), and
        within :data:`MEDIA_DEADLINE_FACTOR` timeouts in all (the timeout bounds each wait
        for a byte only: an answer trickled a byte at a time held the worker, and every
        media behind it, for as long as the provider liked)."""
        if media_id.strip() in ("", ".", ".."):
            # a path segment the URL would resolve away: '..' asked GET /api/v1/waba/media
            # with the API key, '.' /api/v1/waba/messages/media. Never a media's id
            raise ChatApiRefused("invalid_media_id", f"media id {media_id!r} names no media")
        path = f"/api/v1/waba/messages/{quote(media_id, safe='')}/media"
        status, headers, content = await self._read("GET", path, limit=MAX_MEDIA_BYTES,
                                                    deadline_factor=MEDIA_DEADLINE_FACTOR)
        if content is None:
            raise ChatApiRefused("media_too_large", f"HTTP {status}: more than "
                                 f"{MAX_MEDIA_BYTES} bytes", status=status)
        if _is_json_type(headers.get("content-type", "")):
            # errors come as an envelope; so would a JSON answer that is one (success or
            # not): media bytes were asked for, an envelope is never taken as them
            parsed = _json(content)
            if parsed is None or (isinstance(parsed, dict) and "success" in parsed):
                parse_envelope(status, content, api_key=self._key)
                raise ChatApiMalformed("envelope_instead_of_media",
                                       f"HTTP {status}: an envelope, not media bytes",
                                       status=status)
        if status == 429 or status >= 500:
            raise ChatApiUnavailable("http_error", f"HTTP {status}", status=status)
        if not 200 <= status < 300:
            raise ChatApiRefused("http_error", f"HTTP {status}", status=status)
        content_type = headers.get("content-type", "application/octet-stream")
        return Media(content, content_type.split(";")[0].strip()[:100])


def webhook_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a chat webhook URL, or None. Pure.

    https, except on a loopback host (local development against the sandbox).
    """
    if not url.isprintable() or " " in url:
        return "not a valid URL"
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        return "not a valid URL"
    if not parsed.host:
        return "not an absolute URL"
    loopback = is_loopback_host(parsed.host)
    if parsed.scheme == "https":
        return None
    if parsed.scheme == "http" and loopback:
        return None
    if parsed.scheme == "http":
        return "the URL must use https (http is allowed for loopback hosts only)"
    return f"unsupported scheme {parsed.scheme!r}"


CHAT_WEBHOOK_PATH = "/webhooks/chat/"


def webhook_path_warning(url: str, phone_number_id: str) -> str | None:
    """Why deliveries to ``url`` may not verify as ``phone_number_id``'s, or None. Pure.

    hookledger verifies a chat delivery with the secrets of the number its path names, so a
    URL naming another number (or none) has every delivery refused (401, or 404 off the chat
    route) until the provider gives up retrying. A proxy in front may map a path of its own
    there, so this warns rather than refuses. One trailing slash is fine: the receiver
    takes the path as without it. Call it on a URL :func:`webhook_url_problem` accepted.
    """
    expected = CHAT_WEBHOOK_PATH + phone_number_id
    path = httpx.URL(url).path
    if path.endswith(expected) or path.endswith(expected + "/"):
        return None
    return (f"the URL's path does not end in {expected}: hookledger verifies a chat delivery "
            f"with the secret of the number its path names, so deliveries sent there are "
            f"refused unless a proxy in front maps that path to {expected}")
