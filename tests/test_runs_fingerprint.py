"""What a function's fingerprint covers: its own code, and what it reads through global
names (module constants, the user's helper functions and classes, transitively); what
it leaves out (the standard library, installed packages, paralela); and how the run
store names the dependency that changed."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest

import paralela
from paralela.errors import FingerprintMismatchError
from paralela.runs import RunStore
from paralela.runs._fingerprint import (
    Fingerprint,
    describe_changes,
    fingerprint_function,
    is_user_file,
)

# -- a user's project, in files -------------------------------------------------------

MATHHELP = """
SCALE = 2


def scale(x):
    return x * SCALE
"""

JOB = """
import mathhelp

OFFSET = 0


def f(x):
    return mathhelp.scale(x) + OFFSET
"""

DRIVER = """
import json
import sys

import paralela
import job

try:
    results = paralela.map(
        job.f, range(int(sys.argv[2])), backend="sequential", chunksize=3, run_dir=sys.argv[1]
    )
except paralela.ParalelaError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({"results": list(results)}))
"""


def write_project(where: Path, **files: str) -> None:
    for name, text in files.items():
        (where / f"{name}.py").write_text(textwrap.dedent(text))


def run_driver(where: Path, run_dir: Path, n: int, hash_seed: int = 0) -> dict[str, Any]:
    """``map`` in a fresh interpreter: the user's modules as they are on disk now."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": str(hash_seed)}
    proc = subprocess.run(
        [sys.executable, str(where / "driver.py"), str(run_dir), str(n)],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_project(tmp_path, mathhelp=MATHHELP, job=JOB, driver=DRIVER)
    return tmp_path


def test_editing_a_helper_modules_constant_is_a_mismatch_naming_it(project: Path) -> None:
    run_dir = project / "run"
    assert run_driver(project, run_dir, 3) == {"results": [0, 2, 4]}
    write_project(project, mathhelp=MATHHELP.replace("SCALE = 2", "SCALE = 100"))
    again = run_driver(project, run_dir, 6)  # was [0, 2, 4, 300, 400, 500]: mixed
    assert again["error"] == "FingerprintMismatchError"
    assert "What changed: mathhelp.SCALE (value)." in again["message"]


def test_editing_a_helper_function_is_a_mismatch_naming_it(project: Path) -> None:
    run_dir = project / "run"
    assert run_driver(project, run_dir, 3) == {"results": [0, 2, 4]}
    write_project(project, mathhelp=MATHHELP.replace("x * SCALE", "x * SCALE + 1"))
    again = run_driver(project, run_dir, 6)
    assert again["error"] == "FingerprintMismatchError"
    assert "What changed: mathhelp.scale (code)." in again["message"]


def test_editing_a_constant_of_the_functions_own_module_is_a_mismatch(project: Path) -> None:
    run_dir = project / "run"
    run_driver(project, run_dir, 3)
    write_project(project, job=JOB.replace("OFFSET = 0", "OFFSET = 7"))
    again = run_driver(project, run_dir, 6)
    assert again["error"] == "FingerprintMismatchError"
    assert "What changed: job.OFFSET (value)." in again["message"]


def test_the_mismatch_names_every_change_and_the_way_to_resume_anyway(project: Path) -> None:
    run_dir = project / "run"
    run_driver(project, run_dir, 3)
    stored = json.loads((run_dir / "manifest.json").read_text())["identity"]["function"]
    helper = MATHHELP.replace("SCALE = 2", "SCALE = 3").replace("x * SCALE", "SCALE * x")
    write_project(project, mathhelp=helper)
    message = run_driver(project, run_dir, 6)["message"]
    assert "What changed: mathhelp.SCALE (value), mathhelp.scale (code)." in message
    assert f"pass fingerprint={stored!r}" in message


def test_unchanged_code_resumes_in_a_new_process(project: Path) -> None:
    """The fingerprint of the same code is the same in every interpreter: string hash
    seeds (the order of sets, also of ``x in {...}`` constants) do not leak into it."""
    names = "{'alpha', 'beta', 'gamma', 'delta', 'epsilon'}"
    write_project(project, mathhelp=MATHHELP + f"\nNAMES = {names}\n")
    job = JOB.replace("+ OFFSET", f"+ OFFSET + len(mathhelp.NAMES) * 0 + ('x' in {names})")
    write_project(project, job=job)
    run_dir = project / "run"
    assert run_driver(project, run_dir, 3, hash_seed=1) == {"results": [0, 2, 4]}
    assert run_driver(project, run_dir, 6, hash_seed=2) == {"results": [0, 2, 4, 6, 8, 10]}


def test_a_swapped_library_import_is_named(modules: Any) -> None:
    text = "from statistics import mean as average\ndef f(xs):\n    return average(xs)\n"
    before = dependencies(modules("fp_swap", text).f)
    after = dependencies(modules("fp_swap", text.replace("mean", "median")).f)
    assert describe_changes(before, after) == (
        "fp_swap.average (was statistics.mean, now statistics.median)"
    )


def test_a_directory_made_by_an_older_paralela_says_so(tmp_path: Path) -> None:
    (tmp_path / "chunks").mkdir()
    manifest = {"format": 1, "identity": {"function": "0" * 32}, "paralela": "0.3.0"}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FingerprintMismatchError) as info:
        RunStore(tmp_path, {"function": fingerprint_function(_scaled)}, {})
    assert "made by paralela 0.3.0, which fingerprinted functions otherwise" in str(info.value)
    assert f"pass fingerprint={'0' * 32!r} to map or imap" in str(info.value)


def test_what_the_manifest_records(project: Path) -> None:
    run_driver(project, project / "run", 3)
    manifest = json.loads((project / "run" / "manifest.json").read_text())
    dependencies = manifest["dependencies"]["function"]
    assert sorted(dependencies) == ["job.OFFSET", "job.f", "mathhelp.SCALE", "mathhelp.scale"]
    assert dependencies["job.f"].startswith("code:")
    assert dependencies["mathhelp.SCALE"].startswith("value:")


# -- what is followed, in one process --------------------------------------------------


def load_module(where: Path, name: str, text: str) -> types.ModuleType:
    """Import ``text`` as module ``name`` from a file (a new module object each time)."""
    path = where / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def modules(tmp_path: Path) -> Any:
    """Load user modules from files in ``tmp_path``; forget them afterwards."""
    loaded: list[str] = []

    def load(name: str, text: str) -> types.ModuleType:
        loaded.append(name)
        return load_module(tmp_path, name, text)

    yield load
    for name in loaded:
        sys.modules.pop(name, None)


def dependencies(fn: Any) -> dict[str, str]:
    fingerprint = fingerprint_function(fn)
    assert isinstance(fingerprint, Fingerprint)
    return fingerprint.dependencies


def test_a_helper_called_through_from_import_is_followed(modules: Any) -> None:
    modules("fp_a", "K = 1\ndef helper(x):\n    return x + K\n")
    job = modules("fp_b", "from fp_a import helper\ndef f(x):\n    return helper(x)\n")
    assert sorted(dependencies(job.f)) == ["fp_a.K", "fp_a.helper", "fp_b.f"]
    before = fingerprint_function(job.f)
    modules("fp_a", "K = 2\ndef helper(x):\n    return x + K\n")
    job = modules("fp_b", "from fp_a import helper\ndef f(x):\n    return helper(x)\n")
    assert fingerprint_function(job.f) != before


def test_helpers_are_followed_transitively_and_recursion_terminates(modules: Any) -> None:
    job = modules(
        "fp_rec",
        """
        import fp_rec

        LIMIT = 3


        def even(n):
            return n == 0 or odd(n - 1)


        def odd(n):
            return n != 0 and even(n - 1)


        def f(x):
            return fp_rec.even(x) and fact(LIMIT)


        def fact(n):
            return 1 if n <= 1 else n * fact(n - 1)
        """,
    )
    deps = dependencies(job.f)
    assert {"fp_rec.even", "fp_rec.odd", "fp_rec.fact", "fp_rec.LIMIT", "fp_rec.f"} <= set(deps)


def test_classes_and_their_methods_are_followed(modules: Any) -> None:
    text = """
    class Model:
        size = 3

        def predict(self, x):
            return x * self.size


    def f(x):
        return Model().predict(x)
    """
    job = modules("fp_cls", text)
    deps = dependencies(job.f)
    assert deps["fp_cls.Model"].startswith("class:")
    assert deps["fp_cls.Model.predict"].startswith("code:")
    before = dict(deps)
    job = modules("fp_cls", text.replace("x * self.size", "x + self.size"))
    after = dependencies(job.f)
    assert [k for k in after if after[k] != before.get(k)] == ["fp_cls.Model.predict"]
    job = modules("fp_cls", text.replace("size = 3", "size = 4"))
    after = dependencies(job.f)
    assert [k for k in after if after[k] != before.get(k)] == ["fp_cls.Model"]


def test_the_standard_library_installed_packages_and_paralela_are_not_followed(
    modules: Any,
) -> None:
    job = modules(
        "fp_lib",
        """
        import json
        import os.path

        import pytest
        import paralela
        from paralela.runs._fingerprint import digest_bytes


        def f(x):
            pytest.approx(x)
            paralela.map
            digest_bytes(b"")
            return os.path.join(json.dumps(x), "a")
        """,
    )
    kinds = {name: entry.partition(":")[0] for name, entry in dependencies(job.f).items()}
    assert kinds == {  # library code counts by the name it is bound to, and is not followed
        "fp_lib.f": "code",
        "fp_lib.json": "ref",
        "fp_lib.os": "ref",
        "fp_lib.pytest": "ref",
        "fp_lib.paralela": "ref",
        "fp_lib.digest_bytes": "ref",
    }
    assert (
        dependencies(job.f)["fp_lib.digest_bytes"] == "ref:paralela.runs._fingerprint.digest_bytes"
    )
    assert not is_user_file(json.__file__)
    assert not is_user_file(pytest.__file__)
    assert not is_user_file(paralela.__file__)
    assert is_user_file(__file__)
    assert is_user_file("<stdin>")


def test_a_decorated_helper_is_followed_through_wrapped(modules: Any) -> None:
    job = modules(
        "fp_deco",
        """
        import functools

        BASE = 10


        @functools.lru_cache(maxsize=None)
        def cached(x):
            return x + BASE


        def f(x):
            return cached(x)
        """,
    )
    assert {"fp_deco.cached", "fp_deco.BASE"} <= set(dependencies(job.f))


def test_containers_of_functions_and_partials_are_followed(modules: Any) -> None:
    job = modules(
        "fp_cont",
        """
        import functools


        def double(x):
            return 2 * x


        def add(x, y):
            return x + y


        STEPS = {"double": double, "plus_one": functools.partial(add, y=1)}


        def f(x):
            for step in STEPS.values():
                x = step(x)
            return x
        """,
    )
    deps = dependencies(job.f)
    assert {"fp_cont.double", "fp_cont.add", "fp_cont.STEPS"} <= set(deps)


def test_weird_globals_never_raise(modules: Any) -> None:
    job = modules(
        "fp_weird",
        """
        import threading


        class Hostile:
            def __getattr__(self, name):
                raise RuntimeError("no attributes here")

            def __reduce__(self):
                raise RuntimeError("no pickling either")

            def __eq__(self, other):
                raise RuntimeError("nor comparing")

            __hash__ = object.__hash__


        class Loop:
            @property
            def __wrapped__(self):
                return self

            def __call__(self, x):
                return x


        LOCK = threading.Lock()
        HOSTILE = Hostile()
        LOOP = Loop()
        MIXED = {1: "a", "b": 2, (3,): None, frozenset({1}): 1.5}
        DEEP = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]


        def f(x):
            with LOCK:
                return HOSTILE, LOOP(x), MIXED, DEEP
        """,
    )
    deps = dependencies(job.f)
    assert {"fp_weird.LOCK", "fp_weird.HOSTILE", "fp_weird.LOOP", "fp_weird.MIXED"} <= set(deps)
    assert fingerprint_function(job.f) == fingerprint_function(job.f)


def test_a_large_global_counts_by_its_type_and_is_fast(modules: Any) -> None:
    job = modules(
        "fp_big",
        """
        BIG = bytes(200_000_000)


        def f(x):
            return BIG[x]
        """,
    )
    start = time.perf_counter()
    deps = dependencies(job.f)
    assert time.perf_counter() - start < 0.5  # not a hash of 200 MB
    assert deps["fp_big.BIG"].startswith("value:")


def test_a_closure_over_a_helper_follows_the_helper(modules: Any) -> None:
    helper = modules("fp_clo", "N = 5\ndef helper(x):\n    return x + N\n").helper

    def make() -> Any:
        return lambda x: helper(x)

    assert {"fp_clo.helper", "fp_clo.N"} <= set(dependencies(make()))


def test_a_partial_and_a_callable_object_name_their_parts() -> None:
    deps = dependencies(functools.partial(_scaled, factor=3))
    assert "tests.test_runs_fingerprint._scaled" in deps or "test_runs_fingerprint._scaled" in deps
    assert any(k.endswith("(arguments)") or v.startswith("value:") for k, v in deps.items())
    assert fingerprint_function(functools.partial(_scaled, factor=3)) != fingerprint_function(
        functools.partial(_scaled, factor=4)
    )
    assert fingerprint_function(_Adder(1)) != fingerprint_function(_Adder(2))


def test_fingerprinting_a_typical_function_is_fast(modules: Any) -> None:
    modules(
        "fp_typ_helpers",
        """
        import math

        EPS = 1e-9
        WEIGHTS = {"a": 0.5, "b": 0.25, "c": 0.25}


        def normalize(v):
            total = sum(v) + EPS
            return [x / total for x in v]


        def score(v):
            return sum(WEIGHTS[k] * x for k, x in zip(sorted(WEIGHTS), normalize(v)))


        class Scorer:
            offset = 1.0

            def __call__(self, v):
                return score(v) + self.offset + math.log1p(len(v))
        """,
    )
    job = modules(
        "fp_typ_job",
        """
        import json

        import fp_typ_helpers
        from fp_typ_helpers import Scorer

        THRESHOLD = 0.5


        def process(item):
            value = Scorer()(fp_typ_helpers.normalize(item))
            return json.dumps({"ok": value > THRESHOLD})
        """,
    )
    fingerprint_function(job.process)
    start = time.perf_counter()
    for _ in range(20):
        fingerprint_function(job.process)
    assert (time.perf_counter() - start) / 20 < 0.02  # typically well under 1 ms


# -- the override --------------------------------------------------------------------


def test_the_stored_fingerprint_reopens_a_directory_whatever_changed(tmp_path: Path) -> None:
    store = RunStore(tmp_path, {"function": fingerprint_function(_scaled)}, {})
    stored = json.loads(store.manifest_path.read_text())["identity"]["function"]
    RunStore(tmp_path, {"function": stored}, {})  # what map(fingerprint=stored) passes


def test_map_with_a_fingerprint_resumes_after_an_edit(project: Path) -> None:
    run_dir = project / "run"
    run_driver(project, run_dir, 3)
    stored = json.loads((run_dir / "manifest.json").read_text())["identity"]["function"]
    write_project(project, mathhelp=MATHHELP.replace("x * SCALE", "SCALE * x  # commuted"))
    write_project(
        project,
        driver=DRIVER.replace(
            "run_dir=sys.argv[1]", f"run_dir=sys.argv[1], fingerprint={stored!r}"
        ),
    )
    assert run_driver(project, run_dir, 6) == {"results": [0, 2, 4, 6, 8, 10]}


def _scaled(x: int, factor: int) -> int:
    return x * factor


class _Adder:
    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, x: int) -> int:
        return x + self.n
