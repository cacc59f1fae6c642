"""Hand-written SQL kept in ``.sql`` files beside the code, loaded by name once."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def load(package: str, name: str) -> str:
    return (resources.files(package) / "sql" / f"{name}.sql").read_text(encoding="utf-8")
