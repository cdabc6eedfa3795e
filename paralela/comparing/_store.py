"""A comparison's run directory: its identity and the log of finished folds.

::

    run_dir/
      compare-identity.json   data hash and shape, families, folds, scoring: a rerun
                              with other ones is refused
      folds.jsonl             one line per finished (candidate, fold), one per ended
                              candidate; appended, flushed and fsync'd as they finish
      study.db                the Optuna study (sampling, median pruning), when used
      compare.json, leaderboard.csv, best.json, best.pkl   the results (_results)

A rerun with the same run directory reads ``folds.jsonl``: finished folds are not
fitted again, ended candidates are not run again. A line cut short by a crash is
dropped (the file is cut back to its last whole line before appending).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from paralela._files import atomic_write
from paralela.errors import ConfigError
from paralela.files import refuse_others_outputs

if TYPE_CHECKING:
    from paralela.comparing._families import Family

__all__ = [
    "FoldLog",
    "LoggedCandidate",
    "candidate_key",
    "check_identity",
    "comparison_identity",
    "jsonable",
    "open_study",
]

IDENTITY_FILE = "compare-identity.json"
FOLDS_FILE = "folds.jsonl"
#: What a comparison writes in its run directory, replacing what is there.
OUTPUTS = (FOLDS_FILE, "compare.json", "leaderboard.csv", "best.json", "best.pkl")


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: numpy scalars as Python numbers, the rest by repr."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    return repr(value)


def candidate_key(family: str, params: Mapping[str, Any]) -> str:
    """The name of a candidate in the run directory: its family and parameters."""
    return json.dumps([family, jsonable(params)], sort_keys=True, separators=(",", ":"))


def data_digest(X: Any, y: Any) -> dict[str, Any]:
    """Shape and SHA-256 of the data set (arrays by their bytes, anything else pickled)."""
    import pickle

    import numpy as np

    digest = hashlib.sha256()
    shapes = []
    for part in (X, y):
        if hasattr(part, "tocsr"):  # a scipy sparse matrix
            csr = part.tocsr()
            shapes.append(list(csr.shape))
            for a in (csr.data, csr.indices, csr.indptr):
                digest.update(np.ascontiguousarray(a).tobytes())
            continue
        array = np.asarray(part)
        shapes.append(list(array.shape))
        digest.update(str(array.dtype).encode())
        if array.dtype.kind == "O":
            digest.update(pickle.dumps(array.tolist(), protocol=4))
        else:
            digest.update(np.ascontiguousarray(array).tobytes())
    return {"X_shape": shapes[0], "y_shape": shapes[1], "sha256": digest.hexdigest()}


def folds_digest(folds: Sequence[tuple[Any, Any]]) -> str:
    import numpy as np

    digest = hashlib.sha256()
    for train, test in folds:
        digest.update(np.asarray(train, dtype=np.int64).tobytes() + b"|")
        digest.update(np.asarray(test, dtype=np.int64).tobytes() + b";")
    return digest.hexdigest()


def check_identity(run_dir: Path, identity: dict[str, Any]) -> None:
    """Record what this comparison is, or refuse a run directory that holds another one.

    Raises:
        ConfigError: ``run_dir`` holds a comparison of other data, families, folds or
            scoring (the message says which differs), or no comparison but files of
            someone else's that this one would replace (``leaderboard.csv``, ...).
    """
    path = run_dir / IDENTITY_FILE
    if not path.exists():  # a new run directory: what it holds is not a comparison's
        refuse_others_outputs(run_dir, OUTPUTS, "comparison")
        atomic_write(path, json.dumps(identity, indent=1, sort_keys=True).encode())
        return
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} cannot be read ({exc}); it is not a comparison's run directory, or it "
            "was damaged. Use another run_dir."
        ) from exc
    what = {
        "data": "the data set (its shape or content)",
        "families": "the families or their grids",
        "folds": "the cross-validation folds (cv)",
        "scoring": "the scoring",
    }
    for name, words in what.items():
        if stored.get(name) != identity.get(name):
            raise ConfigError(
                f"The run directory {run_dir} holds another comparison: {words} differ "
                f"(was {_short(stored.get(name))}, now {_short(identity.get(name))}). Use "
                "another run_dir, or the same data, families, cv and scoring to resume it."
            )


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


@dataclass
class LoggedCandidate:
    """What ``folds.jsonl`` holds about one candidate."""

    number: int
    family: str
    params: dict[str, Any]
    folds: dict[int, dict[str, Any]] = field(default_factory=dict)
    state: str | None = None  # COMPLETE, PRUNED or FAIL once ended
    error: str | None = None


class FoldLog:
    """``run_dir/folds.jsonl``: read at start, appended to as folds finish."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / FOLDS_FILE
        self.candidates: dict[str, LoggedCandidate] = {}
        self._file: BinaryIO | None = None
        self._read()

    def _read(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) != len(data):  # a line cut short by a crash: drop it
            with open(self.path, "r+b") as f:
                f.truncate(len(whole))
                os.fsync(f.fileno())
        for number, line in enumerate(whole.splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                self._apply(entry)
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{self.path}, line {number}, cannot be read ({exc}); the file was "
                    "edited or damaged. Remove that line (its fold is fitted again) or use "
                    "another run_dir."
                ) from exc

    def _apply(self, entry: dict[str, Any]) -> None:
        key = entry["key"]
        logged = self.candidates.get(key)
        if logged is None:
            logged = self.candidates[key] = LoggedCandidate(
                int(entry["number"]), entry["family"], dict(entry["params"])
            )
        if entry["kind"] == "fold":
            logged.folds[int(entry["fold"])] = entry
        elif entry["kind"] == "end":
            logged.state = str(entry["state"])
            logged.error = entry.get("error")
        else:
            raise ValueError(f"unknown kind {entry['kind']!r}")

    def append(self, entry: dict[str, Any]) -> None:
        """Add one line, on disk (fsync'd) when this returns. A write that fails (a full
        disk) leaves the file as it was, not with half a line, and raises."""
        if self._file is None:
            # unbuffered: nothing left in a buffer to be written half at close
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 (kept open for the run)
        line = json.dumps(jsonable(entry), sort_keys=True, separators=(",", ":")).encode()
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        try:
            view = memoryview(line + b"\n")
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
        self._apply(entry)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def comparison_identity(
    families: Sequence[Family],
    estimators: Sequence[Any],
    X: Any,
    y: Any,
    folds: Sequence[tuple[Any, Any]],
    scoring: str,
) -> dict[str, Any]:
    """What makes two comparisons the same one (see :func:`check_identity`)."""
    return {
        "data": data_digest(X, y),
        "families": [
            {
                "name": f.name,
                "space": f.space.to_dict(),
                "estimator": f"{type(e).__module__}.{type(e).__qualname__}",
            }
            for f, e in zip(families, estimators, strict=True)
        ],
        "folds": {"n": len(folds), "sha256": folds_digest(folds)},
        "scoring": scoring,
    }


def open_study(
    root: Path, sampler: Any, seed: int | None, pruner: Any, *, grid: bool, notes: list[str]
) -> tuple[Any, Any]:
    from optuna.trial import TrialState

    from paralela.studies import (
        choose_storage,
        import_optuna,
        make_sampler,
        open_storage,
        recover_interrupted,
    )

    optuna = import_optuna()
    if grid or sampler is None:
        sampler_obj = make_sampler("random" if grid else "tpe", seed=seed, grid=None)
    elif isinstance(sampler, str):
        sampler_obj = make_sampler(sampler, seed=seed, grid=None)
    else:
        sampler_obj = sampler
    choice = choose_storage(root, None)
    if choice.note:
        notes.append(choice.note)
    database = open_storage(choice.spec, wal=True)
    study = optuna.create_study(
        study_name="compare",
        storage=database,
        sampler=sampler_obj,
        pruner=pruner or optuna.pruners.NopPruner(),
        direction="maximize",
        load_if_exists=True,
    )
    if grid:  # a dead driver's trials: failed; their candidates come from the grid again
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    else:  # failed, and their parameters asked again first
        recover_interrupted(study)
    return study, database
