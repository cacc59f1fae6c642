"""Discrepancy reports: HTML (one self-contained file), Markdown, CSV and JSON.

:func:`build_report` is pure (rows in, a JSON-ready dict out); the renderers only format
that dict, so every format tells the same totals. The HTML file fetches nothing: inline
CSS and an inline SVG chart. No secret is ever read here.

JSON report schema (``schema_version`` 1; fields may be added, none removed or renamed)::

    {
      "schema_version": 1,
      "generated_at": "ISO 8601 with offset",
      "since": "ISO 8601" | null,            # only discrepancies detected since then
      "currency": "TZS",
      "totals": {"discrepancies": int, "open": int, "resolved": int,
                 "amount_at_risk_open": "decimal string"},
      "by_kind":    [{"kind": str, "open": int, "resolved": int,
                      "amount_at_risk_open": "decimal string"}],      # sorted by kind
      "by_service": [{"service": str, "open": int, "resolved": int,
                      "amount_at_risk_open": "decimal string"}],      # sorted by service
      "aging": [{"bucket": "<1h" | "1h-24h" | "1d-7d" | ">7d", "open": int,
                 "amount_at_risk": "decimal string"}],                # open ones, by age
      "timeline": [{"date": "YYYY-MM-DD", "detected": int, "resolved": int}],  # UTC days
      "open": [{"id": str, "kind": str, "service": str, "subject": str,
                "reference": str, "detail": str,
                "amount_at_risk": "decimal string" | null,
                "detected_at": "ISO 8601", "age_s": int, "action": str}]  # oldest first
    }

Every ``amount_at_risk_open`` and aging amount counts each payment (subject and reference)
once, at the largest amount among its open discrepancies (:func:`at_risk`).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import html
import io
import json
import os
import re
import stat
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import structlog

from ingest.codes import CODES

log = structlog.get_logger("hookledger.reconcile")

SCHEMA_VERSION = 1
FORMATS = ("html", "md", "csv", "json")
AGING = (("<1h", 3600), ("1h-24h", 86400), ("1d-7d", 7 * 86400), (">7d", None))
ACTIONS = {
    "missing_webhook": "A webhook was lost; the state was recovered from the provider's API. "
                       "Fulfil, credit or release as a normal webhook would have done, then "
                       "check why the receiver missed it (outage, deploy, network).",
    "status_mismatch": "Webhooks and the provider disagree. The provider's record is "
                       "authoritative: check whether goods were released or money moved, "
                       "and ask the provider's support if it stays. Where the detail says "
                       "the record is of another kind, check what the reference was "
                       "registered or delivered as: nothing was recovered.",
    "amount_mismatch": "The amount differs. For a part payment compare with the amount "
                       "requested and collect the rest or refund; otherwise check the order.",
    "unresolved": "Not final after its resolution window. Check its state with the "
                  "provider by reference before doing anything that moves money again.",
    "unknown_at_provider": "The provider does not know this reference: the initiation most "
                           "likely failed. Check it by reference before initiating again.",
    "conflicting_events": "Webhooks contradict each other; check the payment by reference "
                          "and confirm the state kept.",
    "unsettled_paid_invoice": "invoice.paid arrived with money still due: do not treat the "
                              "invoice as settled; collect the outstanding amount.",
    "refunded_invoice_payment": "A payment against this invoice was refunded, and the "
                                "refund did not update the invoice: it still counts the "
                                "money as received. Check the invoice with the provider "
                                "before releasing goods against it; collect again if owed.",
    "unprojectable_event": "A ledger event could not be folded into a projection and was "
                           "left out of it; the event is kept. Report it with its position.",
    "malformed_delivery": "A signed delivery whose fields could not be read is kept in the "
                          "ledger but in no view. Reconciliation asks the provider about its "
                          "payment; check the rest by hand from the raw body at its position.",
}
# advice that depends on the subject: what is safe to do again differs for money coming in
# (a collection) and money going out (a payout, where a second one can pay twice)
SUBJECT_ACTIONS: dict[tuple[str, str], str] = {
    ("unresolved", "collection"):
        "Not final after the {window} resolution window: a collection this old will not "
        "resolve on its own. Tell the customer, and start a new collection if they still "
        "want to pay.",
    ("unresolved", "payout"):
        "Not final after the {window} payout window. Do not start another payout for it: "
        "this one may already be approved and debited, and can still complete, which would "
        "pay twice. Ask the provider's support about it by reference; if it fails, the "
        "provider refunds the wallet itself (payout.failed).",
    ("unknown_at_provider", "collection"):
        "The provider does not know this reference: the initiation most likely failed. "
        "Re-initiate if the customer still wants to pay.",
    ("unknown_at_provider", "payout"):
        "The provider does not know this payout's reference: the initiation most likely "
        "failed and nothing was debited. Confirm that with the provider (and the wallet "
        "balance) before paying out again, under a new reference.",
}


@dataclass(frozen=True, slots=True)
class Windows:
    """The resolution windows the advice names: ``HOOKLEDGER_RESOLUTION_WINDOW_S`` for a
    collection, ``HOOKLEDGER_RECONCILE_PAYOUT_WINDOW_S`` for a payout (defaults alike)."""

    collection: timedelta = timedelta(seconds=90)
    payout: timedelta = timedelta(hours=24)

    def of(self, subject: str) -> timedelta | None:
        return {"collection": self.collection, "payout": self.payout}.get(subject)


def duration_text(delta: timedelta) -> str:
    """``90 s``, ``2 min``, ``24 h``: the largest unit that states it exactly."""
    seconds = int(delta.total_seconds())
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    kind: str
    service: str
    subject: str
    reference: str
    detail: str
    amount_at_risk: Decimal | None
    status: str
    # None on a row whose resolution was folded before its detection (a replay): resolved,
    # and counted on no day's "detected" until the detection is folded
    detected_at: datetime | None
    resolved_at: datetime | None
    code: int | None = None


def action_for(kind: str, code: int | None, subject: str = "",
               windows: Windows | None = None) -> str:
    """What to do for a discrepancy of ``kind`` about ``subject``, naming its configured
    window, with the spec's retry guidance when a failure code is known."""
    text = SUBJECT_ACTIONS.get((kind, subject)) or ACTIONS.get(
        kind, "Look at the subject's history in hookledger.ledger.")
    window = (windows or Windows()).of(subject)
    if window is not None:
        text = text.replace("{window}", duration_text(window))
    info = CODES.get(code) if code is not None else None
    if info is not None and code is not None and code % 100 >= 50:
        text += f" Code {code}: {info.meaning}; retry: {info.retry}."
    return text


def _money(value: Decimal) -> str:
    return format(value, "f")


def at_risk(rows: Iterable[Row]) -> Decimal:
    """Money at risk in open discrepancies, each payment (subject and reference) counted
    once, at the largest amount any of them names: one payment can hold a conflict, a
    contradicting code and a mismatch at once, and its money is not at risk three times."""
    largest: dict[tuple[str, str], Decimal] = {}
    for row in rows:
        key = (row.subject, row.reference)
        largest[key] = max(largest.get(key, Decimal(0)), row.amount_at_risk or Decimal(0))
    return sum(largest.values(), Decimal(0))


def build_report(rows: Iterable[Row], *, now: datetime, since: datetime | None = None,
                 windows: Windows | None = None) -> dict[str, Any]:
    counts: dict[str, dict[str, list[int]]] = {"kind": defaultdict(lambda: [0, 0]),
                                               "service": defaultdict(lambda: [0, 0])}
    open_by: dict[str, dict[str, list[Row]]] = {"kind": defaultdict(list),
                                                "service": defaultdict(list),
                                                "aging": defaultdict(list)}
    detected: Counter[str] = Counter()
    resolved: Counter[str] = Counter()
    open_rows: list[Row] = []
    total = 0
    for row in rows:
        total += 1
        if row.detected_at is not None:
            detected[row.detected_at.astimezone(UTC).date().isoformat()] += 1
        is_open = row.status == "open" and row.detected_at is not None
        for axis, key in (("kind", row.kind), ("service", row.service)):
            counts[axis][key][0 if is_open else 1] += 1
            if is_open:
                open_by[axis][key].append(row)
        if is_open:
            open_rows.append(row)
            age = (now - _detected(row)).total_seconds()
            bucket = next(name for name, limit in AGING if limit is None or age < limit)
            open_by["aging"][bucket].append(row)
        elif row.resolved_at is not None:
            resolved[row.resolved_at.astimezone(UTC).date().isoformat()] += 1
    open_rows.sort(key=lambda r: (_detected(r), r.id))
    days = sorted(set(detected) | set(resolved))
    return {
        "schema_version": SCHEMA_VERSION, "generated_at": now.isoformat(),
        "since": since.isoformat() if since else None, "currency": "TZS",
        "totals": {"discrepancies": total, "open": len(open_rows),
                   "resolved": total - len(open_rows),
                   "amount_at_risk_open": _money(at_risk(open_rows))},
        "by_kind": [{"kind": k, "open": v[0], "resolved": v[1],
                     "amount_at_risk_open": _money(at_risk(open_by["kind"][k]))}
                    for k, v in sorted(counts["kind"].items())],
        "by_service": [{"service": k, "open": v[0], "resolved": v[1],
                        "amount_at_risk_open": _money(at_risk(open_by["service"][k]))}
                       for k, v in sorted(counts["service"].items())],
        "aging": [{"bucket": name, "open": len(open_by["aging"][name]),
                   "amount_at_risk": _money(at_risk(open_by["aging"][name]))}
                  for name, _ in AGING],
        "timeline": [{"date": d, "detected": detected[d], "resolved": resolved[d]}
                     for d in days],
        "open": [{"id": r.id, "kind": r.kind, "service": r.service, "subject": r.subject,
                  "reference": r.reference, "detail": r.detail,
                  "amount_at_risk": None if r.amount_at_risk is None
                  else _money(r.amount_at_risk),
                  "detected_at": _detected(r).isoformat(),
                  "age_s": int((now - _detected(r)).total_seconds()),
                  "action": action_for(r.kind, r.code, r.subject, windows)}
                 for r in open_rows],
    }


def _detected(row: Row) -> datetime:
    """An open row's detection time (an open row always has one: only a detection opens)."""
    assert row.detected_at is not None
    return row.detected_at


# -- renderers ----------------------------------------------------------------------------

def render(report: Mapping[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        return render_csv(report)
    if fmt == "md":
        return render_md(report)
    if fmt == "html":
        return render_html(report)
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def render_csv(report: Mapping[str, Any]) -> str:
    out = io.StringIO()
    fields = ["id", "kind", "service", "subject", "reference", "amount_at_risk",
              "detected_at", "age_s", "detail", "action"]
    # CRLF, as RFC 4180 has it: the writer quotes a field holding any character of the line
    # ending, and with "\n" alone a bare CR in a reference went out unquoted, and
    # spreadsheets broke the row there
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore",
                            lineterminator="\r\n")
    writer.writeheader()
    for row in report["open"]:
        writer.writerow({k: _csv_cell(v) for k, v in row.items()})
    return out.getvalue()


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> Any:
    """Text a spreadsheet would run as a formula, made inert with a leading quote.

    References and details come from webhooks and the provider's API: a reference such as
    ``=HYPERLINK(...)`` opened by a finance person in a spreadsheet is a link or worse. A
    plain number (a negative amount) is left as it is, since no spreadsheet runs it."""
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    with contextlib.suppress(ArithmeticError, ValueError):
        if Decimal(value).is_finite() and value.strip() == value:
            return value
    return "'" + value


# what Markdown (CommonMark with tables, and the HTML it allows) would read in a cell as a
# link, an image, HTML or the cell's end; emphasis and code spans are harmless and kept
MD_SPECIAL = re.compile(r"([\\\[\]<>|!])")


def _md(text: Any) -> str:
    """A table cell's text, shown as text: markup characters escaped (a reference or detail
    from a webhook could otherwise be a link, an image or HTML in the rendered report), and
    any line break, which ends a table row, made a space."""
    cell = " ".join(str(text if text is not None else "-").splitlines())
    return MD_SPECIAL.sub(r"\\\1", cell)


def render_md(report: Mapping[str, Any]) -> str:
    t = report["totals"]
    lines = ["# hookledger discrepancy report", "",
             f"Generated {report['generated_at']}"
             + (f", since {report['since']}" if report["since"] else "") + ".", "",
             f"- discrepancies: {t['discrepancies']} (open {t['open']}, resolved "
             f"{t['resolved']})", f"- amount at risk (open): {t['amount_at_risk_open']} TZS",
             "", "## By kind", "", "| kind | open | resolved | at risk (TZS) |",
             "|---|---:|---:|---:|"]
    lines += [f"| {_md(k['kind'])} | {k['open']} | {k['resolved']} | {k['amount_at_risk_open']} |"
              for k in report["by_kind"]]
    lines += ["", "## By service", "", "| service | open | resolved | at risk (TZS) |",
              "|---|---:|---:|---:|"]
    lines += [f"| {_md(s['service'])} | {s['open']} | {s['resolved']} | "
              f"{s['amount_at_risk_open']} |" for s in report["by_service"]]
    lines += ["", "## Aging (open)", "", "| age | open | at risk (TZS) |", "|---|---:|---:|"]
    lines += [f"| {a['bucket']} | {a['open']} | {a['amount_at_risk']} |"
              for a in report["aging"]]
    lines += ["", "## Open", "", "| kind | service | reference | at risk | detected | "
              "what to do |", "|---|---|---|---:|---|---|"]
    lines += [f"| {_md(o['kind'])} | {_md(o['service'])} | {_md(o['reference'])} | "
              f"{_md(o['amount_at_risk'])} | {_md(o['detected_at'])} | {_md(o['action'])} |"
              for o in report["open"]]
    return "\n".join(lines) + "\n"


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#1d2330}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0;width:100%}
th,td{border-bottom:1px solid #dde1e8;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f5f8}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:1rem;flex-wrap:wrap}.card{border:1px solid #dde1e8;border-radius:6px;
padding:.7rem 1rem;min-width:10rem}.card b{display:block;font-size:1.4rem}
.kind{font-family:ui-monospace,monospace;font-size:.85em}svg text{font-size:10px;fill:#556}
"""


def _svg_chart(timeline: Sequence[Mapping[str, Any]]) -> str:
    """Detected (and resolved) per day as bars, inline SVG."""
    if not timeline:
        return "<p>No discrepancies in this period.</p>"
    width, height, pad = 720, 180, 28
    peak = max(max(d["detected"], d["resolved"]) for d in timeline) or 1
    step = (width - 2 * pad) / len(timeline)
    bar = max(step / 2 - 1, 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="discrepancies over time" id="chart">',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
             'stroke="#99a"/>', f'<text x="2" y="{pad}">{peak}</text>']
    for i, day in enumerate(timeline):
        x = pad + i * step
        for j, (field, colour) in enumerate((("detected", "#d9534f"), ("resolved", "#5cb85c"))):
            h = (height - 2 * pad) * day[field] / peak
            parts.append(f'<rect x="{x + j * bar:.1f}" y="{height - pad - h:.1f}" '
                         f'width="{bar:.1f}" height="{h:.1f}" fill="{colour}">'
                         f'<title>{html.escape(day["date"])}: {day[field]} {field}</title>'
                         '</rect>')
        if len(timeline) <= 16 or i % max(len(timeline) // 8, 1) == 0:
            parts.append(f'<text x="{x:.1f}" y="{height - 8}">{html.escape(day["date"])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(report: Mapping[str, Any]) -> str:
    e = html.escape
    t = report["totals"]

    def table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: set[int]) -> str:
        ths = "".join(f'<th{" class=n" if i in numeric else ""}>{e(h)}</th>'
                      for i, h in enumerate(head))
        body = "".join("<tr>" + "".join(
            f'<td{" class=n" if i in numeric else ""}>{e(str(c if c is not None else "-"))}'
            "</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
        return f"<table><thead><tr>{ths}</tr></thead><tbody>{body}</tbody></table>"

    since = f", since {e(report['since'])}" if report["since"] else ""
    return "".join([
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width,initial-scale=1'>",
        "<title>hookledger discrepancy report</title>", f"<style>{CSS}</style></head><body>",
        "<h1>hookledger discrepancy report</h1>",
        f"<p>Generated {e(report['generated_at'])}{since}. Amounts in TZS.</p>",
        "<div class=cards>",
        f"<div class=card id=total-open>Open<b>{t['open']}</b></div>",
        f"<div class=card id=total-resolved>Resolved<b>{t['resolved']}</b></div>",
        f"<div class=card id=total-at-risk>Amount at risk (open)<b>"
        f"{e(t['amount_at_risk_open'])}</b></div>",
        f"<div class=card id=total-all>All discrepancies<b>{t['discrepancies']}</b></div>",
        "</div><h2>Over time</h2>", _svg_chart(report["timeline"]),
        "<h2>By kind</h2>",
        table(["kind", "open", "resolved", "at risk (TZS)"],
              ([k["kind"], k["open"], k["resolved"], k["amount_at_risk_open"]]
               for k in report["by_kind"]), {1, 2, 3}),
        "<h2>By service</h2>",
        table(["service", "open", "resolved", "at risk (TZS)"],
              ([s["service"], s["open"], s["resolved"], s["amount_at_risk_open"]]
               for s in report["by_service"]), {1, 2, 3}),
        "<h2>Aging of open discrepancies</h2>",
        table(["age", "open", "at risk (TZS)"],
              ([a["bucket"], a["open"], a["amount_at_risk"]] for a in report["aging"]), {1, 2}),
        "<h2>Open discrepancies</h2>",
        table(["kind", "service", "reference", "at risk (TZS)", "detected", "detail",
               "what to do"],
              ([o["kind"], o["service"], o["reference"], o["amount_at_risk"],
                o["detected_at"], o["detail"], o["action"]] for o in report["open"]), {3}),
        "</body></html>\n",
    ])


# -- loading and writing ------------------------------------------------------------------

LOAD_SQL = """
SELECT id, kind, service, subject, reference, detail, amount_at_risk, status, detected_at,
       resolved_at, (facts->>'provider_code')::int
FROM hookledger_private.discrepancies
WHERE %(since)s::timestamptz IS NULL OR detected_at >= %(since)s::timestamptz
"""


async def load_rows(url: str, since: datetime | None) -> list[Row]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(LOAD_SQL, {"since": since})
        return [Row(*r) for r in await cur.fetchall()]


async def report_for(url: str, *, since: datetime | None = None,
                     now: datetime | None = None, windows: Windows | None = None
                     ) -> dict[str, Any]:
    return build_report(await load_rows(url, since), now=now or datetime.now(UTC),
                        since=since, windows=windows)


STAMP_FORMAT = "%Y%m%dT%H%M%SZ"


async def write_scheduled_report(url: str, directory: Path,
                                 windows: Windows | None = None, *,
                                 keep: timedelta | None = None) -> list[Path]:
    """Every format, stamped, plus ``latest.*`` copies, under ``directory``, after the
    stamped reports older than ``keep`` (None: all kept) are removed.

    Pruned first: pruned after, a full disk failed the first write and kept every expired
    report, so the disk the spool and the embedded database share stayed full. Rendered
    and written in a thread: on the event loop of the worker answering webhooks, a report
    of 100,000 open discrepancies held every delivery for seconds."""
    report = await report_for(url, windows=windows)
    return await asyncio.to_thread(_write_report, report, directory, keep)


def _write_report(report: Mapping[str, Any], directory: Path,
                  keep: timedelta | None) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(directory)
    now = datetime.now(UTC)
    if keep is not None:
        for name in expired_reports([p.name for p in directory.iterdir()], now, keep):
            try:
                (directory / name).unlink()
            except FileNotFoundError:  # another worker's prune
                pass
            except OSError as exc:  # someone else's file, say: the rest are still pruned
                log.warning("reconcile.report_not_pruned", file=name,
                            error=exc.strerror or type(exc).__name__)
    stamp = now.strftime(STAMP_FORMAT)
    written = []
    for fmt in FORMATS:
        text = render(report, fmt)
        for name in (f"discrepancies-{stamp}.{fmt}", f"latest.{fmt}"):
            path = directory / name
            replace_atomically(path, text.encode("utf-8"))
            written.append(path)
    return written


def expired_reports(names: Sequence[str], now: datetime, keep: timedelta) -> list[str]:
    """The stamped reports among ``names`` written more than ``keep`` before ``now``, by the
    time in their names. Every format of every interval was kept for ever: four files an
    hour, on the disk the spool and the embedded database need. ``latest.*`` and anything
    not named as a stamped report are never expired."""
    expired = []
    for name in names:
        stem, dot, fmt = name.partition(".")
        if not stem.startswith("discrepancies-") or not dot or fmt not in FORMATS:
            continue
        try:
            written = datetime.strptime(stem.removeprefix("discrepancies-"), STAMP_FORMAT)
        except ValueError:
            continue
        if written.replace(tzinfo=UTC) < now - keep:
            expired.append(name)
    return sorted(expired)


def _remove_abandoned(directory: Path, older_than_s: float = 3600) -> None:
    """Temporary files a writer killed mid-write left behind (none is written for long)."""
    limit = time.time() - older_than_s
    for leftover in directory.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if leftover.stat().st_mtime < limit:
                leftover.unlink()


def replace_atomically(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write beside ``path`` under a name of this writer's own, then rename over it: every
    worker of a ``serve`` writes the same report names at the same moment, and a shared
    temporary name let one truncate the file another was about to rename. The file keeps
    the mode of the one it replaces (a report someone made private stays private), else
    gets ``mode``."""
    with contextlib.suppress(FileNotFoundError):
        mode = stat.S_IMODE(path.stat().st_mode)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                         suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # a power cut leaves the old report, never an empty one
        os.chmod(temporary, mode)  # not mkstemp's 0600
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
