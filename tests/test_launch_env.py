"""What each rank is told: local plans, Slurm variable sets of several shapes, TF_CONFIG."""

from __future__ import annotations

import json

import pytest

from paralela.distributed import in_slurm_step, slurm_spec, tf_config
from paralela.distributed._env import local_specs, parse_tasks_per_node, slurm_ports
from paralela.errors import ConfigError


def slurm(procid: int, **overrides: str) -> dict[str, str]:
    """The variables srun gives one task of a 2-node, 4-task job step."""
    env = {
        "SLURM_JOB_ID": "81234",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % 2),
        "SLURM_NODEID": str(procid // 2),
        "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    env.update(overrides)
    return env


def test_local_plan_numbers_ranks_and_shares_one_master() -> None:
    specs = local_specs(3)
    assert [s.rank for s in specs] == [0, 1, 2]
    assert [s.local_rank for s in specs] == [0, 1, 2]
    assert {s.master_port for s in specs} == {specs[0].master_port}
    assert specs[0].master_port != specs[0].preflight_port
    env = specs[2].env()
    assert env["RANK"] == "2"
    assert env["WORLD_SIZE"] == "3"
    assert env["LOCAL_WORLD_SIZE"] == "3"
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert len(set(specs[0].tf_ports)) == 3


def test_a_restart_gets_new_ports_locally() -> None:
    first, again = local_specs(2), local_specs(2, restart=1)
    assert again[0].restart == 1
    assert again[0].env()["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert again[0].env()["PARALELA_RESTART_COUNT"] == "1"
    assert first[0].world_size == again[0].world_size


@pytest.mark.parametrize("nproc", [0, -1])
def test_local_plan_needs_one_rank(nproc: int) -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        local_specs(nproc)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]), ("1,3", [1, 3])],
)
def test_tasks_per_node_forms(value: str, expected: list[int]) -> None:
    assert parse_tasks_per_node(value) == expected


@pytest.mark.parametrize("value", ["", "2(x)", "x2", "2(3)"])
def test_bad_tasks_per_node_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match="tasks per node"):
        parse_tasks_per_node(value)


def test_slurm_task_per_rank_on_two_nodes() -> None:
    specs = [slurm_spec(slurm(p)) for p in range(4)]
    assert [(s.rank, s.local_rank, s.node_rank) for s in specs] == [
        (0, 0, 0),
        (1, 1, 0),
        (2, 0, 1),
        (3, 1, 1),
    ]
    assert {s.master_addr for s in specs} == {"gpu01"}
    assert len({(s.master_port, s.preflight_port) for s in specs}) == 1  # agreed, no talking
    assert specs[3].rank_hosts == ("gpu01", "gpu01", "gpu02", "gpu02")
    assert specs[3].local_world_size == 2
    assert specs[3].nnodes == 2
    assert specs[3].env()["NODE_RANK"] == "1"
    assert "GLOO_SOCKET_IFNAME" not in specs[3].env()  # a real network: the site decides


@pytest.mark.parametrize(
    ("nodelist", "tasks", "hosts"),
    [
        ("gpu[01-04,07]", "1(x5)", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("a,b,c", "1,1,1", ["a", "b", "c"]),
        ("node[1-2],login1", "1(x3)", ["node1", "node2", "login1"]),
        ("rack[1-2]-n[01-02]", "1(x4)", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ],
)
def test_node_lists_of_several_shapes(nodelist: str, tasks: str, hosts: list[str]) -> None:
    n = len(hosts)
    last = slurm_spec(
        slurm(
            n - 1,
            SLURM_NTASKS=str(n),
            SLURM_LOCALID="0",
            SLURM_NODEID=str(n - 1),
            SLURM_STEP_NODELIST=nodelist,
            SLURM_STEP_TASKS_PER_NODE=tasks,
        )
    )
    assert list(last.rank_hosts) == hosts
    assert last.master_addr == hosts[0]
    assert last.rank == n - 1
    assert last.world_size == n


def test_uneven_tasks_per_node() -> None:
    env = slurm(
        2,
        SLURM_NTASKS="3",
        SLURM_LOCALID="0",
        SLURM_NODEID="1",
        SLURM_STEP_NODELIST="n[1-2]",
        SLURM_STEP_TASKS_PER_NODE="2,1",
    )
    spec = slurm_spec(env)
    assert spec.rank_hosts == ("n1", "n1", "n2")
    assert spec.local_world_size == 1


def test_job_node_list_when_the_step_has_none() -> None:
    env = slurm(0)
    del env["SLURM_STEP_NODELIST"]
    env["SLURM_JOB_NODELIST"] = "cpu[7-8]"
    assert slurm_spec(env).master_addr == "cpu7"


def test_one_task_per_node_running_nproc_ranks() -> None:
    env = slurm(1, SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_NODEID="1")
    specs = [slurm_spec(env, nproc=4, local_rank=i) for i in range(4)]
    assert [s.rank for s in specs] == [4, 5, 6, 7]
    assert specs[0].world_size == 8
    assert specs[0].local_world_size == 4
    assert specs[0].rank_hosts == ("gpu01",) * 4 + ("gpu02",) * 4


def test_ports_follow_the_job_id_and_the_attempt() -> None:
    a = slurm_ports("81234")
    assert a == slurm_ports("81234")
    assert a[1] == a[0] + 1
    assert slurm_ports("81235") != a
    assert slurm_ports("81234", restart=1) != a
    for job in ("1", "99999999", "123_4"):
        for restart in range(4):
            port, pre = slurm_ports(job, restart)
            assert 1024 < port < pre < 32768


@pytest.mark.parametrize(
    ("missing", "message"), [("SLURM_NTASKS", "SLURM_NTASKS"), ("SLURM_NODEID", "SLURM_NODEID")]
)
def test_missing_slurm_variable_is_named(missing: str, message: str) -> None:
    env = slurm(0)
    del env[missing]
    with pytest.raises(ConfigError, match=message):
        slurm_spec(env)


def test_malformed_slurm_values_are_errors() -> None:
    with pytest.raises(ConfigError, match="not a whole number"):
        slurm_spec(slurm(0, SLURM_PROCID="zero"))
    with pytest.raises(ConfigError, match="outside"):
        slurm_spec(slurm(0, SLURM_PROCID="9"))
    with pytest.raises(ConfigError, match="node list"):
        slurm_spec(slurm(0, SLURM_STEP_NODELIST="gpu[01-"))
    with pytest.raises(ConfigError, match="different jobs"):
        slurm_spec(slurm(0, SLURM_NODEID="5"))


def test_in_slurm_step_only_inside_srun() -> None:
    assert in_slurm_step(slurm(0))
    assert not in_slurm_step({})
    assert not in_slurm_step({"SLURM_JOB_ID": "1"})  # the job, not a step
    assert not in_slurm_step({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "batch"})
    assert not in_slurm_step({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "4294967294"})


def test_tf_config_for_mirrored_workers() -> None:
    config = json.loads(tf_config(["a", "b"], [2000, 2001], 1))
    assert config == {
        "cluster": {"worker": ["a:2000", "b:2001"]},
        "task": {"type": "worker", "index": 1},
    }


def test_tf_config_with_parameter_servers() -> None:
    hosts, ports = ["h0", "h1", "h2", "h3", "h4"], [10, 11, 12, 13, 14]
    configs = [json.loads(tf_config(hosts, ports, r, ps=2)) for r in range(5)]
    assert configs[0]["cluster"] == {
        "chief": ["h0:10"],
        "ps": ["h1:11", "h2:12"],
        "worker": ["h3:13", "h4:14"],
    }
    tasks = [(c["task"]["type"], c["task"]["index"]) for c in configs]
    assert tasks == [("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]


def test_tf_config_from_a_slurm_spec_uses_the_hosts() -> None:
    spec = slurm_spec(slurm(2))
    config = json.loads(spec.env()["TF_CONFIG"])
    workers = config["cluster"]["worker"]
    assert [w.split(":")[0] for w in workers] == ["gpu01", "gpu01", "gpu02", "gpu02"]
    assert workers[0] != workers[1]  # two ranks on one host: two ports
    assert workers[0].split(":")[1] == workers[2].split(":")[1]
    assert config["task"] == {"type": "worker", "index": 2}


def test_tf_ps_must_leave_a_chief_and_a_worker() -> None:
    with pytest.raises(ConfigError, match="parameter servers"):
        local_specs(2, tf_ps=1)
    assert local_specs(3, tf_ps=1)[0].tf_ps == 1
