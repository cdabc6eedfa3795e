"""Options of the slurm backend, cluster limits and chunk sizes (no cluster needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paralela.backends import ThreadBackend, get_backend
from paralela.backends.slurm import ClusterLimits, SlurmBackend, SlurmOptions, parse_options
from paralela.backends.slurm._backend import SlurmTaskDiedError, log_tail
from paralela.backends.slurm._commands import parse_limits, require_slurm
from paralela.backends.slurm._options import DEFAULT_MAX_JOBS, valid_names
from paralela.backends.slurm._state import JobState
from paralela.cli import app
from paralela.errors import ConfigError, WorkerDiedError
from paralela.mapping._api import _packed_chunk_size


def test_defaults() -> None:
    options = parse_options(None)
    assert options == SlurmOptions()
    assert options.max_jobs == DEFAULT_MAX_JOBS
    assert options.cpus_per_task == 1
    assert options.retries == 0
    assert options.job_dir() == Path.cwd() / "paralela-runs" / "slurm-jobs"


def test_every_field_has_a_check() -> None:
    assert valid_names() == [f.name for f in dataclasses.fields(SlurmOptions)]
    shared = ["cpus_per_task", "gpus_per_task", "mem_gb", "timeout_min", "nodes"]
    assert valid_names()[:5] == shared
    assert all(n.startswith("slurm_") for n in valid_names() if n not in {*shared, "retries",
                                                                          "max_jobs"})  # fmt: skip


def test_an_unknown_option_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        parse_options({"gpu": 1, "partition": "x"})
    message = str(info.value)
    assert message.startswith("Unknown option(s) 'gpu', 'partition' (did you mean ")
    assert "'slurm_partition'?" in message
    assert "valid options are: cpus_per_task, gpus_per_task, mem_gb" in message
    assert "slurm_additional" in message


def test_strings_from_the_command_line_are_parsed() -> None:
    options = parse_options(
        {"cpus_per_task": "4", "mem_gb": "1.5", "timeout_min": "none", "max_jobs": " 50 "}
    )
    assert (options.cpus_per_task, options.mem_gb, options.timeout_min) == (4, 1.5, None)
    assert options.max_jobs == 50


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("cpus_per_task", 0, "at least 1"),
        ("cpus_per_task", True, "integer"),
        ("gpus_per_task", "two", "integer"),
        ("mem_gb", -1, "positive number"),
        ("max_jobs", 1.5, "integer"),
        ("slurm_job_name", "  ", "non-empty string"),
        ("slurm_partition", 3, "non-empty string"),
        ("slurm_additional", 3, "dict of sbatch options"),
        ("slurm_setup", [1], "shell line"),
    ],
)
def test_bad_values_say_what_is_allowed(name: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigError, match=f"Option {name} must be .*{expected}"):
        parse_options({name: value})


def test_sbatch_arguments() -> None:
    options = parse_options(
        {
            "cpus_per_task": 4,
            "gpus_per_task": 1,
            "mem_gb": 2,
            "timeout_min": 30,
            "slurm_partition": "gpu",
            "slurm_account": "proj",
            "slurm_qos": "high",
            "slurm_constraint": "a100",
            "slurm_additional": {"exclusive": True, "reservation": "r1", "hint": False},
            "slurm_signal_delay_s": 60,
        }
    )
    args = options.sbatch_args()
    for expected in [
        "--cpus-per-task=4",
        "--gres=gpu:1",
        "--mem=2048M",
        "--time=30",
        "--partition=gpu",
        "--account=proj",
        "--qos=high",
        "--constraint=a100",
        "--exclusive",
        "--reservation=r1",
        "--requeue",
        "--signal=B:USR1@60",
    ]:
        assert expected in args
    assert not any("hint" in a for a in args)
    assert parse_options({"slurm_additional": "--exclusive --comment='a b'"}).slurm_additional == (
        "--exclusive",
        "--comment=a b",
    )


def test_cluster_limits() -> None:
    config = "Configuration data as of x\nMaxArraySize            = 1001\nMaxJobCount = 10000\n"
    config += "SLURM_VERSION           = 22.05.8\nMaxMemPerNode = UNLIMITED\n"
    limits = parse_limits(config, "|\n500|\n")
    assert limits == ClusterLimits(1001, 10000, 500, "22.05.8")
    assert limits.max_tasks() == 500
    assert parse_limits(config).max_tasks() == 1001
    assert parse_limits("").max_tasks() is None


def test_max_tasks_never_exceeds_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    import paralela.backends.slurm._backend as backend_module

    backend = SlurmBackend.__new__(SlurmBackend)  # no cluster: only the arithmetic
    backend.options = parse_options({"max_jobs": 300})
    monkeypatch.setattr(
        backend_module, "cluster_limits", lambda: ClusterLimits(101, None, None, "")
    )
    assert backend.max_tasks() == 101
    monkeypatch.setattr(
        backend_module, "cluster_limits", lambda: ClusterLimits(None, None, None, "")
    )
    assert backend.max_tasks() == 300


def test_packed_chunk_sizes() -> None:
    class Limited(ThreadBackend):
        def max_tasks(self) -> int:
            return 128

    backend = Limited(1)
    try:
        assert _packed_chunk_size(10_000, backend, "auto") == 79  # 127 tasks of 79, 1 of 97
        assert _packed_chunk_size(100, backend, "auto") == 1
        assert _packed_chunk_size(100, backend, 40) == 40  # fewer, longer tasks when asked
        assert _packed_chunk_size(0, backend, "auto") == 1
    finally:
        backend.shutdown()


def test_other_backends_do_not_pack_and_take_no_options() -> None:
    backend = get_backend("threads", 2)
    assert not backend.capabilities.packs_tasks
    assert backend.max_tasks() is None
    backend.flush()  # a no-op where submissions are not grouped
    with pytest.raises(ConfigError, match=r"Backend 'processes' takes no options, got 'x'.*slurm"):
        get_backend("processes", None, {"x": 1})
    with pytest.raises(ConfigError, match="pass them to the ThreadBackend"):
        get_backend(backend, None, {"x": 1})


def test_missing_slurm_commands_are_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match=r"backend 'slurm' needs Slurm's commands on PATH"):
        require_slurm()
    with pytest.raises(ConfigError, match="needs Slurm's commands"):
        SlurmBackend({"cpus_per_task": 2})
    # A bad option is reported first: it is wrong wherever the code runs.
    with pytest.raises(ConfigError, match="Unknown option"):
        SlurmBackend({"cpu": 2})


def test_a_dead_task_error_shows_its_state_and_log(tmp_path: Path) -> None:
    log = tmp_path / "3.out"
    log.write_text("".join(f"line {i}\n" for i in range(50)) + "MemoryError\n")
    error = SlurmTaskDiedError("77_3", JobState("77_3", "OUT_OF_MEMORY", "0:9"), 2, log)
    assert isinstance(error, WorkerDiedError)
    assert error.exitcode == -9
    text = str(error)
    assert "Slurm task 77_3 ended OUT_OF_MEMORY (killed by signal 9) without a result" in text
    assert "(attempt 2)" in text
    assert str(log) in text
    assert "    MemoryError" in text
    assert "line 49" in text
    assert "line 20" not in text
    assert "mem_gb" in text
    assert log_tail(tmp_path / "missing.out") == ""


def test_cli_option_needs_key_equals_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "items.jsonl").write_text("1\n")
    runner = CliRunner()
    monkeypatch.chdir(tmp_path)  # the CLI imports the function from the current directory
    (tmp_path / "work_opts.py").write_text("def f(x):\n    return x\n")
    result = runner.invoke(app, ["map", "work_opts:f", "-i", "items.jsonl", "-o", "o.jsonl",
                                 "--option", "slurm_partition"])  # fmt: skip
    assert result.exit_code == 2
    assert "--option expects KEY=VALUE, got 'slurm_partition'" in result.output
    result = runner.invoke(app, ["map", "work_opts:f", "-i", "items.jsonl", "-o", "o.jsonl",
                                 "--backend", "threads", "--option", "x=1"])  # fmt: skip
    assert result.exit_code == 2
    assert "Backend 'threads' takes no options" in result.output


def test_the_warning_comes_at_most_half_way_through_the_time_limit() -> None:
    # Otherwise a 1-minute limit would warn (and requeue) a task as soon as it starts.
    assert "--signal=B:USR1@30" in parse_options({"timeout_min": 1}).sbatch_args()
    assert "--signal=B:USR1@120" in parse_options({"timeout_min": 60}).sbatch_args()
    assert "--signal=B:USR1@120" in parse_options({}).sbatch_args()
