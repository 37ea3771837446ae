"""shmem4py 1.0's API over shmemvm: a shmem4py program runs here by changing
``from shmem4py import shmem`` into ``from shmemvm import shmem``.

    from shmemvm import shmem
    src = shmem.full(4, shmem.my_pe())             # NumPy arrays on the symmetric heap
    dst = shmem.zeros(4, dtype=src.dtype)
    shmem.put(dst, src, (shmem.my_pe() + 1) % shmem.n_pes())
    shmem.barrier_all()

Launch with mpirun/mpiexec. Importing this module creates the default heap
(shmemvm.init(backend="host")) as shmem4py initialises OpenSHMEM, following
`shmemvm.rc` (shmem4py's `rc`: initialize, threads, thread_level, finalize, and
the SHMEM4PY_RC_* environment variables), and finalizes it at exit.

Symmetric arrays are NumPy views of symmetric tensors of the heap's host
memory. Every call finds the tensor under an array by its address (a slice, a
reshape or a `fromalloc` view of a symmetric array is symmetric too), so an
array keeps its block alive like a tensor does, and a block that no array views
any more on any PE is freed, as shmem4py frees memory its arrays no longer use.
As in shmem4py, arrays passed to put/get/collectives must be contiguous (C or
Fortran order) and are used as flat arrays in memory order; `size` counts
elements and defaults to the smaller of the two arrays.

What differs from shmem4py, and why:
  - shmem4py's C layer (`ffi`, `lib`, the CData handle types) has no
    counterpart: shmemvm is not a C library. This module provides neither.
  - Signals and locks are one-element symmetric NumPy arrays (uint64 and
    int64) rather than CData pointers; new_signal/new_lock/del_signal/del_lock
    handle them, and any such array of the heap works.
  - Atomics and point-to-point synchronization take int32, int64 and uint64
    arrays (float32/float64 too for atomic_fetch/set/swap and their nbi
    forms), the types MPI's atomics reach; others raise TypeError.
  - Errors are shmemvm's (TypeError, ValueError, shmemvm.ShmemError and its
    subclasses) where shmem4py asserts or returns C error codes.
  - long double and its complex type have no torch counterpart (TypeError).
  - init() after the import initialised the heap does nothing (shmem4py's C
    libraries differ on a second init); finalize() then init() makes a new heap.
  - Team.split_2d is an addition (OpenSHMEM's shmem_team_split_2d).
"""

from __future__ import annotations

import atexit
import bisect
import enum
import functools
import operator
import os
import sys
import threading
import weakref
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import api, rc
from ..openshmem import info
from ..errors import FreedTensorError, ShmemError

Number = Union[int, float, complex, np.number]

if sys.version_info >= (3, 11):
    _StrEnum = enum.StrEnum
else:  # pragma: no cover
    class _StrEnum(str, enum.Enum):
        __str__ = str.__str__


# -- version -------------------------------------------------------------------------
MAJOR_VERSION: int = info.SPEC_VERSION[0]
MINOR_VERSION: int = info.SPEC_VERSION[1]
VENDOR_STRING: str = info.info_get_name()


def info_get_version() -> Tuple[int, int]:
    """The OpenSHMEM specification version followed (shmem_info_get_version).

    Returns:
        (major, minor), e.g. (1, 5).

    Raises:
        Nothing.
    """
    return info.info_get_version()


def info_get_name() -> str:
    """The library's name (shmem_info_get_name).

    Returns:
        "shmemvm <version>".

    Raises:
        Nothing.
    """
    return info.info_get_name()


# -- constants ---------------------------------------------------------------------------
class THREAD(enum.IntEnum):
    """Thread support levels (OpenSHMEM's values, as shmemvm.THREAD_*)."""
    SINGLE = 0
    FUNNELED = 1
    SERIALIZED = 2
    MULTIPLE = 3


THREAD_SINGLE = THREAD.SINGLE
THREAD_FUNNELED = THREAD.FUNNELED
THREAD_SERIALIZED = THREAD.SERIALIZED
THREAD_MULTIPLE = THREAD.MULTIPLE


class CTX(enum.IntFlag):
    """Context options (OpenSHMEM's values, as shmemvm.CTX_*)."""
    SERIALIZED = 1
    PRIVATE = 2
    NOSTORE = 4


CTX_SERIALIZED = CTX.SERIALIZED
CTX_PRIVATE = CTX.PRIVATE
CTX_NOSTORE = CTX.NOSTORE


class MALLOC(enum.IntFlag):
    """Allocation hints (OpenSHMEM's values): accepted and recorded by the
    heap; they change nothing in how shmemvm places memory."""
    ATOMICS_REMOTE = 1
    SIGNAL_REMOTE = 2


MALLOC_ATOMICS_REMOTE = MALLOC.ATOMICS_REMOTE
MALLOC_SIGNAL_REMOTE = MALLOC.SIGNAL_REMOTE


class AMO(_StrEnum):
    """Atomic operations of atomic_op / atomic_fetch_op / atomic_fetch_op_nbi."""
    SET = "set"
    INC = "inc"
    ADD = "add"
    AND = "and"
    OR = "or"
    XOR = "xor"


AMO_SET, AMO_INC, AMO_ADD = AMO.SET, AMO.INC, AMO.ADD
AMO_AND, AMO_OR, AMO_XOR = AMO.AND, AMO.OR, AMO.XOR


class SIGNAL(enum.IntEnum):
    """Signal update operations of put_signal (OpenSHMEM's values)."""
    SET = 0
    ADD = 1


SIGNAL_SET = SIGNAL.SET
SIGNAL_ADD = SIGNAL.ADD


class OP(_StrEnum):
    """Reduction operations of reduce."""
    AND = "and"
    OR = "or"
    XOR = "xor"
    MAX = "max"
    MIN = "min"
    SUM = "sum"
    PROD = "prod"


OP_AND, OP_OR, OP_XOR, OP_MAX = OP.AND, OP.OR, OP.XOR, OP.MAX
OP_MIN, OP_SUM, OP_PROD = OP.MIN, OP.SUM, OP.PROD


class CMP(enum.IntEnum):
    """Comparisons of wait_until / test / signal_wait_until (OpenSHMEM's values)."""
    EQ = 0
    NE = 1
    GT = 2
    LE = 3
    LT = 4
    GE = 5


CMP_EQ, CMP_NE, CMP_GT, CMP_LE, CMP_LT, CMP_GE = CMP.EQ, CMP.NE, CMP.GT, CMP.LE, CMP.LT, CMP.GE

_CMP_NAMES = {CMP.EQ: "eq", CMP.NE: "ne", CMP.GT: "gt", CMP.LE: "le", CMP.LT: "lt", CMP.GE: "ge"}
_CMP_SYMBOLS = {"==": "eq", "!=": "ne", ">": "gt", "<=": "le", "<": "lt", ">=": "ge"}


def _cmp(cmp) -> str:
    """A CMP value, "==" and the like, or "eq" and the like, as shmemvm's name."""
    if isinstance(cmp, str):
        name = _CMP_SYMBOLS.get(cmp, cmp.lower())
        if name in _CMP_NAMES.values():
            return name
    elif not isinstance(cmp, bool) and hasattr(type(cmp), "__index__"):
        value = operator.index(cmp)
        if value in CMP._value2member_map_:
            return _CMP_NAMES[CMP(value)]
    raise ValueError(f"cmp must be a CMP value (CMP_EQ, ...), one of "
                     f"{', '.join(_CMP_SYMBOLS)} or a name like 'eq', got {cmp!r}")


# -- the heap ---------------------------------------------------------------------------
def _heap():
    return api.default_heap()


class _Arrays:
    """Where each symmetric allocation lies, to find the tensor under an array.

    Keyed by the allocation's address; holds its storage weakly (the arrays
    hold it), so a block that no array views any more is freed by the heap."""

    def __init__(self):
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._entries: dict[int, tuple[int, weakref.ref]] = {}

    def add(self, tensor: torch.Tensor) -> None:
        start, nbytes = tensor.data_ptr(), tensor.numel()
        with self._lock:
            if start not in self._entries:
                bisect.insort(self._starts, start)
            self._entries[start] = (nbytes, weakref.ref(tensor.untyped_storage()))

    def remove(self, start: int) -> None:
        with self._lock:
            if self._entries.pop(start, None) is not None:
                del self._starts[bisect.bisect_left(self._starts, start)]

    def clear(self) -> None:
        with self._lock:
            self._starts.clear()
            self._entries.clear()

    def find(self, address: int):
        """(storage, start) of the live allocation holding `address`, or None."""
        with self._lock:
            while True:
                i = bisect.bisect_right(self._starts, address) - 1
                if i < 0:
                    return None
                start = self._starts[i]
                nbytes, ref = self._entries[start]
                storage = ref()
                if storage is None:  # its arrays are gone: the heap frees it
                    del self._starts[i], self._entries[start]
                    continue
                if address < start + max(nbytes, 1):
                    return storage, start
                return None


_arrays = _Arrays()


@functools.lru_cache(maxsize=None)
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    if dtype.kind == "S" and dtype.itemsize == 1:  # shmem4py's 'char'
        return torch.uint8
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError:
        raise TypeError(f"NumPy dtype {dtype} has no torch equivalent that shmemvm can move "
                        f"(long double and its complex type are not supported); use float64 "
                        f"or complex128") from None


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _check_array(a, role: str, writable: bool) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"the {role} must be a NumPy array, got {type(a).__name__}")
    if writable and not a.flags.writeable:
        raise ValueError(f"the {role} is read-only")
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError(f"the {role} is not contiguous (strides {a.strides} for shape "
                         f"{a.shape}); pass a contiguous array or slice, e.g. a copy")
    return a


def _symmetric(a, role: str, writable: bool = True) -> torch.Tensor:
    """The symmetric tensor under array `a`: 1-D, a.size elements in memory order,
    sharing the heap block's storage (so the heap recognises it), or a clear error."""
    a = _check_array(a, role, writable)
    dtype = _torch_dtype(a.dtype)
    found = _arrays.find(_address(a))
    if found is None:
        raise FreedTensorError(
            f"the {role} (at {_address(a):#x}) is not an array on the symmetric heap: "
            f"allocate it with shmem.zeros/empty/full/array/new_array/alloc (and do not free "
            f"it before use)")
    storage, start = found
    offset = _address(a) - start
    if offset % a.itemsize:
        raise ValueError(f"the {role} lies at byte {offset} of its allocation, which is not "
                         f"a multiple of its element size {a.itemsize}")
    tensor = torch.empty(0, dtype=dtype).set_(storage, offset // a.itemsize, (a.size,), (1,))
    _heap().symmetric(tensor, role)  # freed since, or another heap's: say so here
    return tensor


def _local(a, role: str, writable: bool) -> torch.Tensor:
    """Any contiguous array as a 1-D tensor over its memory, in memory order."""
    a = _check_array(a, role, writable)
    _torch_dtype(a.dtype)  # a clear error for a dtype torch lacks
    flat = a.reshape(-1, order="A")  # a view: memory order, C or Fortran
    if a.dtype.kind == "S":
        flat = flat.view(np.uint8)
    if not flat.flags.writeable:  # torch takes only writable arrays; a copy reads the same
        flat = flat.copy()
    return torch.from_numpy(flat)


def _count(size, *limits: int) -> int:
    """`size` elements (default: the smallest limit), checked against each limit."""
    if size is None:
        return min(limits)
    if isinstance(size, bool) or not hasattr(type(size), "__index__"):
        raise TypeError(f"size must be an int or None, got {type(size).__name__} {size!r}")
    size = operator.index(size)
    if size < 0 or size > min(limits):
        raise ValueError(f"size {size} must be between 0 and {min(limits)} (the number of "
                         f"elements the arrays hold)")
    return size


def _same_dtype(target: np.ndarray, source: np.ndarray) -> None:
    if target.dtype != source.dtype:
        raise TypeError(f"target has dtype {target.dtype} and source {source.dtype}; they "
                        f"must match (convert with .astype first)")


def _ceildiv(p: int, q: int) -> int:
    return -(-p // q)


def _numpy_of(tensor: torch.Tensor, like: np.ndarray) -> np.ndarray:
    """`tensor` (1-D, like's elements in memory order) as an array of like's layout."""
    flat = tensor.numpy()
    if like.dtype.kind == "S":
        flat = flat.view(like.dtype)
    if like.flags.c_contiguous or like.ndim < 2:
        out = flat.reshape(like.shape)
    else:
        out = flat.reshape(like.shape[::-1]).T
    out.flags.writeable = like.flags.writeable
    return out


# -- setup and exit ------------------------------------------------------------------------
def init() -> None:
    """Create the default symmetric heap on the host (collective; shmem_init).
    Does nothing where one is already open (e.g. made at import).

    Returns:
        None.

    Raises:
        ShmemError and its subclasses: the heap could not be made (see
            shmemvm.init).
    """
    if api.current_heap() is not None:
        return
    _arrays.clear()
    api.init(backend="host")


def init_thread(requested: int = THREAD_MULTIPLE) -> THREAD:
    """Create the default heap at a thread level (collective; shmem_init_thread).

    Args:
        requested: a THREAD level (default THREAD_MULTIPLE).

    Returns:
        The THREAD level provided.

    Raises:
        ValueError: `requested` is not a THREAD level.
        UnsupportedError: MPI was initialised at a lower level.
    """
    if api.current_heap() is None:
        _arrays.clear()
        api.init(backend="host", thread_level=int(requested))
    return query_thread()


def query_thread() -> THREAD:
    """The thread level the heap provides (shmem_query_thread).

    Returns:
        A THREAD level.

    Raises:
        ShmemError: no heap (not initialised, or finalized).
    """
    return THREAD(_heap().query_thread())


def finalize() -> None:
    """Release the default heap (collective; shmem_finalize). Arrays on it must
    not be used afterwards.

    Returns:
        None.

    Raises:
        SymmetryError: some PE is in another collective call.
    """
    api.finalize()
    _arrays.clear()


def global_exit(status: int = 0) -> NoReturn:
    """End every PE's process with `status` (shmem_global_exit).

    Args:
        status: the exit status.

    Returns:
        Never.

    Raises:
        SystemExit: where MPI returns from its abort.
    """
    info.global_exit(status)
    raise SystemExit(status)


def _finalize_at_exit() -> None:
    if api.current_heap() is not None:
        try:
            finalize()
        except Exception as exc:  # a PE that failed: the others must still exit
            print(f"shmemvm.shmem: finalize at exit failed: {exc}", file=sys.stderr)


def _initialize() -> None:
    """What importing this module does, as shmem4py's import."""
    for name in ("initialize", "threads", "thread_level", "finalize"):
        value = os.environ.get(f"SHMEM4PY_RC_{name.upper()}")
        if value:
            lower = value.lower()
            setattr(rc, name, True if lower in ("true", "yes", "on", "y", "1") else
                    False if lower in ("false", "no", "off", "n", "0") else lower)
    if rc.initialize:
        if rc.threads:
            level = str(rc.thread_level).upper()
            if level not in THREAD.__members__:
                raise ValueError(f"rc.thread_level must be one of multiple, serialized, "
                                 f"funneled, single, got {rc.thread_level!r}")
            init_thread(THREAD[level])
        else:
            init()
        if rc.finalize is None:
            rc.finalize = True
    if rc.finalize:
        atexit.register(_finalize_at_exit)


# -- teams ----------------------------------------------------------------------------------
class Team:
    """A team of PEs (shmem4py's Team): TEAM_WORLD, TEAM_SHARED, or one made by
    split_strided/split_2d; a falsy Team is invalid (OpenSHMEM's
    SHMEM_TEAM_INVALID: a destroyed team, or a split this PE is not in).

    Args:
        team: None (an invalid team), another Team (a copy of its handle), or a
            shmemvm.openshmem.teams.Team.
    """

    def __init__(self, team: Any = None) -> None:
        if isinstance(team, Team):
            self._kind, self._team = team._kind, team._team
        elif team is None:
            self._kind, self._team = "invalid", None
        elif isinstance(team, str) and team in ("world", "shared"):
            self._kind, self._team = team, None
        elif hasattr(team, "world_pe") and hasattr(team, "split_strided"):
            self._kind, self._team = "split", team
        else:
            raise TypeError(f"Team() takes None, a Team or a shmemvm team, got "
                            f"{type(team).__name__}")

    def _handle(self):
        """The shmemvm team this stands for."""
        if self._kind == "world":
            return _heap().team_world()
        if self._kind == "shared":
            return _heap().team_shared()
        if self._kind == "invalid":
            raise ValueError("this team is invalid (TEAM_INVALID: destroyed, or a split "
                             "this PE is not a member of)")
        return self._team

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Team):
            return NotImplemented
        return self._kind == other._kind and self._team is other._team

    def __hash__(self) -> int:
        return hash((self._kind, id(self._team)))

    def __bool__(self) -> bool:
        return self._kind != "invalid"

    def __repr__(self) -> str:
        return f"<shmemvm.shmem.Team {self._kind}>"

    def __enter__(self) -> "Team":
        return self

    def __exit__(self, *args: Any) -> None:
        self.destroy()

    def destroy(self) -> None:
        """Destroy the team (collective over it; shmem_team_destroy); it becomes
        invalid. TEAM_WORLD, TEAM_SHARED and invalid teams are left as they are.

        Returns:
            None.

        Raises:
            ShmemError: as shmemvm's team_destroy.
        """
        if self._kind != "split":
            return
        team, self._kind, self._team = self._team, "invalid", None
        team.destroy()

    def split_strided(self, start: int = 0, stride: int = 1, size: Optional[int] = None,
                      config: Optional[Mapping[str, int]] = None, **kwargs: int) -> "Team":
        """A team of this team's PEs start, start+stride, ... (collective over
        this team; shmem_team_split_strided).

        Args:
            start: the first PE (team-relative).
            stride: the step between PEs.
            size: the number of PEs; None: as many as fit in this team.
            config: team settings (e.g. {"num_contexts": 2}); `kwargs` add to it.

        Returns:
            The new Team; an invalid (falsy) Team on PEs that are not in it.

        Raises:
            ValueError, TypeError: bad arguments (as shmemvm's team_split_strided).
            SymmetryError: the PEs of this team asked for different splits.
        """
        parent = self._handle()
        if size is None:
            size = len(range(start, parent.n_pes(), stride))
        settings = dict(config or {})
        settings.update(kwargs)
        return Team(parent.split_strided(start, stride, size, settings or None))

    def split_2d(self, xrange: int, xaxis_config: Optional[Mapping[str, int]] = None,
                 yaxis_config: Optional[Mapping[str, int]] = None) -> Tuple["Team", "Team"]:
        """This team as a 2-D grid of `xrange` columns: (x team, y team) of this
        PE (collective; shmem_team_split_2d). An addition to shmem4py's API.

        Args:
            xrange: the number of PEs along x.
            xaxis_config, yaxis_config: team settings of the two teams.

        Returns:
            (the PEs of this PE's row, the PEs of this PE's column).

        Raises:
            ValueError, TypeError: bad arguments (as shmemvm's team_split_2d).
        """
        x, y = self._handle().split_2d(xrange, xaxis_config, yaxis_config)
        return Team(x), Team(y)

    def get_config(self) -> Dict[str, int]:
        """The team's settings (shmem_team_get_config).

        Returns:
            A dict, e.g. {"num_contexts": 0}.

        Raises:
            ValueError: the team is invalid.
        """
        return dict(self._handle().get_config())

    def my_pe(self) -> int:
        """This PE's number in the team (shmem_team_my_pe).

        Returns:
            0..n_pes()-1.

        Raises:
            ValueError: the team is invalid.
        """
        if self._kind == "world":
            return _heap().my_pe
        return self._handle().my_pe()

    def n_pes(self) -> int:
        """The number of PEs in the team (shmem_team_n_pes).

        Returns:
            An int >= 1.

        Raises:
            ValueError: the team is invalid.
        """
        if self._kind == "world":
            return _heap().n_pes
        return self._handle().n_pes()

    def translate_pe(self, pe: Optional[int] = None, team: Optional["Team"] = None) -> int:
        """PE `pe` of this team as numbered in `team` (shmem_team_translate_pe).

        Args:
            pe: a PE of this team; None: this PE.
            team: the team to translate to; None: TEAM_WORLD.

        Returns:
            Its number in `team`, or -1 where it is not a member.

        Raises:
            ValueError: a team is invalid or `pe` is out of range.
        """
        dest = TEAM_WORLD if team is None else team
        source = self._handle()
        return source.translate_pe(source.my_pe() if pe is None else pe, dest._handle())

    def create_ctx(self, options: int = 0) -> "Ctx":
        """A context whose PE numbers are this team's (shmem_team_create_ctx).

        Args:
            options: CTX flags or 0.

        Returns:
            The new Ctx.

        Raises:
            ValueError: the team is invalid, or bad options.
        """
        return Ctx(self._handle().create_ctx(int(options)))

    def sync(self) -> None:
        """Wait for every PE of the team (collective over it; shmem_team_sync).

        Returns:
            None.

        Raises:
            SymmetryError, PeerTimeoutError: as shmemvm's sync_all.
        """
        if self._kind == "world":
            _heap().sync_all()
        else:
            self._handle().sync()


TEAM_WORLD = Team("world")
TEAM_SHARED = Team("shared")
TEAM_INVALID = Team(None)


def _team_args(team: Optional[Team]) -> dict:
    """The keyword that sends a collective to `team` (none for the world)."""
    if team is None:
        return {}
    if not isinstance(team, Team):
        raise TypeError(f"team must be a shmem.Team or None, got {type(team).__name__}")
    if team._kind == "world":
        return {}
    return {"team": team._handle()}


def _team_size(team: Optional[Team]) -> int:
    _team_args(team)  # checks its type
    return _heap().n_pes if team is None else team.n_pes()


# -- contexts ------------------------------------------------------------------------------
class Ctx:
    """A communication context (shmem4py's Ctx); CTX_DEFAULT is the heap's own.
    A falsy Ctx is invalid (destroyed, or CTX_INVALID).

    Args:
        ctx: None (an invalid context), another Ctx (a copy of its handle), or
            a shmemvm.openshmem.contexts.Ctx.
    """

    def __init__(self, ctx: Any = None) -> None:
        if isinstance(ctx, Ctx):
            self._kind, self._ctx = ctx._kind, ctx._ctx
        elif ctx is None:
            self._kind, self._ctx = "invalid", None
        elif isinstance(ctx, str) and ctx == "default":
            self._kind, self._ctx = "default", None
        elif hasattr(ctx, "quiet") and hasattr(ctx, "put"):
            self._kind, self._ctx = "created", ctx
        else:
            raise TypeError(f"Ctx() takes None, a Ctx or a shmemvm context, got "
                            f"{type(ctx).__name__}")

    def _handle(self):
        """Where this context's operations go: the heap, or a shmemvm context."""
        if self._kind == "default":
            return _heap()
        if self._kind == "invalid":
            raise ValueError("this context is invalid (CTX_INVALID or destroyed)")
        return self._ctx

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Ctx):
            return NotImplemented
        return self._kind == other._kind and self._ctx is other._ctx

    def __hash__(self) -> int:
        return hash((self._kind, id(self._ctx)))

    def __bool__(self) -> bool:
        return self._kind != "invalid"

    def __repr__(self) -> str:
        return f"<shmemvm.shmem.Ctx {self._kind}>"

    def __enter__(self) -> "Ctx":
        return self

    def __exit__(self, *args: Any) -> None:
        self.destroy()

    @staticmethod
    def create(options: int = 0, team: Optional[Team] = None) -> "Ctx":
        """A new context (shmem_ctx_create / shmem_team_create_ctx).

        Args:
            options: CTX flags combined with |, or 0.
            team: None for the world, or the team whose PE numbers it uses.

        Returns:
            The new Ctx.

        Raises:
            ValueError: bad options, or an invalid team.
        """
        if team is not None and team._kind != "world":
            return team.create_ctx(options)
        return Ctx(_heap().ctx_create(int(options)))

    def destroy(self) -> None:
        """Complete this context's operations and invalidate it
        (shmem_ctx_destroy). CTX_DEFAULT and invalid contexts are left alone.

        Returns:
            None.

        Raises:
            ShmemError: as shmemvm's context destroy.
        """
        if self._kind != "created":
            return
        ctx, self._kind, self._ctx = self._ctx, "invalid", None
        ctx.destroy()

    def get_team(self) -> Team:
        """The team of this context (shmem_ctx_get_team).

        Returns:
            A Team; TEAM_WORLD for CTX_DEFAULT and for contexts made without a team.

        Raises:
            ValueError: the context is invalid.
        """
        team = getattr(self._handle(), "team", None) if self._kind == "created" else None
        return Team(TEAM_WORLD) if team is None else Team(team)

    def fence(self) -> None:
        """Order this context's puts to each PE (shmem_ctx_fence).

        Returns:
            None.

        Raises:
            ValueError: the context is invalid.
        """
        self._handle().fence()

    def quiet(self) -> None:
        """Complete this context's outstanding operations (shmem_ctx_quiet).

        Returns:
            None.

        Raises:
            ValueError: the context is invalid.
        """
        self._handle().quiet()


CTX_DEFAULT = Ctx("default")
CTX_INVALID = Ctx(None)


def _via(ctx: Optional[Ctx]):
    """The object that carries an operation on `ctx` (None: the heap)."""
    if ctx is None:
        return _heap()
    if not isinstance(ctx, Ctx):
        raise TypeError(f"ctx must be a shmem.Ctx or None, got {type(ctx).__name__}")
    return ctx._handle()


# -- queries ----------------------------------------------------------------------------------
def my_pe() -> int:
    """This PE's number (shmem_my_pe).

    Returns:
        0..n_pes()-1.

    Raises:
        ShmemError: no heap.
    """
    return _heap().my_pe


def n_pes() -> int:
    """The number of PEs (shmem_n_pes).

    Returns:
        An int >= 1.

    Raises:
        ShmemError: no heap.
    """
    return _heap().n_pes


def pe_accessible(pe: int) -> bool:
    """Whether PE `pe` can be reached by put/get/atomics (shmem_pe_accessible).

    Args:
        pe: a PE number.

    Returns:
        True for every PE of the heap, False for any other number.

    Raises:
        TypeError: `pe` is not an integer.
    """
    heap = _heap()
    try:
        heap.check_pe(pe)
    except ValueError:
        return False
    return True


def addr_accessible(addr: np.ndarray, pe: int) -> bool:
    """Whether array `addr` is symmetric and PE `pe` reachable (shmem_addr_accessible).

    Args:
        addr: a NumPy array.
        pe: a PE number.

    Returns:
        True where `addr` lies on the symmetric heap and `pe` is a PE of it.

    Raises:
        TypeError: `addr` is not a NumPy array.
    """
    if not isinstance(addr, np.ndarray):
        raise TypeError(f"addr must be a NumPy array, got {type(addr).__name__}")
    try:
        _symmetric(addr, "array", writable=False)
    except (ValueError, TypeError, ShmemError):
        return False
    return pe_accessible(pe)


def ptr(target: np.ndarray, pe: int) -> Optional[np.ndarray]:
    """`target` as it lies on PE `pe`, for loads and stores (shmem_ptr).

    Args:
        target: a contiguous symmetric array.
        pe: the PE whose copy is wanted.

    Returns:
        An array of target's shape, dtype and order over PE `pe`'s memory, or
        None where `pe` is on another node.

    Raises:
        FreedTensorError: `target` is not on the symmetric heap.
        TypeError, ValueError: `target` is not a contiguous array, or a bad `pe`.
    """
    view = _heap().ptr(_symmetric(target, "target", writable=False), pe)
    return None if view is None else _numpy_of(view, target)


# -- memory management --------------------------------------------------------------------------
def _allocate(nbytes: int, align: Optional[int], hints: Optional[int], clear: bool):
    heap = _heap()
    if align is not None:
        raw = heap.align(align, nbytes)
    elif hints:
        raw = heap.malloc_with_hints(nbytes, int(hints))
    elif clear:
        raw = heap.zeros(nbytes, torch.uint8)
        clear = False
    else:
        raw = heap.malloc(nbytes)
    if clear:
        raw.zero_()
        heap.sync_all()  # zero everywhere before anyone writes to it
    _arrays.add(raw)
    return raw


def alloc(count: int, size: int = 1, align: Optional[int] = None,
          hints: Optional[int] = None, clear: bool = True) -> memoryview:
    """`count * size` bytes of symmetric memory (collective; shmem_malloc,
    shmem_align, shmem_malloc_with_hints, shmem_calloc).

    Args:
        count: the number of elements.
        size: bytes per element.
        align: None, or a power of two the address is a multiple of.
        hints: MALLOC flags (recorded; they change nothing here).
        clear: zero the memory (on every PE before any returns).

    Returns:
        A writable memoryview of the bytes; fromalloc makes arrays of it.

    Raises:
        SymmetryError: the PEs asked for different allocations.
        HeapExhaustedError: the heap cannot hold it (see SHMEMVM_HEAP_SIZE).
        TypeError, ValueError: bad sizes.
    """
    nbytes = operator.index(count) * operator.index(size)
    return memoryview(_allocate(nbytes, align, hints, clear).numpy())


def _start_of(mem, what: str) -> Tuple[int, Any]:
    """(address, storage) of the allocation that `mem` starts."""
    if isinstance(mem, memoryview):
        mem = np.frombuffer(mem, np.uint8) if mem.nbytes else np.asarray(mem)
    if not isinstance(mem, np.ndarray):
        raise TypeError(f"{what} takes a memoryview from alloc or an array, got "
                        f"{type(mem).__name__}")
    address = _address(mem)
    found = _arrays.find(address)
    if found is None or found[1] != address:
        raise ValueError(f"{what}: this is not the start of an allocation of the symmetric "
                         f"heap (not allocated here, freed already, or a slice of one)")
    return address, found[0]


def free(mem: Union[memoryview, np.ndarray]) -> None:
    """Free symmetric memory (collective; shmem_free). Arrays over it may not be
    used in shmem calls afterwards; their memory is reused once they are gone.

    Args:
        mem: the memoryview from alloc, or an array that starts the allocation
            (from new_array, zeros, ...).

    Returns:
        None.

    Raises:
        TypeError: `mem` is neither.
        ValueError: `mem` does not start an allocation of this heap.
        SymmetryError: the PEs freed different allocations.
    """
    address, storage = _start_of(mem, "free")
    handle = torch.empty(0, dtype=torch.uint8).set_(storage)
    _heap().free(handle)
    _arrays.remove(address)


def fromalloc(mem: memoryview, shape: Optional[Union[int, Sequence[int]]] = None,
              dtype: Any = None, order: str = "C") -> np.ndarray:
    """An array over memory from alloc.

    Args:
        mem: a memoryview from alloc.
        shape: the shape; None: as many elements as fit.
        dtype: a NumPy dtype (None: float64).
        order: "C" or "F".

    Returns:
        A NumPy array over `mem`.

    Raises:
        TypeError: `mem` is not a memoryview.
        ValueError: the shape does not fit.
    """
    if not isinstance(mem, memoryview):
        raise TypeError(f"fromalloc takes a memoryview from alloc, got {type(mem).__name__}")
    dtype = np.dtype(dtype)
    if shape is None:
        shape = mem.nbytes // dtype.itemsize
    count = int(np.prod(shape, dtype=np.int64))
    a = np.frombuffer(mem, dtype, count=count)
    return a.reshape(shape, order=order)


def new_array(shape: Union[int, Sequence[int]], dtype: Any = float, order: str = "C", *,
              align: Optional[int] = None, hints: Optional[int] = None,
              clear: bool = True) -> np.ndarray:
    """A symmetric array (collective).

    Args:
        shape: an int or a sequence of ints.
        dtype: a NumPy dtype (default float64).
        order: "C" or "F".
        align, hints: as alloc.
        clear: zero it (default True).

    Returns:
        A NumPy array on the symmetric heap.

    Raises:
        As alloc.
    """
    dtype = np.dtype(dtype)
    _torch_dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return fromalloc(alloc(count, dtype.itemsize, align, hints, clear), shape, dtype, order)


def del_array(a: np.ndarray) -> None:
    """Free a symmetric array (collective).

    Args:
        a: an array from new_array, zeros, ... (the whole allocation).

    Returns:
        None.

    Raises:
        As free.
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(f"del_array takes a NumPy array, got {type(a).__name__}")
    free(a)


def array(obj: Any, dtype: Any = None, *, order: str = "K", align: Optional[int] = None,
          hints: Optional[int] = None) -> np.ndarray:
    """A symmetric array holding `obj` (collective).

    Args:
        obj: anything np.asarray takes.
        dtype: its dtype (None: obj's).
        order: "K", "A", "C" or "F".
        align, hints: as alloc.

    Returns:
        A NumPy array on the symmetric heap, equal to `obj`, filled on every PE
        before any returns.

    Raises:
        As alloc.
    """
    tmp = np.asarray(obj, dtype=dtype, order=order)
    layout = "F" if tmp.flags.f_contiguous and not tmp.flags.c_contiguous else "C"
    a = new_array(tmp.shape, tmp.dtype, layout, align=align, hints=hints, clear=False)
    np.copyto(a, tmp, casting="no")
    _heap().sync_all()
    return a


def empty(shape: Union[int, Sequence[int]], dtype: Any = float, order: str = "C", *,
          align: Optional[int] = None, hints: Optional[int] = None) -> np.ndarray:
    """An uninitialised symmetric array (collective).

    Args:
        shape, dtype, order, align, hints: as new_array.

    Returns:
        A NumPy array on the symmetric heap.

    Raises:
        As alloc.
    """
    return new_array(shape, dtype, order, align=align, hints=hints, clear=False)


def zeros(shape: Union[int, Sequence[int]], dtype: Any = float, order: str = "C", *,
          align: Optional[int] = None, hints: Optional[int] = None) -> np.ndarray:
    """A zero-filled symmetric array (collective).

    Args:
        shape, dtype, order, align, hints: as new_array.

    Returns:
        A NumPy array on the symmetric heap, zero on every PE before any returns.

    Raises:
        As alloc.
    """
    return new_array(shape, dtype, order, align=align, hints=hints, clear=True)


def ones(shape: Union[int, Sequence[int]], dtype: Any = float, order: str = "C", *,
         align: Optional[int] = None, hints: Optional[int] = None) -> np.ndarray:
    """A symmetric array of ones (collective).

    Args:
        shape, dtype, order, align, hints: as new_array.

    Returns:
        A NumPy array on the symmetric heap, filled on every PE before any returns.

    Raises:
        As alloc.
    """
    return full(shape, 1, dtype, order, align=align, hints=hints)


def full(shape: Union[int, Sequence[int]], fill_value: Number, dtype: Any = None,
         order: str = "C", *, align: Optional[int] = None,
         hints: Optional[int] = None) -> np.ndarray:
    """A symmetric array filled with `fill_value` (collective).

    Args:
        shape: an int or a sequence of ints.
        fill_value: the value.
        dtype: a NumPy dtype (None: fill_value's).
        order, align, hints: as new_array.

    Returns:
        A NumPy array on the symmetric heap, filled on every PE before any returns.

    Raises:
        As alloc.
    """
    if dtype is None:
        dtype = np.array(fill_value).dtype
    a = new_array(shape, dtype, order, align=align, hints=hints, clear=False)
    np.copyto(a, fill_value, casting="unsafe")
    _heap().sync_all()
    return a


# -- remote memory access -----------------------------------------------------------------------
def _rma_pair(target, source, size, tst: int = 1, sst: int = 1, *, put_side: bool):
    """(target tensor, source tensor) of `size` elements for put (target
    symmetric) or get (source symmetric)."""
    _check_array(target, "target", True)
    _check_array(source, "source", False)
    _same_dtype(target, source)
    if put_side:
        t, s = _symmetric(target, "target"), _local(source, "source", False)
    else:
        t, s = _local(target, "target", True), _symmetric(source, "source", False)
    n = _count(size, _ceildiv(target.size, tst), _ceildiv(source.size, sst))
    return t, s, n


def put(target: np.ndarray, source: np.ndarray, pe: int, size: Optional[int] = None,
        ctx: Optional[Ctx] = None) -> None:
    """Copy `source` into symmetric `target` on PE `pe` (shmem_put).

    Args:
        target: a contiguous symmetric array (or slice of one).
        source: a contiguous array of target's dtype.
        pe: the PE to write to.
        size: elements to copy (default: the smaller array's size).
        ctx: a Ctx, or None for the default context.

    Returns:
        None, once `source` may be reused.

    Raises:
        TypeError: not NumPy arrays, or different dtypes.
        ValueError: non-contiguous or read-only target, a bad size or pe.
        FreedTensorError: `target` is not on the symmetric heap.
        PeerTimeoutError: as shmemvm.put.
    """
    t, s, n = _rma_pair(target, source, size, put_side=True)
    _via(ctx).put(t[:n], s[:n], pe)


def get(target: np.ndarray, source: np.ndarray, pe: int, size: Optional[int] = None,
        ctx: Optional[Ctx] = None) -> None:
    """Copy symmetric `source` on PE `pe` into `target` (shmem_get).

    Args:
        target: a contiguous writable array of source's dtype.
        source: a contiguous symmetric array (or slice of one).
        pe: the PE to read from.
        size: elements to copy (default: the smaller array's size).
        ctx: a Ctx, or None for the default context.

    Returns:
        None, once the data is in `target`.

    Raises:
        As put (with source the symmetric array).
    """
    t, s, n = _rma_pair(target, source, size, put_side=False)
    _via(ctx).get(t[:n], s[:n], pe)


def put_nbi(target: np.ndarray, source: np.ndarray, pe: int, size: Optional[int] = None,
            ctx: Optional[Ctx] = None) -> None:
    """put that quiet() completes (shmem_put_nbi).

    Args:
        target, source, pe, size, ctx: as put; `source` must not change until quiet().

    Returns:
        None.

    Raises:
        As put.
    """
    t, s, n = _rma_pair(target, source, size, put_side=True)
    _via(ctx).put_nbi(t[:n], s[:n], pe)


def get_nbi(target: np.ndarray, source: np.ndarray, pe: int, size: Optional[int] = None,
            ctx: Optional[Ctx] = None) -> None:
    """get that quiet() completes (shmem_get_nbi).

    Args:
        target, source, pe, size, ctx: as get; read `target` after quiet().

    Returns:
        None.

    Raises:
        As get.
    """
    t, s, n = _rma_pair(target, source, size, put_side=False)
    _via(ctx).get_nbi(t[:n], s[:n], pe)


def iput(target: np.ndarray, source: np.ndarray, pe: int, tst: int = 1, sst: int = 1,
         size: Optional[int] = None, ctx: Optional[Ctx] = None) -> None:
    """Strided put: target[i*tst] on PE `pe` = source[i*sst] (shmem_iput).

    Args:
        target: a contiguous symmetric array; source: a contiguous array.
        pe: the PE to write to.
        tst, sst: strides in elements (>= 1).
        size: elements to copy (default: as many as both strides allow).
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As put; ValueError for strides < 1.
    """
    t, s, n = _rma_pair(target, source, size, tst, sst, put_side=True)
    _via(ctx).iput(t, s, tst, sst, n, pe)


def iget(target: np.ndarray, source: np.ndarray, pe: int, tst: int = 1, sst: int = 1,
         size: Optional[int] = None, ctx: Optional[Ctx] = None) -> None:
    """Strided get: target[i*tst] = source[i*sst] on PE `pe` (shmem_iget).

    Args:
        target: a contiguous array; source: a contiguous symmetric array.
        pe: the PE to read from.
        tst, sst: strides in elements (>= 1).
        size: elements to copy (default: as many as both strides allow).
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As get; ValueError for strides < 1.
    """
    t, s, n = _rma_pair(target, source, size, tst, sst, put_side=False)
    _via(ctx).iget(t, s, tst, sst, n, pe)


# -- atomics -----------------------------------------------------------------------------------
def _one(a, role: str, writable: bool = True) -> torch.Tensor:
    tensor = _symmetric(a, role, writable)
    if tensor.numel() != 1:
        raise ValueError(f"the {role} must be one element (an array of size 1, e.g. "
                         f"counter[3:4]), got size {tensor.numel()}")
    return tensor


def _fetch(fetch, target, role: str = "target") -> torch.Tensor:
    if not isinstance(fetch, np.ndarray) or fetch.size != 1:
        raise ValueError(f"fetch must be a NumPy array of size 1, got {fetch!r}")
    if isinstance(target, np.ndarray) and fetch.dtype != target.dtype:
        raise TypeError(f"fetch has dtype {fetch.dtype} and the {role} {target.dtype}; "
                        f"they must match")
    return _local(fetch, "fetch", True)


def _amo(name: str, ctx, target, *args, writable: bool = True):
    return getattr(_via(ctx), f"atomic_{name}")(_one(target, "target", writable), *args)


def atomic_set(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` = value, atomically (shmem_atomic_set).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64, float32, float64).
        value: the value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        TypeError, ValueError: as shmemvm.atomic_set; ValueError if target is not size 1.
    """
    _amo("set", ctx, target, value, pe)


def atomic_inc(target: np.ndarray, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` += 1, atomically (shmem_atomic_inc).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo("inc", ctx, target, pe)


def atomic_add(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` += value, atomically (shmem_atomic_add).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        value: the integer to add.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo("add", ctx, target, value, pe)


def atomic_and(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` &= value, atomically (shmem_atomic_and).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo("and", ctx, target, value, pe)


def atomic_or(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` |= value, atomically (shmem_atomic_or).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo("or", ctx, target, value, pe)


def atomic_xor(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` ^= value, atomically (shmem_atomic_xor).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo("xor", ctx, target, value, pe)


def atomic_fetch(source: np.ndarray, pe: int, ctx: Optional[Ctx] = None) -> Number:
    """source on PE `pe`, read atomically (shmem_atomic_fetch).

    Args:
        source: a symmetric array of size 1 (int32, int64, uint64, float32, float64).
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        Its value (int or float).

    Raises:
        As atomic_set.
    """
    return _amo("fetch", ctx, source, pe, writable=False)


def atomic_swap(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> Number:
    """target on PE `pe` = value; the old value (shmem_atomic_swap).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64, float32, float64).
        value: the new value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The value it replaced.

    Raises:
        As atomic_set.
    """
    return _amo("swap", ctx, target, value, pe)


def atomic_compare_swap(target: np.ndarray, cond: Number, value: Number, pe: int,
                        ctx: Optional[Ctx] = None) -> Number:
    """target on PE `pe` = value where it equals `cond`; the old value
    (shmem_atomic_compare_swap).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        cond: the value target must hold for the swap.
        value: the new value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The value target held (== cond where the swap happened).

    Raises:
        As atomic_set.
    """
    return _amo("compare_swap", ctx, target, cond, value, pe)


def atomic_fetch_inc(target: np.ndarray, pe: int, ctx: Optional[Ctx] = None) -> Number:
    """target on PE `pe` += 1; the old value (shmem_atomic_fetch_inc).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo("fetch_inc", ctx, target, pe)


def atomic_fetch_add(target: np.ndarray, value: Number, pe: int,
                     ctx: Optional[Ctx] = None) -> Number:
    """target on PE `pe` += value; the old value (shmem_atomic_fetch_add).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        value: the integer to add.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo("fetch_add", ctx, target, value, pe)


def atomic_fetch_and(target: np.ndarray, value: Number, pe: int,
                     ctx: Optional[Ctx] = None) -> Number:
    """target on PE `pe` &= value; the old value (shmem_atomic_fetch_and).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo("fetch_and", ctx, target, value, pe)


def atomic_fetch_or(target: np.ndarray, value: Number, pe: int,
                    ctx: Optional[Ctx] = None) -> Number:
    """target on PE `pe` |= value; the old value (shmem_atomic_fetch_or).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo("fetch_or", ctx, target, value, pe)


def atomic_fetch_xor(target: np.ndarray, value: Number, pe: int,
                     ctx: Optional[Ctx] = None) -> Number:
    """target on PE `pe` ^= value; the old value (shmem_atomic_fetch_xor).

    Args:
        target: a symmetric array of size 1 (int32, int64, uint64).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo("fetch_xor", ctx, target, value, pe)


def _amo_nbi(name: str, ctx, fetch, target, *args, writable: bool = True) -> None:
    fetched = _fetch(fetch, target)
    getattr(_via(ctx), f"atomic_{name}_nbi")(fetched, _one(target, "target", writable), *args)


def atomic_fetch_nbi(fetch: np.ndarray, source: np.ndarray, pe: int,
                     ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch into `fetch`, complete at quiet() (shmem_atomic_fetch_nbi).

    Args:
        fetch: a local array of size 1 of source's dtype.
        source: a symmetric array of size 1.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None; `fetch` holds the value after quiet().

    Raises:
        As atomic_set; TypeError/ValueError for a bad `fetch`.
    """
    _amo_nbi("fetch", ctx, fetch, source, pe, writable=False)


def atomic_swap_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                    ctx: Optional[Ctx] = None) -> None:
    """atomic_swap whose old value lands in `fetch` at quiet() (shmem_atomic_swap_nbi).

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the new value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi("swap", ctx, fetch, target, value, pe)


def atomic_compare_swap_nbi(fetch: np.ndarray, target: np.ndarray, cond: Number, value: Number,
                            pe: int, ctx: Optional[Ctx] = None) -> None:
    """atomic_compare_swap whose old value lands in `fetch` at quiet()
    (shmem_atomic_compare_swap_nbi).

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        cond: the value target must hold for the swap.
        value: the new value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi("compare_swap", ctx, fetch, target, cond, value, pe)


def atomic_fetch_inc_nbi(fetch: np.ndarray, target: np.ndarray, pe: int,
                         ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_inc whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi("fetch_inc", ctx, fetch, target, pe)


def atomic_fetch_add_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                         ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_add whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the integer to add.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi("fetch_add", ctx, fetch, target, value, pe)


def atomic_fetch_and_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                         ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_and whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi("fetch_and", ctx, fetch, target, value, pe)


def atomic_fetch_or_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                        ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_or whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi("fetch_or", ctx, fetch, target, value, pe)


def atomic_fetch_xor_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                         ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_xor whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi("fetch_xor", ctx, fetch, target, value, pe)


def _amo_name(op) -> str:
    name = str(op).lower()
    if name not in AMO._value2member_map_:
        raise ValueError(f"op must be an AMO value ({', '.join(AMO._value2member_map_)}), "
                         f"got {op!r}")
    return name


def atomic_op(target: np.ndarray, value: Number, op: AMO, pe: int,
              ctx: Optional[Ctx] = None) -> None:
    """Apply AMO `op` with `value` to target on PE `pe` (AMO_INC ignores value).

    Args:
        target: a symmetric array of size 1.
        value: the operand.
        op: an AMO value ("set", "inc", "add", "and", "or", "xor").
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        ValueError: an unknown op; otherwise as atomic_set.
    """
    name = _amo_name(op)
    _amo(name, ctx, target, *(() if name == "inc" else (value,)), pe)


def atomic_fetch_op(target: np.ndarray, value: Number, op: AMO, pe: int,
                    ctx: Optional[Ctx] = None) -> Number:
    """Apply AMO `op` to target on PE `pe`; the old value (AMO_SET swaps).

    Args:
        target: a symmetric array of size 1.
        value: the operand (ignored for AMO_INC).
        op: an AMO value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_op.
    """
    name = _amo_name(op)
    if name == "set":
        return _amo("swap", ctx, target, value, pe)
    return _amo(f"fetch_{name}", ctx, target, *(() if name == "inc" else (value,)), pe)


def atomic_fetch_op_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, op: AMO, pe: int,
                        ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_op whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the operand (ignored for AMO_INC).
        op: an AMO value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_op.
    """
    name = _amo_name(op)
    if name == "set":
        return _amo_nbi("swap", ctx, fetch, target, value, pe)
    return _amo_nbi(f"fetch_{name}", ctx, fetch, target,
                    *(() if name == "inc" else (value,)), pe)


# -- signals ----------------------------------------------------------------------------------
def new_signal() -> np.ndarray:
    """A zeroed symmetric signal variable (collective).

    Returns:
        A uint64 symmetric array of size 1.

    Raises:
        As alloc.
    """
    return zeros(1, np.uint64)


def del_signal(signal: np.ndarray) -> None:
    """Free a signal variable from new_signal (collective).

    Args:
        signal: the array.

    Returns:
        None.

    Raises:
        As free.
    """
    free(signal)


def _sigop(sigop) -> str:
    if isinstance(sigop, bool) or not hasattr(type(sigop), "__index__") or \
            operator.index(sigop) not in tuple(SIGNAL):
        raise ValueError(f"sigop must be SIGNAL_SET or SIGNAL_ADD, got {sigop!r}")
    return "set" if operator.index(sigop) == SIGNAL.SET else "add"


def signal_fetch(signal: np.ndarray) -> int:
    """This PE's signal value, read atomically (shmem_signal_fetch).

    Args:
        signal: a uint64 symmetric array of size 1.

    Returns:
        Its value.

    Raises:
        TypeError, ValueError: not a one-element uint64/int64 symmetric array.
    """
    return _heap().signal_fetch(_one(signal, "signal", writable=False))


def put_signal(target: np.ndarray, source: np.ndarray, pe: int, signal: np.ndarray,
               value: int, sigop: SIGNAL, size: Optional[int] = None,
               ctx: Optional[Ctx] = None) -> None:
    """put, then update `signal` on PE `pe` (shmem_put_signal): whoever sees
    the signal change sees the data.

    Args:
        target, source, pe, size: as put.
        signal: a uint64 symmetric array of size 1.
        value: the signal operand.
        sigop: SIGNAL_SET or SIGNAL_ADD.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As put; ValueError for a bad sigop.
    """
    t, s, n = _rma_pair(target, source, size, put_side=True)
    _via(ctx).put_signal(t[:n], s[:n], _one(signal, "signal"), value, _sigop(sigop), pe)


def put_signal_nbi(target: np.ndarray, source: np.ndarray, pe: int, signal: np.ndarray,
                   value: int, sigop: SIGNAL, size: Optional[int] = None,
                   ctx: Optional[Ctx] = None) -> None:
    """put_signal that quiet() completes (shmem_put_signal_nbi).

    Args:
        target, source, pe, signal, value, sigop, size, ctx: as put_signal.

    Returns:
        None.

    Raises:
        As put_signal.
    """
    t, s, n = _rma_pair(target, source, size, put_side=True)
    _via(ctx).put_signal_nbi(t[:n], s[:n], _one(signal, "signal"), value, _sigop(sigop), pe)


def signal_wait_until(signal: np.ndarray, cmp: CMP, value: Number) -> int:
    """Wait until this PE's signal compares `cmp` to `value` (shmem_signal_wait_until).

    Args:
        signal: a uint64 symmetric array of size 1.
        cmp: a CMP value, "==" and the like, or "eq" and the like.
        value: the integer to compare with.

    Returns:
        The signal's value that satisfied the comparison.

    Raises:
        ValueError: a bad cmp; otherwise as signal_fetch.
    """
    return _heap().signal_wait_until(_one(signal, "signal", writable=False), _cmp(cmp), value)


# -- collectives --------------------------------------------------------------------------------
def barrier_all() -> None:
    """Complete this PE's puts, then wait for every PE (shmem_barrier_all).

    Returns:
        None.

    Raises:
        SymmetryError, PeerTimeoutError: as shmemvm.barrier_all.
    """
    _heap().barrier_all()


def sync_all() -> None:
    """Wait for every PE (shmem_sync_all).

    Returns:
        None.

    Raises:
        SymmetryError, PeerTimeoutError: as shmemvm.sync_all.
    """
    _heap().sync_all()


def sync(team: Optional[Team] = None) -> None:
    """Wait for every PE of `team` (shmem_team_sync; None: all PEs).

    Args:
        team: a Team or None.

    Returns:
        None.

    Raises:
        SymmetryError, PeerTimeoutError: as shmemvm.sync_all.
    """
    if team is not None and not isinstance(team, Team):
        raise TypeError(f"team must be a shmem.Team or None, got {type(team).__name__}")
    (TEAM_WORLD if team is None else team).sync()


def _collective_pair(target, source):
    _same_dtype(_check_array(target, "target", True), _check_array(source, "source", False))
    return _symmetric(target, "target"), _symmetric(source, "source", writable=False)


def broadcast(target: np.ndarray, source: np.ndarray, root: int, size: Optional[int] = None,
              team: Optional[Team] = None) -> None:
    """target on every PE of `team` = source of PE `root` (shmem_broadcast).

    Args:
        target, source: contiguous symmetric arrays of one dtype.
        root: the PE (team-relative) whose source is copied.
        size: elements (default: the smaller array's size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        TypeError, ValueError: bad arrays or sizes.
        SymmetryError: the PEs made different calls.
    """
    t, s = _collective_pair(target, source)
    n = _count(size, t.numel(), s.numel())
    _heap().broadcast(t[:n], s[:n], root, **_team_args(team))


def collect(target: np.ndarray, source: np.ndarray, size: Optional[int] = None,
            team: Optional[Team] = None) -> None:
    """Concatenate every PE's source, whose size may differ by PE, into target
    on every PE (shmem_collect; MPI_Allgatherv).

    Args:
        target: a symmetric array large enough for all of them.
        source: a symmetric array.
        size: this PE's number of elements (default: source's size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        As broadcast.
    """
    t, s = _collective_pair(target, source)
    n = _count(size, s.numel())
    _heap().collect(t, s[:n], **_team_args(team))


def fcollect(target: np.ndarray, source: np.ndarray, size: Optional[int] = None,
             team: Optional[Team] = None) -> None:
    """Concatenate every PE's `size` elements of source into target on every PE
    (shmem_fcollect; MPI_Allgather).

    Args:
        target: a symmetric array of at least size * team size elements.
        source: a symmetric array.
        size: elements per PE, the same on every PE (default: source's size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        As broadcast.
    """
    t, s = _collective_pair(target, source)
    npes = _team_size(team)
    n = _count(size, s.numel(), t.numel() // npes)
    _heap().fcollect(t[:n * npes], s[:n], **_team_args(team))


def alltoall(target: np.ndarray, source: np.ndarray, size: Optional[int] = None,
             team: Optional[Team] = None) -> None:
    """Block j of source on PE i goes to block i of target on PE j
    (shmem_alltoall); a block is `size` elements.

    Args:
        target, source: symmetric arrays of at least size * team size elements.
        size: the block (default: the smaller array's size / team size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        As broadcast.
    """
    t, s = _collective_pair(target, source)
    npes = _team_size(team)
    n = _count(size, t.numel() // npes, s.numel() // npes)
    _heap().alltoall(t[:n * npes], s[:n * npes], **_team_args(team))


def alltoalls(target: np.ndarray, source: np.ndarray, tst: int = 1, sst: int = 1,
              size: Optional[int] = None, team: Optional[Team] = None) -> None:
    """alltoall with element strides (shmem_alltoalls).

    Args:
        target, source: symmetric arrays.
        tst, sst: strides in elements (>= 1).
        size: elements per PE (default: as many as the strides allow).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        As broadcast.
    """
    t, s = _collective_pair(target, source)
    npes = _team_size(team)
    n = _count(size, _ceildiv(t.numel(), tst) // npes, _ceildiv(s.numel(), sst) // npes)
    _heap().alltoalls(t, s, tst, sst, n, **_team_args(team))


def _reduce_name(op) -> str:
    name = str(op).lower()
    if name not in OP._value2member_map_:
        raise ValueError(f"op must be an OP value ({', '.join(OP._value2member_map_)}), "
                         f"got {op!r}")
    return name


def reduce(target: np.ndarray, source: np.ndarray, op: OP = OP_SUM, size: Optional[int] = None,
           team: Optional[Team] = None) -> None:
    """target on every PE of `team` = source of each PE combined elementwise by `op`
    (shmem_<op>_reduce).

    Args:
        target, source: symmetric arrays of one dtype (they may be the same).
        op: an OP value ("sum", "prod", "min", "max", "and", "or", "xor").
        size: elements (default: the smaller array's size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        ValueError: an unknown op; otherwise as broadcast.
    """
    name = _reduce_name(op)
    t, s = _collective_pair(target, source)
    n = _count(size, t.numel(), s.numel())
    _heap().reduce(t[:n], s[:n], name, **_team_args(team))


def _reducer(op: OP):
    def reducer(target: np.ndarray, source: np.ndarray, size: Optional[int] = None,
                team: Optional[Team] = None) -> None:
        reduce(target, source, op, size, team)

    reducer.__name__ = reducer.__qualname__ = f"{op.value}_reduce"
    reducer.__doc__ = f"""reduce with op {op.name} (shmem_{op.value}_reduce).

    Args:
        target, source, size, team: as reduce.

    Returns:
        None.

    Raises:
        As reduce.
    """
    return reducer


and_reduce = _reducer(OP.AND)
or_reduce = _reducer(OP.OR)
xor_reduce = _reducer(OP.XOR)
max_reduce = _reducer(OP.MAX)
min_reduce = _reducer(OP.MIN)
sum_reduce = _reducer(OP.SUM)
prod_reduce = _reducer(OP.PROD)


# -- point-to-point synchronization --------------------------------------------------------------
def _ivars(ivars) -> torch.Tensor:
    return _symmetric(ivars, "ivars", writable=False)


def _status(status):
    return None if status is None else [int(x) for x in np.asarray(status).reshape(-1)]


def _vector(values):
    return [v.item() if hasattr(v, "item") else v for v in np.asarray(values).reshape(-1)]


def wait_until(ivar: np.ndarray, cmp: CMP, value: Number) -> None:
    """Wait until this PE's ivar compares `cmp` to `value` (shmem_wait_until).

    Args:
        ivar: a symmetric array of size 1 (int32, int64, uint64).
        cmp: a CMP value, "==" and the like, or "eq" and the like.
        value: the integer to compare with.

    Returns:
        None.

    Raises:
        TypeError, ValueError: as shmemvm.wait_until.
    """
    _heap().wait_until(_one(ivar, "ivar", writable=False), _cmp(cmp), value)


def wait_until_all(ivars: np.ndarray, cmp: CMP, value: Number,
                   status: Optional[Sequence[int]] = None) -> None:
    """Wait until every element of ivars not excluded by status compares `cmp` to
    `value` (shmem_wait_until_all).

    Args:
        ivars: a contiguous symmetric array (int32, int64, uint64).
        cmp: a CMP value or name.
        value: the integer to compare with.
        status: None, or one int per element (nonzero excludes it).

    Returns:
        None.

    Raises:
        TypeError, ValueError: as shmemvm.wait_until_all.
    """
    _heap().wait_until_all(_ivars(ivars), _cmp(cmp), value, _status(status))


def wait_until_any(ivars: np.ndarray, cmp: CMP, value: Number,
                   status: Optional[Sequence[int]] = None) -> Optional[int]:
    """Wait until some included element satisfies the comparison (shmem_wait_until_any).

    Args:
        ivars, cmp, value, status: as wait_until_all.

    Returns:
        Its index, or None where every element is excluded.

    Raises:
        As wait_until_all.
    """
    return _heap().wait_until_any(_ivars(ivars), _cmp(cmp), value, _status(status))


def wait_until_some(ivars: np.ndarray, cmp: CMP, value: Number,
                    status: Optional[Sequence[int]] = None) -> List[int]:
    """Wait until at least one included element satisfies the comparison
    (shmem_wait_until_some).

    Args:
        ivars, cmp, value, status: as wait_until_all.

    Returns:
        The indices of the elements that satisfied it ([] where all are excluded).

    Raises:
        As wait_until_all.
    """
    return list(_heap().wait_until_some(_ivars(ivars), _cmp(cmp), value, _status(status)))


def wait_until_all_vector(ivars: np.ndarray, cmp: CMP, values: Sequence[Number],
                          status: Optional[Sequence[int]] = None) -> None:
    """Wait until every included ivars[i] compares `cmp` to values[i]
    (shmem_wait_until_all_vector).

    Args:
        ivars, cmp, status: as wait_until_all.
        values: one integer per element.

    Returns:
        None.

    Raises:
        As wait_until_all.
    """
    _heap().wait_until_all_vector(_ivars(ivars), _cmp(cmp), _vector(values), _status(status))


def wait_until_any_vector(ivars: np.ndarray, cmp: CMP, values: Sequence[Number],
                          status: Optional[Sequence[int]] = None) -> Optional[int]:
    """wait_until_any with one value per element (shmem_wait_until_any_vector).

    Args:
        ivars, cmp, values, status: as wait_until_all_vector.

    Returns:
        The index of an element that satisfied it, or None where all are excluded.

    Raises:
        As wait_until_all.
    """
    return _heap().wait_until_any_vector(_ivars(ivars), _cmp(cmp), _vector(values),
                                         _status(status))


def wait_until_some_vector(ivars: np.ndarray, cmp: CMP, values: Sequence[Number],
                           status: Optional[Sequence[int]] = None) -> List[int]:
    """wait_until_some with one value per element (shmem_wait_until_some_vector).

    Args:
        ivars, cmp, values, status: as wait_until_all_vector.

    Returns:
        The indices of the elements that satisfied it.

    Raises:
        As wait_until_all.
    """
    return list(_heap().wait_until_some_vector(_ivars(ivars), _cmp(cmp), _vector(values),
                                               _status(status)))


def test(ivar: np.ndarray, cmp: CMP, value: Number) -> bool:
    """Whether this PE's ivar compares `cmp` to `value` now (shmem_test).

    Args:
        ivar, cmp, value: as wait_until.

    Returns:
        True when it does.

    Raises:
        As wait_until.
    """
    return bool(_heap().test(_one(ivar, "ivar", writable=False), _cmp(cmp), value))


def test_all(ivars: np.ndarray, cmp: CMP, value: Number,
             status: Optional[Sequence[int]] = None) -> bool:
    """Whether every included element satisfies the comparison now (shmem_test_all).

    Args:
        ivars, cmp, value, status: as wait_until_all.

    Returns:
        True when they all do.

    Raises:
        As wait_until_all.
    """
    return bool(_heap().test_all(_ivars(ivars), _cmp(cmp), value, _status(status)))


def test_any(ivars: np.ndarray, cmp: CMP, value: Number,
             status: Optional[Sequence[int]] = None) -> Optional[int]:
    """The index of an included element that satisfies the comparison now
    (shmem_test_any).

    Args:
        ivars, cmp, value, status: as wait_until_all.

    Returns:
        An index, or None.

    Raises:
        As wait_until_all.
    """
    return _heap().test_any(_ivars(ivars), _cmp(cmp), value, _status(status))


def test_some(ivars: np.ndarray, cmp: CMP, value: Number,
              status: Optional[Sequence[int]] = None) -> List[int]:
    """The indices of included elements that satisfy the comparison now
    (shmem_test_some).

    Args:
        ivars, cmp, value, status: as wait_until_all.

    Returns:
        A list of indices (maybe empty).

    Raises:
        As wait_until_all.
    """
    return list(_heap().test_some(_ivars(ivars), _cmp(cmp), value, _status(status)))


def test_all_vector(ivars: np.ndarray, cmp: CMP, values: Sequence[Number],
                    status: Optional[Sequence[int]] = None) -> bool:
    """test_all with one value per element (shmem_test_all_vector).

    Args:
        ivars, cmp, values, status: as wait_until_all_vector.

    Returns:
        True when every included element satisfies its comparison.

    Raises:
        As wait_until_all.
    """
    return bool(_heap().test_all_vector(_ivars(ivars), _cmp(cmp), _vector(values),
                                        _status(status)))


def test_any_vector(ivars: np.ndarray, cmp: CMP, values: Sequence[Number],
                    status: Optional[Sequence[int]] = None) -> Optional[int]:
    """test_any with one value per element (shmem_test_any_vector).

    Args:
        ivars, cmp, values, status: as wait_until_all_vector.

    Returns:
        An index, or None.

    Raises:
        As wait_until_all.
    """
    return _heap().test_any_vector(_ivars(ivars), _cmp(cmp), _vector(values), _status(status))


def test_some_vector(ivars: np.ndarray, cmp: CMP, values: Sequence[Number],
                     status: Optional[Sequence[int]] = None) -> List[int]:
    """test_some with one value per element (shmem_test_some_vector).

    Args:
        ivars, cmp, values, status: as wait_until_all_vector.

    Returns:
        A list of indices (maybe empty).

    Raises:
        As wait_until_all.
    """
    return list(_heap().test_some_vector(_ivars(ivars), _cmp(cmp), _vector(values),
                                         _status(status)))


# -- memory ordering ---------------------------------------------------------------------------
def fence(ctx: Optional[Ctx] = None) -> None:
    """Order puts to each PE (shmem_fence / shmem_ctx_fence).

    Args:
        ctx: a Ctx, or None for the default context.

    Returns:
        None.

    Raises:
        ValueError: an invalid context.
    """
    _via(ctx).fence()


def quiet(ctx: Optional[Ctx] = None) -> None:
    """Complete outstanding operations (shmem_quiet / shmem_ctx_quiet): on `ctx`
    only, where given.

    Args:
        ctx: a Ctx, or None for the default context.

    Returns:
        None.

    Raises:
        ValueError: an invalid context.
    """
    _via(ctx).quiet()


# -- locks ---------------------------------------------------------------------------------------
def new_lock() -> np.ndarray:
    """A cleared symmetric lock (collective).

    Returns:
        An int64 symmetric array of size 1 (OpenSHMEM's `long lock = 0`).

    Raises:
        As alloc.
    """
    return zeros(1, np.int64)


def del_lock(lock: np.ndarray) -> None:
    """Free a lock from new_lock (collective).

    Args:
        lock: the array.

    Returns:
        None.

    Raises:
        As free.
    """
    free(lock)


def _lock(lock) -> torch.Tensor:
    tensor = _one(lock, "lock")
    if tensor.dtype != torch.int64:
        raise TypeError(f"a lock is an int64 symmetric array of size 1 (new_lock()), got "
                        f"dtype {lock.dtype}")
    return tensor


def set_lock(lock: np.ndarray) -> None:
    """Acquire `lock`, waiting for it (shmem_set_lock).

    Args:
        lock: an int64 symmetric array of size 1, zeroed on every PE.

    Returns:
        None, holding the lock.

    Raises:
        TypeError, ValueError: not a lock; PeerTimeoutError as shmemvm.set_lock.
    """
    _heap().set_lock(_lock(lock))


def test_lock(lock: np.ndarray) -> bool:
    """Acquire `lock` only if it is free now (shmem_test_lock).

    Args:
        lock: as set_lock.

    Returns:
        False where this call acquired the lock, True where it was held (as
        shmem4py and OpenSHMEM's 0/1).

    Raises:
        As set_lock.
    """
    return not _heap().test_lock(_lock(lock))


def clear_lock(lock: np.ndarray) -> None:
    """Release `lock`, after completing this PE's puts (shmem_clear_lock).

    Args:
        lock: a lock this PE holds.

    Returns:
        None.

    Raises:
        As set_lock.
    """
    _heap().clear_lock(_lock(lock))


class Lock:
    """A symmetric lock object (collective constructor), usable in `with`."""

    def __init__(self) -> None:
        self._lock: Optional[np.ndarray] = None
        self._lock = new_lock()

    def _array(self) -> np.ndarray:
        if self._lock is None:
            raise ValueError("this Lock was destroyed")
        return self._lock

    def destroy(self) -> None:
        """Free the lock (collective).

        Returns:
            None.

        Raises:
            As free.
        """
        lock, self._lock = self._lock, None
        if lock is not None:
            del_lock(lock)

    def acquire(self, blocking: bool = True) -> bool:
        """Acquire the lock.

        Args:
            blocking: wait for it (True) or only try (False).

        Returns:
            True where this PE now holds it.

        Raises:
            ValueError: the Lock was destroyed.
        """
        if blocking:
            set_lock(self._array())
            return True
        return not test_lock(self._array())

    def release(self) -> None:
        """Release the lock, after completing this PE's puts.

        Returns:
            None.

        Raises:
            ValueError: the Lock was destroyed.
        """
        clear_lock(self._array())

    def __enter__(self) -> "Lock":
        self.acquire()
        return self

    def __exit__(self, *args: Any) -> None:
        self.release()


# -- profiling -----------------------------------------------------------------------------------
def pcontrol(level: int = 1) -> None:
    """Profiling control (shmem_pcontrol): accepted, no effect.

    Args:
        level: an int.

    Returns:
        None.

    Raises:
        TypeError: `level` is not an int.
    """
    info.pcontrol(level)


_initialize()
