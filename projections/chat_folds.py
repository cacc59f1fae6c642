"""Pure folds of chat events into chat messages and chat threads.

A message's status only moves forwards: ``sent`` < ``delivered`` < ``read``, and ``failed``
is terminal. The provider retries for hours, so ``read`` may well arrive before
``delivered``; ranking by status (not by arrival) keeps ``read``. Each status keeps its own
timestamp. A thread is (connected number, customer); each inbound message opens or extends
its 24-hour service window, counted from the customer's last inbound message.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ledger import StoredEvent
from projections.folding import (
    Discrepancy,
    key_from_json,
    key_to_json,
    merge_descriptive,
    sort_key,
)

Row = dict[str, Any]
WINDOW = timedelta(hours=24)
STATUS_RANK = {"received": 0, "sent": 1, "delivered": 2, "read": 3, "failed": 4}
CHAT_EVENTS = frozenset({"chat.message.received", "chat.message.sent",
                         "chat.message.delivered", "chat.message.read", "chat.message.failed"})
THREAD_SEPARATOR = "\x1f"


def message_keys(event: StoredEvent) -> list[str]:
    if event.event_type in CHAT_EVENTS and event.facts.get("message_id"):
        return [event.facts["message_id"]]
    return []


def fold_message(row: Row | None, event: StoredEvent) -> tuple[Row, list[Discrepancy]]:
    facts = dict(event.facts)
    status = facts["status"]
    key = sort_key(STATUS_RANK[status], event.occurred_at, event.dedupe_key, event.position)
    state: Row = dict(row) if row is not None else {
        "message_id": facts["message_id"], "status": None, "code": None, "error_code": None,
        "error_title": None, "updated_at": None, "winner": None, "provenance": {},
        "received_at": None, "sent_at": None, "delivered_at": None, "read_at": None,
        "failed_at": None, "event_count": 0, "last_position": 0}
    failure = _failure_mark(state)
    if state["winner"] is None or key > key_from_json(state["winner"]):
        state.update(status=status, updated_at=event.occurred_at, winner=key_to_json(key))
        if failure is None:  # a cause, once given, is kept (below)
            state.update(_cause_of(facts))
    if status == "failed" and _has_cause(facts) and (
            failure is None or key > key_from_json(failure)):
        state.update(_cause_of(facts))
        state["provenance"] = {**state["provenance"], FAILURE_MARK: key_to_json(key)}
    column = f"{status}_at"
    if event.occurred_at is not None and (
            state[column] is None or event.occurred_at < state[column]):
        state[column] = event.occurred_at
    descriptive = {
        "phone_number_id": facts.get("phone_number_id"),
        "contact_wa_id": facts.get("contact_wa_id"),
        "direction": facts.get("direction"),
        "type": facts.get("message_type"),
        "body": facts.get("body"),
        "media_id": facts.get("media_id"),
    }
    # the inbound message itself describes a message best: rank it above every status
    describe_key = (9 if status == "received" else 0, *key[1:])
    current = {name: state.get(name) for name in descriptive}
    values, provenance = merge_descriptive(current, state["provenance"], descriptive,
                                           describe_key)
    state.update(values)
    state["provenance"] = provenance
    state["event_count"] += 1
    state["last_position"] = max(state["last_position"], event.position)
    return state, []


# where ``provenance`` keeps the key of the failed status whose cause the row shows
FAILURE_MARK = "failure"


CAUSE = ("code", "error_code", "error_title")  # a row's cause, taken from one status


def _cause_of(facts: dict[str, Any]) -> Row:
    return {name: facts.get(name) for name in CAUSE}


def _has_cause(fields: dict[str, Any]) -> bool:
    """Whether an event's facts, or a row, give a failure's cause (not only its code)."""
    return fields.get("error_code") is not None or fields.get("error_title") is not None


def _failure_mark(state: Row) -> list[Any] | None:
    """The key of the failed status whose cause (code, error code and title, taken
    together) the row shows: the latest failed status that gave one. A provider reporting
    a message failed a second time without ``errors`` replaced the cause with none. A row
    folded before the mark was kept has its winner's, when that is a failure with a cause."""
    mark = state["provenance"].get(FAILURE_MARK)
    if mark is None and state["status"] == "failed" and _has_cause(state):
        return state["winner"]
    return mark


def thread_keys(event: StoredEvent) -> list[str]:
    facts = event.facts
    if event.event_type != "chat.message.received":
        return []
    if not facts.get("phone_number_id") or not facts.get("contact_wa_id"):
        return []
    return [f"{facts['phone_number_id']}{THREAD_SEPARATOR}{facts['contact_wa_id']}"]


def window_start(event: StoredEvent) -> datetime:
    """When an inbound message opened or extended its window: its own time, else when the
    delivery reached us.

    The spec makes every inbound message open or extend the window; one that came without
    ``message.timestamp`` left its thread closed (and an open one unextended) although the
    customer had just written. The time it was received is the only evidence left, and the
    ledger keeps it, so a rebuild counts from the same instant as the live projector did.

    Never later than that arrival: a message stamped in the future (a sender's clock days
    ahead, a timestamp of year 5138) held the window open that much longer, and replies
    went out as if the customer had just written."""
    if event.occurred_at is None:
        return event.received_at
    return min(event.occurred_at, event.received_at)


def fold_thread(row: Row | None, event: StoredEvent) -> tuple[Row, list[Discrepancy]]:
    facts = dict(event.facts)
    state: Row = dict(row) if row is not None else {
        "thread_key": thread_keys(event)[0], "phone_number_id": facts["phone_number_id"],
        "contact_wa_id": facts["contact_wa_id"], "profile_name": None,
        "last_inbound_at": None, "window_expires_at": None, "last_message_id": None,
        "provenance": {}, "event_count": 0, "last_position": 0}
    at = window_start(event)
    latest = state["last_inbound_at"]
    # two messages in one second: the greater id is the last, whichever arrived first
    if latest is None or at > latest or (
            at == latest and (facts.get("message_id") or "") > (state["last_message_id"] or "")):
        state["last_inbound_at"] = at
        state["window_expires_at"] = at + WINDOW
        state["last_message_id"] = facts.get("message_id")
    key = sort_key(0, at, event.dedupe_key, event.position)
    values, provenance = merge_descriptive({"profile_name": state["profile_name"]},
                                           state["provenance"],
                                           {"profile_name": facts.get("profile_name")}, key)
    state.update(values)
    state["provenance"] = provenance
    state["event_count"] += 1
    state["last_position"] = max(state["last_position"], event.position)
    return state, []
