"""Making a file's name survive a power cut, for every writer that promises durability."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, cast


def fsync_folder(folder: Path) -> None:
    """Make the names in ``folder`` (a file just created or renamed there) durable: a
    file's own fsync does not write its directory entry."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def durable_folder(folder: Path, *, mode: int = 0o777) -> None:
    """``mkdir -p`` whose names survive a power cut: a file fsynced inside a folder whose
    own name was never written is lost with it (the spool's folder, made at start-up on a
    new home with the home too; a media file's new two-character folder). Its parent is
    fsynced even when it already existed: a process that died before doing so may have
    left it only in the page cache. ``mode`` is the folder's own when this makes it (less
    the umask); an existing folder keeps its own."""
    made = [parent for parent in folder.parents if not parent.exists()]
    folder.mkdir(mode=mode, parents=True, exist_ok=True)
    for name in (folder, *made):
        fsync_folder(name.parent)


def open_private(path: Path, flags: str) -> BinaryIO:
    """Open ``path`` for writing (``"xb"`` or ``"ab"``), readable by its owner alone,
    whatever the umask or an earlier release's mode: the spool's files hold whole delivery
    bodies (customers' names, phone numbers, amounts)."""
    mode = {"xb": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
            "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND}[flags]
    fd = os.open(path, mode | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # one an earlier release made (0644) is made private too
        return cast(BinaryIO, os.fdopen(fd, flags))
    except BaseException:
        os.close(fd)
        raise
