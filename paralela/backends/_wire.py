"""How tasks and results cross the process boundary.

Tasks are pickled as cloudpickle would (lambdas and closures work) at protocol 5: by the C
pickler when all they refer to pickles by reference, by cloudpickle otherwise. A numpy
array (or any buffer) of ``OUT_OF_BAND_MIN_BYTES`` or more takes one of two roads::

    driver                                                worker
    ──────                                                ──────
    a numpy array in a shared mapping of a named file (np.memmap, np.load(mmap_mode=...),
    any view of them), found through /proc/self/maps:
      pickled as (path, inode, offset, shape, strides) ──> the file, mapped read-only once
                                                           per file (kept while tasks
                                                           come; released when idle):
                                                           each item costs a slice
    any other (strided numpy arrays made contiguous first):
      pickled out of band, copied once into ──────────────> the same memfd arena mapped
      the task slot's memfd Arena                           read-only: views, no copy
        │  grows geometrically; ftruncate'd to 0             │
        │  after IDLE_SECONDS unused (shrink_idle)           │ after the task: does
        │                                                    │ anything still refer to
        └── reply prefixed with RETIRED_TAG + slot <─────────┘ the mapping? then it is
            the driver closes that arena and gives the slot       left to what kept it
            a fresh one (the worker opens it as                   (unmapped when that
            /proc/<driver>/fd/<fd>, its inode checked)            goes) and retired

A broadcast value (``Broadcast``: a map's ``shared``, a function's closure, a comparison's
data set) keeps its large buffers out of band too, written once into a block of its own
that every worker maps read-only from ``/proc/<driver>/fd/<fd>`` (:func:`map_shared`):
one copy in memory however many workers use it; the block is closed when the value is
forgotten or the backend shuts down.

Either way the function receives **read-only** arrays, contiguous or not; smaller
arrays are pickled in-band and arrive as private, writable copies. An array the
function keeps stays valid and unchanged: its arena is never written again. memfd
blocks have no name in ``/dev/shm``: the kernel frees them when the last process
holding them exits or unmaps them, so a crash leaks nothing.
"""

from __future__ import annotations

# The C pickler itself: pickle.py would import re and struct, ~3 ms of every worker's
# start (bench/bench_map.py workload d); its dumps, loads, Pickler, PickleBuffer and
# PicklingError are these very objects.
import _pickle as pickle
import collections
import copyreg
import gc
import mmap
import os
import sys
import types
import weakref
from collections.abc import Iterable

# typing is not imported at run time: every worker process imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

__all__ = [
    "IDLE_SECONDS",
    "OUT_OF_BAND_MIN_BYTES",
    "RETIRED_TAG",
    "Arena",
    "ArenaView",
    "dumps",
    "dumps_with_buffers",
    "loads",
    "map_shared",
    "release_files",
    "shrink_idle",
    "zero_copy_available",
]

# Below 64 KiB a buffer is cheaper to pickle in-band than to place and describe in the
# arena (measured with bench/bench_map.py, workload c, on 2-core machines).
OUT_OF_BAND_MIN_BYTES = 64 * 1024
_ALIGN = 64
PROTOCOL = 5
# An arena unused for this long is truncated to nothing: long enough that a running map
# (whose slots are refilled within milliseconds) never pays for faulting pages in
# again, short enough that memory comes back soon after a map over large arrays ends.
IDLE_SECONDS = 0.5
# Arenas of at most this size are kept as they are: not worth a wake-up.
_SMALL_ARENA = 1 << 20
# First byte of a reply whose task left arrays in use (the next byte is the slot).
# Replies are pickles otherwise, which start with the PROTO opcode (0x80).
RETIRED_TAG = b"R"
# Files a worker keeps mapped for by-reference arrays (the least recently used goes).
_MAPPED_FILES = 32

Layout = tuple[int, int, int, list[tuple[int, int]]]  # driver fd, inode, size, spans


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
    """Pickle ``obj`` as cloudpickle would, keeping large contiguous buffers out of band
    (with ``zero_copy``) and numpy arrays that live in a shared file mapping as references
    to the file.

    The C pickler does it when everything ``obj`` refers to pickles by reference (the
    functions and classes of importable modules): the same bytes as cloudpickle's, and
    the driver does not import cloudpickle (~a fifth of a cold ``paralela.map``'s
    start-up, ``bench/bench_map.py`` workload d). Whatever only cloudpickle pickles
    right (``__main__``, lambdas, closures, modules) goes to cloudpickle; so does all
    of it once cloudpickle is imported (``register_pickle_by_value`` is honoured).
    """
    import io

    buffers: list[pickle.PickleBuffer] = []

    def keep_large(buf: pickle.PickleBuffer) -> bool:
        try:
            nbytes = buf.raw().nbytes
        except BufferError:  # not contiguous: pickle it in-band
            return True
        if nbytes < OUT_OF_BAND_MIN_BYTES:
            return True
        buffers.append(buf)
        return False

    callback = keep_large if zero_copy else None
    if "cloudpickle" not in sys.modules:
        with io.BytesIO() as file:
            try:
                _pickler_class(fast=True)(file, protocol=PROTOCOL, buffer_callback=callback).dump(
                    obj
                )
                return file.getvalue(), buffers
            except (_ByValue, pickle.PicklingError, AttributeError, TypeError):
                buffers.clear()  # cloudpickle's turn, from the start
    with io.BytesIO() as file:
        _pickler_class(fast=False)(file, protocol=PROTOCOL, buffer_callback=callback).dump(obj)
        return file.getvalue(), buffers


class _ByValue(Exception):
    """Raised by the fast pickler: this object must go by value (cloudpickle)."""


_MISSING = object()


def _by_reference(obj: Any) -> bool:
    """Whether a function or class is found again under its module and qualified name
    (cloudpickle's test for pickling it by reference), never in ``__main__``."""
    module_name = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(name, str):
        return False
    module = sys.modules.get(module_name)
    if module is None or module_name == "__main__":
        return False
    found: Any = module
    for part in name.split("."):
        try:
            found = getattr(found, part, _MISSING)
        except Exception:  # a module __getattr__ that raises something else
            return False
        if found is _MISSING:
            return False
    return found is obj


class _FastPickler(pickle.Pickler):
    """The C pickler, refusing (``_ByValue``) what cloudpickle would pickle by value."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)):
            if not _by_reference(obj):
                raise _ByValue
        elif isinstance(obj, types.ModuleType):
            raise _ByValue
        return NotImplemented


def loads(data: bytes, buffers: Iterable[Any] | None = None) -> Any:
    """Unpickle what :func:`dumps` or :func:`dumps_with_buffers` made."""
    return pickle.loads(data, buffers=buffers)


# -- numpy arrays -------------------------------------------------------------------


_numpy_picklers: dict[bool, type[pickle.Pickler]] = {}


def _pickler_class(fast: bool) -> type[pickle.Pickler]:
    """The fast pickler (``fast``) or cloudpickle's, plus :func:`_reduce_array` once the
    caller uses numpy (numpy is never imported here)."""
    made = _numpy_picklers.get(fast)
    if made is not None:
        return made
    base: Any
    if fast:
        base = _FastPickler
    else:
        import cloudpickle

        base = cloudpickle.Pickler
    numpy: Any = sys.modules.get("numpy")
    if numpy is None:
        return base  # type: ignore[no-any-return]

    class NumpyPickler(base):  # type: ignore[misc]
        # Read by the C pickler when it starts; consulted for types reducer_override
        # leaves alone (arrays), exact types only.
        dispatch_table: ClassVar[collections.ChainMap[type, Any]] = collections.ChainMap(
            {numpy.ndarray: _reduce_array, numpy.memmap: _reduce_array},
            getattr(base, "dispatch_table", copyreg.dispatch_table),
        )

    _numpy_picklers[fast] = NumpyPickler
    return NumpyPickler


def _reduce_array(a: Any) -> Any:
    """How the driver pickles ``np.ndarray`` and ``np.memmap`` (other subclasses keep
    their own pickling): large arrays in a shared file mapping by reference, every other
    large array out of band, made contiguous first if it is not."""
    if a.nbytes < OUT_OF_BAND_MIN_BYTES or a.dtype.hasobject:
        return a.__reduce_ex__(PROTOCOL)
    if a.base is not None:  # a view: of a file, maybe
        reference = _file_reference(a)
        if reference is not None:
            return reference
    np = sys.modules["numpy"]
    if type(a) is not np.ndarray:  # an np.memmap without a shared file behind it
        a = a.view(np.ndarray)
    if not a.flags.forc:
        # One rule for every large array (read-only on arrival), and cheaper than
        # numpy's own in-band pickle of a strided array.
        a = np.ascontiguousarray(a)
    return a.__reduce_ex__(PROTOCOL)


class _FileMapping:
    """Where an ``mmap`` object of the driver maps its file (from /proc/self/maps)."""

    __slots__ = ("device", "file_offset", "inode", "path", "start")

    def __init__(self, start: int, file_offset: int, path: str, device: int, inode: int):
        self.start = start
        self.file_offset = file_offset
        self.path = path
        self.device = device
        self.inode = inode


_file_mappings: weakref.WeakKeyDictionary[mmap.mmap, _FileMapping | None] = (
    weakref.WeakKeyDictionary()
)


def _file_reference(a: Any) -> tuple[Any, ...] | None:
    """``(_mapped_array, args)`` when ``a`` lies in a shared mapping of a named file,
    else ``None``. Private (copy-on-write) mappings are not the file: they are copied."""
    base = a.base
    try:
        for _ in range(32):  # numpy views of views of... collapse to a few levels
            if base is None or isinstance(base, mmap.mmap):
                break
            base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    except ValueError:  # a released memoryview
        return None
    if not isinstance(base, mmap.mmap):
        return None
    address = a.__array_interface__["data"][0]
    try:
        where = _file_mappings[base]
    except KeyError:
        where = _file_mappings[base] = _find_mapping(address)
    if where is None:
        return None
    offset = where.file_offset + (address - where.start)
    return (
        _mapped_array,
        (where.path, where.device, where.inode, a.dtype, a.shape, a.strides, offset),
    )


def _find_mapping(address: int) -> _FileMapping | None:
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    break
            else:
                return None
    except OSError:  # no /proc: copy
        return None
    path = fields[5].rstrip("\n") if len(fields) > 5 else ""
    if fields[1][3] != "s" or not path.startswith("/") or path.endswith(" (deleted)"):
        return None
    try:
        st = os.stat(path)  # the name the kernel gives the mapped file, followed now
    except OSError:
        return None
    return _FileMapping(start, int(fields[2], 16), path, st.st_dev, st.st_ino)


class _MappedFile:
    __slots__ = ("device", "inode", "view")

    def __init__(self, device: int, inode: int, view: memoryview):
        self.device = device
        self.inode = inode
        self.view = view


_mapped_files: collections.OrderedDict[str, _MappedFile] = collections.OrderedDict()


def _mapped_array(
    path: str,
    device: int,
    inode: int,
    dtype: Any,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
) -> Any:
    """In the worker: a read-only array over ``path``, mapped once per file."""
    import numpy

    low = offset + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    high = offset + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    end = high + dtype.itemsize
    cached = _mapped_files.get(path)
    if cached is None or (cached.device, cached.inode) != (device, inode) or end > len(cached.view):
        cached = _map_file(path, device, inode)
        if low < 0 or end > len(cached.view):
            raise ValueError(
                f"{path} is shorter than the array sent from it ({end} bytes needed, "
                f"{len(cached.view)} there): it was truncated while the task was on its way."
            )
    _mapped_files.move_to_end(path)
    return numpy.ndarray(shape, dtype, buffer=cached.view, offset=offset, strides=strides)


def _map_file(path: str, device: int, inode: int) -> _MappedFile:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (device, inode):
            raise FileNotFoundError(
                f"{path} is no longer the file the array was sent from (it was replaced "
                "while the task was on its way); keep a file in place while a map reads it."
            )
        view = memoryview(mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ))
    finally:
        os.close(fd)  # the mapping stays
    mapped = _mapped_files[path] = _MappedFile(device, inode, view)
    while len(_mapped_files) > _MAPPED_FILES:  # arrays still using one keep it mapped
        _mapped_files.popitem(last=False)
    return mapped


def release_files() -> None:
    """Forget the files mapped for by-reference arrays (arrays still over one keep it
    mapped): a worker does so when idle, so that a file deleted after a map does not
    stay allocated for as long as the pool lives."""
    _mapped_files.clear()


# -- arenas ---------------------------------------------------------------------------


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class Arena:
    """A growable shared memory block written by the driver (one per in-flight task
    slot). ``idle_since`` is when :func:`shrink_idle` first saw it unused."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("paralela-arena")
        self.inode = os.fstat(self.fd).st_ino
        self.size = 0
        self.idle_since: float | None = None
        self._map: mmap.mmap | None = None

    def write(self, buffers: list[pickle.PickleBuffer]) -> Layout:
        """Copy ``buffers`` into the block; say where the worker finds each one."""
        self.idle_since = None
        raws = [b.raw() for b in buffers]
        spans: list[tuple[int, int]] = []
        offset = 0
        for raw in raws:
            spans.append((offset, raw.nbytes))
            offset += _aligned(raw.nbytes)
        if offset > self.size:
            self._grow(offset)
        assert self._map is not None  # _grow mapped it
        view = memoryview(self._map)
        try:
            for raw, (off, n) in zip(raws, spans, strict=True):
                view[off : off + n] = raw
        finally:
            view.release()
        return (self.fd, self.inode, self.size, spans)

    def _grow(self, needed: int) -> None:
        # Grow geometrically so that a run of slowly growing chunks remaps rarely.
        new_size = max(needed, self.size * 2, _SMALL_ARENA)
        os.ftruncate(self.fd, new_size)
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self.fd, new_size)
        self.size = new_size

    def shrink(self) -> None:
        """Give the memory back (the worker maps the block anew at its next size)."""
        if self._map is not None:
            self._map.close()
            self._map = None
        os.ftruncate(self.fd, 0)
        self.size = 0
        self.idle_since = None

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        os.close(self.fd)


def map_shared(layout: Layout) -> list[memoryview]:
    """The worker's read-only views of a block the driver wrote once for every worker (a
    broadcast value's large buffers): mapped from ``/proc/<driver>/fd/<fd>``, its inode
    checked; the views keep the mapping, unmapped when the last array over it goes."""
    driver_fd, inode, size, spans = layout
    fd = os.open(f"/proc/{os.getppid()}/fd/{driver_fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_ino != inode:
            raise RuntimeError("the driver's shared memory block is gone (driver exiting?)")
        block = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    base = memoryview(block)
    return [base[off : off + n] for off, n in spans]


def shrink_idle(idle: Iterable[Arena], now: float) -> float | None:
    """Shrink the ``idle`` arenas (no task uses them) unused for ``IDLE_SECONDS``.
    Returns the seconds until the next one is due, or ``None`` when none is."""
    due: float | None = None
    for arena in idle:
        if arena.size <= _SMALL_ARENA:
            continue
        if arena.idle_since is None:
            arena.idle_since = now
        left = arena.idle_since + IDLE_SECONDS - now
        if left <= 0:
            arena.shrink()
        elif due is None or left < due:
            due = left
    return due


class ArenaView:
    """The worker's read-only window on the :class:`Arena` of one task slot."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.inode = os.fstat(fd).st_ino
        self._map: mmap.mmap | None = None
        self._size = 0
        self._baseline = 0  # references to the map when no task holds any

    def views(self, layout: Layout) -> list[memoryview]:
        driver_fd, inode, size, spans = layout
        if inode != self.inode:  # the driver replaced a retired arena
            self._open(driver_fd, inode)
        if self._map is None or size != self._size:
            # Mapped at the arena's current size: never past the end of the file (the
            # driver may have shrunk it), which would be SIGBUS, not an exception.
            self._map = mmap.mmap(self.fd, size, prot=mmap.PROT_READ)
            self._size = size
            self._baseline = sys.getrefcount(self._map)
        base = memoryview(self._map)  # every view below holds the map through it
        return [base[off : off + n] for off, n in spans]

    def retire_if_kept(self) -> bool:
        """After a task: when something still refers to the mapping (an array the
        function kept), leave the mapping to it and forget this arena; return True."""
        if self._map is None or sys.getrefcount(self._map) <= self._baseline:
            return False
        gc.collect(1)  # a young reference cycle (an exception's traceback) is no keeper
        if sys.getrefcount(self._map) <= self._baseline:
            return False
        self._map = None  # unmapped when the last array over it goes
        self._size = 0
        os.close(self.fd)
        self.fd = -1
        self.inode = -1
        return True

    def _open(self, driver_fd: int, inode: int) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._map = None
        fd = os.open(f"/proc/{os.getppid()}/fd/{driver_fd}", os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(fd).st_ino != inode:
            os.close(fd)
            raise RuntimeError("the driver's shared memory block is gone (driver exiting?)")
        self.fd = fd
        self.inode = inode
