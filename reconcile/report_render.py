"""A report's formats: HTML (one self-contained file), Markdown, CSV and JSON.

Each renderer turns the report's summary into a head, each open discrepancy into a row and
closes with a tail, so that a report of any size is written as it is read
(:mod:`reconcile.report_files`), and :func:`render` joins the same pieces for a report held
in memory. The HTML file fetches nothing: inline CSS and an inline SVG chart.
"""

from __future__ import annotations

import contextlib
import csv
import html
import io
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol

FORMATS = ("html", "md", "csv", "json")


class Renderer(Protocol):
    def head(self, summary: Mapping[str, Any]) -> str: ...
    def row(self, item: Mapping[str, Any]) -> str: ...
    def tail(self) -> str: ...


def renderer_for(fmt: str) -> Renderer:
    """A fresh renderer (some count the rows they wrote)."""
    kinds: dict[str, type[Renderer]] = {"json": JsonReport, "csv": CsvReport,
                                         "md": MarkdownReport, "html": HtmlReport}
    if fmt not in kinds:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    return kinds[fmt]()


def render(report: Mapping[str, Any], fmt: str) -> str:
    """A whole report held in memory, as text."""
    renderer = renderer_for(fmt)
    summary = {key: value for key, value in report.items() if key != "open"}
    return (renderer.head(summary) + "".join(renderer.row(item) for item in report["open"])
            + renderer.tail())


class JsonReport:
    """The text ``json.dumps(report, indent=2, ensure_ascii=False)`` gives, plus a newline:
    ``open`` comes last, so that its items can follow the rest one by one."""

    def __init__(self) -> None:
        self._rows = 0

    def head(self, summary: Mapping[str, Any]) -> str:
        text = json.dumps(summary, indent=2, ensure_ascii=False)
        return text.removesuffix("\n}") + ',\n  "open": ['

    def row(self, item: Mapping[str, Any]) -> str:
        """As ``json.dumps(indent=2)`` lays a flat item out at this depth, each value
        encoded alone: an indented dump runs the pure-Python encoder, three times slower."""
        self._rows += 1
        fields = ",\n      ".join(f"{_scalar(key)}: {_scalar(value)}"
                                  for key, value in item.items())
        return ("\n    " if self._rows == 1 else ",\n    ") + "{\n      " + fields + "\n    }"

    def tail(self) -> str:
        return "\n  ]\n}\n" if self._rows else "]\n}\n"


_encode = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(..., ensure_ascii=False)
# builds an encoder per call: a third of the report's time


def _scalar(value: str | int | None) -> str:
    if isinstance(value, dict | list | tuple):  # an open item holds none; never guessed at
        raise TypeError(f"an open item's values are scalars, not {type(value).__name__}")
    return _encode(value)


CSV_FIELDS = ["id", "kind", "service", "subject", "reference", "amount_at_risk",
              "detected_at", "age_s", "detail", "action"]


class CsvReport:
    """The open discrepancies, a row each."""

    def __init__(self) -> None:
        self._buffer = io.StringIO()
        # CRLF, as RFC 4180 has it: the writer quotes a field holding any character of the
        # line ending, and with "\n" alone a bare CR in a reference went out unquoted, and
        # spreadsheets broke the row there
        self._writer = csv.DictWriter(self._buffer, fieldnames=CSV_FIELDS,
                                      extrasaction="ignore", lineterminator="\r\n")

    def head(self, summary: Mapping[str, Any]) -> str:
        self._writer.writeheader()
        return self._taken()

    def row(self, item: Mapping[str, Any]) -> str:
        self._writer.writerow({key: _csv_cell(value) for key, value in item.items()})
        return self._taken()

    def tail(self) -> str:
        return ""

    def _taken(self) -> str:
        text = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return text


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


# what GitHub-flavoured Markdown makes a link of by itself, with no markup at all: a
# scheme's ``://``, ``www.`` and an e-mail address's ``@``; a backslash before the ``:``,
# the ``.`` or the ``@`` (each an escapable character, shown as itself) stops it
MD_AUTOLINK = re.compile(r"(?i):(?=//)|(?<=www)\.|@")


def _md(text: Any) -> str:
    """A table cell's text, shown as text: markup characters escaped (a reference or detail
    from a webhook could otherwise be a link, an image or HTML in the rendered report), a
    bare address kept from being linked, and any line break, which ends a table row, made
    a space."""
    cell = " ".join(str(text if text is not None else "-").splitlines())
    return MD_AUTOLINK.sub(lambda found: "\\" + found.group(), MD_SPECIAL.sub(r"\\\1", cell))


class MarkdownReport:
    def head(self, summary: Mapping[str, Any]) -> str:
        t = summary["totals"]
        lines = ["# hookledger discrepancy report", "",
                 f"Generated {summary['generated_at']}"
                 + (f", since {summary['since']}" if summary["since"] else "") + ".", "",
                 f"- discrepancies: {t['discrepancies']} (open {t['open']}, resolved "
                 f"{t['resolved']})",
                 f"- amount at risk (open): {t['amount_at_risk_open']} TZS",
                 "", "## By kind", "", "| kind | open | resolved | at risk (TZS) |",
                 "|---|---:|---:|---:|"]
        lines += [f"| {_md(k['kind'])} | {k['open']} | {k['resolved']} | "
                  f"{k['amount_at_risk_open']} |" for k in summary["by_kind"]]
        lines += ["", "## By service", "", "| service | open | resolved | at risk (TZS) |",
                  "|---|---:|---:|---:|"]
        lines += [f"| {_md(s['service'])} | {s['open']} | {s['resolved']} | "
                  f"{s['amount_at_risk_open']} |" for s in summary["by_service"]]
        lines += ["", "## Aging (open)", "", "| age | open | at risk (TZS) |",
                  "|---|---:|---:|"]
        lines += [f"| {a['bucket']} | {a['open']} | {a['amount_at_risk']} |"
                  for a in summary["aging"]]
        lines += ["", "## Open", "", "| kind | service | reference | at risk | detected | "
                  "detail | what to do | id |", "|---|---|---|---:|---|---|---|---|"]
        return "\n".join(lines) + "\n"

    def row(self, item: Mapping[str, Any]) -> str:
        # the detail says what differs (amounts, what was recovered), and the id is what
        # ``hookledger resolve`` takes: without them the advice pointed at nothing shown
        return (f"| {_md(item['kind'])} | {_md(item['service'])} | {_md(item['reference'])} "
                f"| {_md(item['amount_at_risk'])} | {_md(item['detected_at'])} | "
                f"{_md(item['detail'])} | {_md(item['action'])} | {_md(item['id'])} |\n")

    def tail(self) -> str:
        return ""


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


def _cells(cells: Sequence[Any], numeric: set[int]) -> str:
    return "<tr>" + "".join(
        f'<td{" class=n" if i in numeric else ""}>{html.escape(str(c if c is not None else "-"))}'
        "</td>" for i, c in enumerate(cells)) + "</tr>"


def _table_head(head: Sequence[str], numeric: set[int]) -> str:
    ths = "".join(f'<th{" class=n" if i in numeric else ""}>{html.escape(h)}</th>'
                  for i, h in enumerate(head))
    return f"<table><thead><tr>{ths}</tr></thead><tbody>"


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: set[int]) -> str:
    return (_table_head(head, numeric) + "".join(_cells(r, numeric) for r in rows)
            + "</tbody></table>")


OPEN_HEAD = ["kind", "service", "reference", "at risk (TZS)", "detected", "detail",
             "what to do", "id"]
OPEN_NUMERIC = {3}


class HtmlReport:
    def head(self, summary: Mapping[str, Any]) -> str:
        e = html.escape
        t = summary["totals"]
        since = f", since {e(summary['since'])}" if summary["since"] else ""
        return "".join([
            "<!doctype html><html lang=en><head><meta charset=utf-8>",
            "<meta name=viewport content='width=device-width,initial-scale=1'>",
            "<title>hookledger discrepancy report</title>", f"<style>{CSS}</style></head><body>",
            "<h1>hookledger discrepancy report</h1>",
            f"<p>Generated {e(summary['generated_at'])}{since}. Amounts in TZS.</p>",
            "<div class=cards>",
            f"<div class=card id=total-open>Open<b>{t['open']}</b></div>",
            f"<div class=card id=total-resolved>Resolved<b>{t['resolved']}</b></div>",
            f"<div class=card id=total-at-risk>Amount at risk (open)<b>"
            f"{e(t['amount_at_risk_open'])}</b></div>",
            f"<div class=card id=total-all>All discrepancies<b>{t['discrepancies']}</b></div>",
            "</div><h2>Over time</h2>", _svg_chart(summary["timeline"]),
            "<h2>By kind</h2>",
            _table(["kind", "open", "resolved", "at risk (TZS)"],
                   ([k["kind"], k["open"], k["resolved"], k["amount_at_risk_open"]]
                    for k in summary["by_kind"]), {1, 2, 3}),
            "<h2>By service</h2>",
            _table(["service", "open", "resolved", "at risk (TZS)"],
                   ([s["service"], s["open"], s["resolved"], s["amount_at_risk_open"]]
                    for s in summary["by_service"]), {1, 2, 3}),
            "<h2>Aging of open discrepancies</h2>",
            _table(["age", "open", "at risk (TZS)"],
                   ([a["bucket"], a["open"], a["amount_at_risk"]] for a in summary["aging"]),
                   {1, 2}),
            "<h2>Open discrepancies</h2>", _table_head(OPEN_HEAD, OPEN_NUMERIC),
        ])

    def row(self, item: Mapping[str, Any]) -> str:
        return _cells([item["kind"], item["service"], item["reference"],
                       item["amount_at_risk"], item["detected_at"], item["detail"],
                       item["action"], item["id"]], OPEN_NUMERIC)

    def tail(self) -> str:
        return "</tbody></table></body></html>\n"
