"""``paralela sweep --backend slurm`` (the sweep packed into one allocation) and the GPUs
a Slurm job was granted as sweep slots even where no NVML or nvidia-smi answers.

The real test submits to the local cluster, whose fake GPUs are character devices
with no driver behind them: only Slurm's own variables say they are there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import default_sigint
from sweep_helpers import (
    RECORD_VARIABLE,
    SLEEP_VARIABLE,
    TIMED_TRIAL,
    command,
    intervals_by_device,
    most_at_once,
    notes,
    write_script,
)

from paralela.backends.slurm import JobOptions
from paralela.cli._errors import EXIT_USAGE
from paralela.cli._sweep import sweep as sweep_cli
from paralela.cli._sweep_slurm import inner_args
from paralela.errors import ConfigError
from paralela.resources import detect, make_slots
from paralela.resources._gpus import detect_gpus
from paralela.sweeping._slurm import SWEEP_OPTIONS, submit_sweep, sweep_script

PYTHON = sys.executable
# As in test_slurm_submit.py: room for waiting behind others' jobs on a shared cluster.
SLURM_TEST_TIMEOUT = 300
CLI_TIMEOUT = 240
SPACE = "x:\n  type: float\n  low: -2.0\n  high: 3.0\n"


# -- the GPUs Slurm granted ----------------------------------------------------------


@pytest.fixture
def no_gpu_tools(tmp_path: Path) -> str:
    """A PATH without nvidia-smi (NVML is not tried: use_nvml=False)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    return str(empty)


def granted(path: str, **variables: str) -> dict[str, str]:
    return {"PATH": path, "SLURM_JOB_ID": "42", **variables}


def test_the_gpus_slurm_granted_are_used_when_no_probe_answers(no_gpu_tools: str) -> None:
    env = granted(no_gpu_tools, SLURM_JOB_GPUS="0,1", CUDA_VISIBLE_DEVICES="0,1")
    report = detect_gpus(env, use_nvml=False)
    assert report.source == "slurm"
    assert [(g.index, g.physical_index, g.uuid) for g in report.gpus] == [(0, 0, ""), (1, 1, "")]
    assert [g.device_id for g in report.gpus] == ["0", "1"]
    assert all(g.memory_total is None and g.memory_free is None for g in report.gpus)
    assert report.notes[:2] == ("NVML: not tried", "nvidia-smi: not found on PATH")
    assert "using the 2 GPU(s) Slurm granted this job" in report.notes[2]


@pytest.mark.parametrize(
    ("variables", "devices"),
    [
        # A node whose cgroup renumbers the job's GPUs: Slurm says 2,3, CUDA sees 0,1.
        ({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}, ["0", "1"]),
        # A step's own GPUs.
        ({"SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1"}, ["1"]),
        # Sites that export UUIDs.
        (
            {"SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "GPU-aaa,MIG-bbb"},
            ["GPU-aaa", "MIG-bbb"],
        ),
    ],
)
def test_each_granted_gpu_is_shown_to_a_child_as_slurm_named_it(
    no_gpu_tools: str, variables: dict[str, str], devices: list[str]
) -> None:
    report = detect_gpus(granted(no_gpu_tools, **variables), use_nvml=False)
    assert report.source == "slurm"
    assert [g.device_id for g in report.gpus] == devices


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VISIBLE_DEVICES": "0,1"},  # not in a Slurm job
        {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "0,1"},  # a job given no GPU
        {"SLURM_JOB_ID": "42", "SLURM_GPUS_ON_NODE": "0", "CUDA_VISIBLE_DEVICES": "0"},
        {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": ""},
        {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1"},  # no CUDA_VISIBLE_DEVICES
        {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0,0"},
        {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "gpu0"},
    ],
)
def test_no_granted_gpus_without_slurm_saying_so(no_gpu_tools: str, env: dict[str, str]) -> None:
    report = detect_gpus({"PATH": no_gpu_tools, **env}, use_nvml=False)
    assert report.gpus == ()
    assert report.source == "none"


def test_a_probe_that_answers_wins_over_slurm(tmp_path: Path) -> None:
    from sweep_helpers import GPU_UUIDS, write_fake_nvidia_smi

    smi = write_fake_nvidia_smi(tmp_path / "bin")
    env = granted(str(smi), SLURM_JOB_GPUS="0,2", CUDA_VISIBLE_DEVICES="0,2")
    report = detect_gpus(env, use_nvml=False)
    assert report.source == "nvidia-smi"
    assert [g.uuid for g in report.gpus] == [GPU_UUIDS[0], GPU_UUIDS[2]]


def test_granted_gpus_become_one_slot_each(
    no_gpu_tools: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails: no NVML
    env = {**os.environ, **granted(no_gpu_tools, SLURM_JOB_GPUS="0,1", CUDA_VISIBLE_DEVICES="0,1")}
    resources = detect(env)
    assert resources.gpu_source == "slurm", resources.gpu_notes
    slots = make_slots(resources, gpus_per_slot=1)
    assert [s.env()["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "1"]


# -- the job's command line ----------------------------------------------------------


def defaults() -> dict[str, object]:
    import inspect

    return {n: p.default for n, p in inspect.signature(sweep_cli).parameters.items()}


def test_only_the_sweep_options_given_are_passed_to_the_job() -> None:
    params = {
        **defaults(),
        "trials": 8,
        "pruner": "median",
        "plots": False,
        "progress": True,
        "max_failures": 0,
        # Slurm's and the submitter's own: not passed on as given.
        "gpus_per_node": 2,
        "slurm_partition": "gpu",
        "slurm_additional": ["exclusive"],
        "backend": "slurm",
        "run_dir": Path("somewhere"),
        "study": "s",
        "json_out": True,
    }
    assert inner_args(params, defaults()) == [
        "--trials", "8", "--pruner", "median", "--max-failures", "0", "--progress", "--no-plots",
    ]  # fmt: skip
    assert inner_args(defaults(), defaults()) == []


def test_every_option_of_the_sweep_command_has_a_flag_typer_accepts(tmp_path: Path) -> None:
    # inner_args spells an option --name-with-dashes (--no-name for a switch): the
    # sweep command must accept exactly that spelling for each of its options.
    help_text = subprocess.run(
        [PYTHON, "-m", "paralela", "sweep", "--help"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"},
    ).stdout  # fmt: skip
    for name, default in defaults().items():
        if name in ("ctx", "space", "function", "json_out"):
            continue
        flag = "--" + name.replace("_", "-")
        assert flag in help_text, flag
        if isinstance(default, bool):
            assert f"--no-{name.replace('_', '-')}" in help_text, name


def test_the_batch_script_runs_the_sweep_with_its_run_dir_before_the_command(
    tmp_path: Path,
) -> None:
    options = JobOptions(gpus_per_node=2, cpus_per_task=4, partition="gpu", timeout_min=60)
    script = sweep_script(
        ["--space", "space.yaml", "--trials", "4", "--", "python", "train.py", "--lr", "{lr}"],
        options,
        run_dir=tmp_path / "run",
        study_name="train",
        workdir=tmp_path,
    )
    lines = script.splitlines()
    assert "#SBATCH --gpus-per-node=2" in lines
    assert "#SBATCH --cpus-per-task=4" in lines
    assert "#SBATCH --ntasks-per-node=1" in lines
    assert f"#SBATCH --output={tmp_path}/run/slurm-%j.out" in lines
    assert lines[-1] == (
        f"exec {PYTHON} -m paralela sweep --space space.yaml --trials 4 --study train "
        f"--run-dir {tmp_path}/run -- python train.py --lr '{{lr}}'"
    )
    subprocess.run(["bash", "-n"], input=script, text=True, check=True, timeout=30)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"slurm_mode": "per-trial"}, "backend='slurm'"),
        ({"slurm_mode": "array"}, "valid modes are: pack, per-trial"),
        ({"nodes": 2}, "A packed sweep runs on one node"),
        ({"gpus_per_task": 1}, "Unknown option.*'gpus_per_task'.*valid options are: "),
        ({"partition": "gpu"}, "did you mean 'slurm_partition'"),
        ({"gpus_per_node": -1}, "gpus_per_node must be an integer of at least 0"),
    ],
)
def test_submit_sweep_refuses_before_submitting(
    tmp_path: Path, kwargs: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        submit_sweep(["--space", "s.yaml"], run_dir=tmp_path / "r", study_name="s", **kwargs)
    assert not (tmp_path / "r").exists()


def test_the_valid_options_are_listed() -> None:
    with pytest.raises(ConfigError) as caught:
        submit_sweep([], run_dir="r", study_name="s", gpus=2)
    assert ", ".join(SWEEP_OPTIONS) in str(caught.value)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--gpus-per-node", "2"], "--gpus-per-node is an option of Slurm jobs"),
        (["--slurm-partition", "gpu"], "--slurm-partition is an option of Slurm jobs"),
        (["--backend", "ray"], "unknown backend 'ray'; valid backends are: processes, slurm"),
        (["--backend", "slurm", "--slurm-mode", "array"], "valid modes are: pack, per-trial"),
        (
            ["--backend", "slurm", "--slurm-mode", "per-trial", "--gpus-per-trial", "2"],
            "--gpus-per-trial chooses this machine's GPUs",
        ),
        (["--backend", "slurm", "--slurm-mode", "per-trial", "--nodes", "2"], "one node"),
    ],
)
def test_cli_usage_errors(tmp_path: Path, args: list[str], expected: str) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    done = subprocess.run(
        [PYTHON, "-m", "paralela", "sweep", "--space", "space.yaml", *args, "--", "true"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr
    assert expected in " ".join(done.stderr.split())


# -- a real packed sweep -------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_sweep_packed_in_one_allocation_runs_one_trial_per_granted_gpu(
    slurm_cluster: str, tmp_path: Path
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    trial = write_script(tmp_path, "trial.py", TIMED_TRIAL)
    record = tmp_path / "record.jsonl"
    env = {**os.environ, RECORD_VARIABLE: str(record), SLEEP_VARIABLE: "0.3"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen(
        [PYTHON, "-m", "paralela", "sweep", "--backend", "slurm", "--gpus-per-node", "2",
         "--cpus-per-task", "2", "--slurm-partition", slurm_cluster, "--timeout-min", "5",
         "--space", "space.yaml", "--trials", "6", "--seed", "3", "--no-plots", "--json",
         "--", *command(trial, "--x", "{x}")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # cancels the job
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the packed sweep did not finish within {CLI_TIMEOUT} s:\n{err}")
    assert proc.returncode == 0, err

    # Each trial saw exactly one of the two granted GPUs; both were used; never two
    # trials on one GPU at once.
    ran = notes(record, "ran")
    assert len(ran) == 6
    assert {n["devices"] for n in ran} == {"0", "1"}
    by_device = intervals_by_device(ran)
    assert all(most_at_once(spans) == 1 for spans in by_device.values())
    assert most_at_once([span for spans in by_device.values() for span in spans]) == 2

    # The results are in the run directory, and --json printed them (alone) on stdout.
    (run_dir,) = (tmp_path / "paralela-runs").glob("trial-*")
    trials = json.loads(out)
    assert trials == json.loads((run_dir / "trials.json").read_text())
    assert trials["slots"] == 2
    assert len(trials["trials"]) == 6
    assert {t["state"] for t in trials["trials"]} == {"COMPLETE"}
    assert (run_dir / "trials.csv").exists()
    assert len(list((run_dir / "trials").glob("trial-*.log"))) == 6
    job = err.split("submitted Slurm job ", 1)[1].split()[0]
    assert "#SBATCH --gpus-per-node=2" in (run_dir / f"slurm-{job}.sbatch").read_text()
    assert (run_dir / f"slurm-{job}.out").exists()
    # Streamed on stderr: each trial's start, the sweep's own output.
    assert all(f"trial {i} started" in err for i in range(6))
    assert "6 trials (6 complete) on 2 slots" in err


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_the_python_api_packs_function_trials(
    slurm_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(record))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    helpers = Path(__file__).parent / "sweep_helpers.py"
    with open(tmp_path / "console.txt", "wb") as console:
        job = submit_sweep(
            ["--space", "space.yaml", "--trials", "2", "--no-plots",
             "--function", f"{helpers}:timed"],
            run_dir="runs/timed",
            study_name="timed",
            gpus_per_node=1,
            slurm_partition=slurm_cluster,
            timeout_min=5,
            console=console,
        )  # fmt: skip
    assert job.run_dir == tmp_path / "runs" / "timed"
    assert [t["state"] for t in job.trials()] == ["COMPLETE", "COMPLETE"]
    assert [n["devices"] for n in notes(record, "ran")] == ["0", "0"]  # the one granted GPU
    assert "2 trials (2 complete) on 1 slots" in (tmp_path / "console.txt").read_text()


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_sweep_that_fails_in_its_job_raises_with_its_reason(
    slurm_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paralela.sweeping import SweepError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE)
    with pytest.raises(SweepError) as caught, open(tmp_path / "console.txt", "wb") as console:
        submit_sweep(
            ["--space", "space.yaml", "--trials", "3", "--max-failures", "0", "--no-plots",
             "--", "false", "{x}"],
            run_dir="runs/false",
            study_name="false",
            slurm_partition=slurm_cluster,
            timeout_min=5,
            console=console,
        )  # fmt: skip
    message = str(caught.value)
    assert message.startswith("The sweep in Slurm job ")
    assert "failed" in message  # the sweep's own reason, from the job's output


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_an_optuna_objective_is_packed_without_a_space(slurm_cluster: str, tmp_path: Path) -> None:
    """Optuna's scikit-learn example, as published, as the whole sweep of one job."""
    example = Path(__file__).parent / "optuna_examples" / "sklearn_simple.py"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run(
        [PYTHON, "-m", "paralela", "sweep", "--backend", "slurm", "--gpus-per-node", "1",
         "--cpus-per-task", "2", "--slurm-partition", slurm_cluster, "--timeout-min", "5",
         "--function", f"{example}:objective", "--direction", "maximize", "--trials", "4",
         "--seed", "0", "--run-dir", "run", "--no-plots", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trials = json.loads(proc.stdout)["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 4
    for trial in trials:
        own = "svc_c" if trial["params"]["classifier"] == "SVC" else "rf_max_depth"
        assert set(trial["params"]) == {"classifier", own}
        assert 0.0 < trial["values"][0] <= 1.0
    assert "submitted Slurm job " in proc.stderr
