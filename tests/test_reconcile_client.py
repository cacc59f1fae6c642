"""The reference API client against the sandbox's real HTTP server (no database needed)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconcile.client import MAX_ANSWER_BYTES, Lookup, ReferenceClient
from sandbox.faults import FaultSettings
from sandbox.runner import running_sandbox, serve_asgi
from sandbox.server import gzip_bomb
from tests.peak_memory import peak_bytes
from tests.reconcile_helpers import API_KEY, CountingState, body


class TimedState(CountingState):
    """Also notes when each lookup reached the provider's handler (past its fault switches)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times: list[float] = []

    def record(self, reference: str) -> dict[str, Any] | None:
        with self._count_lock:
            self.times.append(time.monotonic())
        return super().record(reference)


def look_up_once(url: str, *references: str) -> list[Lookup]:
    """Each of ``references`` asked once, in turn, by a client of one attempt."""
    async def look_up() -> list[Lookup]:
        async with ReferenceClient(url, API_KEY, max_attempts=1, seed=1) as client:
            return [await client.lookup(reference) for reference in references]
    return asyncio.run(look_up())


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_a_429_pauses_every_lookup_for_its_retry_after_not_only_its_own(
        max_attempts: int) -> None:
    """The provider limits the caller: lookups that kept asking during a 429's
    ``Retry-After`` would be refused in turn and use up their attempts. (With one attempt
    the refused lookup is an error, and the others wait all the same.)"""
    state = TimedState()
    references = [f"L-{i}" for i in range(40)]
    for reference in references:
        state.record_general(body("payment.confirmed", 91000, reference=reference, amount=100))
    concurrency = 4
    faults = FaultSettings(latency_ms=20, rate_limit_count=1, retry_after_s=1)

    async def look_up_all(url: str) -> tuple[float, list[Lookup]]:
        async with ReferenceClient(url, API_KEY, max_attempts=max_attempts, backoff_base_s=0.01,
                                   backoff_cap_s=0.05, concurrency=concurrency,
                                   seed=1) as client:
            started = time.monotonic()
            return started, list(await asyncio.gather(*map(client.lookup, references)))

    with running_sandbox(state=state, faults=faults) as api:
        started, lookups = asyncio.run(look_up_all(api.url))
    kinds = sorted(lookup.kind for lookup in lookups)
    if max_attempts > 1:
        assert kinds == ["found"] * len(references)
        assert sum(lookup.attempts for lookup in lookups) == len(references) + 1  # one 429
    else:
        assert kinds == ["error"] + ["found"] * (len(references) - 1)
    # the first answer was the 429 (counts are used first): only lookups already in flight
    # beside it, or sent while its answer was on the way, reached the provider within its
    # second; without the shared pause all but the refused one did
    within_the_pause = [t for t in state.times if t - started < 0.9]
    assert len(within_the_pause) <= 2 * concurrency
    assert len(state.times) == len(references) - (max_attempts == 1)


def test_an_answer_past_the_size_bound_is_read_no_further() -> None:
    """A payment's record is a few hundred bytes. A huge answer was read whole into memory,
    several at once inside ``serve``; past the bound it is now an error, asked again later."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="HUGE-1", amount=100))
    huge = state.record("HUGE-1")
    assert huge is not None
    state.put_record("HUGE-1", {**huge, "note": "x" * (MAX_ANSWER_BYTES + 1)})
    state.record_general(body("payment.confirmed", 91000, reference="FINE-1", amount=100))

    with running_sandbox(state=state) as api:
        big, fine = look_up_once(api.url, "HUGE-1", "FINE-1")
    assert (big.kind, big.error) == ("error", "too_large"), big
    assert fine.kind == "found" and fine.record is not None


def test_an_answer_trickled_in_byte_by_byte_is_given_up_on_at_the_timeout() -> None:
    """httpx's timeouts are per read: an answer whose bytes kept coming, each within the
    timeout, was waited for however long it took (here about a minute; an endless one, for
    ever), and the pass waiting on it held every process's reconciliation lock meanwhile."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="DRIP-1", amount=100))

    async def look_up(url: str) -> tuple[float, Lookup]:
        async with ReferenceClient(url, API_KEY, timeout_s=0.5, connect_timeout_s=0.5,
                                   max_attempts=2, backoff_base_s=0.01, backoff_cap_s=0.05,
                                   seed=1) as client:
            started = time.monotonic()
            lookup = await asyncio.wait_for(client.lookup("DRIP-1"), 20)
            return time.monotonic() - started, lookup

    with running_sandbox(state=state, faults=FaultSettings(trickle_ms=100)) as api:
        elapsed, lookup = asyncio.run(look_up(api.url))
    assert (lookup.kind, lookup.error, lookup.attempts) == ("error", "timeout", 2), lookup
    assert elapsed < 5


@pytest.mark.parametrize("reference", [".", "..", "a..b"])
def test_a_reference_of_dots_is_asked_about_as_itself(reference: str) -> None:
    """``..`` was sent as a dot segment, which the URL's normalisation removes: the client
    asked ``/api/v1/payment`` for it, and any answer there was read as its record."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference=reference, amount=100))
    state.record_general(body("payment.failed", 91050, reference="PAY-1", amount=100))

    with running_sandbox(state=state) as api:
        [lookup] = look_up_once(api.url, reference)
    assert lookup.kind == "found" and lookup.record is not None, lookup
    assert (lookup.record.reference, lookup.record.outcome) == (reference, "success")


@pytest.mark.parametrize("data", [{}, {"reference": "BARE-1", "amount": 100},
                                  {"payment": {"reference": "BARE-1", "status": "SUCCESSFUL"}},
                                  {"reference": "BARE-1", "status": "  ", "amount": 100}])
def test_a_record_that_says_no_state_is_a_mapping_error_not_a_pending_payment(
        data: dict[str, Any]) -> None:
    """With none of status, event or code where the mapping looks (a provider whose
    ``data`` is shaped otherwise), the record was read as pending: an ``unresolved`` whose
    advice is to charge the customer again, and a mismatch for every confirmed payment."""
    state = CountingState()
    state.put_record("BARE-1", data)
    state.put_record("SAYS-1", {"reference": "SAYS-1", "status": "PENDING"})

    with running_sandbox(state=state) as api:
        bare, says = look_up_once(api.url, "BARE-1", "SAYS-1")
    assert (bare.kind, bare.error) == ("error", "mapping"), bare
    assert "no status, event or code" in (bare.detail or "")
    assert says.kind == "found" and says.record is not None
    assert says.record.outcome == "pending"


def test_an_answer_gzipped_twice_is_bounded_while_it_is_undone() -> None:
    """httpx undoes every ``Content-Encoding`` layer of a chunk in full before the size bound
    sees it: 600 bytes labelled ``gzip, gzip`` became 256 MiB in memory at once (a few
    kilobytes, gigabytes), up to ``HOOKLEDGER_API_CONCURRENCY`` at once inside ``serve``."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="BOMB-1", amount=100))
    gzip_bomb()  # built before the count begins: the sandbox's, not the client's

    with running_sandbox(state=state, faults=FaultSettings(
            malformed_count=1, malformed_kind="gzip_bomb")) as api:
        with peak_bytes() as peak:
            bomb, fine = look_up_once(api.url, "BOMB-1", "BOMB-1")
    assert (bomb.kind, bomb.error) == ("error", "too_large"), bomb
    assert fine.kind == "found", fine
    assert peak[0] < 8 * MAX_ANSWER_BYTES, peak


def test_the_providers_words_reach_no_lookup_with_the_api_key_in_them() -> None:
    """A not-found answer's message was kept verbatim as the lookup's detail, which goes
    into the ``reconcile.checked`` event for good: a provider or proxy echoing the request
    (its ``apiToken`` header) put the key in the ledger, and a megabyte of message was
    kept in every check of the subject. Masked, then cut, as the chat API's are."""
    echo = f"no such payment (request headers: apiToken: {API_KEY}) " + "x" * 5000

    async def not_found(_: Any) -> Response:
        return JSONResponse({"success": False, "code": 1404, "message": echo, "data": None},
                            status_code=404)

    async def unreadable(_: Any) -> Response:
        return JSONResponse({"success": True, "code": 1000, "message": "ok",
                             "data": {"reference": API_KEY, "status": "SUCCESSFUL"}})

    app = Starlette(routes=[Route("/api/v1/payment/reference/GONE-1", not_found),
                            Route("/api/v1/payment/reference/OTHER-1", unreadable)])
    with serve_asgi(app) as url:
        gone, other = look_up_once(url, "GONE-1", "OTHER-1")
    assert gone.kind == "not_found" and other.error == "mapping", (gone, other)
    for lookup in (gone, other):
        assert lookup.detail is not None and API_KEY not in lookup.detail, lookup
        assert "[redacted]" in lookup.detail and len(lookup.detail) <= 300, lookup
