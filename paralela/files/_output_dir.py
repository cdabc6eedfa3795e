"""Output directories of ``mapreduce`` and ``predict``: paralela replaces only what it
wrote there, known from what it recorded, never from a name.

::

    check_output_dir(dir, mode)   before any work: made if missing; every entry must be
        paralela's own (below), else ConfigError naming a few (mode "errorifexists", as
        Spark's default save mode) or the entry is deleted (mode "overwrite")
    claim_output_dir(dir, files)  before the first part: .paralela-output.json lists the
        files this run will write and the own files still there; _SUCCESS and the own
        temp files a killed run left go
    write part files              temp names start with temp_prefix(dir): TMP_PREFIX + token
    finish_output_dir(dir, files, success)   own files not in ``files`` and own temp
        files go; _SUCCESS (``success`` + ``files`` + the token) written last; the
        manifest goes, _SUCCESS now lists the own files

paralela's own files are those that the manifest (while a run is under way or after it
was killed) or paralela's ``_SUCCESS`` (after a run finished) lists, the two
themselves, and the temp files whose names start with the token either records. At
every moment each file paralela wrote there is listed by one of the two, so a rerun
after a crash at any point recognises all of them. Another ``_SUCCESS`` (Spark's is
empty) or a ``part-*`` file neither lists is someone else's.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from paralela._files import TMP_PREFIX, make_dirs, replacing
from paralela.errors import ConfigError

__all__ = [
    "MANIFEST_NAME",
    "MODES",
    "SUCCESS_NAME",
    "check_mode",
    "check_output_dir",
    "claim_output_dir",
    "finish_output_dir",
    "remove_own_temporaries",
    "refuse_others_outputs",
    "remove_stale",
    "temp_prefix",
]

SUCCESS_NAME = "_SUCCESS"
MANIFEST_NAME = ".paralela-output.json"
#: What to do with an output directory that holds files paralela did not write.
MODES = ("errorifexists", "overwrite")
_SHOWN = 5  # files named in the refusal


def check_mode(mode: Any) -> str:
    """``mode``, checked: one of :data:`MODES`."""
    if mode not in MODES:
        raise ConfigError(f"mode must be 'errorifexists' or 'overwrite', got {mode!r}.")
    return str(mode)


class _Own:
    """What paralela recorded in a directory: its own file names and temp prefixes."""

    def __init__(self, directory: Path) -> None:
        self.files: set[str] = set()
        self.prefixes: set[str] = set()
        self.token: str | None = None
        for name in (MANIFEST_NAME, SUCCESS_NAME):
            record = _read_record(directory / name)
            if record is None:
                continue
            self.files.add(name)
            self.files.update(record["files"])
            token = record.get("token")
            if isinstance(token, str) and token.isalnum():
                self.prefixes.add(_prefix(token))
                if name == MANIFEST_NAME or self.token is None:
                    self.token = token

    def owns(self, name: str) -> bool:
        return name in self.files or name.startswith(tuple(self.prefixes))


def _prefix(token: str) -> str:
    return f"{TMP_PREFIX}{token}-"


def _read_record(path: Path) -> dict[str, Any] | None:
    """The files and token paralela recorded in ``path`` (its manifest, or its JSON
    ``_SUCCESS``: the part files under ``parts``), or ``None``: not paralela's."""
    try:
        with open(path, "rb") as f:  # a symlink is followed: then its target's record
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    files = data.get("files")
    if files is None and isinstance(data.get("parts"), list):  # a _SUCCESS of before
        files = [p.get("file") for p in data["parts"] if isinstance(p, dict)]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return {"files": [f for f in files if "/" not in f], "token": data.get("token")}


def check_output_dir(directory: str | os.PathLike[str], mode: str = "errorifexists") -> Path:
    """The output directory, made if missing; refuses (or, with ``mode="overwrite"``,
    deletes) every entry there that paralela did not write.

    Raises:
        ConfigError: ``directory`` is a file or cannot be made, or holds files paralela
            did not write (names a few) and ``mode`` is ``"errorifexists"``.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output={str(directory)!r} is a file; pass a directory for the parts.")
    try:
        make_dirs(path)
    except OSError as exc:
        raise ConfigError(f"The output directory {path} cannot be made: {exc}.") from exc
    own = _Own(path)
    others = sorted(entry.name for entry in os.scandir(path) if not own.owns(entry.name))
    if not others:
        return path
    if mode == "overwrite":
        for name in others:
            _remove(path / name)
        return path
    more = f" and {len(others) - _SHOWN} more" if len(others) > _SHOWN else ""
    raise ConfigError(
        f"The output directory {path} holds other files ({', '.join(others[:_SHOWN])}{more}): "
        "paralela did not write them, and would replace or mix with them. Pass a new or "
        "empty directory, or mode='overwrite' (--overwrite on the command line) to delete "
        "the directory's contents first."
    )


def refuse_others_outputs(
    directory: str | os.PathLike[str], names: Iterable[str], run: str
) -> None:
    """For a run directory no ``run`` of paralela's has written yet (the caller knows: no
    record of one there): refuse it if it holds any of ``names``, the files and folders
    that run would replace (a folder counts when it holds something).

    Raises:
        ConfigError: naming the files found.
    """
    path = Path(directory)
    found = []
    for name in names:
        target = path / name
        if target.is_dir() and not target.is_symlink():
            if any(os.scandir(target)):
                found.append(name)
        elif os.path.lexists(target):
            found.append(name)
    if found:
        raise ConfigError(
            f"The run directory {path} holds {', '.join(found)}, which paralela did not "
            f"write (no {run} was made there) and which this {run} would replace. Pass a "
            "new or empty run_dir (--run-dir), or move them away first."
        )


def _remove(path: Path) -> None:
    """Delete ``path``: a directory with what it holds, a symlink itself (never its target)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def temp_prefix(directory: str | os.PathLike[str]) -> str:
    """The prefix of the temp files paralela writes in ``directory``: the claimed
    output directory's own (``TMP_PREFIX``, its token, ``-``), else the plain one."""
    record = _read_record(Path(directory) / MANIFEST_NAME)
    token = None if record is None else record.get("token")
    return _prefix(token) if isinstance(token, str) and token.isalnum() else TMP_PREFIX


def claim_output_dir(directory: str | os.PathLike[str], files: Iterable[str]) -> None:
    """Record that this run writes ``files`` (names) in ``directory``, already checked by
    :func:`check_output_dir`: the manifest lists them and paralela's own files still
    there (a resumed run's finished parts); a former ``_SUCCESS`` goes (it must not vouch
    for parts this run rewrites), and so do the temp files of a run that was killed."""
    path = Path(directory)
    own = _Own(path)
    present = {name for name in own.files if (path / name).exists()}
    token = own.token or uuid.uuid4().hex[:16]
    listed = sorted(present | set(files) | {SUCCESS_NAME})
    _write_manifest(path, listed, token)
    (path / SUCCESS_NAME).unlink(missing_ok=True)
    remove_own_temporaries(path)


def _write_manifest(path: Path, files: list[str], token: str) -> None:
    data = {
        "written_by": "paralela",
        "about": "the files paralela wrote here (a rerun replaces only these)",
        "token": token,
        "files": files,
    }
    _write(path / MANIFEST_NAME, json.dumps(data, indent=1), token)


def _write(path: Path, text: str, token: str) -> None:
    with replacing(path, _prefix(token)) as f:
        f.write((text + "\n").encode())


def remove_own_temporaries(directory: str | os.PathLike[str]) -> None:
    """Remove the temp files of paralela's in ``directory`` (their names start with a
    token paralela recorded there): parts whose writing was cut short."""
    path = Path(directory)
    own = _Own(path)
    if not own.prefixes:
        return
    for entry in os.scandir(path):
        if entry.name.startswith(tuple(own.prefixes)) and entry.is_file(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)


def finish_output_dir(
    directory: str | os.PathLike[str], files: Iterable[str], success: Mapping[str, Any]
) -> None:
    """End a run that wrote ``files`` (names) in ``directory``: paralela's own files not
    among them (a former run's extra parts) and its temp files go, then ``_SUCCESS``
    (``success``, with ``files`` and the token) is written, and the manifest removed."""
    path = Path(directory)
    keep = set(files)
    remove_stale(path, keep)
    remove_own_temporaries(path)
    token = _Own(path).token or uuid.uuid4().hex[:16]
    data = {**success, "files": sorted(keep), "token": token}
    text = json.dumps(data, indent=1, allow_nan=False, default=str)
    _write(path / SUCCESS_NAME, text, token)
    (path / MANIFEST_NAME).unlink(missing_ok=True)


def remove_stale(directory: str | os.PathLike[str], keep: Iterable[str]) -> None:
    """Remove paralela's own files in ``directory`` that are not in ``keep`` (names): the
    parts a former run wrote that this one did not (it had more, or another format)."""
    path = Path(directory)
    for name in sorted(_Own(path).files - set(keep) - {MANIFEST_NAME, SUCCESS_NAME}):
        target = path / name
        if target.is_symlink() or target.is_file():
            target.unlink(missing_ok=True)
