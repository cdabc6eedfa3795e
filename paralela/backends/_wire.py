"""How tasks and results cross the process boundary.

Tasks are pickled with cloudpickle (lambdas and closures work) at protocol 5. Buffers of
``OUT_OF_BAND_MIN_BYTES`` or more (numpy arrays, anything exposing the buffer protocol)
are taken out of the pickle and copied once into an :class:`Arena`, a memfd-backed
shared memory block that the worker maps; the worker rebuilds the objects as read-only
views of that memory, so a 1 MiB array costs one ``memcpy``, not a pickle, a pipe write,
a pipe read and an unpickle. memfd blocks have no name in ``/dev/shm``: the kernel frees
them when the last process holding them exits, so a crash leaks nothing.
"""

from __future__ import annotations

import mmap
import os
import pickle
from typing import Any

__all__ = [
    "OUT_OF_BAND_MIN_BYTES",
    "Arena",
    "ArenaView",
    "dumps",
    "dumps_with_buffers",
    "loads",
    "zero_copy_available",
]

# Below 64 KiB a buffer is cheaper to pickle in-band than to place and describe in the
# arena (measured with bench/bench_map.py, workload c, on 2-core machines).
OUT_OF_BAND_MIN_BYTES = 64 * 1024
_ALIGN = 64
PROTOCOL = 5


def zero_copy_available() -> bool:
    """memfd-backed arenas need Linux's ``memfd_create``."""
    return hasattr(os, "memfd_create")


def dumps(obj: Any) -> bytes:
    """Pickle ``obj``: the fast C pickler first, cloudpickle for what it cannot handle."""
    try:
        return pickle.dumps(obj, protocol=PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle  # imported on demand: workers start faster without it

        return cloudpickle.dumps(obj, protocol=PROTOCOL)  # type: ignore[no-any-return]


def dumps_with_buffers(obj: Any, zero_copy: bool) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj`` with cloudpickle, keeping large contiguous buffers out of band."""
    import cloudpickle

    buffers: list[pickle.PickleBuffer] = []
    if not zero_copy:
        return cloudpickle.dumps(obj, protocol=PROTOCOL), buffers

    def keep_large(buf: pickle.PickleBuffer) -> bool:
        try:
            nbytes = buf.raw().nbytes
        except BufferError:  # not contiguous: pickle it in-band
            return True
        if nbytes < OUT_OF_BAND_MIN_BYTES:
            return True
        buffers.append(buf)
        return False

    data = cloudpickle.dumps(obj, protocol=PROTOCOL, buffer_callback=keep_large)
    return data, buffers


def loads(data: bytes, buffers: list[memoryview] | None = None) -> Any:
    """Unpickle what :func:`dumps` or :func:`dumps_with_buffers` made."""
    return pickle.loads(data, buffers=buffers)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class Arena:
    """A growable shared memory block written by the driver (one per in-flight task slot)."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("paralela-arena")
        self.size = 0
        self._map: mmap.mmap | None = None

    def write(self, buffers: list[pickle.PickleBuffer]) -> list[tuple[int, int]]:
        """Copy ``buffers`` into the block; return each one's ``(offset, nbytes)``."""
        raws = [b.raw() for b in buffers]
        layout: list[tuple[int, int]] = []
        offset = 0
        for raw in raws:
            layout.append((offset, raw.nbytes))
            offset += _aligned(raw.nbytes)
        if offset > self.size:
            self._grow(offset)
        assert self._map is not None  # _grow mapped it
        view = memoryview(self._map)
        try:
            for raw, (off, n) in zip(raws, layout, strict=True):
                view[off : off + n] = raw
        finally:
            view.release()
        return layout

    def _grow(self, needed: int) -> None:
        # Grow geometrically so that a run of slowly growing chunks remaps rarely.
        new_size = max(needed, self.size * 2, 1 << 20)
        os.ftruncate(self.fd, new_size)
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self.fd, new_size)
        self.size = new_size

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        os.close(self.fd)


class ArenaView:
    """The worker's read-only window on an :class:`Arena`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._size = 0

    def views(self, layout: list[tuple[int, int]]) -> list[memoryview]:
        if not layout:
            return []
        end = max(off + n for off, n in layout)
        if end > self._size:
            size = os.fstat(self.fd).st_size
            # An old map may still be exported to objects a task kept; drop our
            # reference and let the garbage collector unmap it when they go.
            self._map = mmap.mmap(self.fd, size, prot=mmap.PROT_READ)
            self._view = memoryview(self._map)
            self._size = size
        assert self._view is not None
        return [self._view[off : off + n] for off, n in layout]
