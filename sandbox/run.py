"""Executing a scenario plan against a running hookledger. The I/O half of ``scenario``.

General sends are posted at their planned offsets (never retried); chat sends go through
:func:`sandbox.delivery.deliver_chat` (retries on the compressed schedule). A 404 from a
chat URL (hookledger without chat ingest yet) is counted, never fatal. Every wait is
bounded.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx

from sandbox.delivery import (
    DEFAULT_RETRY_SCALE,
    Answer,
    ChatDelivery,
    deliver_chat,
    post_general,
)
from sandbox.scenario import GeneralSend, Plan

MAX_CONCURRENCY = 32
WRONG_SECRET_PREFIX = "not-the-secret-"


@dataclass
class RunReport:
    """What happened on the wire (the truth of what *should* be known is in the plan)."""

    general: Counter[str] = field(default_factory=Counter)
    chat: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"general": dict(self.general), "chat": dict(self.chat),
                "seconds": Decimal(f"{self.seconds:.3f}")}


def _classify(answer: Answer) -> str:
    if answer.status == 200:
        try:
            duplicate = bool(json.loads(answer.body).get("duplicate"))
        except (ValueError, AttributeError):
            duplicate = False
        return "duplicate" if duplicate else "accepted"
    if 200 <= answer.status < 300:
        return "accepted"
    if answer.status == 404:
        return "not_found"
    if answer.status in (400, 401, 403, 413, 415):
        return "refused"
    return "error" if answer.status else "no_answer"


async def execute(plan: Plan, *, to: str, general_secrets: Mapping[str, str],
                  chat_secrets: Mapping[str, str], retry_scale: float = DEFAULT_RETRY_SCALE,
                  time_scale: float = 1.0, deadline_s: float = 120.0) -> RunReport:
    """Send the plan's deliveries to hookledger at ``to``; return counts of the answers."""
    report = RunReport()
    report.general["planned_dropped"] = len(plan.truth["dropped"])
    started = time.monotonic()
    limit = asyncio.Semaphore(MAX_CONCURRENCY)
    base = to.rstrip("/")

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=MAX_CONCURRENCY)) as client:

        async def at_offset(ms: int) -> None:
            wait = started + ms * time_scale / 1000 - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)

        async def general(send: GeneralSend) -> None:
            await at_offset(send.send_at_ms)
            secret = general_secrets[send.endpoint]
            if send.bad_signature:
                secret = WRONG_SECRET_PREFIX + secret
            async with limit:
                answer = await post_general(client, f"{base}/webhooks/general/{send.endpoint}",
                                            send.body, secret)
            report.general["sent"] += 1
            report.general["bad_signature_sent"] += send.bad_signature
            report.general["duplicate_copies_sent"] += send.copy > 0
            report.general[_classify(answer)] += 1

        async def chat(send: Any) -> None:
            secret = chat_secrets.get(send.phone_number_id)
            if secret is None:
                report.chat["skipped_no_secret"] += 1
                return
            await at_offset(send.send_at_ms)
            delivery = ChatDelivery(send.delivery_id, send.phone_number_id,
                                    f"{base}/webhooks/chat/{send.phone_number_id}", send.body,
                                    secret, send.first_attempt_fault, send.lost_attempts)
            await deliver_chat(client, delivery, retry_scale=retry_scale)
            report.chat["events"] += 1
            report.chat[delivery.state] += 1
            for _attempt, answer in delivery.answers:
                report.chat["attempts"] += 1
                report.chat["lost_in_transit" if answer.error == "lost_in_transit"
                            else _classify(answer)] += 1

        tasks = [general(s) for s in plan.general_sends] + [chat(s) for s in plan.chat_sends]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=deadline_s)
    report.seconds = time.monotonic() - started
    return report


def run_plan(plan: Plan, **options: Any) -> RunReport:
    """Synchronous wrapper of :func:`execute`."""
    return asyncio.run(execute(plan, **options))
