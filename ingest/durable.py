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


def durable_folder(folder: Path) -> None:
    """``mkdir -p`` whose names survive a power cut: a file fsynced inside a folder whose
    own name was never written is lost with it (the spool's folder, made at start-up on a
    new home with the home too; a media file's new two-character folder). Its parent is
    fsynced even when it already existed: a process that died before doing so may have
    left it only in the page cache."""
    made = [parent for parent in folder.parents if not parent.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    for name in (folder, *made):
        fsync_folder(name.parent)
