"""The reference API client: ``GET {base}/api/v1/payment/reference/{reference}``.

Every lookup ends in a :class:`Lookup` (found, not found, or an error with its reason); it
never raises for what the network or the provider does, so one bad answer cannot stop a
pass. Explicit timeouts, for each read and for a whole request (an answer trickled in a
byte at a time, each read within the read timeout, would otherwise hold a pass, and its
lock, for as long as it lasts); retries with exponential backoff and full jitter on timeouts,
connection errors, 5xx, 429 (honouring ``Retry-After``, capped) and malformed envelopes;
at most ``concurrency`` requests in flight. A 429 pauses the whole client, not only the
lookup it answered: the provider limits the caller, and lookups that went on asking
meanwhile would only be refused in turn and use up their attempts. A refused API key (401
whatever the body, a 403 without the API's envelope, or an envelope code of the
authentication service, 4xxxx, whatever the status) is error ``key_refused``, never retried,
and lookups that share a ``stop`` event ask nothing more once one of them meets it (error
``stopped``): a key the provider refuses is refused on every lookup, and each one more asked
with it is only one more refusal (a provider may lock the key out after enough of them). The
API key goes in the ``apiToken`` header and nowhere else: errors name the reference and the
HTTP status, never headers, and a provider's words kept in a lookup have the key masked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, replace
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any, Literal
from urllib.parse import quote

import httpx

from ingest.bounded_read import ACCEPT_ENCODING, read_at_most
from ingest.errors import BodyError
from ingest.json_body import object_of_distinct_keys
from ledger.jsonenc import decimal_or_text, jsonb_safe
from reconcile.errors import (
    ApiKeyRefused,
    ApiRefused,
    ApiUnavailable,
    MalformedEnvelope,
    MappingError,
)
from reconcile.records import CODE_RANGE, ProviderRecord, RecordMapping

LookupKind = Literal["found", "not_found", "error"]
REFERENCE_PATH = "/api/v1/payment/reference/{reference}"
MAX_RETRY_AFTER_S = 30.0
# a payment's record is a few hundred bytes; an answer past this (decoded, every layer of
# its encoding undone within it: ingest.bounded_read) is read no further: read whole, a
# huge or endless answer (or a gzip bomb) held a pass's memory, with up to ``concurrency``
# of them at once, inside ``serve``
MAX_ANSWER_BYTES = 1024 * 1024
# answers refusing who asks, not what is asked: a wrong, revoked or expired key. The API's
# HTTP statuses are not in the spec, so a refused key may come as a 200 or 400 carrying
# 40101 as well as a 401. A 403 counts without the API's envelope (a gateway's page); in
# it, only with the authentication service's code (another is about the request)
KEY_REFUSED_STATUSES = frozenset({401, 403})
AUTHENTICATION_CODES = range(40000, 50000)  # the spec's 4xxxx
KEY_REFUSED = "key_refused"  # a lookup's error: the provider refused the API key
STOPPED = "stopped"  # a lookup's error: not asked (again), its ``stop`` was set first


@dataclass(frozen=True, slots=True)
class Lookup:
    """The answer about one reference, after retries."""

    reference: str
    kind: LookupKind
    record: ProviderRecord | None = None
    # a reason code: unavailable, malformed_envelope, refused, key_refused, stopped, ...
    error: str | None = None
    detail: str | None = None
    api_code: int | None = None
    attempts: int = 1
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Envelope:
    success: bool
    code: int
    message: str
    data: dict[str, Any]


def parse_envelope(body: bytes) -> Envelope:
    """Strictly: a JSON object with success (bool), code (int), message (str), data (object),
    no object anywhere in it naming a key twice."""
    try:
        # a key named twice is refused, as ingest refuses it: read with its last value,
        # {"status": "FAILED", ..., "status": "SUCCESSFUL"} was recovered as a success
        value = json.loads(body, parse_float=decimal_or_text,
                           object_pairs_hook=object_of_distinct_keys)
    except BodyError as exc:
        raise MalformedEnvelope("the answer names a key twice in one object") from exc
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # nested past the reader
        raise MalformedEnvelope("the answer is not JSON") from exc
    if not isinstance(value, dict):
        raise MalformedEnvelope("the answer is not a JSON object")
    success, code, message = value.get("success"), value.get("code"), value.get("message")
    data = value.get("data")
    if not isinstance(success, bool):
        raise MalformedEnvelope("envelope field success is missing or not a boolean")
    if isinstance(code, bool) or not isinstance(code, int):
        raise MalformedEnvelope("envelope field code is missing or not an integer")
    if code not in CODE_RANGE:
        raise MalformedEnvelope("envelope field code is out of range")
    if not isinstance(message, str):
        raise MalformedEnvelope("envelope field message is missing or not a string")
    if data is None and not success:
        data = {}
    if not isinstance(data, dict):
        raise MalformedEnvelope("envelope field data is missing or not an object")
    # the message is kept in events as information: what jsonb refuses is escaped
    return Envelope(success, code, jsonb_safe(message), data)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds (delta or HTTP date), capped; None when absent or bad."""
    if not value:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():  # "²" is a digit to isdigit, not to float
        return min(float(text), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # asctime and "-0000" write no zone: an HTTP date is GMT, never
        when = when.replace(tzinfo=UTC)  # the process's local time (RFC 9110, 5.6.7)
    delta = when.timestamp() - (time.time() if now is None else now)
    return min(max(delta, 0.0), MAX_RETRY_AFTER_S)


MAX_DOUBLINGS = 62  # far past any cap; 2**1024 times a float overflowed


def backoff_delay(attempt: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]. The doubling stops at
    :data:`MAX_DOUBLINGS`: ``HOOKLEDGER_API_MAX_ATTEMPTS`` has no upper bound, and past about
    a thousand attempts the float product raised ``OverflowError`` inside a pass."""
    doublings = min(MAX_DOUBLINGS, max(0, attempt - 1))
    return rng.uniform(0.0, min(cap_s, base_s * (2 ** doublings)))


MAX_DETAIL = 300  # characters of a lookup's detail (a provider's message in it)
MASK = "[redacted]"


def masked(text: str | None, api_key: str | None) -> str | None:
    """A lookup's detail as it may be kept: the API key masked (a provider or proxy that
    echoes the request's headers in its message must not put it in the ledger), then cut
    to :data:`MAX_DETAIL` (masked first: cut first, a key across the cut kept its first
    characters in clear). Pure."""
    if text is None:
        return None
    if api_key and len(api_key) >= 4:
        text = text.replace(api_key, MASK)
    return text[:MAX_DETAIL]


RESUME_SPREAD_S = 0.25  # after a 429's pause, lookups resume spread over this long


class _Retryable(Exception):
    def __init__(self, reason: str, detail: str, wait_s: float | None = None,
                 api_code: int | None = None) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.wait_s, self.api_code = reason, detail, wait_s, api_code


def path_segment(reference: str) -> str:
    """``reference`` as one path segment. ``quote`` leaves dots alone, so a reference of
    ``.`` or ``..`` was a dot segment, which the URL's normalisation removes: ``..`` asked
    ``/api/v1/payment`` and read its answer as that payment's. Written ``%2E`` they stay a
    name (RFC 3986, 3.3)."""
    segment = quote(reference, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """``asyncio.sleep``, cut short once ``stop`` is set (a pass's refused key)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class ReferenceClient:
    """Async client for the reference API; use as ``async with ReferenceClient(...)``."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 10.0,
                 connect_timeout_s: float = 5.0, max_attempts: int = 4,
                 backoff_base_s: float = 0.5, backoff_cap_s: float = 8.0,
                 concurrency: int = 16, mapping: RecordMapping | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 seed: int | None = None) -> None:
        headers = {"Accept": "application/json", "User-Agent": "hookledger-reconciler",
                   "Accept-Encoding": ACCEPT_ENCODING}
        if api_key:
            headers["apiToken"] = api_key
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=concurrency,
                                max_keepalive_connections=concurrency))
        self._semaphore = asyncio.Semaphore(concurrency)
        self._deadline_s = connect_timeout_s + timeout_s  # a whole request, body included
        self._max_attempts = max(1, max_attempts)
        self._base_s, self._cap_s = backoff_base_s, backoff_cap_s
        self._mapping = mapping or RecordMapping.create()
        self._rng = random.Random(seed)
        self._key = api_key
        self._resume_at = 0.0  # time.monotonic() before which no request is sent (a 429's)
        self.requests = 0

    async def __aenter__(self) -> ReferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def lookup(self, reference: str, *, stop: asyncio.Event | None = None) -> Lookup:
        """What the provider says about ``reference``; its detail never holds the API key
        (:func:`masked`): it is kept in the ``reconcile.checked`` event for good.

        ``stop``, shared by the lookups of one pass: set when one of them has the key
        refused, and from then on none of them sends a request (a first one, or a retry),
        nor waits out a pause or backoff any longer: each ends as error ``stopped``. Those
        already sent finish."""
        lookup = await self._lookup(reference, asyncio.Event() if stop is None else stop)
        detail = masked(lookup.detail, self._key)
        return lookup if detail == lookup.detail else replace(lookup, detail=detail)

    async def _lookup(self, reference: str, stop: asyncio.Event) -> Lookup:
        started = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            try:
                if stop.is_set():
                    return self._stopped(reference, attempt, started)
                async with self._semaphore:
                    await self._paced(stop)
                    if stop.is_set():  # set while this one waited
                        return self._stopped(reference, attempt, started)
                    return self._finish(await self._once(reference), attempt, started)
            except _Retryable as retry:
                delay = backoff_delay(attempt, base_s=self._base_s, cap_s=self._cap_s,
                                      rng=self._rng)
                if retry.wait_s is not None:
                    delay = max(delay, retry.wait_s)
                if retry.reason == "rate_limited":  # the others wait too, last attempt or not
                    self._resume_at = max(self._resume_at, time.monotonic() + delay)
                if attempt >= self._max_attempts:
                    error = ApiUnavailable if retry.reason != "malformed_envelope" \
                        else MalformedEnvelope
                    return Lookup(reference, "error", error=retry.reason,
                                  detail=f"{error.__name__}: {retry.detail}",
                                  api_code=retry.api_code, attempts=attempt,
                                  seconds=time.perf_counter() - started)
                await sleep_unless(stop, delay)
            except (ApiRefused, MappingError) as exc:
                if isinstance(exc, ApiKeyRefused):
                    reason = KEY_REFUSED
                    stop.set()  # before any other lookup's next step: none starts now
                else:
                    reason = "refused" if isinstance(exc, ApiRefused) else "mapping"
                return Lookup(reference, "error", error=reason,
                              detail=f"{type(exc).__name__}: {exc}", attempts=attempt,
                              seconds=time.perf_counter() - started)

    @staticmethod
    def _stopped(reference: str, attempt: int, started: float) -> Lookup:
        return Lookup(reference, "error", error=STOPPED,
                      detail="not asked: another lookup had the API key refused",
                      attempts=attempt - 1, seconds=time.perf_counter() - started)

    async def _paced(self, stop: asyncio.Event) -> None:
        """Wait out the latest 429's pause (another lookup may lengthen it meanwhile), then
        a moment more of one's own, so that the waiting lookups do not all ask at once."""
        paused = False
        while (wait := self._resume_at - time.monotonic()) > 0 \
                and not stop.is_set():
            paused = True
            await sleep_unless(stop, wait)
        if paused:
            await sleep_unless(stop, self._rng.uniform(0.0, RESUME_SPREAD_S))

    async def _get(self, path: str) -> tuple[httpx.Response, bytes]:
        """The answer and its body, read no further than :data:`MAX_ANSWER_BYTES`."""
        async with self._http.stream("GET", path) as answer:
            if answer.status_code == 429 or answer.status_code >= 500:
                return answer, b""  # retried on its status (and Retry-After) alone
            content = await read_at_most(answer, MAX_ANSWER_BYTES)
            if content is None and answer.status_code in KEY_REFUSED_STATUSES:
                return answer, b""  # refused on its status alone
            if content is None:
                raise _Retryable("too_large",
                                 f"HTTP {answer.status_code}: an answer over "
                                 f"{MAX_ANSWER_BYTES} bytes")
        return answer, content

    def _finish(self, lookup: Lookup, attempt: int, started: float) -> Lookup:
        return Lookup(lookup.reference, lookup.kind, lookup.record, lookup.error,
                      lookup.detail, lookup.api_code, attempt, time.perf_counter() - started)

    async def _once(self, reference: str) -> Lookup:
        path = REFERENCE_PATH.format(reference=path_segment(reference))
        self.requests += 1
        try:
            async with asyncio.timeout(self._deadline_s):  # httpx's bound each read only
                answer, content = await self._get(path)
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise _Retryable("timeout", f"no answer in time ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retryable("unreachable", f"transport error ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:  # an answer httpx could not read (a bad gzip body...)
            raise _Retryable("unreadable", f"unreadable answer ({type(exc).__name__})") from exc
        status = answer.status_code
        if status == 429:
            raise _Retryable("rate_limited", "HTTP 429",
                             retry_after_seconds(answer.headers.get("retry-after")))
        if status >= 500:
            raise _Retryable("server_error", f"HTTP {status}")
        try:
            envelope = parse_envelope(content)
        except MalformedEnvelope as exc:
            if status in KEY_REFUSED_STATUSES:  # a gateway's own page, its status says it
                raise ApiKeyRefused(f"HTTP {status} without the API's envelope") from exc
            # a 404 without the API's envelope is a wrong base URL or a proxy, not the
            # provider saying it has no such payment: "unknown at the provider" would tell
            # someone to charge a customer again
            raise _Retryable("malformed_envelope", f"HTTP {status}: {exc}") from exc
        if status == 401 or (not envelope.success and envelope.code in AUTHENTICATION_CODES):
            raise ApiKeyRefused(f"HTTP {status}, API code {envelope.code}")
        # a 403 in the API's envelope with another service's code refuses this request (a
        # reference of another merchant, say), not the key: a refusal of that one subject
        if not envelope.success and (envelope.code == 1404 or (
                status == 404 and 1000 <= envelope.code <= 1999)):
            return Lookup(reference, "not_found", detail=envelope.message,
                          api_code=envelope.code)
        if status >= 400 or not envelope.success:
            raise ApiRefused(f"HTTP {status}, API code {envelope.code}")
        return Lookup(reference, "found", record=self._mapping.read(envelope.data, reference),
                      api_code=envelope.code)
