"""What a sweep is for (its objective and its space), which names its study and directory.

Every Optuna example calls its function ``objective``: named after the function alone,
two unrelated sweeps would share one study, and the second would report the first's
best. So the default study name is ``<objective>-<8 hex digits>``, the digits hashing
the objective's identity (``module:qualname``, or the command with its ``{placeholders}``)
and the space's canonical form, and the default run directory is
``paralela-runs/<that name>``. A study records what it was created for (two user
attributes), and continuing it with another objective or space is refused, naming both,
unless the user named the study, which says they mean to continue it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError
from paralela.files import refuse_others_outputs
from paralela.space import Space

__all__ = ["SweepIdentity", "check_identity", "check_run_dir", "identify"]

OBJECTIVE_ATTR = "paralela:objective"
SPACE_ATTR = "paralela:space"
SHOWN_CHARS = 160  # of a space in a message
#: What a sweep writes in its run directory, replacing what is there (trials/: logs).
OUTPUTS = ("trials.csv", "trials.json", "plots", "trials")


@dataclass(frozen=True)
class SweepIdentity:
    """The objective and the space of a sweep, as text that is the same on every run."""

    stem: str  # what the name starts with: the function's or the script's name
    objective: str
    space: str  # canonical JSON

    @property
    def default_name(self) -> str:
        text = f"{self.objective}\0{self.space}".encode()
        return f"{self.stem}-{hashlib.sha256(text).hexdigest()[:8]}"

    def differs_from(self, objective: str, space: str) -> str | None:
        """How a study made for ``objective`` and ``space`` differs from this sweep."""
        problems = []
        if objective != self.objective:
            problems.append(f"objective {objective} (now {self.objective})")
        if space != self.space:
            problems.append(f"space {_short(space)} (now {_short(self.space)})")
        return " and ".join(problems) or None


def identify(
    function: Callable[..., Any] | str | None, command: Sequence[str] | None, space: Space
) -> SweepIdentity:
    """The identity of a sweep of ``function`` (or ``"module:func"``) or ``command``."""
    canonical = json.dumps(space.to_dict(), sort_keys=True, default=str)
    if command is not None:
        scripts = [a for a in command if a.endswith(".py")]
        stem = Path(scripts[0] if scripts else command[0]).stem
        return SweepIdentity(stem or "sweep", " ".join(command), canonical)
    if isinstance(function, str):  # MODULE:FUNC or file.py:func, as the command line has it
        module, _, name = function.rpartition(":")
        objective = f"{Path(module).stem if module.endswith('.py') else module}:{name}"
        return SweepIdentity(name or "sweep", objective, canonical)
    name = str(getattr(function, "__name__", "sweep")).strip("<>") or "sweep"
    qualname = getattr(function, "__qualname__", name)
    module = getattr(function, "__module__", None) or "?"
    return SweepIdentity(name, f"{module}:{qualname}", canonical)


def check_identity(study: Any, identity: SweepIdentity, *, named: bool) -> str | None:
    """Record what a new study is for; refuse to continue one made for another sweep.

    Returns a note when a study the user named is continued with another objective or
    space (allowed: naming it says so).

    Raises:
        ConfigError: the study was made for another objective or space, and the user
            did not name it.
    """
    attrs = study.user_attrs
    if OBJECTIVE_ATTR not in attrs:
        if not study.get_trials(deepcopy=False):  # new: say what it is for
            study.set_user_attr(OBJECTIVE_ATTR, identity.objective)
            study.set_user_attr(SPACE_ATTR, identity.space)
        return None
    difference = identity.differs_from(attrs[OBJECTIVE_ATTR], attrs.get(SPACE_ATTR, ""))
    if difference is None:
        return None
    if named:
        return f"continuing study {study.study_name!r}, which was made for {difference}"
    raise ConfigError(
        f"The study {study.study_name!r} was made for {difference}. Use another run_dir "
        "(--run-dir), or name the study (study_name= / --study) to continue it anyway."
    )


def check_run_dir(storage: Any, root: Path, name: str, identity: SweepIdentity) -> None:
    """Refuse a run directory whose database already holds another sweep's study: its
    ``trials.csv``, logs and plots would be overwritten by this one's.

    Raises:
        ConfigError: naming the study there (and what it was made for) and this sweep;
            or, in a directory that holds no study yet, naming the files of someone
            else's that this sweep would replace (``trials.csv``, ``plots/``, ...).
    """
    studies = storage.get_all_studies()
    if not studies:  # a new run directory: what it holds is not a sweep's of paralela's
        refuse_others_outputs(root, OUTPUTS, "sweep")
        return
    others = [s for s in studies if s.study_name != name]
    if not others:
        return
    other = others[0]
    attrs = other.user_attrs
    made_for = (
        f"objective {attrs[OBJECTIVE_ATTR]}, space {_short(attrs.get(SPACE_ATTR, ''))}"
        if OBJECTIVE_ATTR in attrs
        else "an objective and space it does not record (an earlier paralela?)"
    )
    raise ConfigError(
        f"{root} already holds the sweep {other.study_name!r} ({made_for}); this sweep "
        f"({identity.default_name}: objective {identity.objective}, space "
        f"{_short(identity.space)}) is another one. Use another run_dir (--run-dir), or "
        f"name the study (study_name={other.study_name!r} / --study {other.study_name}) "
        "to continue that one with this objective and space."
    )


def _short(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
