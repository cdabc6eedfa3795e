"""Crash-safe file writes for the run store: the helpers of :mod:`paralela._files`.

They live in that neutral module so that backends (the Slurm worker) use the same one.
"""

from __future__ import annotations

from paralela._files import TMP_PREFIX, atomic_write, create_exclusive

__all__ = ["TMP_PREFIX", "atomic_write", "create_exclusive"]
