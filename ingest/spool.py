"""The durable spool: verified deliveries the database could not take, on local disk.

The general system never retries, so answering 503 while PostgreSQL is down loses the
delivery for good. Instead, the appender writes such a batch here, fsyncs, and answers
200; a drainer appends the spooled events to the ledger, in the order they were spooled,
when the database is back (the ledger's dedupe key makes a re-append after a crash
harmless), and deletes each file once all of it is in the ledger.

Each database has its own folder under the home's ``spool/`` (:func:`database_folder`,
named after the ledger's identity, migration 0011): processes run from one folder against
different databases (production and staging, two tenants) share a home, and a drainer took
any file there, appending an acknowledged delivery to another database's ledger. Files
written before there were such folders lie in ``spool/`` itself and are still drained by
any process (``legacy``). Files waiting in another database's folder are named at start
(:meth:`Spool.elsewhere`), never drained here: moving them into the right folder drains them.

Format: a file per process start and generation, ``spool-<pid>-<start>-<n>.hls``, held
under an exclusive ``flock`` by the process writing it, so a second process never drains a
file still being written, and drains the files of a process that died. ``<start>`` is
random per process start: a restarted service often has its predecessor's process id (1 in
a container), and with the id alone it reopened the dead process's file, which its own
drainer was reading; the drainer then deleted the file under the writer, and each waited
for the other's lock. A file is locked before it gets its name (created under a name no
drainer looks for, then renamed), so no drainer ever finds one it may take from its
writer. Each record is
``HLS1`` + length (u32) + CRC-32 (u32) + the event as JSON. A torn or corrupt record (a
crash mid-write) is detected by its length or CRC, recorded, and skipped by searching
for the next ``HLS1``; it never blocks the records after it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from ingest.durable import durable_folder, fsync_folder, open_private
from ledger import NewEvent
from ledger.jsonenc import dumps

log = structlog.get_logger("hookledger.spool")

MAGIC = b"HLS1"
HEADER = struct.Struct(">4sII")
# the most a record's length (u32) can say: the reader must read back every record the
# writer writes. A smaller sanity bound (64 MiB, once) turned an acknowledged delivery of a
# large body (HOOKLEDGER_MAX_BODY_BYTES has no upper bound) into damage, skipped; a corrupt
# length is caught anyway, by the file's end or the CRC.
MAX_RECORD = 0xFFFF_FFFF
QUARANTINE = "quarantine.hls"  # events the ledger refused while draining; never drained
UNNAMED_STALE_S = 60.0  # a hidden, not yet named file this old was left by a crash


def encode_event(event: NewEvent) -> bytes:
    fields = {
        "stream": event.stream, "event_type": event.event_type, "source": event.source,
        "dedupe_key": event.dedupe_key, "payload_json": event.payload_json,
        "received_at": event.received_at.isoformat(), "facts": dict(event.facts),
        "occurred_at": event.occurred_at.isoformat() if event.occurred_at else None,
        "raw_body": base64.b64encode(event.raw_body).decode() if event.raw_body is not None
        else None,
        "headers": dict(event.headers), "endpoint": event.endpoint,
        "verified_by": event.verified_by,
    }
    payload = dumps(fields).encode()
    if len(payload) > MAX_RECORD:  # no length to say it with: refused, never written torn
        raise ValueError(f"a spool record of {len(payload)} bytes is too large")
    return HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode_event(payload: bytes) -> NewEvent:
    fields: dict[str, Any] = json.loads(payload)
    raw = fields["raw_body"]
    occurred = fields["occurred_at"]
    return NewEvent(
        stream=fields["stream"], event_type=fields["event_type"], source=fields["source"],
        dedupe_key=fields["dedupe_key"], payload_json=fields["payload_json"],
        received_at=datetime.fromisoformat(fields["received_at"]), facts=fields["facts"],
        occurred_at=datetime.fromisoformat(occurred) if occurred else None,
        raw_body=base64.b64decode(raw) if raw is not None else None,
        headers=fields["headers"], endpoint=fields["endpoint"],
        verified_by=fields["verified_by"])


@dataclass(frozen=True)
class Damage:
    """A stretch of a spool file that held no readable record."""

    file: str
    offset: int
    length: int
    reason: str


def read_records(data: bytes, name: str = "") -> tuple[list[NewEvent], list[Damage]]:
    """Every intact record of a spool file's bytes, in order, and what was skipped. Pure."""
    events: list[NewEvent] = []
    damage: list[Damage] = []
    at = 0
    while at < len(data):
        reason = None
        if len(data) - at < HEADER.size:
            reason = "truncated_header"
        else:
            magic, length, crc = HEADER.unpack_from(data, at)
            end = at + HEADER.size + length
            if magic != MAGIC or length > MAX_RECORD:
                reason = "bad_header"
            elif end > len(data):
                reason = "truncated_record"
            else:
                payload = data[at + HEADER.size:end]
                if zlib.crc32(payload) != crc:
                    reason = "bad_checksum"
                else:
                    try:
                        events.append(decode_event(payload))
                    except (ValueError, KeyError, TypeError):
                        reason = "bad_record"
                    else:
                        at = end
                        continue
        following = data.find(MAGIC, at + 1)
        resume = following if following != -1 else len(data)
        damage.append(Damage(name, at, resume - at, reason))
        at = resume
    return events, damage


def database_folder(spool_home: Path, identity: str) -> Path:
    """The spool folder of the ledger whose identity (``ledger.store.database_identity``)
    is given: a short digest of it, the same for every process using that database."""
    return spool_home / f"db-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def make_private(folder: Path) -> None:
    """The folder 0700 and its files 0600, as far as this process may: another process of
    the same home may drain (remove) a file meanwhile, and a folder or file of another
    owner is left as it is rather than stopping the start."""
    with contextlib.suppress(PermissionError):
        folder.chmod(0o700)
    for path in folder.iterdir():
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if path.is_file() and path.stat().st_mode & 0o077:
                path.chmod(0o600)


class Spool:
    """This process's spool: append with fsync, and hand closed files to the drainer."""

    def __init__(self, folder: Path, *, owner: str | None = None,
                 legacy: Path | None = None) -> None:
        self.folder = folder
        self.legacy = legacy  # where files of releases without per-database folders lie
        durable_folder(folder, mode=0o700)  # its files hold whole delivery bodies
        make_private(folder)  # also one an earlier release made 0755, its files 0644
        self._owner = owner  # None: this process's id (tests give two spools two owners)
        self._start = os.urandom(4).hex()  # this process start's own names (see above)
        self._generation = 0
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._lock = threading.Lock()  # the file being written: held through each fsync
        # the counts alone, so that ``backlog`` (read on the event loop) never waits for
        # a write's fsync: that froze every connection of the worker for the fsync's time
        self._counts_lock = threading.Lock()
        self._written: dict[Path, int] = {}  # our files not yet drained -> their records
        self._unreadable: set[Path] = set()  # files drainable() could not open, told once
        self._sweep_unnamed()  # what a crash of an earlier start left

    @property
    def prefix(self) -> str:
        return f"spool-{self._owner or os.getpid()}-{self._start}-"

    @property
    def backlog(self) -> int:
        """Records this process spooled that are not in the ledger yet.

        Counted from the files themselves: any process's drainer may take a file of ours
        (and deletes it once its events committed), so a file that is gone is drained,
        whoever did it. A count kept by hand here missed those, and left this process
        spooling every later delivery for good.
        """
        with self._counts_lock:
            for path in [p for p in self._written if p != self._path and not p.exists()]:
                del self._written[path]
            return sum(self._written.values())

    def write(self, events: Sequence[NewEvent]) -> None:
        """Append and fsync; return only when the records are on disk. They count in
        :attr:`backlog` from then on, not while the fsync is in progress."""
        data = b"".join(encode_event(e) for e in events)
        with self._lock:
            if self._file is None:
                self._open()
            assert self._file is not None
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())
            assert self._path is not None
            with self._counts_lock:
                self._written[self._path] = self._written.get(self._path, 0) + len(events)

    def drained(self, path: Path) -> None:
        """``path`` is in the ledger and may go (its records leave whoever's backlog)."""
        path.unlink(missing_ok=True)
        with self._counts_lock:
            self._written.pop(path, None)

    def _open(self) -> None:
        """A new file, locked before a drainer can see it: created under a hidden name that
        is new or refused (``x``), locked, then given its drainable name."""
        while True:
            self._generation += 1
            path = self.folder / f"{self.prefix}{self._generation:06d}.hls"
            hidden = path.with_name(f".{path.name}.new")
            if path.exists():
                continue
            try:
                handle = open_private(hidden, "xb")
            except FileExistsError:
                continue
            break
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else has it
            os.rename(hidden, path)  # the lock stays with the open file
        except BaseException:
            handle.close()
            hidden.unlink(missing_ok=True)
            raise
        try:
            fsync_folder(self.folder)  # the new name itself must survive a power cut
        except BaseException:
            # kept in use, it took every later record, each answered 200 under a name never
            # made durable. Let go empty and unlocked instead: a drain removes it
            handle.close()
            raise
        self._file, self._path = handle, path

    def quarantine(self, event: NewEvent) -> None:
        """Keep an event the ledger refused, in the spool's format, for a person to look at.
        Once its spool file is drained this is the event's only copy: the file's name is
        made durable as well as its bytes (the first quarantine creates it)."""
        with open_private(self.folder / QUARANTINE, "ab") as handle:
            handle.write(encode_event(event))
            handle.flush()
            os.fsync(handle.fileno())
        fsync_folder(self.folder)

    def seal(self) -> None:
        """Close the file being written (its lock goes with it): the next write starts a
        new one, and this one can be drained."""
        with self._lock:
            if self._file is not None:
                try:  # a record a full disk refused stays buffered, and fails the close too
                    self._file.close()
                finally:  # closed all the same: kept, every write raised ValueError till
                    self._file = self._path = None  # the next seal, answered 503

    def close(self) -> None:
        self.seal()

    def drainable(self) -> Iterator[tuple[Path, BinaryIO]]:
        """Spool files no live process is writing, oldest first, each locked while yielded.

        A file another process holds (its writer, or another worker's drainer) holds back
        the later files of the same writer: drained meanwhile, their events would reach the
        ledger before that file's, out of the order they were written in."""
        self._sweep_unnamed()
        held: set[str] = set()  # writers one of whose files another process holds
        for path in _in_order(self._files()):
            if path == self._path or _writer(path) in held:
                continue
            try:
                handle = open(path, "rb")
            except FileNotFoundError:
                continue
            except OSError as exc:
                # one file this process cannot read (another user's, a disk error) failed
                # every round, and every file after it waited for ever: only its own
                # writer's later files wait now, as behind a held one; it stays for a person
                if path not in self._unreadable:  # every drain round meets it again
                    self._unreadable.add(path)
                    log.error("spool.unreadable", path=str(path), error=type(exc).__name__)
                held.add(_writer(path))
                continue
            try:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    held.add(_writer(path))  # still being written, or drained elsewhere
                    continue
                if path.exists():
                    yield path, handle
            finally:
                handle.close()

    def _sweep_unnamed(self) -> None:
        """Remove hidden names a crash left between creating a file and naming it.

        Nothing is written to a file before its rename, so such a name holds no record.
        One is removed only when it is empty, older than :data:`UNNAMED_STALE_S`, and its
        lock is free: a live writer locks its file right after creating it and keeps the
        lock, a dead one's went with it. Never raises: a name that cannot be removed must
        not hold back the drain.
        """
        cutoff = time.time() - UNNAMED_STALE_S
        for hidden in self.folder.glob(".spool-*.hls.new"):
            try:
                with open(hidden, "rb") as handle:
                    found = os.fstat(handle.fileno())
                    if found.st_mtime >= cutoff or found.st_size != 0:
                        continue
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    hidden.unlink()
            except OSError:  # gone meanwhile, locked by its writer, or not ours to remove
                continue

    def _files(self) -> list[Path]:
        found = list(self.folder.glob("spool-*.hls"))
        if self.legacy is not None and self.legacy != self.folder:
            found += self.legacy.glob("spool-*.hls")
        return found

    def elsewhere(self) -> dict[Path, int]:
        """Spool files waiting in other databases' folders of this home, by folder: theirs
        to drain, unless a database moved (a restore into a database with another
        identity), and then a person's to move here."""
        found: dict[Path, int] = {}
        if self.legacy is None:
            return found
        for folder in self.legacy.glob("db-*"):
            if folder == self.folder:
                continue
            count = sum(1 for _ in folder.glob("spool-*.hls"))
            if count:
                found[folder] = count
        return found

    def depth(self) -> int:
        """Bytes waiting in spool files (this process's and any other's)."""
        total = 0
        for path in self._files():
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
        return total


def _writer(path: Path) -> str:
    """The process start that wrote ``path``: its name without the generation."""
    return path.name.rsplit("-", 1)[0]


def _generation(path: Path) -> tuple[int, str]:
    """Where ``path`` comes among its writer's files: the generation in its name."""
    tail = path.stem.rsplit("-", 1)[-1]
    return (int(tail) if tail.isdigit() else -1), path.name


def _in_order(paths: list[Path]) -> list[Path]:
    """``paths`` oldest first by modification time, but each writer's own files in the
    order it wrote them. By the times alone, a clock set back between two files of one
    writer (an NTP step, a restored VM) put its later file first, and its events reached
    the ledger ahead of the earlier file's. Each writer's files fill the places the times
    give them, in generation order."""
    queues: dict[str, list[Path]] = {}
    for path in sorted(paths, key=_generation, reverse=True):
        queues.setdefault(_writer(path), []).append(path)
    return [queues[_writer(path)].pop() for path in sorted(paths, key=_age)]


def _age(path: Path) -> tuple[float, str]:
    try:
        return path.stat().st_mtime, path.name
    except FileNotFoundError:
        return 0.0, path.name
