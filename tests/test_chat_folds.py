"""Pure folds of chat events: statuses never move backwards, the 24-hour window."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any
from uuid import uuid4

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.chat_body import DeliveryMeta, read_chat
from ledger import StoredEvent
from projections.chat_folds import (
    FAILURE_MARK,
    STATUS_RANK,
    fold_message,
    fold_thread,
    message_keys,
    thread_keys,
)
from projections.registry import Row

_positions = count(1)
T0 = 1_795_000_000


def chat_event(body: dict[str, Any], position: int | None = None) -> StoredEvent:
    read = read_chat(body, DeliveryMeta(phone_number_id="100001", delivery_id=str(uuid4()),
                                        attempt=1))
    now = datetime.now(UTC)
    return StoredEvent(position or next(_positions), uuid4(), read.stream, read.event_type,
                       "chat", read.dedupe_key, None, json.loads(json.dumps(read.facts)), now,
                       now, read.occurred_at, None, {}, None, None)


def status(message_id: str, value: str, at: int, error: tuple[int, str] | None = None
           ) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "status", "wabaId": "W", "phoneNumberId": "100001",
                            "status": {"id": message_id, "status": value,
                                       "timestamp": str(at), "recipient_id": "255700000001"}}
    if error:
        body["errors"] = [{"code": error[0], "title": error[1]}]
    return body


def inbound(message_id: str, at: int, contact: str = "255700000001", name: str = "Asha",
            kind: str = "text") -> dict[str, Any]:
    message: dict[str, Any] = {"id": message_id, "from": contact, "timestamp": str(at),
                               "type": kind}
    if kind == "text":
        message["text"] = {"body": "habari"}
    else:
        message[kind] = {"id": f"media-{message_id}"}
    return {"type": "message", "wabaId": "W", "phoneNumberId": "100001",
            "contactWaId": contact, "profileName": name, "message": message}


def fold(events: list[StoredEvent], keys: Any, folder: Any) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for event in events:
        for key in keys(event):
            rows[key], _ = folder(rows.get(key), event)
    return rows


def test_read_arriving_before_delivered_keeps_read_and_both_times() -> None:
    events = [chat_event(status("m1", "sent", T0)), chat_event(status("m1", "read", T0 + 20)),
              chat_event(status("m1", "delivered", T0 + 10))]
    row = fold(events, message_keys, fold_message)["m1"]
    assert (row["status"], row["code"]) == ("read", 95002)
    assert row["delivered_at"] == datetime.fromtimestamp(T0 + 10, UTC)
    assert row["read_at"] == datetime.fromtimestamp(T0 + 20, UTC)
    assert row["direction"] == "outbound"


def in_both_orders(first: StoredEvent, second: StoredEvent) -> list[Row]:
    """The message row the two events fold into, in each order they can arrive in."""
    (key,) = message_keys(first)
    return [fold(order, message_keys, fold_message)[key]
            for order in ([first, second], [second, first])]


def test_failed_is_terminal_with_its_mapped_cause() -> None:
    failed = chat_event(status("m2", "failed", T0 + 5, (131047, "Re-engagement message")))
    later = chat_event(status("m2", "read", T0 + 50))
    for row in in_both_orders(failed, later):
        assert (row["status"], row["code"], row["error_code"], row["error_title"]) == (
            "failed", 95063, "131047", "Re-engagement message")


def test_a_later_failed_status_without_a_cause_keeps_the_earlier_ones_cause() -> None:
    """The provider may report a message failed twice; the second report without
    ``errors`` said nothing new, and the cause (why the message never arrived) was lost."""
    caused = chat_event(status("m4", "failed", T0 + 5, (131047, "Re-engagement message")))
    bare = chat_event(status("m4", "failed", T0 + 60))
    for row in in_both_orders(caused, bare):
        assert (row["status"], row["code"], row["error_code"], row["error_title"]) == (
            "failed", 95063, "131047", "Re-engagement message")
        assert row["updated_at"] == datetime.fromtimestamp(T0 + 60, UTC)


def test_a_row_folded_before_the_cause_was_marked_keeps_its_cause_too() -> None:
    caused = chat_event(status("m6", "failed", T0 + 5, (131047, "Re-engagement message")))
    row, _ = fold_message(None, caused)
    old = {**row, "provenance": {k: v for k, v in row["provenance"].items()
                                 if k != FAILURE_MARK}}
    assert FAILURE_MARK in row["provenance"] and FAILURE_MARK not in old["provenance"]
    later, _ = fold_message(old, chat_event(status("m6", "failed", T0 + 60)))
    assert (later["code"], later["error_code"]) == (95063, "131047")


def test_of_two_failed_statuses_with_causes_the_later_ones_cause_counts_whole() -> None:
    first = chat_event(status("m5", "failed", T0 + 5, (131047, "Re-engagement message")))
    second = chat_event(status("m5", "failed", T0 + 9, (131026, "Message undeliverable")))
    for row in in_both_orders(first, second):
        assert (row["error_code"], row["error_title"]) == ("131026", "Message undeliverable")
        assert row["code"] == second.facts["code"]


def test_an_unmapped_platform_error_is_95050() -> None:
    row = fold([chat_event(status("m3", "failed", T0, (999999, "???")))], message_keys,
               fold_message)["m3"]
    assert row["code"] == 95050


def test_an_inbound_media_message_is_received_with_its_media_id() -> None:
    row = fold([chat_event(inbound("in1", T0, kind="image"))], message_keys, fold_message)["in1"]
    assert (row["status"], row["code"], row["direction"], row["type"], row["media_id"]) == (
        "received", 95003, "inbound", "image", "media-in1")


def test_an_inbound_media_messages_caption_shows_as_its_body() -> None:
    body = inbound("in2", T0, kind="document")
    body["message"]["document"]["caption"] = "Invoice INV-7, paid"
    row = fold([chat_event(body)], message_keys, fold_message)["in2"]
    assert (row["type"], row["body"], row["media_id"]) == (
        "document", "Invoice INV-7, paid", "media-in2")


def test_each_inbound_message_extends_the_window_and_a_late_old_one_does_not_shrink_it() -> None:
    newer = chat_event(inbound("a", T0 + 3600, name="Asha M."))
    older = chat_event(inbound("b", T0, name="Asha"))
    rows = fold([newer, older], thread_keys, fold_thread)
    [row] = rows.values()
    assert row["last_inbound_at"] == datetime.fromtimestamp(T0 + 3600, UTC)
    assert row["window_expires_at"] - row["last_inbound_at"] == timedelta(hours=24)
    assert (row["profile_name"], row["last_message_id"]) == ("Asha M.", "a")


def test_two_messages_in_one_second_leave_the_same_thread_whatever_arrived_first() -> None:
    """Timestamps are whole seconds: arrival order must not pick the last message, nor the
    name the thread shows."""
    a = chat_event(inbound("wamid.A", T0, name="Asha"))
    b = chat_event(inbound("wamid.B", T0, name="Asha M."))
    first = fold([a, b], thread_keys, fold_thread)
    again = fold([dataclasses.replace(b, position=1), dataclasses.replace(a, position=2)],
                 thread_keys, fold_thread)
    assert [{k: v for k, v in row.items() if k not in HIDDEN} for row in first.values()] == [
        {k: v for k, v in row.items() if k not in HIDDEN} for row in again.values()]
    [row] = first.values()
    assert row["last_message_id"] == "wamid.B" and row["last_inbound_at"] == datetime.fromtimestamp(
        T0, UTC)


def test_a_failed_status_with_a_numeric_recipient_id_is_folded_terminal() -> None:
    """Strict, ``recipient_id`` sent as a number kept the ``failed`` status malformed: it was
    never folded and the message stayed ``sent``. It only describes the message."""
    failed = status("m10", "failed", T0 + 5, (131026, "Undeliverable"))
    failed["status"]["recipient_id"] = 255700000001
    events = [chat_event(status("m10", "sent", T0)), chat_event(failed)]
    row = fold(events, message_keys, fold_message)["m10"]
    assert (row["status"], row["code"], row["contact_wa_id"]) == (
        "failed", 95057, "255700000001")


def test_an_inbound_message_with_a_numeric_business_account_id_opens_the_window() -> None:
    """Strict, a numeric ``wabaId`` kept the inbound message malformed: no thread and no
    24-hour window although the customer had written."""
    body = {**inbound("wamid.WABA", T0), "wabaId": 2001234567}
    [row] = fold([chat_event(body)], thread_keys, fold_thread).values()
    assert (row["contact_wa_id"], row["last_message_id"]) == ("255700000001", "wamid.WABA")
    assert row["window_expires_at"] == datetime.fromtimestamp(T0, UTC) + timedelta(hours=24)


def test_statuses_do_not_open_a_window() -> None:
    assert thread_keys(chat_event(status("m9", "read", T0))) == []


HIDDEN = {"winner", "provenance", "last_position"}


@given(st.permutations(["sent", "delivered", "read", "failed"]), st.integers(0, 3))
def test_status_order_of_arrival_never_matters(order: list[str], drop: int) -> None:
    times = {"sent": T0, "delivered": T0 + 10, "read": T0 + 20, "failed": T0 + 30}
    chosen = [s for i, s in enumerate(order) if i != drop]
    canonical = sorted(chosen, key=lambda s: times[s])

    def run(sequence: list[str]) -> Row:
        events = [chat_event(status("m", s, times[s]), position=i + 1)
                  for i, s in enumerate(sequence)]
        row = fold(events, message_keys, fold_message)["m"]
        return {k: v for k, v in row.items() if k not in HIDDEN}

    assert run(chosen) == run(canonical)


def test_an_inbound_message_without_its_own_time_still_opens_and_extends_the_window() -> None:
    """Every inbound message opens or extends the window; one without ``message.timestamp``
    counts from when it was received, never leaves the thread closed."""
    received = datetime.fromtimestamp(T0 + 7200, UTC)
    body = inbound("wamid.NOTS", T0)
    del body["message"]["timestamp"]
    untimed = dataclasses.replace(chat_event(body), received_at=received)
    earlier = chat_event(inbound("wamid.EARLY", T0))
    for order in ([untimed], [earlier, untimed], [untimed, earlier]):
        [row] = fold(order, thread_keys, fold_thread).values()
        assert (row["last_inbound_at"], row["window_expires_at"], row["last_message_id"]) == (
            received, received + timedelta(hours=24), "wamid.NOTS")


def test_a_message_timestamped_in_the_future_opens_the_window_when_it_arrived() -> None:
    """A sender's clock days ahead (or a timestamp of year 5138) kept the 24-hour window
    open that much longer: replies would be sent as if the customer had just written. The
    window counts from the earlier of the message's time and its arrival."""
    received = datetime.fromtimestamp(T0, UTC)
    for ahead in (3 * 86400, 99_999_999_999 - T0):
        future = dataclasses.replace(chat_event(inbound("wamid.FUTURE", T0 + ahead)),
                                     received_at=received)
        [row] = fold([future], thread_keys, fold_thread).values()
        assert (row["last_inbound_at"], row["window_expires_at"]) == (
            received, received + timedelta(hours=24))
    retried = dataclasses.replace(chat_event(inbound("wamid.LATE", T0 - 3600)),
                                  received_at=received)  # delivered on a retry an hour on
    [row] = fold([retried], thread_keys, fold_thread).values()
    assert row["last_inbound_at"] == received - timedelta(hours=1)


@st.composite
def chat_history(draw: st.DrawFn) -> list[StoredEvent]:
    """Inbound messages to two numbers from two customers, some in one second, some 24 h
    apart to the second, some without their own time and counted from arrival, each
    delivered once or twice under different delivery ids; and statuses of sent messages,
    some without a time, some failed with a cause."""
    events: list[StoredEvent] = []
    for i in range(draw(st.integers(1, 6))):
        contact = draw(st.sampled_from(["255700000001", "255700000002"]))
        at = T0 + draw(st.sampled_from([0, 1, 86399, 86400, 86401]))
        body = inbound(f"wamid.P{i}", at, contact=contact,
                       name=draw(st.sampled_from(["Asha", "Asha M."])),
                       kind=draw(st.sampled_from(["text", "image"])))
        body["phoneNumberId"] = draw(st.sampled_from(["100001", "100002"]))
        if draw(st.booleans()):
            del body["message"]["timestamp"]
        if draw(st.booleans()):
            del body["profileName"]
        for _ in range(draw(st.integers(1, 2))):
            received = datetime.fromtimestamp(at + draw(st.sampled_from([0, 5, 3600])), UTC)
            event = chat_event_for(body, body["phoneNumberId"])
            events.append(dataclasses.replace(event, received_at=received))
    for j in range(draw(st.integers(0, 3))):
        for value in draw(st.lists(st.sampled_from(["sent", "delivered", "read", "failed"]),
                                   max_size=5)):
            body = status(f"wamid.S{j}", value, T0 + draw(st.integers(0, 3)),
                          draw(st.sampled_from([None, (131047, "Re-engagement"),
                                                (131026, "Undeliverable")]))
                          if value == "failed" else None)
            body["status"]["recipient_id"] = draw(st.sampled_from(["2557001", "2557002"]))
            if draw(st.booleans()):
                del body["status"]["timestamp"]
            events.append(chat_event(body))
    return events


def chat_event_for(body: dict[str, Any], phone_number_id: str) -> StoredEvent:
    read = read_chat(body, DeliveryMeta(phone_number_id=phone_number_id,
                                        delivery_id=str(uuid4()), attempt=1))
    now = datetime.now(UTC)
    return StoredEvent(next(_positions), uuid4(), read.stream, read.event_type, "chat",
                       read.dedupe_key, None, json.loads(json.dumps(read.facts)), now, now,
                       read.occurred_at, None, {}, None, None)


def folded_views(events: list[StoredEvent]) -> dict[str, dict[str, Row]]:
    """Both chat projections, as a user sees them, after ``events`` in this order."""
    views = {}
    for keys, folder in ((message_keys, fold_message), (thread_keys, fold_thread)):
        arrived = [dataclasses.replace(event, position=n)
                   for n, event in enumerate(events, start=1)]
        views[folder.__name__] = {
            key: {k: v for k, v in row.items() if k not in HIDDEN}
            for key, row in fold(arrived, keys, folder).items()}
    return views


@settings(max_examples=300)
@given(chat_history(), st.randoms(use_true_random=False))
def test_messages_and_threads_depend_on_the_deliveries_not_their_order(
        events: list[StoredEvent], rng: Any) -> None:
    """Retries reorder everything: a thread's window, its last message and its name, and
    every message's status, cause and times are the same whatever order the same
    deliveries (copies under other delivery ids included) arrived in."""
    shuffled = list(events)
    rng.shuffle(shuffled)
    assert folded_views(shuffled) == folded_views(events)


@settings(max_examples=300)
@given(chat_history(), st.randoms(use_true_random=False))
def test_after_every_delivery_a_status_never_went_back_and_a_window_never_shrank(
        events: list[StoredEvent], rng: Any) -> None:
    """Checked after each delivery in any order, not only at the end: a message's status is
    the highest of those it has had (``failed`` for good, with a failure's cause), each
    status keeps the first time it was given, and a thread's window runs 24 h from its
    latest inbound message (its own time, or its arrival when that is earlier or it has
    none), never closing earlier than it did before."""
    arrived = list(events)
    rng.shuffle(arrived)
    messages: dict[str, Row] = {}
    threads: dict[str, Row] = {}
    seen: list[StoredEvent] = []
    for event in arrived:
        seen.append(event)
        for key in message_keys(event):
            before = messages.get(key)
            row = messages[key] = fold_message(before, event)[0]
            mine = [e for e in seen if message_keys(e) == [key]]
            assert STATUS_RANK[row["status"]] == max(STATUS_RANK[e.facts["status"]]
                                                     for e in mine)
            if before is not None:
                assert STATUS_RANK[row["status"]] >= STATUS_RANK[before["status"]]
            if row["status"] == "failed":
                assert (row["code"], row["error_code"], row["error_title"]) in {
                    (e.facts["code"], e.facts["error_code"], e.facts["error_title"])
                    for e in mine if e.facts["status"] == "failed"}
            for value in STATUS_RANK:
                times = [e.occurred_at for e in mine
                         if e.facts["status"] == value and e.occurred_at is not None]
                assert row[f"{value}_at"] == (min(times) if times else None)
        for key in thread_keys(event):
            before = threads.get(key)
            row = threads[key] = fold_thread(before, event)[0]
            latest = max(min(e.occurred_at or e.received_at, e.received_at)
                         for e in seen if thread_keys(e) == [key])
            assert (row["last_inbound_at"], row["window_expires_at"]) == (
                latest, latest + timedelta(hours=24))
            if before is not None:
                assert row["window_expires_at"] >= before["window_expires_at"]


# -- found unpinned by mutation testing ----------------------------------------------------

def test_rows_count_their_events_and_keep_the_highest_position_in_any_order() -> None:
    messages = [chat_event(status("mc", "sent", T0), position=5),
                chat_event(status("mc", "read", T0 + 20), position=9),
                chat_event(status("mc", "delivered", T0 + 10), position=7)]
    inbounds = [chat_event(inbound("ia", T0), position=4),
                chat_event(inbound("ib", T0 + 60), position=8),
                chat_event(inbound("ic", T0 + 30), position=6)]
    for order in (messages, messages[::-1]):
        row = fold(order, message_keys, fold_message)["mc"]
        assert (row["event_count"], row["last_position"]) == (3, 9)
    for order in (inbounds, inbounds[::-1]):
        [thread] = fold(order, thread_keys, fold_thread).values()
        assert (thread["event_count"], thread["last_position"]) == (3, 8)


def test_an_inbound_message_without_a_customer_id_opens_no_thread() -> None:
    """No ``contactWaId`` and no ``message.from``: whose window it would open is unknown."""
    body = inbound("wamid.ANON", T0)
    del body["contactWaId"]
    del body["message"]["from"]
    event = chat_event(body)
    assert event.event_type == "chat.message.received" and thread_keys(event) == []
    assert message_keys(event) == ["wamid.ANON"]


def test_the_inbound_message_describes_its_row_over_any_status_of_that_id() -> None:
    """Ranked above every status whatever its time: the message's own direction and text."""
    received = chat_event(inbound("wamid.BOTH", T0))
    later_status = chat_event(status("wamid.BOTH", "read", T0 + 60))
    for order in ([received, later_status], [later_status, received]):
        row = fold(order, message_keys, fold_message)["wamid.BOTH"]
        assert (row["direction"], row["type"], row["body"]) == ("inbound", "text", "habari")
