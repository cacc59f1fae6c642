"""Deterministic scenarios: the provider's world for a seed, and how it is delivered. Pure.

``make_plan(name, seed, ...)`` returns a :class:`Plan`: every event the provider produced
(general and chat), the records its reference API holds, the sends (with the faults of the
scenario: drops, duplicates through up to three endpoints, delays, reorders, bad or stale
signatures, chat attempts lost in transit so that retries reorder statuses), and the GROUND
TRUTH. Same name, seed, start, endpoints and phone numbers: identical plan, byte for byte.

The ground truth is derived from the story models (not from the bodies or the records), so
comparing it with the reference API checks one against the other. Its JSON shape::

    {
      "scenario": "faulty", "seed": 7, "start": "2026-11-22T05:00:00+00:00",
      "payments": {REF: {"status", "outcome", "amount", "code", "transaction_id",
                         "customer_reference", "invoice_no"}},      # collections
      "payouts":  {REF: {"status", "outcome", "amount", "code", "transaction_id",
                         "refunded_to_wallet"}},
      "invoices": {NO:  {"status", "total", "amount_paid", "amount_due", "settled",
                         "currency", "payment_reference"}},
      "sms":      {MESSAGE_ID: {"status", "recipient", "code"}},    # status pending when
                                                                    # never terminal
      "chat_messages": {MESSAGE_ID: {"phone_number_id", "contact_wa_id", "direction",
                                     "type", "status", "code", "error_code",
                                     "error_title", "media_id"}},
      "chat_threads": [{"phone_number_id", "contact_wa_id", "profile_name",
                        "last_inbound_at"}],
      "general_events": [{"event_id", "event", "reference", "code", "delivered",
                          "copies", "body"}],                        # provider order
      "dropped": [{"event_id", "event", "reference"}],              # never sent
      "bad_signatures": [{"system", "id", "endpoint", "body_sha256"}],
      "counts": {"general_events", "general_sends", "dropped", "duplicates",
                 "bad_signatures", "chat_events", "chat_lost_attempts"}
    }

Amounts are exact JSON numbers; times are ISO 8601 with offsets. Vocabularies follow
CONTRACT.md (``outcome``: success/failure/refunded/pending; invoice ``status``:
open/partially_paid/paid/cancelled; SMS: pending/delivered/failed; chat: received/sent/
delivered/read/failed).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from sandbox import events as ev
from sandbox.codes import (
    CHAT_ERRORS,
    CHAT_STATUS_CODE,
    COLLECTION_FAILURE_CODES,
    GENERAL_CODES,
    MEDIA_KINDS,
    PAYOUT_FAILURE_CODES,
    SMS_FAILURE_CODES,
)
from sandbox.delivery import Fault
from sandbox.jsonenc import encode

DEFAULT_START = datetime(2026, 11, 22, 5, 0, tzinfo=UTC)
DEFAULT_PHONE_NUMBERS = ("100001", "100002", "100003")
DEFAULT_ENDPOINTS = ("primary",)
SPACING_MS = 4  # the provider's events are this far apart on the run's clock


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Per-delivery probabilities of each fault (general) and per chat event (chat)."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    reorder: float = 0.0
    bad_signature: float = 0.0
    max_delay_ms: int = 150
    chat_lost: float = 0.0
    chat_bad_signature: float = 0.0
    chat_stale: float = 0.0


SCENARIOS: dict[str, FaultRates] = {
    "clean": FaultRates(),
    "faulty": FaultRates(drop=0.06, duplicate=0.15, delay=0.1, reorder=0.1,
                         bad_signature=0.04, chat_lost=0.25, chat_bad_signature=0.05,
                         chat_stale=0.05),
}


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    event_id: str
    system: Literal["general", "chat"]
    at: datetime
    body: dict[str, Any]
    phone_number_id: str | None = None


@dataclass(frozen=True, slots=True)
class GeneralSend:
    seq: int
    event_id: str
    endpoint: str
    body: bytes
    bad_signature: bool
    send_at_ms: int
    copy: int  # 0: the original; 1, 2: duplicates


@dataclass(frozen=True, slots=True)
class ChatSend:
    delivery_id: str
    event_id: str
    phone_number_id: str
    body: bytes
    lost_attempts: int
    first_attempt_fault: Fault | None
    send_at_ms: int


@dataclass(frozen=True)
class Plan:
    scenario: str
    seed: int
    start: datetime
    events: list[ProviderEvent]
    general_sends: list[GeneralSend]
    chat_sends: list[ChatSend]
    records: dict[str, dict[str, Any]]
    media: dict[str, str]
    truth: dict[str, Any]


# -- the world: stories of subjects, interleaved on one clock ------------------------------

Step = Callable[[datetime], None]

FIRST_NAMES = ("Asha", "Baraka", "Neema", "Juma", "Rehema", "Daudi", "Zawadi", "Hamisi")
LAST_NAMES = ("Mushi", "Mwakyusa", "Kimaro", "Said", "Njau", "Massawe", "Ally", "Shirima")
OPERATORS = ("Vodacom", "Airtel", "Tigo", "Halotel")


@dataclass
class _World:
    rng: random.Random
    tag: str
    events: list[ProviderEvent] = field(default_factory=list)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    media: dict[str, str] = field(default_factory=dict)
    truth: dict[str, Any] = field(default_factory=dict)
    counter: int = 0

    def next_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.tag}-{self.counter:04d}"

    def customer(self) -> ev.Customer:
        r = self.rng
        return ev.Customer(r.choice(FIRST_NAMES), r.choice(LAST_NAMES),
                           f"2557{r.randint(10_000_000, 99_999_999)}", r.choice(OPERATORS))

    def amount(self) -> Decimal:
        whole = Decimal(self.rng.randint(10, 5000) * 100)
        return whole + (Decimal("0.50") if self.rng.random() < 0.2 else 0)

    def general(self, body: dict[str, Any], at: datetime) -> None:
        self.events.append(ProviderEvent(self.next_id("E"), "general", at, body))
        self.records[str(body["reference"])] = {k: v for k, v in body.items()
                                                if k != "payloadSignature"}

    def chat(self, body: dict[str, Any], at: datetime, phone_number_id: str) -> None:
        self.events.append(ProviderEvent(self.next_id("E"), "chat", at, body, phone_number_id))


def _payment_truth(status: str, outcome: str, amount: Decimal, code: int,
                   transaction_id: str | None, customer_reference: str | None,
                   invoice_no: str | None = None) -> dict[str, Any]:
    return {"status": status, "outcome": outcome, "amount": amount, "code": code,
            "transaction_id": transaction_id, "customer_reference": customer_reference,
            "invoice_no": invoice_no}


def _collection_stories(w: _World, count: int) -> list[list[Step]]:
    payments: dict[str, Any] = w.truth.setdefault("payments", {})
    plans: list[int | str] = list(COLLECTION_FAILURE_CODES)
    while len(plans) < count:
        plans.append(w.rng.choice(["paid", "paid", "refunded"]))
    plans = plans[:max(count, len(COLLECTION_FAILURE_CODES) + 2)]
    plans[-1], plans[-2] = "paid", "refunded"  # both always appear
    w.rng.shuffle(plans)
    stories: list[list[Step]] = []
    for plan in plans:
        ref, cust, order = w.next_id("C"), w.customer(), w.next_id("order-")
        amount, txn = w.amount(), w.next_id("TX")
        if isinstance(plan, int):
            def failed(at: datetime, ref: str = ref, code: int = plan,
                       cust: ev.Customer = cust, order: str = order) -> None:
                w.general(ev.payment_failed(ref, code, at, customer=cust,
                                            customer_reference=order), at)
                payments[ref] = _payment_truth(GENERAL_CODES[code][1], "failure",
                                               Decimal(0), code, None, order)
            stories.append([failed])
            continue

        def paid(at: datetime, ref: str = ref, cust: ev.Customer = cust, order: str = order,
                 amount: Decimal = amount, txn: str = txn) -> None:
            w.general(ev.payment_confirmed(ref, amount, at, transaction_id=txn, customer=cust,
                                           customer_reference=order), at)
            payments[ref] = _payment_truth("SUCCESSFUL", "success", amount, 91000, txn, order)

        story: list[Step] = [paid]
        if plan == "refunded":
            def refunded(at: datetime, ref: str = ref, cust: ev.Customer = cust,
                         order: str = order, amount: Decimal = amount, txn: str = txn) -> None:
                w.general(ev.payment_refunded(ref, amount, at, transaction_id=txn,
                                              customer=cust, customer_reference=order), at)
                payments[ref] = _payment_truth("REFUNDED", "refunded", amount, 91010, txn,
                                               order)
            story.append(refunded)
        stories.append(story)
    return stories


def _payout_stories(w: _World, count: int) -> list[list[Step]]:
    payouts: dict[str, Any] = w.truth.setdefault("payouts", {})
    shapes: list[tuple[str, int | None]] = []
    for i, failure in enumerate(PAYOUT_FAILURE_CODES):  # every failure code, half approved
        shapes.append(("approved_failed" if i % 2 else "failed", failure))
    while len(shapes) < max(count, len(PAYOUT_FAILURE_CODES) + 3):
        shapes.append((w.rng.choice(["confirmed", "confirmed", "approved_only"]), None))
    shapes[-1] = ("confirmed", None)
    w.rng.shuffle(shapes)
    stories: list[list[Step]] = []
    for shape, code in shapes:
        ref, cust, amount = w.next_id("P"), w.customer(), w.amount()
        txn, order = w.next_id("PTX"), w.next_id("payout-")

        def approved(at: datetime, ref: str = ref, cust: ev.Customer = cust,
                     amount: Decimal = amount, order: str = order) -> None:
            w.general(ev.payout_approved(ref, amount, at, customer=cust,
                                         customer_reference=order), at)
            payouts[ref] = {"status": "APPROVED", "outcome": "pending", "amount": amount,
                            "code": 92002, "transaction_id": None,
                            "refunded_to_wallet": False}

        def confirmed(at: datetime, ref: str = ref, cust: ev.Customer = cust,
                      amount: Decimal = amount, txn: str = txn, order: str = order) -> None:
            w.general(ev.payout_confirmed(ref, amount, at, transaction_id=txn, customer=cust,
                                          customer_reference=order), at)
            payouts[ref] = {"status": "SUCCESSFUL", "outcome": "success", "amount": amount,
                            "code": 92000, "transaction_id": txn,
                            "refunded_to_wallet": False}

        def failed(at: datetime, ref: str = ref, cust: ev.Customer = cust,
                   code: int | None = code, order: str = order) -> None:
            assert code is not None
            w.general(ev.payout_failed(ref, code, at, customer=cust,
                                       customer_reference=order), at)
            payouts[ref] = {"status": GENERAL_CODES[code][1], "outcome": "failure",
                            "amount": Decimal(0), "code": code, "transaction_id": None,
                            "refunded_to_wallet": True}

        by_shape: dict[str, list[Step]] = {
            "failed": [failed], "approved_failed": [approved, failed],
            "confirmed": [approved, confirmed], "approved_only": [approved]}
        stories.append(by_shape[shape])
    return stories


def _invoice_stories(w: _World, count: int) -> list[list[Step]]:
    invoices: dict[str, Any] = w.truth.setdefault("invoices", {})
    payments: dict[str, Any] = w.truth.setdefault("payments", {})
    templates = ["paid_in_parts", "partial", "cancelled", "paid_at_once", "created_only"]
    stories: list[list[Step]] = []
    for i in range(max(count, len(templates))):
        template = templates[i % len(templates)]
        no, cust = w.next_id("INV"), w.customer()
        total = Decimal(w.rng.randint(20, 400) * 1000)
        box: dict[str, Any] = {"invoice": ev.Invoice(
            no, total, Decimal(0), date(2026, 12, 1) + timedelta(days=w.rng.randint(0, 60)),
            f"99{w.rng.randint(100000, 999999)}"), "cancelled": False}

        def truth(box: dict[str, Any]) -> None:
            inv: ev.Invoice = box["invoice"]
            status = ("cancelled" if box["cancelled"] else "paid" if inv.settled
                      else "partially_paid" if inv.amount_paid > 0 else "open")
            invoices[inv.invoice_no] = {
                "status": status, "total": inv.total, "amount_paid": inv.amount_paid,
                "amount_due": inv.amount_due, "settled": inv.settled,
                "currency": inv.currency, "payment_reference": inv.payment_reference}

        def invoice_step(event: str, box: dict[str, Any] = box, cust: ev.Customer = cust,
                         extend_days: int = 0) -> Step:
            def step(at: datetime) -> None:
                inv: ev.Invoice = box["invoice"]
                if extend_days:
                    inv = ev.Invoice(inv.invoice_no, inv.total, inv.amount_paid,
                                     inv.due_date + timedelta(days=extend_days),
                                     inv.payment_reference, inv.currency, inv.paid_date)
                if event == "invoice.cancelled":
                    box["cancelled"] = True
                box["invoice"] = inv
                w.general(ev.invoice_event(event, inv, at, customer=cust,
                                           cancelled=box["cancelled"]), at)
                truth(box)
            return step

        def pay(fraction: Decimal | None, box: dict[str, Any] = box,
                cust: ev.Customer = cust) -> Step:
            """A payment against the invoice: part (91001) or the rest (91000)."""
            def step(at: datetime) -> None:
                inv: ev.Invoice = box["invoice"]
                amount = (inv.amount_due if fraction is None
                          else (inv.amount_due * fraction).quantize(Decimal(1)))
                inv = inv.paying(amount)
                if inv.settled:
                    inv = ev.Invoice(inv.invoice_no, inv.total, inv.amount_paid, inv.due_date,
                                     inv.payment_reference, inv.currency, at)
                box["invoice"] = inv
                ref, txn = w.next_id("C"), w.next_id("TX")
                part = not inv.settled
                w.general(ev.payment_confirmed(ref, amount, at, transaction_id=txn,
                                               customer=cust,
                                               customer_reference=inv.payment_reference,
                                               part=part, invoice=inv), at)
                payments[ref] = _payment_truth("PARTIAL" if part else "SUCCESSFUL", "success",
                                               amount, 91001 if part else 91000, txn,
                                               inv.payment_reference, inv.invoice_no)
                truth(box)
            return step

        created = invoice_step("invoice.created")
        stories.append({
            "paid_in_parts": [created, invoice_step("invoice.updated", extend_days=7),
                              pay(Decimal("0.4")), invoice_step("invoice.updated",
                                                                extend_days=14),
                              pay(None), invoice_step("invoice.paid"),
                              invoice_step("invoice.updated")],
            "partial": [created, pay(Decimal("0.25")),
                        invoice_step("invoice.updated", extend_days=10)],
            "cancelled": [created, invoice_step("invoice.updated", extend_days=5),
                          invoice_step("invoice.cancelled"), invoice_step("invoice.updated")],
            "paid_at_once": [created, pay(None), invoice_step("invoice.paid")],
            "created_only": [created],
        }[template])
    return stories


def _sms_stories(w: _World, count: int, start: datetime) -> list[list[Step]]:
    sms: dict[str, Any] = w.truth.setdefault("sms", {})
    outcomes: list[int | None] = [94000, *SMS_FAILURE_CODES, None]
    while len(outcomes) < count:
        outcomes.append(w.rng.choice([94000, 94000, 94000, None, *SMS_FAILURE_CODES]))
    w.rng.shuffle(outcomes)
    stories: list[list[Step]] = []
    for code in outcomes:
        message_id, cust = w.next_id("SMS"), w.customer()
        sms[message_id] = {"status": "pending", "recipient": cust.phone_number, "code": None}
        # the provider knows a sent message from the start, terminal or not
        w.records[message_id] = {
            "reference": message_id, "customerReference": cust.phone_number,
            "amount": Decimal(0), "type": "CHARGE", "status": "SENT", "service": "Bulk SMS",
            "timestamp": ev.provider_timestamp(start), "customer": cust.as_json()}
        if code is None:
            continue  # never reaches a terminal state: no webhook, ever

        def report(at: datetime, message_id: str = message_id, cust: ev.Customer = cust,
                   code: int = code) -> None:
            w.general(ev.sms_event(message_id, cust.phone_number, at, code=code,
                                   customer=cust), at)
            sms[message_id] = {"status": "delivered" if code == 94000 else "failed",
                               "recipient": cust.phone_number, "code": code}
        stories.append([report])
    return stories


def _chat_stories(w: _World, phone_numbers: tuple[str, ...], waba_id: str
                  ) -> list[list[Step]]:
    messages: dict[str, Any] = w.truth.setdefault("chat_messages", {})
    threads: dict[tuple[str, str], dict[str, Any]] = {}
    w.truth["_threads"] = threads
    failure_codes = sorted(CHAT_ERRORS)
    stories: list[list[Step]] = []
    outbound_index = 0
    kinds = ["text", "image", "document", "audio", "video"]
    for pn_index, pn in enumerate(phone_numbers):
        contacts = [(f"2556{w.rng.randint(10_000_000, 99_999_999)}",
                     f"{w.rng.choice(FIRST_NAMES)} {w.rng.choice(LAST_NAMES)}")
                    for _ in range(2)]
        for m in range(4):  # inbound: every kind appears on the first number
            contact, profile = contacts[m % 2]
            kind = kinds[(m + pn_index * 4) % len(kinds)]
            message_id = w.next_id("wamid.IN")
            media_id = w.next_id("media-") if kind in MEDIA_KINDS else None
            if media_id is not None:
                w.media[media_id] = kind
            text = f"Habari, order {w.rng.randint(100, 999)}" if kind == "text" else None

            def inbound(at: datetime, pn: str = pn, contact: str = contact,
                        profile: str = profile, message_id: str = message_id,
                        kind: str = kind, media_id: str | None = media_id,
                        text: str | None = text) -> None:
                w.chat(ev.chat_inbound(waba_id=waba_id, phone_number_id=pn,
                                       contact_wa_id=contact, profile_name=profile,
                                       message_id=message_id, at=at, kind=kind, text=text,
                                       media_id=media_id), at, pn)
                messages[message_id] = {
                    "phone_number_id": pn, "contact_wa_id": contact, "direction": "inbound",
                    "type": kind, "status": "received", "code": CHAT_STATUS_CODE["received"],
                    "error_code": None, "error_title": None, "media_id": media_id}
                at_unix = datetime.fromtimestamp(int(at.timestamp()), UTC)
                threads[(pn, contact)] = {"phone_number_id": pn, "contact_wa_id": contact,
                                          "profile_name": profile,
                                          "last_inbound_at": at_unix.isoformat()}
            stories.append([inbound])
        for _ in range(6):  # outbound with statuses
            contact, _profile = contacts[w.rng.randint(0, 1)]
            message_id = w.next_id("wamid.OUT")
            if outbound_index < len(failure_codes):
                code = failure_codes[outbound_index]
                path: list[str] = ["sent", "failed"] if w.rng.random() < 0.5 else ["failed"]
            else:
                code = None
                path = ["sent", "delivered", "read"][:w.rng.randint(1, 3)]
            outbound_index += 1
            steps: list[Step] = []
            for status in path:
                def status_step(at: datetime, pn: str = pn, contact: str = contact,
                                message_id: str = message_id, status: str = status,
                                code: int | None = code) -> None:
                    failure = code if status == "failed" else None
                    w.chat(ev.chat_status(waba_id=waba_id, phone_number_id=pn,
                                          message_id=message_id, status=status, at=at,
                                          recipient_id=contact, failure_code=failure), at, pn)
                    error = CHAT_ERRORS[failure] if failure is not None else None
                    messages[message_id] = {
                        "phone_number_id": pn, "contact_wa_id": contact,
                        "direction": "outbound", "type": None, "status": status,
                        "code": failure if failure is not None else CHAT_STATUS_CODE[status],
                        "error_code": error[0] if error else None,
                        "error_title": error[1] if error else None, "media_id": None}
                steps.append(status_step)
            stories.append(steps)
    return stories


def _interleave(w: _World, stories: list[list[Step]], start: datetime) -> None:
    """Run the stories' steps on one clock, in a seeded interleaving."""
    now = start
    live = [list(s) for s in stories if s]
    for _ in range(sum(len(s) for s in live)):
        story = live[w.rng.randrange(len(live))]
        now += timedelta(seconds=w.rng.randint(1, 40))
        story.pop(0)(now)
        live = [s for s in live if s]


# -- delivery faults ---------------------------------------------------------------------

def _general_sends(events: list[ProviderEvent], rates: FaultRates, rng: random.Random,
                   endpoints: tuple[str, ...]) -> tuple[list[GeneralSend], list[str]]:
    sends: list[GeneralSend] = []
    dropped: list[str] = []
    seq = 0
    for index, event in enumerate(events):
        if event.system != "general":
            continue
        drop = rng.random() < rates.drop
        delay = rng.randint(1, rates.max_delay_ms) if rng.random() < rates.delay else 0
        reorder = SPACING_MS * rng.randint(2, 8) if rng.random() < rates.reorder else 0
        bad = rng.random() < rates.bad_signature
        extra = rng.randint(1, 2) if rng.random() < rates.duplicate else 0
        if drop:
            dropped.append(event.event_id)
            continue
        body = encode(event.body)
        base = index * SPACING_MS + delay + reorder
        targets = [endpoints[0]]
        for k in range(extra):  # through the other endpoints when there are any
            targets.append(endpoints[(k + 1) % len(endpoints)])
        for copy, endpoint in enumerate(targets):
            jitter = 0 if copy == 0 else rng.randint(0, 3 * SPACING_MS)
            sends.append(GeneralSend(seq, event.event_id, endpoint, body,
                                     bad and copy == 0, base + jitter, copy))
            seq += 1
    sends.sort(key=lambda s: (s.send_at_ms, s.seq))
    return sends, dropped


def _chat_sends(events: list[ProviderEvent], rates: FaultRates, rng: random.Random,
                tag: str) -> list[ChatSend]:
    sends: list[ChatSend] = []
    for index, event in enumerate(events):
        if event.system != "chat":
            continue
        assert event.phone_number_id is not None
        lost = rng.randint(1, 2) if rng.random() < rates.chat_lost else 0
        draw = rng.random()
        fault: Fault | None = (
            "bad_signature" if draw < rates.chat_bad_signature
            else "stale" if draw < rates.chat_bad_signature + rates.chat_stale else None)
        sends.append(ChatSend(f"dlv-{tag}-{index:05d}", event.event_id,
                              event.phone_number_id, encode(event.body), lost, fault,
                              index * SPACING_MS))
    return sends


# -- the plan ----------------------------------------------------------------------------

def make_plan(scenario: str, seed: int, *, start: datetime = DEFAULT_START,
              endpoints: tuple[str, ...] = DEFAULT_ENDPOINTS,
              phone_numbers: tuple[str, ...] = DEFAULT_PHONE_NUMBERS,
              rates: FaultRates | None = None, waba_id: str = "waba-sandbox",
              size: int = 1) -> Plan:
    """The whole scenario for ``seed``; ``size`` multiplies the number of subjects."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    if not endpoints or len(endpoints) > 3:
        raise ValueError("between 1 and 3 general endpoints")
    if start.tzinfo is None:
        raise ValueError("start must be timezone-aware")
    rates = rates or SCENARIOS[scenario]
    tag = f"{seed}"
    world = _World(random.Random(f"sandbox:{scenario}:{seed}:world"), tag)
    stories = (_collection_stories(world, 16 * size) + _payout_stories(world, 16 * size)
               + _invoice_stories(world, 5 * size) + _sms_stories(world, 8 * size, start)
               + _chat_stories(world, phone_numbers, waba_id))
    _interleave(world, stories, start)
    faults_rng = random.Random(f"sandbox:{scenario}:{seed}:faults")
    general_sends, dropped = _general_sends(world.events, rates, faults_rng, endpoints)
    chat_sends = _chat_sends(world.events, rates, faults_rng, tag)
    truth = _truth(world, scenario, seed, start, general_sends, dropped, chat_sends)
    return Plan(scenario, seed, start, world.events, general_sends, chat_sends,
                world.records, world.media, truth)


def _truth(w: _World, scenario: str, seed: int, start: datetime,
           general_sends: list[GeneralSend], dropped: list[str],
           chat_sends: list[ChatSend]) -> dict[str, Any]:
    good = {s.event_id for s in general_sends if not s.bad_signature}
    copies: dict[str, int] = {}
    for s in general_sends:
        copies[s.event_id] = copies.get(s.event_id, 0) + 1
    general = [e for e in w.events if e.system == "general"]
    threads = w.truth.pop("_threads")
    bad = [{"system": "general", "id": s.event_id, "endpoint": s.endpoint,
            "body_sha256": hashlib.sha256(s.body).hexdigest()}
           for s in general_sends if s.bad_signature]
    bad += [{"system": "chat", "id": s.delivery_id, "endpoint": s.phone_number_id,
             "body_sha256": hashlib.sha256(s.body).hexdigest(), "fault": s.first_attempt_fault}
            for s in chat_sends if s.first_attempt_fault]
    return {
        "scenario": scenario, "seed": seed, "start": start.isoformat(),
        "payments": w.truth.get("payments", {}), "payouts": w.truth.get("payouts", {}),
        "invoices": w.truth.get("invoices", {}), "sms": w.truth.get("sms", {}),
        "chat_messages": w.truth.get("chat_messages", {}),
        "chat_threads": [threads[k] for k in sorted(threads)],
        "general_events": [{"event_id": e.event_id, "event": e.body["event"],
                            "reference": e.body["reference"], "code": e.body["code"],
                            "delivered": e.event_id in good,
                            "copies": copies.get(e.event_id, 0), "body": e.body}
                           for e in general],
        "dropped": [{"event_id": e.event_id, "event": e.body["event"],
                     "reference": e.body["reference"]}
                    for e in general if e.event_id in set(dropped)],
        "bad_signatures": bad,
        "counts": {
            "general_events": len(general), "general_sends": len(general_sends),
            "dropped": len(dropped),
            "duplicates": sum(1 for s in general_sends if s.copy > 0),
            "bad_signatures": len(bad), "chat_events": len(chat_sends),
            "chat_lost_attempts": sum(s.lost_attempts for s in chat_sends),
        },
    }
