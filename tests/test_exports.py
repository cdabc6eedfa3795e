"""The public API: exactly the exported names, and a cheap ``import paralela``."""

from __future__ import annotations

import json
import subprocess
import sys

import paralela

EXPORTED = {
    "__version__",
    # hyperparameter sweeps
    "sweep",
    "report",
    "current_params",
    "TrialPruned",
    "SweepResult",
    "TrialRecord",
    "SweepError",
    "Space",
    "Float",
    "Int",
    "Categorical",
    "Choice",
    "Fixed",
    "Grid",
    "load_space",
    # model comparison
    "compare",
    "CompareResult",
    "CompareError",
    # distributed training
    "launch",
    "LaunchResult",
    # data-parallel map
    "map",
    "imap",
    "Results",
    "MapIterator",
    "MapSummary",
    "WorkerStats",
    "ChunkTiming",
    # MapReduce
    "mapreduce",
    "MapReduceResult",
    "MapReduceSummary",
    # batch prediction
    "predict",
    # serving a model class over HTTP
    "serve",
    "PredictResult",
    # scaling analysis
    "measure",
    "fit_amdahl",
    "fit_gustafson",
    "ScalingResult",
    "ScalingError",
    "load_scaling",
    # run reports
    "write_report",
    "RunReport",
    # data staging
    "stage",
    "verify_stage",
    "StageResult",
    # configuration
    "config",
    "UNSET",
    # resources and slots
    "detect",
    "Resources",
    "CpuInfo",
    "MemoryInfo",
    "GpuInfo",
    "SlurmAllocation",
    "FilesystemInfo",
    "expand_nodelist",
    "make_slots",
    "Slot",
    "THREAD_VARIABLES",
    # backends
    "Backend",
    "Broadcast",
    "Capabilities",
    "available_backends",
    "get_backend",
    # run store
    "RunStore",
    # errors
    "ParalelaError",
    "ConfigError",
    "UnpicklableError",
    "TaskError",
    "MapError",
    "WorkerDiedError",
    "RunStoreError",
    "FingerprintMismatchError",
    "DistributedError",
    "RendezvousError",
    "RankFailedError",
    "StageError",
    "VerificationError",
    "MissingExtraError",
    "MapReduceError",
    "InputError",
    "UserFunctionError",
}

HEAVY = ["rich", "typer", "cloudpickle", "torch", "numpy", "pandas", "optuna", "submitit"]


def test_all_is_exactly_the_public_api() -> None:
    assert set(paralela.__all__) == EXPORTED
    assert len(paralela.__all__) == len(set(paralela.__all__)), "a name is exported twice"


def test_every_exported_name_exists() -> None:
    for name in paralela.__all__:
        assert getattr(paralela, name, None) is not None, name


def test_star_import_gives_the_exported_names() -> None:
    namespace: dict[str, object] = {}
    exec("from paralela import *", namespace)
    assert set(namespace) - {"__builtins__"} == EXPORTED


def test_version_is_a_string() -> None:
    assert isinstance(paralela.__version__, str)
    assert paralela.__version__[0].isdigit()


def test_import_paralela_loads_no_heavy_dependency() -> None:
    code = (
        f"import json, sys, paralela; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


def test_distributed_exports_exist_and_launching_needs_no_torch() -> None:
    import paralela.distributed as distributed

    for name in distributed.__all__:
        assert getattr(distributed, name, None) is not None, name
    code = (
        "import json, sys, paralela.distributed, paralela.cli._launch; paralela.launch; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules and m != 'typer'"
        " and m != 'rich']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


def test_the_data_subpackage_is_an_attribute_imported_on_first_use() -> None:
    import subprocess
    import sys

    code = (
        "import sys, paralela\n"
        "assert 'paralela.data' not in sys.modules\n"
        "print(paralela.data.Pipeline.__name__, 'data' in dir(paralela))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["Pipeline", "True"], out.stderr
