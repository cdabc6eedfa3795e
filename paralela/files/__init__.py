"""File inputs, their splits, and output directories: what ``mapreduce`` and ``predict``
share (above ``runs/``; below both).

::

    inputs ──plan_splits──> Split, ...   paths, directories, globs (text, JSONL, CSV, gzip,
                                         Parquet) or any iterable of records; small and
                                         picklable: a path and bounds, never data
    Split ──read_split_batches──> lists of records        (in a worker)
    Split, record index ──locate──> "data/a.jsonl line 12" (for error messages)
    output= directory:  check_output_dir ──> claim_output_dir ──> part files written
                        under temp_prefix(dir), renamed ──> finish_output_dir
                        (paralela replaces only the files it recorded as its own)
    "64MiB" ──parse_size / parse_bytes──> 67108864

Importing this package is cheap: the readers (csv, gzip, pyarrow when a Parquet file is
read) load on the first use of a name from the inputs side.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from paralela.files._output_dir import (
    MANIFEST_NAME,
    MODES,
    SUCCESS_NAME,
    check_mode,
    check_output_dir,
    claim_output_dir,
    finish_output_dir,
    refuse_others_outputs,
    remove_own_temporaries,
    remove_stale,
    temp_prefix,
)
from paralela.files._sizes import parse_bytes, parse_size

if TYPE_CHECKING:
    from paralela.files._formats import BLOCK_BYTES
    from paralela.files._inputs import FORMATS as INPUT_FORMATS
    from paralela.files._inputs import (
        MIN_SPLIT_BYTES,
        Split,
        group_splits,
        input_identity,
        locate,
        parse_split_bytes,
        plan_splits,
        read_split,
        read_split_batches,
    )

__all__ = [
    # inputs and splits
    "plan_splits",
    "Split",
    "read_split",
    "read_split_batches",
    "locate",
    "group_splits",
    "input_identity",
    "parse_split_bytes",
    "INPUT_FORMATS",
    "MIN_SPLIT_BYTES",
    "BLOCK_BYTES",
    # output directories
    "check_mode",
    "check_output_dir",
    "claim_output_dir",
    "finish_output_dir",
    "remove_stale",
    "remove_own_temporaries",
    "refuse_others_outputs",
    "temp_prefix",
    "MODES",
    "SUCCESS_NAME",
    "MANIFEST_NAME",
    # sizes
    "parse_bytes",
    "parse_size",
]

_LAZY = {
    "BLOCK_BYTES": ("paralela.files._formats", "BLOCK_BYTES"),
    "INPUT_FORMATS": ("paralela.files._inputs", "FORMATS"),
    **{
        name: ("paralela.files._inputs", name)
        for name in (
            "MIN_SPLIT_BYTES",
            "Split",
            "group_splits",
            "input_identity",
            "locate",
            "parse_split_bytes",
            "plan_splits",
            "read_split",
            "read_split_batches",
        )
    },
}


def __getattr__(name: str) -> Any:
    found = _LAZY.get(name)
    if found is None:
        raise AttributeError(f"module 'paralela.files' has no attribute {name!r}")
    module, attribute = found
    return getattr(importlib.import_module(module), attribute)
