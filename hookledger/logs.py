"""structlog, configured once at the entry point.

JSON lines when the output is not a terminal (the service under a supervisor), readable
console lines on a terminal. A last-line-of-defence processor masks any configured secret
that somehow reached a log line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog

MASK = "[redacted]"


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time (it may be replaced after start-up)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def secret_masker(secrets: Iterable[str]) -> structlog.types.Processor:
    needles = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)

    def mask(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if not needles:
            return event
        for key, value in event.items():
            if isinstance(value, str):
                for needle in needles:
                    if needle in value:
                        value = value.replace(needle, MASK)
                event[key] = value
        return event

    return mask


def configure(*, fmt: str = "auto", level: str = "info", secrets: Iterable[str] = (),
              cache: bool = True) -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            secret_masker(secrets),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=cache,
    )
