"""A program written for torchrun: reads its contract from the environment, uses @record.

Writes what it was told to ``<out>/rank-<RANK>.json``; the rank named by ``FAIL_RANK``
raises after the first all-reduce, so ``@record`` writes its error file.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

CONTRACT = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)


@record
def main() -> None:
    out = Path(sys.argv[1])
    seen = {name: os.environ.get(name) for name in CONTRACT}
    seen["is_torchelastic_launched"] = dist.is_torchelastic_launched()
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    seen["all_reduce"] = total.item()
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(seen))
    if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
        raise ValueError("loss diverged at step 3")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
