"""The shared lower-floor packages: their public names, a cheap import, one failure carrier."""

from __future__ import annotations

import importlib
import json
import pickle
import subprocess
import sys
import threading

import pytest

from paralela.backends import RemoteTraceback
from paralela.errors import InputError, UserFunctionError
from paralela.tasks import TaskFailed, carry, exception_bytes

PACKAGES = [
    "paralela.tasks",
    "paralela.files",
    "paralela.runs",
    "paralela.resources",
    "paralela.serving",
    "paralela.mapping",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == []


def test_import_paralela_files_leaves_the_readers_unloaded() -> None:
    code = (
        "import json, sys; import paralela.files; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('paralela.files')"
        " or m in ('csv', 'gzip'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [
        "paralela.files",
        "paralela.files._output_dir",
        "paralela.files._sizes",
    ]


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_the_carrier_brings_the_error_back_with_the_users_exception_as_its_cause() -> None:
    cause = _raised(ValueError("bad record"))
    error = UserFunctionError("The mapper raised", function="mapper")
    failed = pickle.loads(pickle.dumps(carry(error, cause)))
    assert isinstance(failed, TaskFailed)
    assert str(failed) == "The mapper raised"
    back = failed.reraise()
    assert type(back) is UserFunctionError
    assert str(back) == "The mapper raised"
    assert back.function == "mapper"
    assert type(back.__cause__) is ValueError
    assert str(back.__cause__) == "bad record"
    remote = back.__cause__.__cause__
    assert isinstance(remote, RemoteTraceback)
    assert "bad record" in remote.tb


class _Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def test_a_cause_that_does_not_pickle_leaves_its_traceback() -> None:
    cause = _raised(_Unpicklable("holds a lock"))
    assert exception_bytes(cause) is None
    failed = pickle.loads(pickle.dumps(carry(InputError("data.csv line 3: bad"), cause)))
    assert failed.cause is None
    error = failed.reraise()
    assert type(error) is InputError
    assert isinstance(error.__cause__, RemoteTraceback)
    assert "holds a lock" in error.__cause__.tb
