"""Who is which rank: the environment each rank of a launch gets, locally or under Slurm.

A :class:`RankSpec` holds everything one rank must know; :meth:`RankSpec.env` turns it
into the variables torch.distributed (``env://``), torchrun-style scripts and
TensorFlow (``TF_CONFIG``) read::

    local:  paralela launch --nproc 2 train.py        Slurm:  srun paralela launch train.py
            free ports picked at run time                     SLURM_PROCID / NTASKS / LOCALID /
            ranks 0..N-1 on 127.0.0.1                         NODEID / STEP_NODELIST, ports
                    │                                         from the job id (no talking)
                    └──────────────► RankSpec ◄───────────────┘
                                        │ .env()
                                        ▼
        RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_*
        NODE_RANK MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TF_CONFIG ...
        (the launcher adds TORCHELASTIC_RUN_ID, _MAX_RESTARTS and _ERROR_FILE)

Nothing here imports torch: the launcher must start fast and also serve TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from paralela.errors import ConfigError
from paralela.resources import expand_nodelist

__all__ = [
    "RankSpec",
    "free_ports",
    "local_specs",
    "parse_tasks_per_node",
    "slurm_ports",
    "slurm_spec",
    "tf_config",
]

LOCAL_HOST = "127.0.0.1"

# Ports derived from the Slurm job id: every rank computes the same ones without talking.
# The range stays below the usual ephemeral range (32768-60999 on Linux): TensorFlow's
# servers sit 100 above the master port. One pair of ports per job and restart attempt.
SLURM_PORT_BASE = 12000
SLURM_PORT_PAIRS = 10000
PORTS_PER_ATTEMPT = 2  # MASTER_PORT, then the preflight port
RESTART_STRIDE = 7919  # a prime: attempts of one job land far apart
TF_PORT_OFFSET = 100  # TensorFlow's gRPC servers: base + 100 + local rank


@dataclass(frozen=True)
class RankSpec:
    """Everything one rank of a launch must know to find the others.

    Attributes:
        rank: global rank, 0..world_size-1.
        local_rank: rank among the ranks on this host.
        world_size: number of ranks in all.
        local_world_size: number of ranks on this host.
        node_rank: this host's number among the hosts, 0 being the master's.
        nnodes: number of hosts.
        master_addr: the host of rank 0, where the process group's store listens.
        master_port: the store's port (``MASTER_PORT``).
        preflight_port: where rank 0 listens for the preflight rendezvous.
        rank_hosts: the host of every rank, in rank order (for error messages).
        tf_ports: the port of every rank's TensorFlow server, in rank order.
        restart: how many times the group was restarted before this attempt.
        tf_ps: how many ranks are TensorFlow parameter servers (0: all workers).
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    preflight_port: int
    rank_hosts: tuple[str, ...]
    tf_ports: tuple[int, ...] = field(default=())
    restart: int = 0
    tf_ps: int = 0

    def env(self) -> dict[str, str]:
        """The variables that tell the rank's program who it is."""
        env = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.nnodes),
            "NODE_RANK": str(self.node_rank),
            "NNODES": str(self.nnodes),
            # torchrun's one role, "default": its ranks are the global ones.
            "ROLE_NAME": "default",
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart),
            "PARALELA_RESTART_COUNT": str(self.restart),
            "PARALELA_PREFLIGHT_PORT": str(self.preflight_port),
            "PARALELA_RANK_HOSTS": ",".join(self.rank_hosts),
        }
        if self.tf_ports:
            env["TF_CONFIG"] = tf_config(self.rank_hosts, self.tf_ports, self.rank, ps=self.tf_ps)
        if self.master_addr == LOCAL_HOST:
            # One machine: keep gloo and TensorPipe on loopback, whatever the interfaces.
            env["GLOO_SOCKET_IFNAME"] = "lo"
            env["TP_SOCKET_IFNAME"] = "lo"
        return env


def free_ports(count: int, host: str = LOCAL_HOST) -> list[int]:
    """``count`` distinct TCP ports on ``host`` that nothing listens on right now.

    All sockets stay open until every port is chosen, so the ports differ; another
    program could still take one before the rank binds it (the preflight then fails
    with a clear message, and a restart picks new ports).
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_specs(
    nproc: int, *, restart: int = 0, tf_ps: int = 0, with_tf: bool = True
) -> list[RankSpec]:
    """The ranks of a launch on this machine: ``nproc`` ranks on 127.0.0.1, fresh ports.

    Raises:
        ConfigError: ``nproc`` < 1, or ``tf_ps`` leaves no chief.
    """
    if nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}.")
    _check_tf_ps(tf_ps, nproc)
    ports = free_ports(2 + (nproc if with_tf else 0))
    hosts = (LOCAL_HOST,) * nproc
    return [
        RankSpec(
            rank=rank,
            local_rank=rank,
            world_size=nproc,
            local_world_size=nproc,
            node_rank=0,
            nnodes=1,
            master_addr=LOCAL_HOST,
            master_port=ports[0],
            preflight_port=ports[1],
            rank_hosts=hosts,
            tf_ports=tuple(ports[2:]),
            restart=restart,
            tf_ps=tf_ps,
        )
        for rank in range(nproc)
    ]


_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(value: str) -> list[int]:
    """Expand Slurm's ``SLURM_TASKS_PER_NODE`` form: ``"2(x3),1"`` → ``[2, 2, 2, 1]``.

    Raises:
        ConfigError: the value is not in that form.
    """
    counts: list[int] = []
    for token in value.split(","):
        match = _TASKS_RE.match(token.strip())
        if not match:
            raise ConfigError(
                f"Cannot read the Slurm tasks per node {value!r}: {token!r} is not 'N' or "
                "'N(xM)'. Slurm writes it itself; unset it or fix the job script."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def slurm_ports(job_id: str, restart: int = 0) -> tuple[int, int]:
    """``(MASTER_PORT, preflight port)`` for a Slurm job: the same on every rank.

    Each restart attempt gets another pair, so a restarted group never meets the
    sockets of the attempt before it.
    """
    digits = re.sub(r"\D", "", job_id) or "0"
    slot = (int(digits) + restart * RESTART_STRIDE) % SLURM_PORT_PAIRS
    base = SLURM_PORT_BASE + slot * PORTS_PER_ATTEMPT
    return base, base + 1


def _need(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(
            f"paralela launch runs under Slurm (SLURM_JOB_ID is set) but {name} is not. "
            "Start it with srun inside the job (srun paralela launch script.py), one task "
            "per rank, or run it outside Slurm with --nproc N."
        )
    return value


def _int(env: Mapping[str, str], name: str) -> int:
    value = _need(env, name)
    if not value.isdigit():
        raise ConfigError(f"The Slurm variable {name}={value!r} is not a whole number >= 0.")
    return int(value)


def slurm_spec(
    env: Mapping[str, str] | None = None,
    *,
    nproc: int | None = None,
    local_rank: int = 0,
    restart: int = 0,
    tf_ps: int = 0,
) -> RankSpec:
    """The spec of one rank of a launch inside a Slurm job step.

    Two shapes, as ``srun`` starts them:

    - one task per rank (``srun paralela launch script.py``, ``nproc`` ``None``): the
      rank is ``SLURM_PROCID`` of ``SLURM_NTASKS``, local rank ``SLURM_LOCALID``;
    - one task per node running ``nproc`` ranks (``srun --ntasks-per-node 1 paralela
      launch --nproc 4 ...``): rank ``SLURM_NODEID * nproc + local_rank``.

    The master is the first host of ``SLURM_STEP_NODELIST`` (else ``SLURM_NODELIST`` /
    ``SLURM_JOB_NODELIST``), expanded with python-hostlist; the ports come from
    ``SLURM_JOB_ID`` (:func:`slurm_ports`), so all ranks agree without talking.

    Raises:
        ConfigError: a variable is missing or malformed, or the counts disagree (the
            message says which and what to change).
    """
    env = os.environ if env is None else env
    job_id = _need(env, "SLURM_JOB_ID")
    nodelist = next(
        (
            env[name].strip()
            for name in ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
            if env.get(name, "").strip()
        ),
        "",
    )
    if not nodelist:
        raise ConfigError(
            "paralela launch runs under Slurm but none of SLURM_STEP_NODELIST, "
            "SLURM_NODELIST, SLURM_JOB_NODELIST is set; start it with srun inside the job."
        )
    nodes = expand_nodelist(nodelist)
    node_rank = _int(env, "SLURM_NODEID")
    if node_rank >= len(nodes):
        raise ConfigError(
            f"SLURM_NODEID={node_rank} but the node list {nodelist!r} has {len(nodes)} "
            "host(s); the variables come from different jobs."
        )
    if nproc is None:
        world_size = _int(env, "SLURM_NTASKS")
        rank = _int(env, "SLURM_PROCID")
        local_rank = _int(env, "SLURM_LOCALID")
        tasks_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        per_node = parse_tasks_per_node(tasks_text) if tasks_text else []
        if sum(per_node) != world_size or len(per_node) != len(nodes):
            per_node = _even_split(world_size, len(nodes))
        local_world_size = per_node[node_rank]
        rank_hosts = tuple(host for host, n in zip(nodes, per_node, strict=True) for _ in range(n))
    else:
        if nproc < 1:
            raise ConfigError(f"--nproc must be at least 1, got {nproc}.")
        world_size = nproc * len(nodes)
        rank = node_rank * nproc + local_rank
        local_world_size = nproc
        rank_hosts = tuple(host for host in nodes for _ in range(nproc))
    if not 0 <= rank < world_size:
        raise ConfigError(
            f"Rank {rank} is outside 0..{world_size - 1} (SLURM_PROCID / SLURM_NTASKS "
            "disagree); start the launch with srun inside one job step."
        )
    _check_tf_ps(tf_ps, world_size)
    master_port, preflight_port = slurm_ports(job_id, restart)
    local_index = dict.fromkeys(nodes, 0)
    tf_ports = []
    for host in rank_hosts:  # each host numbers its own ranks' TF ports from the base
        tf_ports.append(master_port + TF_PORT_OFFSET + local_index[host])
        local_index[host] += 1
    return RankSpec(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        nnodes=len(nodes),
        master_addr=nodes[0],
        master_port=master_port,
        preflight_port=preflight_port,
        rank_hosts=rank_hosts,
        tf_ports=tuple(tf_ports),
        restart=restart,
        tf_ps=tf_ps,
    )


def _even_split(total: int, parts: int) -> list[int]:
    """Slurm's block distribution when it did not say: the first hosts get one more."""
    share, extra = divmod(total, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


def _check_tf_ps(tf_ps: int, world_size: int) -> None:
    if tf_ps < 0 or (tf_ps and tf_ps >= world_size - 1):
        raise ConfigError(
            f"--tf-ps {tf_ps} with {world_size} rank(s) leaves no chief and worker: "
            "rank 0 is the chief, ranks 1..N the parameter servers, the rest workers. "
            f"Use at most {max(0, world_size - 2)} parameter servers, or more ranks."
        )


def tf_config(hosts: Sequence[str], ports: Sequence[int], rank: int, *, ps: int = 0) -> str:
    """The ``TF_CONFIG`` JSON for one rank.

    Without parameter servers (``ps=0``) every rank is a ``worker`` (what
    ``MultiWorkerMirroredStrategy`` expects) and the task index is the rank. With
    ``ps=N`` (``ParameterServerStrategy``), rank 0 is the ``chief``, ranks 1..N are
    ``ps`` and the rest are ``worker`` s, each numbered from 0 within its role.
    """
    if len(hosts) != len(ports):
        raise ConfigError(f"tf_config: {len(hosts)} hosts but {len(ports)} ports.")
    addresses = [f"{h}:{p}" for h, p in zip(hosts, ports, strict=True)]
    if ps == 0:
        cluster: dict[str, list[str]] = {"worker": addresses}
        task = {"type": "worker", "index": rank}
    else:
        cluster = {
            "chief": addresses[:1],
            "ps": addresses[1 : ps + 1],
            "worker": addresses[ps + 1 :],
        }
        if rank == 0:
            task = {"type": "chief", "index": 0}
        elif rank <= ps:
            task = {"type": "ps", "index": rank - 1}
        else:
            task = {"type": "worker", "index": rank - ps - 1}
    return json.dumps({"cluster": cluster, "task": task})
