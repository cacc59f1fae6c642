"""Deliveries kept but unreadable become discrepancies, so a person looks at each.

A signed delivery of a known event whose fields cannot be read (``general.malformed`` and
``chat.malformed``, see :mod:`ingest.general_body` and :mod:`ingest.chat_body`) is in the
ledger with its raw bytes, but no projection can apply it: the payment, invoice or message
it is about may now be wrong in the views. The finding names the delivery (by its dedupe
key), so each is reported once, live or rebuilt. Pure.
"""

from __future__ import annotations

from ledger import StoredEvent
from projections.folding import Discrepancy

# ingest.general_body.MALFORMED_EVENT_TYPE and ingest.chat_body.MALFORMED_EVENT_TYPE
MALFORMED_EVENT_TYPES = frozenset({"general.malformed", "chat.malformed"})


def malformed_discrepancy(event: StoredEvent) -> Discrepancy | None:
    if event.event_type not in MALFORMED_EVENT_TYPES:
        return None
    facts = event.facts
    name = facts.get("event") or (f"chat {facts['kind']}" if facts.get("kind") else "an event")
    return Discrepancy(
        kind="malformed_delivery", subject=str(facts.get("subject") or event.source),
        reference=str(facts.get("reference") or facts.get("message_id") or ""),
        detail=f"a signed {name} delivery could not be read ({facts.get('reason')}: "
               f"{facts.get('detail')}); it is kept in the ledger at position "
               f"{event.position} but in no projection: check it against the provider",
        amount_at_risk=None, evidence=(event.dedupe_key,))
