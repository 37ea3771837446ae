"""Teams: OpenSHMEM 1.5 teams as views of ONE symmetric heap over a subset of its PEs.

A team is not a heap of its own: world-allocated symmetric tensors work in
its collectives, and PE numbers in team calls are team-relative (team PE i is
heap PE team.world_pe(i)). Each team has

  - an MPI communicator with its members only, ranked in team order (so the
    MPI path of a collective runs on it and team rank = team PE number);
  - its own agreement (agreement.Agreement over that communicator): every
    team collective starts with one small allreduce among the members only,
    with the heap's deadline; a mismatch raises the same SymmetryError on
    every member. A step that times out breaks the whole heap, as a heap
    collective's does (the late PE may be in any call).

The predefined teams cost nothing to make: team_world() is the heap itself
(its communicator and agreement, so team_world().sync() is sync_all() and a
world-team collective is the heap's), and team_shared() runs over the heap's
node communicator (the PEs whose memory this PE maps directly). Split teams
are made collectively over their parent: one agreed step checks the
arguments on every PE (a bad start/stride/size raises the same ValueError on
every PE), then MPI_Comm_split, which has no nonblocking form, runs at once
after it with nothing in between that can fail or wait (as the heap's own
node split at init). finalize() destroys every team of the heap.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

from mpi4py import MPI

from . import collectives
from ..agreement.protocol import Agreement, Call, Outcome, Phase
from ..errors import ShmemError

#: the team configuration keys OpenSHMEM 1.5 defines (shmem_team_config_t)
CONFIG_KEYS = ("num_contexts",)


def _integer(value, role: str) -> int:
    """`value` as an int (NumPy and other integer types too), or TypeError."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{role} must be an int, got {type(value).__name__} {value!r}")
    try:
        return operator.index(value)
    except TypeError:  # e.g. a float tensor: has __index__, refuses it
        raise TypeError(f"{role} must be an int, got {type(value).__name__} {value!r}") from None


def _config(config, role: str = "config") -> dict:
    """A team configuration: None or a mapping of CONFIG_KEYS to integers >= 0."""
    result = {key: 0 for key in CONFIG_KEYS}
    if config is None:
        return result
    if not isinstance(config, Mapping):
        raise TypeError(f"{role} must be None or a dict such as {{'num_contexts': 2}}, got "
                        f"{type(config).__name__}")
    for key, value in config.items():
        name = str(key).lower()
        if name not in CONFIG_KEYS:
            raise ValueError(f"{role}: unknown team configuration key {key!r}; OpenSHMEM 1.5 "
                             f"defines {', '.join(CONFIG_KEYS)}")
        number = _integer(value, f"{role}[{key!r}]")
        if number < 0:
            raise ValueError(f"{role}[{key!r}] must be >= 0, got {number}")
        result[name] = number
    return result


def _pe_text(pes) -> str:
    """PE numbers for messages: '0, 2, 4' or '0..30 step 2' for long progressions."""
    pes = list(pes)
    if len(pes) > 4:
        step = pes[1] - pes[0]
        if all(b - a == step for a, b in zip(pes, pes[1:])):
            return f"{pes[0]}..{pes[-1]}" + (f" step {step}" if step != 1 else "")
    return ", ".join(map(str, pes))


class Team:
    """A set of PEs of one symmetric heap, numbered 0..n_pes()-1 in the order of
    their heap PE numbers' selection (see split_strided), with collectives over
    its members only. Made by heap.team_world(), heap.team_shared() and the
    split methods; compare teams with `is`."""

    def __init__(self, heap, comm: MPI.Comm, pes, agreement: Agreement, *, kind: str,
                 config: dict | None = None):
        self.heap = heap
        #: the members' communicator, rank i = team PE i
        self.comm = comm
        #: heap PE number of each team PE
        self.pes = tuple(pes)
        self.agreement = agreement
        #: "world", "shared" or "split"
        self.kind = kind
        self.destroyed = False
        self._config = dict(config) if config is not None else _config(None)
        self._index = {pe: i for i, pe in enumerate(self.pes)}
        self._me = self._index[heap.my_pe]
        #: every member on this node: the same answer on every member (see collectives.py)
        self.on_node = set(self.pes) <= set(heap.node_pes)
        self.name = {"world": "the world team", "shared": f"the shared team (PEs "
                     f"{_pe_text(self.pes)})"}.get(kind, f"the team of PEs {_pe_text(self.pes)}")
        #: prefix of call texts in messages ("" for the world team: its calls are the heap's)
        self.label = "" if kind == "world" else f"{self.name}: "
        self._contexts: list = []

    def __repr__(self) -> str:
        state = ", destroyed" if self.destroyed else ""
        return f"<shmemvm.Team: {self.name}, n_pes={len(self.pes)}{state}>"

    # -- state --------------------------------------------------------------------------
    def check_usable(self) -> None:
        """Raise ShmemError where the heap is finalized or broken, or this team destroyed."""
        self.heap._check_usable()
        if self.destroyed:
            raise ShmemError(f"{self.name} was destroyed (destroy() or the heap's finalize()); "
                             f"split a new team from a live one")

    def check_pe(self, pe, role: str = "pe") -> int:
        """A team PE number as an int in 0..n_pes()-1, or TypeError/ValueError."""
        number = _integer(pe, role)
        if not 0 <= number < len(self.pes):
            raise ValueError(f"{role} {number} is out of range: {self.name} has {len(self.pes)} "
                             f"PEs (0..{len(self.pes) - 1}); PE numbers in team calls are "
                             f"team-relative")
        return number

    # -- queries (local) -----------------------------------------------------------------
    def my_pe(self) -> int:
        """This PE's number in the team.

        Returns:
            0..n_pes()-1.

        Raises:
            ShmemError: the team was destroyed, or the heap finalized.
        """
        self.check_usable()
        return self._me

    def n_pes(self) -> int:
        """The number of PEs in the team.

        Returns:
            An int >= 1.

        Raises:
            ShmemError: the team was destroyed, or the heap finalized.
        """
        self.check_usable()
        return len(self.pes)

    def world_pe(self, team_pe: int) -> int:
        """The heap PE number of team PE `team_pe`.

        Args:
            team_pe: a team PE number, 0..n_pes()-1.

        Returns:
            The PE's number in the heap (what put/get/atomics take).

        Raises:
            TypeError: `team_pe` is not an integer.
            ValueError: `team_pe` is out of range.
            ShmemError: the team was destroyed, or the heap finalized.
        """
        self.check_usable()
        return self.pes[self.check_pe(team_pe, "team_pe")]

    def translate_pe(self, pe: int, dest_team: Team | None) -> int:
        """Team PE `pe` of this team as a PE number of `dest_team`.

        Args:
            pe: a PE number of this team, 0..n_pes()-1.
            dest_team: a team of the same heap, or None (OpenSHMEM's
                SHMEM_TEAM_INVALID: the answer is then -1).

        Returns:
            Its number in `dest_team`, or -1 where it is not a member of it.

        Raises:
            TypeError: `pe` is not an integer, or `dest_team` not a Team.
            ValueError: `pe` is out of range, or `dest_team` belongs to another heap.
            ShmemError: either team was destroyed, or the heap finalized.
        """
        self.check_usable()
        number = self.check_pe(pe)
        if dest_team is None:
            return -1
        _same_heap(self.heap, dest_team, "translate_pe: dest_team").check_usable()
        return dest_team._index.get(self.pes[number], -1)

    def get_config(self) -> dict:
        """The configuration the team was made with.

        Returns:
            A dict {"num_contexts": n} (0 where none was given, and for the
            predefined teams).

        Raises:
            ShmemError: the team was destroyed, or the heap finalized.
        """
        self.check_usable()
        return dict(self._config)

    # -- agreed steps over the team's members ------------------------------------------------
    def _guarded(self, step, *args, **kwargs):
        """Run an agreement step; a step that breaks the team's agreement (a
        timeout, PEs out of step) breaks the heap too."""
        try:
            return step(*args, **kwargs)
        finally:
            if self.agreement.broken and self.kind != "world":
                self.heap.agreement.mark_broken(f"{self.name}: {self.agreement.broken}")

    def agree(self, call: Call) -> Outcome:
        """One agreed step among the members (the heap's own agreement for the
        world team, which also releases blocks dropped on every PE)."""
        self.check_usable()
        if self.kind == "world":
            return self.heap.agree(call)
        return self._guarded(self.agreement.collective, call)

    def agree_checked(self, phase: Phase, text: str, check):
        """Agree on the call `phase`: `check()` returns (args, text) or raises a
        local error, which then fails the call on every member (that error where
        every member has it, else SymmetryError). Returns the agreed args."""
        try:
            args, text = check()
            error = None
        except (TypeError, ValueError, ShmemError) as exc:
            args, error = (), exc
        self.agree(Call(phase, args, text, error))
        return args

    def step(self, phase: Phase, text: str) -> None:
        """An internal barrier step of a call, after this PE's device work."""
        self.heap.backend.synchronize()
        self.agree(Call(phase, text=text))

    def wait(self, request: MPI.Request, what: str) -> None:
        """Complete a data step of the team's communicator with the heap's deadline."""
        self._guarded(self.agreement.wait, request,
                      f"{what} (in your collective call #{self.agreement.calls})")

    def allgather(self, phase: Phase, data: bytes, what: str) -> list[bytes]:
        """Every member's `data`, in team order, with the heap's deadline."""
        return self._guarded(self.agreement.allgather_bytes, phase, data, what, self.comm)

    # -- collective team management ----------------------------------------------------------
    def split_strided(self, start: int, stride: int, size: int, config=None) -> Team | None:
        """A new team of the `size` PEs start, start+stride, ..., of this team
        (collective over this team: every member calls it with the same
        start, stride and size).

        Args:
            start: the first PE of the new team, a PE number of this team.
            stride: the step between this team's PE numbers, >= 1 (OpenSHMEM 1.5).
            size: the number of PEs, >= 1; the last, start + (size-1)*stride,
                must be a PE of this team.
            config: None or {"num_contexts": n} (recorded; get_config()).

        Returns:
            The new Team on its members (numbered in the order above), None
            on the other PEs of this team (OpenSHMEM's SHMEM_TEAM_INVALID).

        Raises:
            TypeError: an argument is not an integer, or config not a dict.
            ValueError: start, stride or size out of range (on every PE).
            SymmetryError: the PEs of this team made different calls or passed
                different arguments (nothing was made).
            PeerTimeoutError: a PE did not join within the heap's timeout.
            ShmemError: this team was destroyed, or the heap finalized.
        """
        def check():
            n = len(self.pes)
            first, step, count = (_integer(start, "start"), _integer(stride, "stride"),
                                  _integer(size, "size"))
            text = f"{self.label}split_strided(start={first}, stride={step}, size={count})"
            if step < 1:
                raise ValueError(f"{text}: stride must be >= 1 (OpenSHMEM 1.5)")
            if count < 1:
                raise ValueError(f"{text}: size must be >= 1")
            if not 0 <= first < n:
                raise ValueError(f"{text}: start is out of range: the parent team has {n} PEs "
                                 f"(0..{n - 1})")
            last = first + (count - 1) * step
            if last >= n:
                raise ValueError(f"{text}: the last PE would be {last}, but the parent team has "
                                 f"{n} PEs (0..{n - 1}); at most {(n - 1 - first) // step + 1} "
                                 f"PEs fit from start {first} with stride {step}")
            _config(config)
            return (first, step, count), text

        with self.heap._lock:
            self.check_usable()
            first, step, count = self.agree_checked(
                Phase.TEAM_SPLIT_STRIDED, f"{self.label}split_strided(start={start!r}, "
                f"stride={stride!r}, size={size!r})", check)
            members = [first + i * step for i in range(count)]
            return self._split([members], _config(config))

    def split_2d(self, xrange: int, xaxis_config=None, yaxis_config=None) -> tuple[Team, Team]:
        """Arrange this team's PEs in a grid of `xrange` columns, row by row
        (PE i at column i % xrange, row i // xrange), and make a team of each
        row and one of each column (collective over this team).

        Args:
            xrange: the number of columns, >= 1; one larger than n_pes() is
                taken as n_pes() (OpenSHMEM 1.5). The last row may be short.
            xaxis_config, yaxis_config: None or {"num_contexts": n} for the
                row and the column teams.

        Returns:
            (xaxis_team, yaxis_team): this PE's row (its team PE number is its
            column) and its column (its team PE number is its row). Every PE
            is in one of each.

        Raises:
            TypeError: xrange is not an integer, or a config not a dict.
            ValueError: xrange < 1 (on every PE).
            SymmetryError: the PEs of this team made different calls or passed
                different arguments (nothing was made).
            PeerTimeoutError: a PE did not join within the heap's timeout.
            ShmemError: this team was destroyed, or the heap finalized.
        """
        def check():
            columns = _integer(xrange, "xrange")
            text = f"{self.label}split_2d(xrange={columns})"
            if columns < 1:
                raise ValueError(f"{text}: xrange must be >= 1")
            _config(xaxis_config, "xaxis_config")
            _config(yaxis_config, "yaxis_config")
            return (columns,), text

        with self.heap._lock:
            self.check_usable()
            (columns,) = self.agree_checked(Phase.TEAM_SPLIT_2D,
                                            f"{self.label}split_2d(xrange={xrange!r})", check)
            n = len(self.pes)
            columns = min(columns, n)
            rows = [list(range(start, min(start + columns, n))) for start in range(0, n, columns)]
            cols = [list(range(start, n, columns)) for start in range(columns)]
            xaxis = self._split(rows, _config(xaxis_config, "xaxis_config"))
            yaxis = self._split(cols, _config(yaxis_config, "yaxis_config"))
            return xaxis, yaxis

    def _split(self, groups: list[list[int]], config: dict) -> Team | None:
        """MPI_Comm_split of this team into `groups` (lists of this team's PE
        numbers, disjoint): this PE's new team, or None where it is in none.
        Right after an agreed step: every member is here or on its way."""
        mine = next((i for i, group in enumerate(groups) if self._me in group), None)
        color = MPI.UNDEFINED if mine is None else mine
        key = 0 if mine is None else groups[mine].index(self._me)
        comm = self.comm.Split(color, key)
        if mine is None:
            return None
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        heap = self.heap
        team = Team(heap, comm, [self.pes[i] for i in groups[mine]],
                    Agreement(comm, heap.timeout, heap.my_pe), kind="split", config=config)
        team.agreement.initialized = True
        heap._teams.append(team)
        return team

    def sync(self) -> None:
        """Wait for every PE of the team (collective over the team; OpenSHMEM's
        shmem_team_sync). This PE's own stores are complete first, device work
        included, as for sync_all(); outstanding puts are not (quiet() does).
        On the world team it is sync_all().

        Returns:
            None.

        Raises:
            SymmetryError: some member is in another call on this team.
            PeerTimeoutError: a member did not arrive within the heap's
                timeout; the heap is unusable afterwards.
            ShmemError: the team was destroyed, or the heap finalized.
        """
        if self.kind == "world":
            self.check_usable()
            return self.heap.sync_all()
        with self.heap._lock:
            self.step(Phase.TEAM_SYNC, f"{self.label}sync()")

    def destroy(self) -> None:
        """Destroy the team (collective over the team): contexts made from it
        are destroyed first, then its communicator is freed; later use of the
        team raises ShmemError. Teams split from it live on.

        Returns:
            None.

        Raises:
            ShmemError: a predefined team (world, shared), or one already
                destroyed, or the heap is finalized.
            SymmetryError: some member is in another call on this team (the
                team stays usable).
            PeerTimeoutError: a member did not arrive within the heap's timeout.
        """
        if self.kind != "split":
            raise ShmemError(f"{self.name} is predefined; it lives as long as the heap and "
                             f"cannot be destroyed")
        with self.heap._lock:
            self.check_usable()
            for context in self._contexts:
                try:
                    context.destroy()
                except ShmemError:  # the user destroyed it already
                    pass
            self.agree(Call(Phase.TEAM_DESTROY, text=f"{self.label}destroy()"))
            self._release()
            if self in self.heap._teams:
                self.heap._teams.remove(self)

    def _release(self) -> None:
        """Mark the team destroyed and free its communicator (not under a broken
        heap: a timed-out request may still be pending on it)."""
        if self.destroyed:
            return
        self.destroyed = True
        self._contexts.clear()
        if self.kind != "world" and not self.heap._broken:
            self.agreement.close()  # its persistent request (not the heap's: world's is)
        if self.kind == "split" and not self.agreement.broken and not self.heap._broken:
            self.comm.Free()

    def create_ctx(self, options: int = 0):
        """A communication context on this team's heap whose PE numbers are
        team-relative (shmem_team_create_ctx); destroyed with the team.

        Args:
            options: contexts.CTX_SERIALIZED / CTX_PRIVATE / CTX_NOSTORE, or'ed.

        Returns:
            A contexts.Ctx.

        Raises:
            ShmemError: the team was destroyed, or the heap finalized.
        """
        from . import contexts   # the contexts module builds on teams, not the other way

        self.check_usable()
        context = contexts.Ctx(self.heap, options, team=self)
        self._contexts.append(context)
        return context

    # -- collectives over the team (collectives.py), team-relative PE numbers ----------------
    def broadcast(self, dest, source, root: int) -> None:
        """heap.broadcast(dest, source, root, team=self): root is a team PE number."""
        collectives.broadcast(self.heap, dest, source, root, team=self)

    def collect(self, dest, source) -> None:
        """heap.collect(dest, source, team=self)."""
        collectives.collect(self.heap, dest, source, team=self)

    def fcollect(self, dest, source) -> None:
        """heap.fcollect(dest, source, team=self)."""
        collectives.fcollect(self.heap, dest, source, team=self)

    def alltoall(self, dest, source) -> None:
        """heap.alltoall(dest, source, team=self)."""
        collectives.alltoall(self.heap, dest, source, team=self)

    def alltoalls(self, dest, source, dst: int, sst: int, nelems: int) -> None:
        """heap.alltoalls(dest, source, dst, sst, nelems, team=self)."""
        collectives.alltoalls(self.heap, dest, source, dst, sst, nelems, team=self)

    def reduce(self, dest, source, op: str = "sum") -> None:
        """heap.reduce(dest, source, op, team=self)."""
        collectives.reduce(self.heap, dest, source, op, team=self)


def _same_heap(heap, team, role: str) -> Team:
    if not isinstance(team, Team):
        raise TypeError(f"{role} must be a shmemvm Team, got {type(team).__name__} {team!r}")
    if team.heap is not heap:
        raise ValueError(f"{role} is {team.name} of another symmetric heap; teams are views of "
                         f"the heap they were made from")
    return team


def resolve(heap, team, what: str) -> Team:
    """The team a call runs over: `team`, or the world team for None."""
    if team is None:
        return team_world(heap)
    _same_heap(heap, team, f"{what}: team").check_usable()
    return team


def _member(heap, team, what: str) -> Team:
    """`team` for a call that needs one: None is OpenSHMEM's SHMEM_TEAM_INVALID,
    what a split returns on the PEs it leaves out."""
    if team is None:
        raise TypeError(f"{what}: team is None (SHMEM_TEAM_INVALID, what a split returns on "
                        f"the PEs that are not members): only a team's members can call this")
    return _same_heap(heap, team, f"{what}: team")


class TeamRegistry(list):
    """The split teams of one heap that are not destroyed yet, and its two
    predefined teams once asked for."""

    world: Team | None = None
    shared: Team | None = None

    def close(self) -> None:
        """Destroy every team (the heap's finalize)."""
        for team in (*self, self.world, self.shared):
            if team is not None:
                team._release()
        self.clear()


# -- the heap's team functions (bound as SymmetricHeap methods in heap.py) -------------------
def team_world(heap) -> Team:
    """The team of every PE of the heap (OpenSHMEM's SHMEM_TEAM_WORLD); local.

    Returns:
        The same Team object at every call; its PE numbers are the heap's,
        its collectives and sync() are the heap's own (sync_all()).

    Raises:
        ShmemError: the heap is finalized.
    """
    heap._check_usable()
    registry = heap._teams
    if registry.world is None:
        registry.world = Team(heap, heap.comm, range(heap.n_pes), heap.agreement, kind="world")
    return registry.world


def team_shared(heap) -> Team:
    """The team of the PEs whose memory this PE maps directly: the PEs of its
    node (of its simulated node under SHMEMVM_NODE_SPLIT), in heap PE order
    (OpenSHMEM's SHMEM_TEAM_SHARED); local.

    Returns:
        The same Team object at every call; its collectives use the node path.

    Raises:
        ShmemError: the heap is finalized.
    """
    heap._check_usable()
    registry = heap._teams
    if registry.shared is None:
        agreement = Agreement(heap.node, heap.timeout, heap.my_pe)
        agreement.initialized = True
        registry.shared = Team(heap, heap.node, heap.node_pes, agreement, kind="shared")
    return registry.shared


def team_split_strided(heap, parent: Team, start: int, stride: int, size: int,
                       config=None) -> Team | None:
    """parent.split_strided(start, stride, size, config) (collective over `parent`).

    Args:
        parent: the team to split (team_world() for all PEs).
        start: the first PE of the new team, a PE number of `parent`.
        stride: the step between `parent`'s PE numbers, >= 1.
        size: the number of PEs, >= 1.
        config: None or {"num_contexts": n}.

    Returns:
        The new Team on its members, None on the other PEs of `parent`.

    Raises:
        TypeError: `parent` is None (this PE is in no team to split) or not a
            Team, or an argument is not an integer.
        ValueError: start, stride or size out of range (on every PE), or
            `parent` is of another heap.
        SymmetryError: the PEs made different calls or passed different arguments.
        PeerTimeoutError: a PE did not join within the heap's timeout.
        ShmemError: `parent` was destroyed, or the heap finalized.
    """
    return _member(heap, parent, "team_split_strided").split_strided(start, stride, size, config)


def team_split_2d(heap, parent: Team, xrange: int, xaxis_config=None,
                  yaxis_config=None) -> tuple[Team, Team]:
    """parent.split_2d(xrange, xaxis_config, yaxis_config) (collective over `parent`).

    Args:
        parent: the team to split.
        xrange: the number of columns of the grid, >= 1 (n_pes() where larger).
        xaxis_config: None or {"num_contexts": n} for the row teams.
        yaxis_config: None or {"num_contexts": n} for the column teams.

    Returns:
        (xaxis_team, yaxis_team): this PE's row and column teams.

    Raises:
        TypeError: `parent` is None or not a Team, or xrange not an integer.
        ValueError: xrange < 1 (on every PE), or `parent` is of another heap.
        SymmetryError: the PEs made different calls or passed different arguments.
        PeerTimeoutError: a PE did not join within the heap's timeout.
        ShmemError: `parent` was destroyed, or the heap finalized.
    """
    return _member(heap, parent, "team_split_2d").split_2d(xrange, xaxis_config, yaxis_config)


def team_my_pe(heap, team: Team | None) -> int:
    """This PE's number in `team`; local.

    Args:
        team: a Team of this heap, or None (SHMEM_TEAM_INVALID).

    Returns:
        0..n_pes-1, or -1 for None (as OpenSHMEM's shmem_team_my_pe).

    Raises:
        TypeError: `team` is not a Team.
        ValueError: `team` is of another heap.
        ShmemError: `team` was destroyed, or the heap finalized.
    """
    if team is None:
        return -1
    return _same_heap(heap, team, "team_my_pe: team").my_pe()


def team_n_pes(heap, team: Team | None) -> int:
    """The number of PEs in `team`; local.

    Args:
        team: a Team of this heap, or None (SHMEM_TEAM_INVALID).

    Returns:
        An int >= 1, or -1 for None (as OpenSHMEM's shmem_team_n_pes).

    Raises:
        TypeError: `team` is not a Team.
        ValueError: `team` is of another heap.
        ShmemError: `team` was destroyed, or the heap finalized.
    """
    if team is None:
        return -1
    return _same_heap(heap, team, "team_n_pes: team").n_pes()


def team_translate_pe(heap, src_team: Team | None, src_pe: int, dest_team: Team | None) -> int:
    """PE `src_pe` of `src_team` as a PE number of `dest_team`; local.

    Args:
        src_team: a Team of this heap, or None (SHMEM_TEAM_INVALID).
        src_pe: a PE number of `src_team`.
        dest_team: a Team of this heap, or None.

    Returns:
        Its number in `dest_team`; -1 where it is not a member of it, or
        either team is None (as OpenSHMEM's shmem_team_translate_pe).

    Raises:
        TypeError: a team is not a Team, or `src_pe` not an integer.
        ValueError: `src_pe` is out of range, or a team is of another heap.
        ShmemError: a team was destroyed, or the heap finalized.
    """
    if src_team is None:
        return -1
    return _same_heap(heap, src_team, "team_translate_pe: src_team").translate_pe(src_pe,
                                                                                  dest_team)


def team_sync(heap, team: Team) -> None:
    """team.sync(): wait for every PE of `team` (collective over `team`).

    Args:
        team: a Team of this heap that this PE is a member of.

    Returns:
        None.

    Raises:
        TypeError: `team` is None (this PE is not a member) or not a Team.
        ValueError: `team` is of another heap.
        SymmetryError: some member is in another call on this team.
        PeerTimeoutError: a member did not arrive within the heap's timeout.
        ShmemError: `team` was destroyed, or the heap finalized.
    """
    _member(heap, team, "team_sync").sync()


def team_destroy(heap, team: Team) -> None:
    """team.destroy(): free a split team (collective over `team`).

    Args:
        team: a split Team of this heap that this PE is a member of.

    Returns:
        None.

    Raises:
        TypeError: `team` is None (this PE is not a member) or not a Team.
        ValueError: `team` is of another heap.
        ShmemError: `team` is predefined or already destroyed, or the heap finalized.
        SymmetryError: some member is in another call on this team.
        PeerTimeoutError: a member did not arrive within the heap's timeout.
    """
    _member(heap, team, "team_destroy").destroy()
