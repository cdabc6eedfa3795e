"""The run store: crash-safe, resumable results of a run, in a directory."""

from paralela.runs._store import ChunkRecord, RunStore, StoredChunk

__all__ = ["ChunkRecord", "RunStore", "StoredChunk"]
