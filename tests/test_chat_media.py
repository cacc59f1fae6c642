"""Inbound media fetched in the background from the real sandbox API, with the ledger as state."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ingest.chat_media
import ingest.durable
from ingest.chat_api import ChatApiMalformed, ChatApiRefused, ChatApiUnavailable, parse_envelope
from ingest.chat_media import (
    OUTAGE_ATTEMPTS,
    MediaStore,
    Pending,
    backoff,
    key_refused_code,
    plan,
)
from sandbox.runner import Sandbox, running_sandbox
from sandbox.state import media_bytes
from tests.chat_events import PHONE, encode, inbound
from tests.chat_live import API_KEY, json_logs, post_chat, rows, wait_for  # noqa: F401
from tests.live import running_service
from tests.peak_memory import peak_bytes

SECRET = "chat-secret-media-1"
MAX_ATTEMPTS = 3


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with running_sandbox(api_key=API_KEY) as box:
        box.state.connect_number(PHONE, secret=SECRET)
        yield box


@pytest.fixture
def service(db_url: str, sandbox: Sandbox, tmp_path: Path) -> Iterator[str]:
    with running_service(db_url, chat_secrets={PHONE: SECRET}, api_base_url=sandbox.url,
                         api_key=API_KEY, home=tmp_path, chat_media_poll_s=0.1,
                         chat_media_retry_base_s=0.1, chat_media_max_attempts=MAX_ATTEMPTS,
                         chat_api_timeout_s=2) as base:
        sandbox.state.set_webhook_url(PHONE, f"{base}/webhooks/chat/{PHONE}")
        yield base


def media_events(db_url: str) -> list[tuple[str, str, dict[str, Any]]]:
    return rows(db_url, "SELECT event_type, source, payload FROM hookledger.ledger "
                        "WHERE stream LIKE 'chat-media:%%' ORDER BY position")


def deliver_image(sandbox: Sandbox, media_id: str, message_id: str, delivery_id: str) -> None:
    body = inbound("image", message_id=message_id)
    body["message"]["image"]["id"] = media_id
    sent = sandbox.queue_chat(PHONE, body, delivery_id=delivery_id)
    sandbox.dispatcher.drain()
    assert sent is not None and sent.state == "delivered"


def fetched(db_url: str) -> list[dict[str, Any]]:
    return [p for t, _, p in media_events(db_url) if t == "chat.media.fetched"]


def test_a_media_message_leads_to_stored_bytes_and_a_fetched_event(
        service: str, sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    sandbox.state.issue_media("media-img-1", "image")
    deliver_image(sandbox, "media-img-1", "wamid.M1", "d-1")
    # a second copy of the message under another delivery id: still one fetch
    deliver_image(sandbox, "media-img-1", "wamid.M1", "d-1-copy")
    [event] = wait_for(lambda: fetched(db_url))
    expected = media_bytes("media-img-1")
    digest = hashlib.sha256(expected).hexdigest()
    assert event["sha256"] == digest and event["size"] == len(expected)
    assert event["content_type"] == "image/jpeg" and event["message_id"] == "wamid.M1"
    assert event["path"] == f"media/{digest[:2]}/{digest}" and event["attempt"] == 1
    assert (tmp_path / event["path"]).read_bytes() == expected
    time.sleep(0.5)  # more polls change nothing
    assert [(t, s) for t, s, _ in media_events(db_url)] == [("chat.media.fetched", "media")]


def test_a_failing_media_endpoint_is_retried_then_fetched(
        service: str, sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    sandbox.state.issue_media("media-doc-1", "document")
    sandbox.faults.set(error_count=2, error_status=503)
    deliver_image(sandbox, "media-doc-1", "wamid.M2", "d-2")
    wait_for(lambda: fetched(db_url))
    events = media_events(db_url)
    assert [(t, p["attempt"]) for t, _, p in events] == [
        ("chat.media.failed", 1), ("chat.media.failed", 2), ("chat.media.fetched", 3)]
    assert {p["reason"] for t, _, p in events if t == "chat.media.failed"} == {"unavailable"}
    stored = events[-1][2]
    assert stored["content_type"] == "application/pdf"
    assert (tmp_path / stored["path"]).read_bytes() == media_bytes("media-doc-1")


def test_an_api_unavailable_for_longer_than_the_bound_still_gets_the_media_fetched(
        service: str, sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    """Only answers refusing the media count toward giving up: a provider down (5xx, 429,
    timeouts) for more attempts than the bound is waited out, never gives the media up."""
    sandbox.state.issue_media("media-vid-9", "video")
    sandbox.faults.set(error_count=MAX_ATTEMPTS + 1, error_status=503)
    deliver_image(sandbox, "media-vid-9", "wamid.M9", "d-9")
    [stored] = wait_for(lambda: fetched(db_url))
    failed = [p for t, _, p in media_events(db_url) if t == "chat.media.failed"]
    assert [(p["attempt"], p["final"]) for p in failed] == [
        (n, False) for n in range(1, MAX_ATTEMPTS + 2)]
    assert stored["attempt"] == MAX_ATTEMPTS + 2
    assert (tmp_path / stored["path"]).read_bytes() == media_bytes("media-vid-9")


def test_a_home_that_cannot_take_the_media_for_a_while_never_gives_it_up(
        service: str, sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    """A full disk or a broken media folder says nothing about the media: such failures are
    waited out as an outage is, where they once gave every media up after a few seconds."""
    media = tmp_path / "media"
    if media.is_dir():
        media.rmdir()
    media.write_bytes(b"")  # a file where the folder belongs: every store fails
    sandbox.state.issue_media("media-img-7", "image")
    deliver_image(sandbox, "media-img-7", "wamid.M7", "d-7")
    wait_for(lambda: len(media_events(db_url)) > MAX_ATTEMPTS)
    failed = [p for _, _, p in media_events(db_url)]
    assert {p["reason"] for p in failed} == {"storage"}
    assert not any(p["final"] for p in failed)
    media.unlink()
    [stored] = wait_for(lambda: fetched(db_url))
    assert (tmp_path / stored["path"]).read_bytes() == media_bytes("media-img-7")


def test_a_failure_no_rule_foresaw_is_recorded_and_the_other_media_fetched(
        service: str, sandbox: Sandbox, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the API's and the disk's errors were caught: anything else escaped the poll, no
    outcome was recorded, and the same media was tried again every poll while every later
    media waited for good. Now it is a failure like any other, counted toward giving up."""
    from ingest.chat_media import MediaStore

    real_put = MediaStore.put
    poison = media_bytes("media-odd-1")

    def put(self: MediaStore, content: bytes) -> Any:
        if content == poison:
            raise RuntimeError("a failure no rule foresaw")
        return real_put(self, content)

    monkeypatch.setattr(MediaStore, "put", put)
    sandbox.state.issue_media("media-odd-1", "image")
    sandbox.state.issue_media("media-ok-2", "image")
    deliver_image(sandbox, "media-odd-1", "wamid.ODD", "d-odd")
    deliver_image(sandbox, "media-ok-2", "wamid.OK2", "d-ok2")
    [stored] = wait_for(lambda: fetched(db_url))
    assert stored["media_id"] == "media-ok-2"
    wait_for(lambda: len([p for t, _, p in media_events(db_url)
                          if t == "chat.media.failed"]) >= MAX_ATTEMPTS)
    failed = [p for t, _, p in media_events(db_url) if t == "chat.media.failed"]
    assert {(p["media_id"], p["reason"], p["detail"]) for p in failed} == {
        ("media-odd-1", "internal", "RuntimeError")}
    assert [p["final"] for p in failed] == [False] * (MAX_ATTEMPTS - 1) + [True]


@pytest.mark.parametrize("media_id", ["..", ".", " "])
def test_a_media_id_the_url_would_resolve_away_is_never_asked_for(
        sandbox: Sandbox, media_id: str) -> None:
    """'..' asked GET /api/v1/waba/media with the API key; '.' another path again."""
    import asyncio

    from ingest.chat_api import ChatApi

    async def ask() -> None:
        api = ChatApi(sandbox.url, API_KEY, timeout_s=2)
        try:
            await api.fetch_media(media_id)
        finally:
            await api.aclose()

    with pytest.raises(ChatApiRefused) as refused:
        asyncio.run(ask())
    assert refused.value.reason == "invalid_media_id"  # refused before any request


def test_a_media_past_the_size_limit_is_refused_before_it_fills_the_memory(
        sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole answer was read into memory, decoded: a gigabyte (or a small gzip body that
    decodes to one) took the process that answers webhooks with it."""
    import asyncio

    from ingest import chat_api
    from ingest.chat_api import ChatApi

    sandbox.state.issue_media("media-big-1", "image")  # 256 bytes in the sandbox
    monkeypatch.setattr(chat_api, "MAX_MEDIA_BYTES", 100)

    async def ask() -> None:
        async with ChatApi(sandbox.url, API_KEY, timeout_s=2) as api:
            await api.fetch_media("media-big-1")

    with pytest.raises(ChatApiRefused) as refused:
        asyncio.run(ask())
    assert refused.value.reason == "media_too_large"
    monkeypatch.setattr(chat_api, "MAX_MEDIA_BYTES", 256)
    asyncio.run(ask())  # at the limit itself: fetched


def test_a_media_gzipped_twice_is_bounded_while_it_is_undone(
        sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx undoes every ``Content-Encoding`` layer of a chunk in full before the size bound
    sees it: 600 bytes labelled ``gzip, gzip`` became 256 MiB in memory at once (a few
    kilobytes, gigabytes), in the process that answers webhooks."""
    import asyncio

    from ingest import chat_api
    from ingest.chat_api import ChatApi
    from sandbox.server import gzip_bomb

    sandbox.state.issue_media("media-bomb-1", "image")
    sandbox.faults.set(malformed_count=1, malformed_kind="gzip_bomb")
    monkeypatch.setattr(chat_api, "MAX_MEDIA_BYTES", 1024 * 1024)
    gzip_bomb()  # built before the count begins: the sandbox's, not the client's

    async def ask() -> None:
        async with ChatApi(sandbox.url, API_KEY, timeout_s=5) as api:
            await api.fetch_media("media-bomb-1")

    with peak_bytes() as peak, pytest.raises(ChatApiRefused) as refused:
        asyncio.run(ask())
    assert refused.value.reason == "media_too_large"
    assert peak[0] < 8 * 1024 * 1024, peak
    asyncio.run(ask())  # the fault used up: the media itself is fetched


def test_a_media_answer_trickled_past_its_deadline_is_given_up_for_now(
        sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeout bounds each wait for a byte: an answer sent a byte at a time held the
    worker, and every media behind it, for as long as the provider liked."""
    import asyncio
    import time as clock

    from ingest import chat_api
    from ingest.chat_api import ChatApi

    sandbox.state.issue_media("media-slow-1", "image")
    sandbox.faults.set(trickle_ms=50)  # 256 bytes: about 13 s in all, 50 ms a byte
    monkeypatch.setattr(chat_api, "MEDIA_DEADLINE_FACTOR", 2)

    async def ask() -> None:
        async with ChatApi(sandbox.url, API_KEY, timeout_s=1) as api:
            await api.fetch_media("media-slow-1")

    started = clock.monotonic()
    with pytest.raises(ChatApiUnavailable) as unavailable:
        asyncio.run(ask())
    assert unavailable.value.reason == "timeout"
    assert clock.monotonic() - started < 5


def test_permanent_failures_stop_after_the_bound(
        service: str, sandbox: Sandbox, db_url: str) -> None:
    deliver_image(sandbox, "media-never-issued", "wamid.M3", "d-3")  # the API answers 404
    wait_for(lambda: len(media_events(db_url)) >= MAX_ATTEMPTS)
    time.sleep(1.0)  # well past the next backoff: nothing more is tried
    events = media_events(db_url)
    assert [(t, p["attempt"], p["final"]) for t, _, p in events] == [
        ("chat.media.failed", 1, False), ("chat.media.failed", 2, False),
        ("chat.media.failed", 3, True)]
    assert all(p["detail"].startswith("HTTP 404") for _, _, p in events)


def test_text_messages_are_not_fetched_and_the_request_path_does_not_wait(
        service: str, sandbox: Sandbox, db_url: str) -> None:
    sandbox.state.issue_media("media-slow", "video")
    sandbox.faults.set(latency_ms=1500)  # a slow media endpoint
    started = time.monotonic()
    raw = encode(inbound("video", message_id="wamid.V1"))
    body = json.loads(raw)
    body["message"]["video"]["id"] = "media-slow"
    assert post_chat(service, PHONE, encode(body), SECRET, delivery_id="v-1").status_code == 200
    assert post_chat(service, PHONE, encode(inbound("text", message_id="wamid.T1")), SECRET,
                     delivery_id="t-1").status_code == 200
    assert time.monotonic() - started < 1.0  # answered before the media arrived
    [event] = wait_for(lambda: fetched(db_url))
    assert event["message_id"] == "wamid.V1"


def test_no_api_key_in_media_logs(service: str, sandbox: Sandbox, db_url: str,
                                  json_logs: None,  # noqa: F811
                                  capsys: pytest.CaptureFixture[str]) -> None:
    sandbox.faults.set(error_count=1)
    sandbox.state.issue_media("media-aud-1", "audio")
    deliver_image(sandbox, "media-aud-1", "wamid.M4", "d-4")
    wait_for(lambda: fetched(db_url))
    err = capsys.readouterr().err
    assert "chat_media.failed" in err and "chat_media.fetched" in err
    assert API_KEY not in err and SECRET not in err


def test_a_process_with_media_off_fetches_none(db_url: str, sandbox: Sandbox,
                                              tmp_path: Path) -> None:
    """Processes on several machines each stored the media they fetched in their own home:
    with ``HOOKLEDGER_CHAT_MEDIA=off`` on all but one, every media lands in one place."""
    sandbox.state.issue_media("media-elsewhere", "image")
    with running_service(db_url, chat_secrets={PHONE: SECRET}, api_base_url=sandbox.url,
                         api_key=API_KEY, home=tmp_path, chat_media=False,
                         chat_media_poll_s=0.05) as base:
        sandbox.state.set_webhook_url(PHONE, f"{base}/webhooks/chat/{PHONE}")
        deliver_image(sandbox, "media-elsewhere", "wamid.E1", "e-1")
        time.sleep(1.0)  # twenty polls, had there been a fetcher
        assert media_events(db_url) == []
    with running_service(db_url, chat_secrets={PHONE: SECRET}, api_base_url=sandbox.url,
                         api_key=API_KEY, home=tmp_path / "fetcher", chat_media_poll_s=0.05):
        [event] = wait_for(lambda: fetched(db_url))
    assert (tmp_path / "fetcher" / event["path"]).exists()


def test_a_media_that_keeps_failing_does_not_keep_later_media_waiting(
        db_url: str, sandbox: Sandbox, tmp_path: Path) -> None:
    """Rows were read from a cursor that an unsettled media held, a batch at a time: once a
    batch behind a media still being retried was all fetched ones, every later media waited
    until that one settled, which for an outage is twelve hours."""
    import asyncio

    from psycopg_pool import AsyncConnectionPool

    from ingest.chat_api import ChatApi
    from ingest.chat_media import MediaFetcher, MediaStore
    from ledger import LedgerStore

    later = [f"media-later-{i}" for i in range(5)]
    # the service's own fetcher polls once at start, then not for an hour: this test's runs
    with running_service(db_url, chat_secrets={PHONE: SECRET}, api_base_url=sandbox.url,
                         api_key=API_KEY, home=tmp_path, chat_media_poll_s=3600) as base:
        sandbox.state.set_webhook_url(PHONE, f"{base}/webhooks/chat/{PHONE}")
        deliver_image(sandbox, "media-never-issued", "wamid.F0", "f-0")  # 404, retried later
        for i, media_id in enumerate(later):
            sandbox.state.issue_media(media_id, "image")
            deliver_image(sandbox, media_id, f"wamid.L{i}", f"l-{i}")

    async def polls() -> None:
        async with AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                                       kwargs={"autocommit": True}) as pool:
            fetcher = MediaFetcher(pool=pool, ledger=LedgerStore(pool),
                                   api=ChatApi(sandbox.url, API_KEY),
                                   store=MediaStore(tmp_path), max_attempts=100,
                                   retry_base_s=3600, batch=2)
            try:
                for _ in range(len(later) + 1):
                    await fetcher.run_once()
            finally:
                await fetcher.stop()

    asyncio.run(polls())
    assert sorted(p["media_id"] for p in fetched(db_url)) == later
    assert [p["attempt"] for t, _, p in media_events(db_url) if t == "chat.media.failed"] == [1]


# -- pure parts ----------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def pending(position: int, media_id: str, *, fetched: bool = False, failures: int = 0,
            ago_s: float | None = None, refusals: int | None = None) -> Pending:
    last = NOW - timedelta(seconds=ago_s) if ago_s is not None else None
    return Pending(position, media_id, f"m-{position}", PHONE, fetched, failures, last,
                   failures if refusals is None else refusals)


def test_plan_skips_settled_rows_waits_for_backoff_and_times_the_rest() -> None:
    rows_ = [pending(1, "a", fetched=True), pending(2, "b", failures=3, ago_s=1),
             pending(3, "c", failures=1, ago_s=0.5), pending(4, "d"),
             pending(5, "d"), pending(6, "e", failures=2, ago_s=10)]
    due, again = plan(rows_, now=NOW, max_attempts=3, base_s=1, cap_s=60)
    assert [r.media_id for r in due] == ["d", "e"]  # c waits 1 s after its first failure
    # a (fetched) and b (given up) are never looked at again; c when its wait is over;
    # d's two messages and e at once, to read what their fetch recorded
    assert again == {3: NOW + timedelta(seconds=0.5), 4: NOW, 5: NOW, 6: NOW}


def test_plan_never_gives_up_media_for_failures_that_said_nothing_about_it() -> None:
    """Attempts the API could not answer are retried at the capped delay, however many."""
    waited_out = pending(1, "a", failures=7, refusals=1, ago_s=60)
    due, again = plan([waited_out], now=NOW, max_attempts=3, base_s=1, cap_s=60)
    assert (due, again) == ([waited_out], {1: NOW})
    # but not for ever
    outlasted = pending(1, "a", failures=3 + OUTAGE_ATTEMPTS, refusals=0, ago_s=600)
    assert plan([outlasted], now=NOW, max_attempts=3, base_s=1, cap_s=60) == ([], {})


@given(st.lists(st.builds(
    pending, st.integers(1, 40), st.sampled_from(["a", "b", "c"]), fetched=st.booleans(),
    failures=st.integers(0, 200), ago_s=st.none() | st.floats(0, 10_000),
    refusals=st.none() | st.integers(0, 5)), max_size=30, unique_by=lambda r: r.position))
def test_plan_fetches_each_media_once_and_never_loses_an_unsettled_row(
        rows_: list[Pending]) -> None:
    """Whatever the rows: nothing settled is fetched or looked at again, one fetch per
    media id, and every row not settled is looked at again, never before now."""
    due, again = plan(rows_, now=NOW, max_attempts=3, base_s=1, cap_s=60)
    settled = {r.position for r in rows_ if r.fetched or r.refusals >= 3
               or r.failures >= 3 + OUTAGE_ATTEMPTS}
    assert set(again) == {r.position for r in rows_} - settled
    assert all(at >= NOW for at in again.values())
    assert len({r.media_id for r in due}) == len(due)
    assert all(r.position not in settled and again[r.position] == NOW for r in due)


def test_the_backoff_stays_at_its_cap_however_many_failures() -> None:
    assert backoff(5000, 2.0, 300.0) == 300.0
    assert (backoff(1, 2.0, 300.0), backoff(3, 2.0, 300.0)) == (2.0, 8.0)


def test_a_providers_message_is_masked_whole_and_storable() -> None:
    """Cut to its length before the key was masked, a message with the key across the cut
    kept the key's first characters in clear; and a NUL or half an emoji in it made the
    chat.media.failed event unwritable, which stopped every media fetch for good."""
    key = "APIKEY-0123456789"
    message = r"\u0000 and \ud83d, " + "x" * 270 + " key " + key  # the key across the cut
    body = ('{"success":false,"code":40401,"message":"' + message + '","data":null}').encode()
    with pytest.raises(ChatApiRefused) as refused:
        parse_envelope(404, body, api_key=key)
    detail = str(refused.value)
    assert "API" not in detail and "\x00" not in detail
    detail.encode("utf-8")  # no lone surrogate either: jsonb takes it


def test_envelopes_are_read_strictly() -> None:
    ok = parse_envelope(200, b'{"success":true,"code":1000,"message":"ok","data":{"a":1}}')
    assert ok.data == {"a": 1}
    with pytest.raises(ChatApiRefused) as refused:
        parse_envelope(401, b'{"success":false,"code":40101,"message":"bad key k-123456",'
                            b'"data":null}', api_key="k-123456")
    assert refused.value.code == 40101 and "k-123456" not in str(refused.value)
    with pytest.raises(ChatApiUnavailable):
        parse_envelope(503, b"<html>busy</html>")
    for body in (b"[]", b"{}", b'{"success":true}', b'{"success":"yes","code":1,'
                 b'"message":"","data":{}}', b"\xff"):
        with pytest.raises(ChatApiMalformed):
            parse_envelope(200, body)


def test_a_media_files_new_folders_are_made_durable_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the file's own folder was fsynced: after a power cut the new ``media`` folder
    (or its two-character one) could be gone, and the file with it, while the
    ``chat.media.fetched`` event already named it."""
    synced: list[Path] = []

    def noting(folder: Path) -> None:
        synced.append(Path(folder))

    monkeypatch.setattr(ingest.durable, "fsync_folder", noting)
    monkeypatch.setattr(ingest.chat_media, "fsync_folder", noting)
    home = tmp_path / "home"
    home.mkdir()
    stored = MediaStore(home).put(b"picture bytes")
    target = home / stored.path
    assert target.read_bytes() == b"picture bytes"
    # each new name's folder: the home (for media/), media/ (for its ab/), ab/ (the file)
    assert {home, home / "media", target.parent} <= set(synced)


def test_an_api_key_the_provider_refuses_never_gives_the_media_up(
        db_url: str, sandbox: Sandbox, tmp_path: Path) -> None:
    """A 401 says the key is wrong (mistyped, rotated, expired), nothing about the media:
    counted toward giving up, every media that arrived until the key was put right was
    given up after a few seconds and never fetched again."""
    sandbox.state.issue_media("media-key-1", "image")
    settings: dict[str, Any] = dict(
        chat_secrets={PHONE: SECRET}, api_base_url=sandbox.url, home=tmp_path,
        chat_media_poll_s=0.1, chat_media_retry_base_s=0.1,
        chat_media_max_attempts=MAX_ATTEMPTS, chat_api_timeout_s=2)
    with running_service(db_url, api_key="a-key-the-provider-refuses", **settings) as base:
        sandbox.state.set_webhook_url(PHONE, f"{base}/webhooks/chat/{PHONE}")
        deliver_image(sandbox, "media-key-1", "wamid.K1", "d-k1")
        wait_for(lambda: len(media_events(db_url)) > MAX_ATTEMPTS)
    failed = [p for _, _, p in media_events(db_url)]
    assert {p["detail"].split(",")[0] for p in failed} == {"HTTP 401"}
    assert not any(p["final"] for p in failed) and all(p["retryable"] for p in failed)
    with running_service(db_url, api_key=API_KEY, **settings):  # the key put right
        [stored] = wait_for(lambda: fetched(db_url))
    assert (tmp_path / stored["path"]).read_bytes() == media_bytes("media-key-1")


@pytest.mark.parametrize(("code", "refused"), [
    (40101, True), (40000, True), (49999, True), (30001, False), (1404, False), (None, False)])
def test_an_authentication_code_is_a_refused_key_whatever_the_http_status(
        code: int | None, refused: bool) -> None:
    """The API's HTTP statuses are not in the spec: a key refused as a 200 or a 400 carrying
    the authentication service's 4xxxx is waited out as a 401 is, not counted toward giving
    the media up."""
    assert key_refused_code(code) is refused


NESTED = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("body", [
    NESTED, b'{"success":true,"code":1000,"message":"ok","data":{"x":' + NESTED + b"}}"])
def test_an_answer_nested_past_the_reader_is_malformed_not_a_crash(body: bytes) -> None:
    """``json.loads`` gives up on deep nesting with RecursionError, which is no ValueError:
    it escaped as itself, a traceback from set-webhook and rotate-secret (the admin route a
    500) and a fetch recorded as an ``internal`` failure, not what the answer is."""
    with pytest.raises(ChatApiMalformed):
        parse_envelope(200, body)
    with pytest.raises(ChatApiUnavailable):
        parse_envelope(503, body)


def test_a_json_media_nested_past_the_reader_is_malformed_not_internal() -> None:
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from ingest.chat_api import ChatApi
    from sandbox.runner import serve_asgi

    async def deep(_: Any) -> Response:
        return Response(NESTED, media_type="application/json")

    async def ask(url: str) -> None:
        async with ChatApi(url, API_KEY, timeout_s=5) as api:
            await api.fetch_media("media-deep-1")

    app = Starlette(routes=[Route("/api/v1/waba/messages/{media_id}/media", deep)])
    with serve_asgi(app) as url, pytest.raises(ChatApiMalformed):
        asyncio.run(ask(url))


def test_a_chat_api_answer_naming_a_key_twice_is_no_envelope() -> None:
    """A rotation answer with two ``secret`` fields: its last one stored (a guess) left every
    delivery signed with the other refused; it is an answer not understood instead."""
    raw = (b'{"success":true,"code":1000,"message":"ok",'
           b'"data":{"secret":"s-one","secret":"s-two"}}')
    with pytest.raises(ChatApiMalformed):
        parse_envelope(200, raw)
    assert parse_envelope(200, raw.replace(b'"secret":"s-one",', b"")).data == {
        "secret": "s-two"}
