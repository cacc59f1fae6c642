"""Making a file's name survive a power cut, for every writer that promises durability."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_folder(folder: Path) -> None:
    """Make the names in ``folder`` (a file just created or renamed there) durable: a
    file's own fsync does not write its directory entry."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
