"""Reports read from the database and written to files, a row at a time.

A scheduled report runs in the service, beside the worker answering webhooks, over a table
that only grows: every discrepancy ever found, resolved ones included. Held in memory, with
every format built as one string, 200,000 of them took 600 MB. Here the rows are summed in
one pass grouped by payment (:class:`reconcile.report.ReportTotals`) and the open ones
listed in a second, both from server-side cursors in one snapshot, so the totals and the
list agree and memory stays flat whatever the table holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, TextIO

import psycopg
import structlog

from reconcile.report import ReportTotals, Row, Windows, build_report, open_item
from reconcile.report_render import FORMATS, renderer_for

log = structlog.get_logger("hookledger.reconcile")

# rows fetched from the server at a time: a few MB at most, whatever the table holds
FETCH_ROWS = 2000
# a report's snapshot is held only while it is written; a writer stuck on a hung disk
# lets it go (and the rows vacuum is waiting for) after this
IDLE_IN_TRANSACTION = "60s"

SINCE = "(%(since)s::timestamptz IS NULL OR detected_at >= %(since)s::timestamptz)"
# grouped by payment, in a fixed order within one (byte order: deterministic, and a sort
# PostgreSQL does faster than a linguistic one); no text the totals do not need
TOTALS_SQL = f"""
SELECT id, kind, service, subject, reference, '', amount_at_risk, status, detected_at,
       resolved_at
FROM hookledger_private.discrepancies WHERE {SINCE}
ORDER BY subject COLLATE "C", reference COLLATE "C", id COLLATE "C"
"""
# the provider's code, for its retry advice: one no 9SOO code could be (a code past 32
# bits that a release before such codes were refused kept in a finding's facts) is no
# code, where the cast failed every report from then on
CODE = ("CASE WHEN facts->>'provider_code' ~ '^-?[0-9]{1,9}$' "
        "THEN (facts->>'provider_code')::int END")
OPEN_SQL = f"""
SELECT id, kind, service, subject, reference, detail, amount_at_risk, status, detected_at,
       resolved_at, {CODE}
FROM hookledger_private.discrepancies
WHERE status = 'open' AND detected_at IS NOT NULL AND {SINCE}
ORDER BY detected_at, id COLLATE "C"
"""
LOAD_SQL = f"""
SELECT id, kind, service, subject, reference, detail, amount_at_risk, status, detected_at,
       resolved_at, {CODE}
FROM hookledger_private.discrepancies WHERE {SINCE}
"""


def stream_report(url: str, sinks: Mapping[str, TextIO], *, since: datetime | None = None,
                  now: datetime | None = None, windows: Windows | None = None) -> int:
    """Write the report in each sink's format (``{"csv": file, ...}``); the number of open
    discrepancies listed. Times are in UTC, whatever the server's time zone; ages count
    from ``now``, by default the moment the snapshot is taken (so none is negative).

    The sinks are written while the snapshot is open, which lets go of it after a minute
    idle: give files, not a reader that may stop (a pager; see :func:`spooled`)."""
    params = {"since": since}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'")
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        with conn.transaction():
            conn.execute("SELECT 1")  # the snapshot: no row it shows is newer than this
            now = now or datetime.now(UTC)
            totals = ReportTotals(now)
            for record in _rows(conn, "report_totals", TOTALS_SQL, params):
                totals.add(Row(*record))
            summary = totals.summary(since)
            renderers = {fmt: renderer_for(fmt) for fmt in sinks}
            for fmt, sink in sinks.items():
                sink.write(renderers[fmt].head(summary))
            listed = 0
            for record in _rows(conn, "report_open", OPEN_SQL, params):
                item = open_item(Row(*record), now, windows)
                listed += 1
                for fmt, sink in sinks.items():
                    sink.write(renderers[fmt].row(item))
    for fmt, sink in sinks.items():
        sink.write(renderers[fmt].tail())
    return listed


@contextlib.contextmanager
def spooled(out: TextIO) -> Iterator[TextIO]:
    """A temporary file for the report, copied to ``out`` once it is whole: a reader of
    standard output that pauses (a pager) paused the writer, and after a minute the server
    ended the report's snapshot, and the report with a traceback, half written.

    Copied as UTF-8 bytes where ``out`` has a byte buffer: a report is UTF-8 (the HTML says
    so), and written as text to a standard output in another encoding (``LANG`` with
    ISO-8859-1, ``PYTHONIOENCODING``) a reference such as ``M-€`` stopped the command with
    a traceback, and one that did encode was not the UTF-8 the page declares."""
    with tempfile.TemporaryFile("w+b") as raw_spool:
        spool = io.TextIOWrapper(raw_spool, encoding="utf-8", newline="")
        yield spool
        spool.flush()
        raw = getattr(out, "buffer", None)
        if raw is None:  # a text stream with no bytes under it: as text
            spool.seek(0)
            shutil.copyfileobj(spool, out)
        else:
            out.flush()
            raw_spool.seek(0)
            shutil.copyfileobj(raw_spool, raw)
        spool.detach()  # the temporary file closes it
        out.flush()  # here, not at exit: a reader gone by then is an error Python prints
        # (a text stream's flush flushes the buffer under it)


def _rows(conn: psycopg.Connection[Any], name: str, sql: str,
          params: Mapping[str, Any]) -> Iterator[tuple[Any, ...]]:
    with conn.cursor(name=name) as cursor:
        cursor.itersize = FETCH_ROWS
        cursor.execute(sql, params)
        yield from cursor


async def load_rows(url: str, since: datetime | None) -> list[Row]:
    """Every row in memory: for a small table (tests), never the service or a command."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SET TIME ZONE 'UTC'")
        cur = await conn.execute(LOAD_SQL, {"since": since})
        return [Row(*r) for r in await cur.fetchall()]


async def report_for(url: str, *, since: datetime | None = None,
                     now: datetime | None = None, windows: Windows | None = None
                     ) -> dict[str, Any]:
    """The report as a dict in memory (see :func:`load_rows`)."""
    return build_report(await load_rows(url, since), now=now or datetime.now(UTC),
                        since=since, windows=windows)


STAMP_FORMAT = "%Y%m%dT%H%M%SZ"


async def write_scheduled_report(url: str, directory: Path,
                                  windows: Windows | None = None, *,
                                  keep: timedelta | None = None,
                                  interval: timedelta | None = None) -> list[Path]:
    """Every format, stamped, plus ``latest.*`` copies, under ``directory``, after the
    stamped reports older than ``keep`` (None: all kept) are removed; nothing (an empty
    list) when another process is writing them, or wrote them less than half of
    ``interval`` ago: every worker of a ``serve`` runs the schedule, and each read the
    whole table and wrote the whole report beside the others.

    In a thread: on the event loop of the worker answering webhooks, a report of 100,000
    open discrepancies held every delivery for seconds."""
    return await asyncio.to_thread(_write_once, url, directory, windows, keep, interval)


def _write_once(url: str, directory: Path, windows: Windows | None,
                keep: timedelta | None, interval: timedelta | None) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".writing.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go when the file closes
        except BlockingIOError:
            log.info("reconcile.report_skipped", reason="another process is writing it")
            return []
        now = datetime.now(UTC)
        began = last_report_began(directory, now)
        if interval is not None and began is not None and now - began < interval / 2:
            log.info("reconcile.report_skipped", reason="written this interval")
            return []
        return write_report_files(url, directory, windows, keep)


def last_report_began(directory: Path, now: datetime | None = None) -> datetime | None:
    """When the newest stamped report began, by the time in its name (a report that took
    long finished late: counted from then, a lone worker skipped every other interval).
    One stamped after ``now`` is left out: written while the clock ran ahead, it counted as
    this interval's until the clock reached it, and no report was written meanwhile."""
    stamps = [stamp for path in directory.glob("discrepancies-*.json")
              if (stamp := report_stamp(path.name)) is not None
              and (now is None or stamp <= now)]
    return max(stamps, default=None)


def write_report_files(url: str, directory: Path, windows: Windows | None = None,
                       keep: timedelta | None = None) -> list[Path]:
    """Pruned first: pruned after, a full disk failed the first write and kept every
    expired report, so the disk the spool and the embedded database share stayed full."""
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
    stamped = {fmt: directory / f"discrepancies-{stamp}.{fmt}" for fmt in FORMATS}
    with contextlib.ExitStack() as files:
        sinks = {fmt: files.enter_context(atomic_text(path))
                 for fmt, path in stamped.items()}
        stream_report(url, sinks, windows=windows)  # its own now, once its snapshot is
    written = []
    for fmt, path in stamped.items():
        latest = directory / f"latest.{fmt}"
        with path.open("rb") as source, atomic_file(latest) as copy:
            shutil.copyfileobj(source, copy)
        written += [path, latest]
    return written


def report_stamp(name: str) -> datetime | None:
    """When the stamped report ``name`` (``discrepancies-<UTC stamp>.<format>``) was begun;
    None for any other name (``latest.*``, a person's own files)."""
    stem, dot, fmt = name.partition(".")
    if not stem.startswith("discrepancies-") or not dot or fmt not in FORMATS:
        return None
    try:
        return datetime.strptime(stem.removeprefix("discrepancies-"),
                                 STAMP_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def expired_reports(names: Sequence[str], now: datetime, keep: timedelta) -> list[str]:
    """The stamped reports among ``names`` written more than ``keep`` before ``now``, by the
    time in their names. Every format of every interval was kept for ever: four files an
    hour, on the disk the spool and the embedded database need. ``latest.*`` and anything
    not named as a stamped report are never expired."""
    return sorted(name for name in names
                  if (stamp := report_stamp(name)) is not None and stamp < now - keep)


def _remove_abandoned(directory: Path, older_than_s: float = 3600) -> None:
    """Temporary files a writer killed mid-write left behind (none is written for long)."""
    limit = time.time() - older_than_s
    for leftover in directory.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if leftover.stat().st_mtime < limit:
                leftover.unlink()


def new_file_mode() -> int:
    """What ``open`` gives a new file here: 0666 less the umask (027: group-readable only).

    Read from ``/proc`` where it can be: ``os.umask`` only tells by setting it, and for that
    moment every file another thread of ``serve`` makes (the spool's, say) would be made
    with no umask at all.
    """
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    umask = os.umask(0o077)  # the narrowest for the moment it takes
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_file(path: Path, *, mode: int | None = None) -> Iterator[IO[bytes]]:
    """A file written beside ``path`` under a name of this writer's own, renamed over it
    once the block ends without an exception (removed if it raises): every worker of a
    ``serve`` writes the same report names at the same moment, and a shared temporary name
    let one truncate the file another was about to rename. The file keeps the mode of the
    one it replaces (a report someone made private stays private), else gets ``mode``, by
    default what the umask gives (a report lists references and amounts: it was 0644
    whatever the umask)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = new_file_mode() if mode is None else mode
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                         suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())  # a power cut leaves the old report, never an empty one
        os.chmod(temporary, mode)  # not mkstemp's 0600
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def atomic_text(path: Path, *, mode: int | None = None) -> Iterator[TextIO]:
    """:func:`atomic_file` as UTF-8 text, line endings as written (CSV rows end in CRLF)."""
    with atomic_file(path, mode=mode) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        try:
            yield text
        finally:
            text.detach()  # flushed; atomic_file syncs, closes and renames (or removes) it


def replace_atomically(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """``data`` written to ``path`` through :func:`atomic_file`."""
    with atomic_file(path, mode=mode) as out:
        out.write(data)
