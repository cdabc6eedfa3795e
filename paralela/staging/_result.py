"""What a stage did (:class:`StageResult`), and how it fails.

::

    ParalelaError
    └── StageError                  a file could not be copied (named, with the reason)
        └── VerificationError       a copy did not match its source, or no longer matches
                                    what was copied (``verify_stage``)

``ConfigError`` (bad usage: SRC missing, DEST inside SRC, DEST not writable, not enough
space) is raised before any file is copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from paralela.errors import ParalelaError

__all__ = ["StageError", "StageResult", "VerificationError"]

_SHOWN_FAILURES = 10  # the message names this many files; ``failures`` holds them all


@dataclass(frozen=True)
class StageResult:
    """What one :func:`~paralela.staging.stage` (or ``verify_stage``) call did.

    Attributes:
        source: the directory files were read from (for ``back=True``: the scratch copy).
        dest: the directory files were written to; it holds the manifest
            ``.paralela-stage.jsonl``.
        path: what to hand to your program: the staged directory, or the staged file when
            SRC is a file (for ``back=True``: SRC itself).
        direction: ``"stage"`` (to scratch), ``"back"`` (results home) or ``"verify"``.
        files_copied: files copied in this call.
        files_skipped: files already up to date (same size and modification time as the
            source, and the copy untouched since it was made and recorded).
        files_verified: files whose copy was read back and matched the source's checksum
            (for ``"verify"``: every recorded file checked).
        bytes_copied: bytes of the copied files.
        bytes_total: bytes of every file of the source (``"verify"``: of the files checked).
        seconds: wall time of the call.
        workers: threads used.
        checksum: the checksum algorithm (``"blake2b"`` or ``"sha256"``).
        warnings: things skipped or worth knowing (broken symbolic links, special files,
            a DEST on a network filesystem or tmpfs...), one sentence each.
    """

    source: str
    dest: str
    path: str
    direction: str
    files_copied: int
    files_skipped: int
    files_verified: int
    bytes_copied: int
    bytes_total: int
    seconds: float
    workers: int
    checksum: str
    warnings: tuple[str, ...] = field(default=())

    @property
    def files_total(self) -> int:
        """Files copied plus files skipped."""
        return self.files_copied + self.files_skipped

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields (``warnings`` as a list)."""
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        return data

    def summary(self) -> str:
        """One line for humans: counts, sizes, speed and where the files are."""
        from paralela.resources import format_bytes

        if self.direction == "verify":
            return (
                f"paralela stage: {self.files_verified} file(s), {format_bytes(self.bytes_total)} "
                f"verified in {self.seconds:.2f} s ({self.checksum}): {self.dest}"
            )
        arrow = "->" if self.direction == "stage" else "-> (back)"
        copied = f"{self.files_copied} file(s) copied"
        if self.files_copied:
            rate = self.bytes_copied / self.seconds if self.seconds > 0 else 0.0
            copied += f" ({format_bytes(self.bytes_copied)}, {format_bytes(int(rate))}/s)"
        return (
            f"paralela stage: {copied}, {self.files_skipped} up to date, "
            f"{self.files_verified} verified, in {self.seconds:.2f} s with {self.workers} "
            f"threads: {self.source} {arrow} {self.dest}"
        )


def _list_failures(failures: Sequence[tuple[str, str]]) -> str:
    shown = [f"  {path}: {reason}" for path, reason in failures[:_SHOWN_FAILURES]]
    if len(failures) > _SHOWN_FAILURES:
        shown.append(f"  ... and {len(failures) - _SHOWN_FAILURES} more")
    return "\n".join(shown)


class StageError(ParalelaError):
    """Some files could not be copied; every other file was, and is recorded.

    Attributes:
        failures: ``(relative path, reason)`` for every file that failed.
        result: what the call did nonetheless (``None`` when it stopped before copying).
    """

    def __init__(
        self,
        message: str,
        failures: Sequence[tuple[str, str]] = (),
        result: StageResult | None = None,
    ) -> None:
        self.failures = tuple(failures)
        self.result = result
        text = message if not self.failures else f"{message}\n{_list_failures(self.failures)}"
        super().__init__(text)


class VerificationError(StageError):
    """A copy did not match its source's size and checksum, or no longer matches them.

    Such files never get their final name during a stage (the damaged copy is deleted);
    ``verify_stage`` forgets them in the manifest, so the next stage copies them anew.
    """
