"""structlog, configured once at the entry point.

JSON lines when the output is not a terminal (the service under a supervisor), readable
console lines on a terminal. A last-line-of-defence processor masks any configured secret
that somehow reached a log line. Records from the standard library's ``logging`` (uvicorn,
psycopg's pool, alembic, APScheduler) go through the same renderer and masker, so that a log
shipper reads one format and no line escapes the masking.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import structlog

from ingest.headers import MIN_MASKED

MASK = "[redacted]"


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time (it may be replaced after start-up).

    A line that cannot be written is dropped: once the reader had gone (journald restarted,
    which cuts every service's stream; the other end of a pipe closed; the log file's disk
    full), each line raised into the request that wrote it, and a signed delivery logged
    before its append was answered 500 and never kept, the general system never sending
    it again. The standard library's handlers drop theirs likewise."""

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except (OSError, ValueError):  # ValueError: a stderr closed in this process
            return 0

    def flush(self) -> None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def secret_masker(secrets: Iterable[str]) -> structlog.types.Processor:
    """Mask every configured secret in every value a line renders: text, and text inside
    mappings, sequences, bytes and any other object (by the text it renders as), since the
    renderer writes those too. Numbers, booleans and None pass as they are."""
    needles = sorted({s for s in secrets if len(s) >= MIN_MASKED}, key=len, reverse=True)

    def masked_text(text: str) -> str:
        for needle in needles:
            if needle in text:
                text = text.replace(needle, MASK)
        return text

    def masked_key(key: Any) -> Any:
        """A key as a renderer can write it: text masked, a number, boolean or None as it
        was, anything else (a tuple) as its masked text. Made a list, a tuple key raised
        in the masker; kept a tuple, it raised in the JSON renderer."""
        if key is None or isinstance(key, bool | int | float):
            return key
        return masked_text(key if isinstance(key, str) else str(key))

    def masked(value: Any, depth: int = 0) -> Any:
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return masked_text(value)
        if depth < 8 and isinstance(value, Mapping):
            return {masked_key(k): masked(v, depth + 1) for k, v in value.items()}
        if depth < 8 and isinstance(value, list | tuple | set | frozenset):
            return [masked(v, depth + 1) for v in value]
        text = (value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray)
                else str(value))
        return masked_text(text) if any(n in text for n in needles) else value

    def mask(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if not needles:
            return event
        for key, value in event.items():
            event[key] = masked(value)
        return event

    return mask


# values the console writes as text that may hold lines of their own
MULTILINE_KEYS = frozenset({"exception", "stack"})


def escaped(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable (but those in ``keep``) written
    as its escape (``\\x1b``, ``\\u2028``), printable ones of any script as they are."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep
                   else c.encode("unicode_escape").decode("ascii") for c in text)


def printable(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Control characters in a console line's text escaped, a traceback's line breaks
    kept. The console renderer writes a text value as it is unless it holds a blank or a
    quote, and the event (a library record's message) always: a reference a signed
    delivery chose (bound to every line of its request) reached the terminal with its
    escape sequences, which can erase the lines before it and draw forged ones. JSON lines
    escape them already. Other values are written by ``repr``, which escapes them too."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = escaped(value, "\n" if key in MULTILINE_KEYS else "")
    return event


def _console(fmt: str) -> bool:
    return fmt == "console" or (fmt == "auto" and sys.stderr.isatty())


def _renderer(fmt: str) -> list[structlog.types.Processor]:
    """The renderer, after :func:`printable` on the console."""
    if _console(fmt):
        return [printable, structlog.dev.ConsoleRenderer()]
    return [structlog.processors.JSONRenderer()]


def configure(*, fmt: str = "auto", level: str = "info", secrets: Iterable[str] = (),
              cache: bool = True) -> None:
    renderer = _renderer(fmt)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            secret_masker(secrets),
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]),
        # one write per line (PrintLogger's print() writes the line, then its newline): a
        # library's record from another thread cannot land between the two
        logger_factory=structlog.WriteLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=cache,
    )


class _StdlibHandler(logging.StreamHandler):
    """Marks the handler this module installed, so that configuring again replaces it."""


def route_stdlib(*, fmt: str = "auto", level: str = "warning",
                 secrets: Iterable[str] = ()) -> logging.Handler:
    """Render the standard library's records as structlog renders its own, masked.

    Before this, uvicorn's "Exception in ASGI application" traceback or a pool warning came
    out as plain text among the JSON lines, and skipped the masker. Returns the installed
    handler (the root logger's only one from this module).
    """
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            secret_masker(secrets),
            *_renderer(fmt),
        ],
    )
    handler = _StdlibHandler(_CurrentStderr())
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.getLevelNamesMapping()[level.upper()])
    return handler
