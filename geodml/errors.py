"""The errors a run reports as one ``geodml: error:`` line with exit code 2 on every rank (docs/reliability.md)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


class InputError(ValueError):
    """A bad input found during set-up, after the process group exists (a port taken between the
    preflight and the exporter's start, a checkpoint the ranks disagree on, a bind address). The
    CLI prints it once (rank 0) and every rank exits 2; a rank other than the one that found it
    learns it through the peer watch (geodml.peerwatch)."""


class StorageError(InputError):
    """A file of the run could not be written (a full disk, an I/O error, a permission taken away): the
    message names the file, the operation, the error and the free space; the partial file is gone and
    every file written before is as it was (geodml.rundir's writers). ``remedy``: what to do before resuming."""

    def __init__(self, message: str, remedy: str = "fix the cause") -> None:
        super().__init__(message)
        self.remedy = remedy


def remedy_for(err: int | None) -> str:
    """What a user does about a failed write before resuming, by its errno."""
    if err in (errno.ENOSPC, errno.EDQUOT):
        return "make room"
    if err in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "restore write access"
    if err == errno.EIO:
        return "check the disk"
    return "fix the cause"


def free_space(path: Path) -> str:
    """The free space of the file system holding ``path`` (its nearest existing parent), for error messages."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = float(shutil.disk_usage(p).free)
    except OSError:
        return "free space unknown"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if free < 1000 or unit == "TB":
            return f"{free:.0f} {unit} free" if unit == "B" else f"{free:.1f} {unit} free"
        free /= 1000.0
    return "free space unknown"


def storage_error(path: Path, what: str, exc: OSError) -> StorageError:
    """One line for a failed write: the file, what was being written, the error, the free space."""
    reason = exc.strerror or type(exc).__name__
    return StorageError(f"cannot write {what} {path}: {reason} ({free_space(path.parent)} on its file system)",
                        remedy_for(exc.errno))
