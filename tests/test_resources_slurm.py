"""The Slurm allocation read from SLURM_* variable sets as Slurm writes them."""

from __future__ import annotations

import json

import pytest

from paralela.errors import ConfigError
from paralela.resources import SlurmAllocation, expand_nodelist
from paralela.resources._slurm import detect_slurm

# What `srun` sets in task 3 of `sbatch -N2 --ntasks-per-node=2 -c4 --gres=gpu:2`.
SRUN_TASK = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu[01-02]",
    "SLURM_NODELIST": "gpu[01-02]",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_CPUS_PER_TASK": "4",
    "SLURM_CPUS_ON_NODE": "8",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_GPUS_ON_NODE": "2",
    "SLURM_JOB_GPUS": "0,1",
    "SLURM_STEP_GPUS": "1",
    "SLURM_TMPDIR": "/localscratch/123456",
    "TMPDIR": "/tmp",
    "HOME": "/home/ana",
}


def test_a_full_srun_task() -> None:
    alloc = detect_slurm(SRUN_TASK)
    assert alloc == SlurmAllocation(
        job_id="123456",
        ntasks=4,
        procid=3,
        localid=1,
        nodeid=1,
        cpus_per_task=4,
        cpus_on_node=8,
        ntasks_per_node=2,
        gpus_on_node=2,
        gpu_ids=(1,),
        nodelist="gpu[01-02]",
        nodes=("gpu01", "gpu02"),
        tmpdir="/localscratch/123456",
    )
    assert alloc is not None
    assert alloc.nnodes == 2
    assert not alloc.is_array


@pytest.mark.parametrize(
    ("nodelist", "nodes"),
    [
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[1-2],login1", ["node1", "node2", "login1"]),
        ("n[001-003]", ["n001", "n002", "n003"]),
        ("cn17", ["cn17"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_node_lists_expand(nodelist: str, nodes: list[str]) -> None:
    assert expand_nodelist(nodelist) == nodes
    alloc = detect_slurm({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": nodelist})
    assert alloc is not None
    assert alloc.nodes == tuple(nodes)
    assert alloc.nodelist == nodelist


def test_outside_slurm_is_none() -> None:
    assert detect_slurm({"HOME": "/home/ana", "SLURM_NTASKS": "abc"}) is None
    assert detect_slurm({"SLURM_JOB_ID": ""}) is None


def test_sbatch_batch_script_without_step_variables() -> None:
    alloc = detect_slurm(
        {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "c1", "SLURM_CPUS_ON_NODE": "16"}
    )
    assert alloc is not None
    assert (alloc.ntasks, alloc.procid, alloc.cpus_per_task) == (None, None, None)
    assert alloc.cpus_on_node == 16
    assert alloc.gpu_ids == ()
    assert alloc.tmpdir is None


def test_tmpdir_falls_back_to_tmpdir_inside_the_job() -> None:
    alloc = detect_slurm({"SLURM_JOB_ID": "5", "TMPDIR": "/scratch/job5"})
    assert alloc is not None
    assert alloc.tmpdir == "/scratch/job5"


def test_job_gpus_with_ranges() -> None:
    alloc = detect_slurm({"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0-2,5"})
    assert alloc is not None
    assert alloc.gpu_ids == (0, 1, 2, 5)


def test_array_task() -> None:
    alloc = detect_slurm(
        {"SLURM_JOB_ID": "901", "SLURM_ARRAY_JOB_ID": "900", "SLURM_ARRAY_TASK_ID": "1"}
    )
    assert alloc is not None
    assert alloc.is_array
    assert (alloc.array_job_id, alloc.array_task_id) == (900, 1)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SLURM_NTASKS", "abc"),
        ("SLURM_PROCID", "-1"),
        ("SLURM_CPUS_PER_TASK", "2.5"),
        ("SLURM_ARRAY_TASK_ID", "x7"),
    ],
)
def test_malformed_number_names_the_variable_and_value(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        detect_slurm({"SLURM_JOB_ID": "1", name: value})
    assert name in str(info.value)
    assert repr(value) in str(info.value)


def test_malformed_gpu_list() -> None:
    with pytest.raises(ConfigError, match=r"SLURM_JOB_GPUS='0,gpu1'.*'gpu1'"):
        detect_slurm({"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,gpu1"})


def test_malformed_node_list_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"SLURM_NODELIST.*'gpu\[01-'"):
        detect_slurm({"SLURM_JOB_ID": "1", "SLURM_NODELIST": "gpu[01-"})
    with pytest.raises(ConfigError, match="unbalanced"):
        expand_nodelist("a[1-2")


def test_json_round_trip() -> None:
    alloc = detect_slurm(SRUN_TASK)
    assert alloc is not None
    data = json.loads(json.dumps(alloc.to_dict()))
    assert data["nodes"] == ["gpu01", "gpu02"]
    assert SlurmAllocation.from_dict(data) == alloc
