"""A pass whose API key the provider refuses (401, a 403 without the envelope, or an
authentication code 4xxxx) stops asking at once: the subjects not answered stay due,
unmarked, for the next pass."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from structlog.testing import capture_logs

from hookledger.cli import main
from reconcile.client import Lookup, ReferenceClient
from reconcile.runner import PassConfig, PassResult, Reconciler
from sandbox.faults import FaultSettings
from sandbox.runner import running_sandbox, serve_asgi
from tests.reconcile_helpers import (
    API_KEY,
    CountingState,
    body,
    expect,
    rows,
    scheduled_pass_counted,
)

WRONG_KEY = "wrong-api-key-0123456789"


class RevokedAfter(CountingState):
    """The provider revokes the key once it has answered ``answers`` lookups (its records
    are looked at past the key check, so ``asked`` counts the answered ones only)."""

    def __init__(self, answers: int) -> None:
        super().__init__()
        self._left = answers

    def record(self, reference: str) -> dict[str, Any] | None:
        found = super().record(reference)
        with self._count_lock:
            self._left -= 1
            if self._left == 0:
                self.api_key = "revoked"
        return found


def payments(state: CountingState, url: str, count: int, prefix: str = "KEY") -> list[str]:
    """``count`` confirmed payments the provider knows and whose webhook never came."""
    references = [f"{prefix}-{n:02d}" for n in range(count)]
    for reference in references:
        state.record_general(body("payment.confirmed", 91000, reference=reference,
                                  amount=100))
        expect(url, reference, "collection", 100)
    return references


def one_pass(url: str, api: str, *, key: str = API_KEY, concurrency: int = 1,
             max_attempts: int = 3, **config: Any) -> tuple[PassResult, int]:
    """One pass; what it found and how many requests its client sent."""
    async def go() -> tuple[PassResult, int]:
        async with ReferenceClient(api, key, timeout_s=2, connect_timeout_s=1,
                                   max_attempts=max_attempts, backoff_base_s=0.01,
                                   backoff_cap_s=0.05, concurrency=concurrency,
                                   seed=1) as client:
            result = await Reconciler(url, client, PassConfig(**config)).run_pass()
            return result, client.requests
    return asyncio.run(go())


def marked(url: str) -> list[tuple[str, str]]:
    return [tuple(r) for r in rows(  # type: ignore[misc]
        url, "SELECT reference, last_result FROM hookledger_private.reconcile_subjects "
             "ORDER BY reference")]


def checked_events(url: str) -> list[str]:
    return [r[0] for r in rows(url, "SELECT payload->>'reference' FROM hookledger.ledger "
                                    "WHERE event_type = 'reconcile.checked' ORDER BY 1")]


def test_a_key_revoked_mid_pass_stops_its_lookups_and_leaves_the_rest_due(
        db_url: str) -> None:
    """Each subject after the first 401 was asked with the refused key, stored ``refused``
    and put into backoff: a dozen useless calls (a provider may lock the key out), and once
    the key was put right every one of them waited its backoff before it was checked."""
    state = RevokedAfter(answers=3)
    references = payments(state, db_url, 12)
    with running_sandbox(state=state) as api:
        stopped, requests = one_pass(db_url, api.url)
        assert requests == 4  # three answered, one refused, none after it
        assert stopped.stopped == "key_refused"
        assert stopped.checked == 3 and stopped.left_due == 9
        assert sorted(stopped.recovered) == references[:3]
        assert stopped.errors == {"key_refused": 1}
        assert "error" not in stopped.results
        # what was asked and answered is kept; the refused one and the rest are not marked
        assert marked(db_url) == [(r, "recovered") for r in references[:3]]
        assert checked_events(db_url) == references[:3]
        state.api_key = API_KEY  # the key is put right: the rest is asked at once
        resumed, _ = one_pass(db_url, api.url)
    assert resumed.stopped is None and resumed.checked == 9
    assert sorted(resumed.recovered) == references[3:]
    assert dict(state.asked) == dict.fromkeys(references, 1)


def test_lookups_in_flight_when_the_key_is_refused_finish_and_no_new_one_starts(
        db_url: str) -> None:
    """With several lookups at once, those already sent are answered (or refused) and
    kept as such; none starts after the refusal, and no subject is judged twice."""
    concurrency = 4
    state = RevokedAfter(answers=5)
    references = payments(state, db_url, 40)
    with running_sandbox(state=state, faults=FaultSettings(latency_ms=30)) as api:
        stopped, requests = one_pass(db_url, api.url, concurrency=concurrency)
        # at most the ones in flight beside the revocation and the first refusal were sent
        assert requests <= 5 + 2 * concurrency, requests
        answered = sorted(state.asked)
        assert stopped.stopped == "key_refused" and stopped.checked == len(answered)
        assert stopped.left_due == 40 - len(answered)
        assert marked(db_url) == [(r, "recovered") for r in answered]
        state.api_key = API_KEY
        resumed, _ = one_pass(db_url, api.url, concurrency=concurrency)
    assert resumed.stopped is None and resumed.checked == 40 - len(answered)
    assert dict(state.asked) == dict.fromkeys(references, 1)


def test_a_paced_pass_with_a_refused_key_ends_at_once(db_url: str) -> None:
    """At one lookup a second, the subjects after the refusal each waited their turn of
    the pace to be told there was nothing to ask: 20 s of a pass, and its lock, for
    nothing."""
    state = CountingState()
    payments(state, db_url, 20)
    with running_sandbox(state=state) as api:
        started = time.monotonic()
        result, requests = one_pass(db_url, api.url, key=WRONG_KEY, rate_per_s=1.0)
        seconds = time.monotonic() - started
    assert requests == 1 and result.stopped == "key_refused" and result.left_due == 20
    assert seconds < 5, seconds
    assert marked(db_url) == []


def refusing_app(status: int, content: bytes, media_type: str) -> Starlette:
    async def refuse(request: Request) -> Response:
        return Response(content, status_code=status, media_type=media_type)
    return Starlette(routes=[Route("/api/v1/payment/reference/{reference:path}", refuse)])


@pytest.mark.parametrize(("status", "content", "media_type"), [
    (401, b'{"success": false, "code": 40101, "message": "invalid apiToken", "data": {}}',
     "application/json"),
    (403, b'{"success": false, "code": 40301, "message": "forbidden", "data": {}}',
     "application/json"),
    # a gateway's own page: no envelope, but the status says who was refused
    (401, b"<html><body>401 Authorization Required</body></html>", "text/html"),
    (403, b"<html><body>Forbidden</body></html>", "text/html"),
    # the authentication service's code, whatever the status the API put around it
    (200, b'{"success": false, "code": 40103, "message": "token expired", "data": {}}',
     "application/json"),
    (400, b'{"success": false, "code": 40102, "message": "token revoked", "data": {}}',
     "application/json"),
])
def test_a_refused_key_is_told_apart_and_not_retried(status: int, content: bytes,
                                                      media_type: str) -> None:
    """A 401 page without the API's envelope was retried as malformed, and a 401, 403 or
    4xxxx envelope was error ``refused`` as a refused reference is."""
    async def go(url: str) -> tuple[Lookup, int]:
        async with ReferenceClient(url, API_KEY, max_attempts=4, backoff_base_s=0.01,
                                   backoff_cap_s=0.02, seed=1) as client:
            return await client.lookup("AUTH-1"), client.requests

    with serve_asgi(refusing_app(status, content, media_type)) as url:
        lookup, requests = asyncio.run(go(url))
    assert (lookup.kind, lookup.error, requests) == ("error", "key_refused", 1)
    assert lookup.detail is not None and f"HTTP {status}" in lookup.detail


def test_a_lookup_being_retried_is_not_asked_again_once_another_has_the_key_refused(
        ) -> None:
    """Its next attempt would be one more request with a key the provider refuses; it ends
    ``stopped`` instead, without waiting out its backoff."""
    sent: list[str] = []

    async def answer(request: Request) -> Response:
        reference = request.path_params["reference"]
        sent.append(reference)
        if reference == "KEY":
            await asyncio.sleep(0.3)  # the busy one is retrying meanwhile
            return JSONResponse({"success": False, "code": 40101, "message": "no",
                                 "data": {}}, status_code=401)
        return Response(b"", status_code=503)

    app = Starlette(routes=[Route("/api/v1/payment/reference/{reference:path}", answer)])

    async def go(url: str) -> list[Lookup]:
        async with ReferenceClient(url, API_KEY, max_attempts=50, backoff_base_s=0.05,
                                   backoff_cap_s=0.05, seed=1) as client:
            stop = asyncio.Event()
            return list(await asyncio.gather(client.lookup("BUSY", stop=stop),
                                             client.lookup("KEY", stop=stop)))

    with serve_asgi(app) as url:
        started = time.monotonic()
        busy, key = asyncio.run(go(url))
        seconds = time.monotonic() - started
    assert (key.error, busy.error) == ("key_refused", "stopped")
    assert sent.count("KEY") == 1 and 1 <= sent.count("BUSY") < 20, sent
    assert seconds < 2


def test_a_refused_reference_is_still_only_that_subjects_error() -> None:
    """A 400 or 422 about one reference says nothing of the key: not a stop."""
    app = Starlette(routes=[Route("/api/v1/payment/reference/{reference:path}",
                                  lambda request: JSONResponse(
                                      {"success": False, "code": 1400,
                                       "message": "bad reference", "data": {}},
                                      status_code=400))])

    async def go(url: str) -> Lookup:
        async with ReferenceClient(url, API_KEY, max_attempts=2, seed=1) as client:
            return await client.lookup("BAD-1")

    with serve_asgi(app) as url:
        lookup = asyncio.run(go(url))
    assert (lookup.kind, lookup.error) == ("error", "refused")


def test_a_wrong_key_logs_one_line_without_the_key(db_url: str) -> None:
    state = CountingState()
    payments(state, db_url, 6)
    with running_sandbox(state=state) as api, capture_logs() as logs:
        result, _ = one_pass(db_url, api.url, key=WRONG_KEY, concurrency=2)
    assert result.stopped == "key_refused"
    refusals = [e for e in logs if e["log_level"] in ("error", "warning")]
    assert [e["event"] for e in refusals] == ["reconcile.key_refused"], logs
    assert refusals[0]["left_due"] == 6 and "401" in refusals[0]["detail"]
    assert WRONG_KEY not in repr(logs) and API_KEY not in repr(logs)
    assert any("refused the API key" in line for line in result.summary())


def test_reconcile_with_a_wrong_key_exits_5_and_leaves_every_subject_due(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong key exited 4 ("every lookup failed"), having asked every subject with it
    and put each into backoff; a script could not tell it from a provider outage."""
    state = CountingState()
    references = payments(state, db_url, 5, prefix="CLI")
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    runner = CliRunner()
    with running_sandbox(state=state) as api:
        monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", api.url)
        monkeypatch.setenv("HOOKLEDGER_API_KEY", WRONG_KEY)
        refused = runner.invoke(main, ["reconcile"])
        assert refused.exit_code == 5, refused.output
        assert "refused the API key" in refused.output
        assert "HOOKLEDGER_API_KEY" in refused.output and WRONG_KEY not in refused.output
        assert marked(db_url) == [] and checked_events(db_url) == []
        monkeypatch.setenv("HOOKLEDGER_API_KEY", API_KEY)
        fixed = runner.invoke(main, ["reconcile"])
    assert fixed.exit_code == 0, fixed.output
    assert "checked 5 subject(s)" in fixed.output
    assert dict(state.asked) == dict.fromkeys(references, 1)


def test_a_scheduled_pass_with_a_refused_key_shows_so_in_the_metrics(db_url: str) -> None:
    registry = CollectorRegistry()

    async def go(api_url: str) -> None:
        client = ReferenceClient(api_url, WRONG_KEY, timeout_s=1, max_attempts=2,
                                 backoff_base_s=0.01, concurrency=1)
        await scheduled_pass_counted(db_url, client, registry)

    for n in range(4):
        expect(db_url, f"SCH-{n}", "collection", 5)
    with running_sandbox() as api:
        asyncio.run(go(api.url))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("hookledger_reconcile_passes_total", outcome="key_refused") == 1
    assert sample("hookledger_reconcile_passes_total", outcome="ran") is None
    assert sample("hookledger_reconcile_lookup_errors_total", error="key_refused") == 1
    assert sample("hookledger_reconcile_last_pass_timestamp_seconds") is not None
    assert marked(db_url) == []



def test_a_403_about_the_request_in_the_apis_envelope_is_that_subjects_refusal() -> None:
    """A 403 carrying the payments API's own code (a reference the merchant may not read)
    refuses that request, not the key: taken for a refused key, it stopped every pass at
    that one subject, which stayed due and was asked first again each time."""
    content = b'{"success": false, "code": 1403, "message": "not yours", "data": {}}'

    async def go(url: str) -> tuple[Lookup, int]:
        async with ReferenceClient(url, API_KEY, max_attempts=4, backoff_base_s=0.01,
                                   backoff_cap_s=0.02, seed=1) as client:
            return await client.lookup("OTHER-1"), client.requests

    with serve_asgi(refusing_app(403, content, "application/json")) as url:
        lookup, requests = asyncio.run(go(url))
    assert (lookup.kind, lookup.error, requests) == ("error", "refused", 1)
