"""The run store: crash-safe, resumable results of a run, in a directory.

Also the fingerprints that decide whether stored results still belong to a run: of a
function (its code and what it reads), of an object, of a list of items.
"""

from paralela.runs._fingerprint import (
    Fingerprint,
    describe_changes,
    digest_bytes,
    digest_items,
    fingerprint_function,
    fingerprint_object,
)
from paralela.runs._store import ChunkRecord, RunStore, StoredChunk

__all__ = [
    # the store
    "ChunkRecord",
    "RunStore",
    "StoredChunk",
    # fingerprints
    "Fingerprint",
    "describe_changes",
    "digest_bytes",
    "digest_items",
    "fingerprint_function",
    "fingerprint_object",
]
