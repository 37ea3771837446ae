"""The compiled fast paths on memory the node's PEs share (native/_native.c),
behind one Python interface, and the setting that turns them off.

Python has no atomic instructions, so the pure Python library reaches even a
node peer's memory through MPI for atomics (the MPI window: an accumulate the
target's MPI applies), which costs a round trip through the target's progress
engine: 130x OpenSHMEM in C on this machine (docs/performance.md). With the
compiled piece, a heap whose PEs are all on one node applies every atomic
with the CPU's own atomic instructions on the shared mapping
(transport/route.py decides; every PE must have it, so it is voted on at
init), waits poll with atomic loads, and the agreement's board steps run in C.

SHMEMVM_NATIVE=0 (or a missing build) keeps the pure Python paths, which the
tests run too.
"""

from __future__ import annotations

from ..config import setting

from .. import vocabulary

try:
    from . import _native  # type: ignore[attr-defined]  # built by meson; no stub
except ImportError:  # not built (a source tree used without meson): the Python paths
    _native = None
try:   # the board's steps and the node collectives (_collective.c), built with it
    from . import _collective  # type: ignore[attr-defined]  # built by meson; no stub
except ImportError:
    _collective = None

# The numbers the compiled pieces give word kinds, atomic operations and reduce
# operations. Each C module exports its own (its enums: _native's WORDS and
# OPERATIONS, _collective's KINDS and REDUCE_OPS); these are the Python side's,
# from vocabulary.py (the names must exist where C is not built: the pure Python
# paths use them as codes). _numbering() holds them equal at import: a build of
# another C file would otherwise turn an ADD into an AND without a word.
_WORDS = vocabulary.numbering(vocabulary.WORD_CODES)
_OPERATIONS = vocabulary.numbering(vocabulary.NATIVE_ATOMIC_OPS)
_REDUCE_OPS = vocabulary.numbering(vocabulary.REDUCE_OPS)


def _numbering(module, tables=(("WORDS", _WORDS), ("OPERATIONS", _OPERATIONS))) -> tuple:
    """The tables (name, ours) of the compiled `module` (None: not built, ours),
    each as a dict; ImportError where its numbers are not this file's."""
    if module is None:
        return tuple(dict(ours) for _, ours in tables)
    for name, ours in tables:
        theirs = getattr(module, name, None)
        if theirs != ours:
            raise ImportError(
                f"the compiled piece {getattr(module, '__file__', module)} numbers its {name} "
                f"{theirs}, shmemvm/vocabulary.py (through native/__init__.py) expects {ours}: "
                f"it was built from another version of its C file. Rebuild it (pip install "
                f"-e . again, or remove the stale .so), or make the two tables equal")
    return tuple(dict(getattr(module, name)) for name, _ in tables)


#: word kinds of _native.c, by the array/struct typecode of their bits
#: (OPERATIONS: its atomic() operations, by name)
WORDS, OPERATIONS = _numbering(_native)
#: the element kinds of _collective.c's combine() (WORDS' numbering) and its reduce ops
KINDS, REDUCE_OPS = _numbering(_collective, (("KINDS", _WORDS), ("REDUCE_OPS", _REDUCE_OPS)))
#: operations of _native.c's atomic()
FETCH, SET, ADD, AND, OR, XOR, CAS = (OPERATIONS[name] for name in
                                      ("fetch", "set", "add", "and", "or", "xor", "cas"))


def built() -> str | None:
    """Where the compiled piece was loaded from; None where it is not built."""
    return None if _native is None else _native.__file__


def wanted(value=None) -> bool:
    """Whether this PE can and may use the compiled paths: both pieces built
    here (_native and _collective: a heap votes once for both), and
    SHMEMVM_NATIVE (or native=) is not 0. Raises ValueError for a bad setting."""
    raw = setting("SHMEMVM_NATIVE", None if value is None else str(value))
    text = str(raw).strip().lower()
    if text in ("0", "off", "false", "no"):
        return False
    if text not in ("auto", "1", "on", "true", "yes"):
        raise ValueError(f"SHMEMVM_NATIVE (the native= argument) must be auto or 0, got {raw!r}")
    return _native is not None and _collective is not None


class PyHeapMemory:
    """One allocation of the heap, as NumPy sees it (the NumPy face's object
    at the end of every heap array's base chain: shmem/arrays.py): the array
    interface of a uint8 tensor of its block, whose storage is the block's
    own. The pure Python one; views.c's HeapMemory is the compiled one (a
    buffer, which NumPy takes in a tenth of the time)."""

    def __init__(self, tensor):
        self.tensor = tensor
        # from the storage: a tensor without elements has no data_ptr()
        self.address = int(tensor.untyped_storage().data_ptr() + tensor.storage_offset())
        self.nbytes = tensor.numel()

    @property
    def __array_interface__(self) -> dict:
        return {"data": (self.address, False), "shape": (self.nbytes,), "typestr": "|u1",
                "version": 3}


def bytes_view(memory) -> memoryview:
    """A memoryview of a HeapMemory's bytes (the NumPy face's alloc result): of
    the compiled one itself, a buffer; of a NumPy array over the pure one,
    which has only the array interface."""
    if isinstance(memory, PyHeapMemory):
        import numpy   # (the pure path only: this module stays free of NumPy)
        return numpy.asarray(memory).data   # (the array's memoryview)
    return memoryview(memory)


def _local() -> bool:
    """wanted(), for what no other PE takes part in (so no vote): a bad
    setting leaves it Python's here, and init() raises for it."""
    try:
        return wanted()
    except ValueError:
        return False


#: HeapMemory(tensor): the type of the NumPy face's allocations (`tensor`,
#: `address`, `nbytes`; numpy.asarray(memory) is a uint8 array over them):
#: views.c's where the compiled piece is built and wanted, else PyHeapMemory
HeapMemory: type = _native.HeapMemory if _local() else PyHeapMemory

#: CachedBlocks(engine, buddy, tensor, record, block_type, quick_limit): the
#: allocator's cached branch (a small block of a size freed lately, taken, and a
#: small block given back) in one call (blocks.c), where the compiled piece is
#: built and wanted; else None, and the allocator's Python path does it all
CachedBlocks = _native.CachedBlocks if _local() else None

#: DeadBlocks(core, cached): the core's dead blocks taken into its pending set and
#: released, in one call each (dead.c), over its engine's CachedBlocks; None as
#: CachedBlocks is
DeadBlocks = _native.DeadBlocks if CachedBlocks is not None else None

#: FaceFree(core, cached, tensor_type, use_count, held_alone): the faces' frees in
#: one call where the quick step is kept (face_free.c: free_memory of the NumPy
#: face's memory, free_tensor of a torch tensor), over its engine's CachedBlocks;
#: None as CachedBlocks is
FaceFree = _native.FaceFree if CachedBlocks is not None else None


def atomic(address: int, code: str, op: int, value=0, cond=0):
    """One atomic operation on the word at `address` (checked by the caller:
    mapped, aligned, of typecode `code`); the value before it."""
    return _native.atomic(address, WORDS[code], op, value, cond)


def load(address: int, code: str):
    """The word at `address`, read atomically."""
    return _native.load(address, WORDS[code])


def copy(dst: int, src: int, nbytes: int) -> None:
    """memmove(dst, src, nbytes) between checked addresses. Like every entry
    point here, ValueError (never a crash) for a negative length, a null
    address or one below the lowest mappable page, or a range past the
    highest user address; the callers check the rest (the live block)."""
    _native.copy(dst, src, nbytes)


def interface_address(buffer) -> int:
    """Where NumPy array `buffer` starts (its first element, any layout), by its
    array interface."""
    return buffer.__array_interface__["data"][0]


#: address(buffer): where C-contiguous `buffer` (a NumPy array) starts; the compiled
#: piece's own function where it is built (0.1 us against the array interface's 0.8,
#: and no Python call around it: the NumPy face asks it for every array it is given)
address = _native.address if _native is not None else interface_address


#: call_key(kind, group_id, values, target, source, ndarray, memory): the NumPy
#: face's memo key of a collective call in one call (_collective.c; None where
#: not built; shmem/collectives.py checks it reads NumPy's arrays right first)
call_key = _collective.call_key if _collective is not None else None


def copy_from(dst: int, buffer, nbytes: int) -> None:
    """memmove(dst, buffer's first nbytes); ValueError where it has fewer."""
    _native.copy_from(dst, buffer, nbytes)


def copy_into(buffer, src: int, nbytes: int) -> None:
    """memmove(writable buffer's first nbytes, src); ValueError where it has fewer."""
    _native.copy_into(buffer, src, nbytes)


def board_write(slot: int, vector, seq: int) -> None:
    """Write this PE's slot of a board step (agreement/board.py's layout)."""
    _native.board_write(slot, vector, seq)


def board_read(slot: int, words: int, seq: int, seq_word: int, spins: int, out) -> bool:
    """Poll another PE's slot for step `seq` at most `spins` times; True once
    `out` holds its vector."""
    return _native.board_read(slot, words, seq, seq_word, spins, out)
