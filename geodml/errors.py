"""The errors a run reports as one ``geodml: error:`` line with exit code 2 on every rank (docs/reliability.md)."""

from __future__ import annotations


class InputError(ValueError):
    """A bad input found during set-up, after the process group exists (a port taken between the
    preflight and the exporter's start, a checkpoint the ranks disagree on, a bind address). The
    CLI prints it once (rank 0) and every rank exits 2; a rank other than the one that found it
    learns it through the peer watch (geodml.peerwatch)."""


class StorageError(InputError):
    """A file of the run could not be written (a full disk, an I/O error, a permission taken away): the
    message names the file, the operation, the error and the free space; the partial file is gone and
    every file written before is as it was (geodml.rundir's writers)."""
