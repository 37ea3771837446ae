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

from collections.abc import Callable, Mapping

from mpi4py import MPI

from .. import _args
from ..agreement.agreement import Agreement
from ..agreement.protocol import Call, Phase
from ..core.state import Core, FeatureKey
from ..errors import ShmemError, plural
from . import barrier, collectives, contexts
from .group import Group, agreement, same_heap

#: the team configuration keys OpenSHMEM 1.5 defines (shmem_team_config_t)
CONFIG_KEYS = ("num_contexts",)


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
        number = _args.integer(value, f"{role}[{key!r}]")
        if number < 0:
            raise ValueError(f"{role}[{key!r}] must be >= 0, got {number}")
        result[name] = number
    return result


def _agreed(config: dict) -> tuple:
    """A checked configuration as the agreement compares it (sorted pairs)."""
    return tuple(sorted(config.items()))


class Team(Group):
    """A set of PEs of one symmetric heap, numbered 0..n_pes()-1 in the order of
    their heap PE numbers' selection (see split_strided), with collectives over
    its members only (a Group, group.py). Made by heap.team_world(),
    heap.team_shared() and the split methods; compare teams with `is`."""

    def __init__(self, heap: Core, comm: MPI.Comm, pes, agreement: Agreement, *,
                 kind: str, config: dict | None = None):
        super().__init__(heap, comm, pes, agreement, kind=kind)
        self._config = dict(config) if config is not None else _config(None)
        self._contexts: list = []   # the live contexts made from it (a destroyed one leaves)
        #: sync()'s call, made and encoded once (a board step takes its vector as it is),
        #: and its quick step (made at the first sync(); None: none, or not yet)
        self._sync = Call(Phase.TEAM_SYNC, text=f"{self.label}sync()").fixed()
        self._quick_sync: Callable[[], object] | None = None
        self._quick_made = False

    def __repr__(self) -> str:
        state = ", destroyed" if self.destroyed else ""
        return f"<shmemvm.Team: {self.name}, n_pes={len(self.pes)}{state}>"

    # -- queries (local) -----------------------------------------------------------------
    def my_pe(self) -> int:
        """This PE's number in the team.

        Returns:
            0..n_pes()-1.

        Raises:
            ShmemError: the team was destroyed, or the heap finalized.
        """
        self.check_usable()
        return self.me

    def n_pes(self) -> int:
        """The number of PEs in the team.

        Returns:
            An int >= 1.

        Raises:
            ShmemError: the team was destroyed, or the heap finalized.
        """
        self.check_usable()
        return len(self.pes)

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
        _team(self.core, dest_team, "translate_pe: dest_team").check_usable()
        return dest_team.index.get(self.pes[number], -1)

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
                different arguments, config included (nothing was made).
            PeerTimeoutError: a PE did not join within the heap's timeout.
            ShmemError: this team was destroyed, or the heap finalized.
        """
        def check():
            n = len(self.pes)
            first, step, count = (_args.integer(start, "start"), _args.integer(stride, "stride"),
                                  _args.integer(size, "size"))
            text = f"{self.label}split_strided(start={first}, stride={step}, size={count})"
            if step < 1:
                raise ValueError(f"{text}: stride must be >= 1 (OpenSHMEM 1.5)")
            if count < 1:
                raise ValueError(f"{text}: size must be >= 1")
            if not 0 <= first < n:
                raise ValueError(f"{text}: start is out of range: the parent team has "
                                 f"{plural(n, 'PE')} (0..{n - 1})")
            last = first + (count - 1) * step
            if last >= n:
                raise ValueError(f"{text}: the last PE would be {last}, but the parent team has "
                                 f"{plural(n, 'PE')} (0..{n - 1}); at most "
                                 f"{plural((n - 1 - first) // step + 1, 'PE')} fit from start "
                                 f"{first} with stride {step}")
            made = _config(config)   # agreed too: every PE's team has the same config
            return (first, step, count, _agreed(made)), f"{text[:-1]}, config={made})"

        with self.lock:
            self.check_usable()
            first, step, count, made = self.agree_checked(
                Phase.TEAM_SPLIT_STRIDED, f"{self.label}split_strided(start={start!r}, "
                f"stride={stride!r}, size={size!r}, config={config!r})", check)
            members = [first + i * step for i in range(count)]
            return self._split([members], dict(made))

    def split_2d(self, xrange: int, xaxis_config=None, yaxis_config=None) -> tuple[Team | None, Team | None]:
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
            columns = _args.integer(xrange, "xrange")
            text = f"{self.label}split_2d(xrange={columns})"
            if columns < 1:
                raise ValueError(f"{text}: xrange must be >= 1")
            rows = _config(xaxis_config, "xaxis_config")
            cols = _config(yaxis_config, "yaxis_config")
            return (columns, _agreed(rows), _agreed(cols)), \
                f"{text[:-1]}, xaxis_config={rows}, yaxis_config={cols})"

        with self.lock:
            self.check_usable()
            columns, _, _ = self.agree_checked(
                Phase.TEAM_SPLIT_2D, f"{self.label}split_2d(xrange={xrange!r}, xaxis_config="
                f"{xaxis_config!r}, yaxis_config={yaxis_config!r})", check)
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
        self.splits += 1   # (on every member: every member makes every split)
        mine = next((i for i, group in enumerate(groups) if self.me in group), None)
        color = MPI.UNDEFINED if mine is None else mine
        key = 0 if mine is None else groups[mine].index(self.me)
        comm = self.comm.Split(color, key)
        if mine is None:
            return None
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        heap = self.core
        pes = [self.pes[i] for i in groups[mine]]
        made = agreement(heap, comm, "split", self.agreement.key, self.splits, pes)
        parent = self.agreement.board
        if parent is not None and parent.fuses:
            # The parent's steps run on a board in C (the heap's vote, so on every
            # member alike, all on this node): the team's do too, and its small
            # collectives fuse with them (transport/nodecoll.py; issue 30). A
            # collective over the team's communicator, as the split itself.
            board = made.make_board()
            board.use_native()
            made.use_board(board)
        team = Team(heap, comm, pes, made, kind="split", config=config)
        _registry(heap).append(team)
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
            return barrier.sync_all(self.core)
        quick = self._quick_sync   # (the same step, whole in C, where nothing is unusual)
        if quick is None or quick() is None:
            with self.lock:
                self.core.calls.synchronize()   # (step() with the team's one call)
                self.agree(self._sync)
                if not self._quick_made:
                    self._quick_made = True
                    self._quick_sync = self.quick_step(self._sync)

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
        with self.lock:
            self.check_usable()
            for context in list(self._contexts):   # each leaves the list as it is destroyed
                try:
                    context.destroy()
                except ShmemError:  # the user destroyed it already
                    pass
            self.agree(Call(Phase.TEAM_DESTROY, text=f"{self.label}destroy()"))
            self._release()
            registry = _registry(self.core)
            if self in registry:
                registry.remove(self)

    def _release(self) -> None:
        """Mark the team destroyed and free its communicator (not under a broken
        heap: a timed-out request may still be pending on it)."""
        if self.destroyed:
            return
        self.destroyed = True
        self._quick_sync = None
        self._contexts.clear()
        self.core.where.forget()   # (its calls' Plans hold it: let it go)
        if self.kind != "world" and not self.core.calls.broken:
            self.agreement.close()  # its persistent request (not the heap's: world's is)
        if self.kind == "split" and not self.agreement.broken and not self.core.calls.broken:
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
        self.check_usable()
        context = contexts.Ctx(self.core, options, team=self)
        self._contexts.append(context)
        return context

    def forget_ctx(self, context) -> None:
        """`context` (made by create_ctx) was destroyed: the team no longer
        holds it, so contexts made and destroyed leave the team flat."""
        try:
            self._contexts.remove(context)
        except ValueError:   # the team was destroyed (its list cleared) first
            pass

    # -- collectives over the team (collectives.py), team-relative PE numbers ----------------
    def broadcast(self, dest, source, root: int) -> None:
        """heap.broadcast(dest, source, root, team=self): root is a team PE number."""
        collectives.broadcast(self.core, dest, source, root, team=self)

    def collect(self, dest, source) -> None:
        """heap.collect(dest, source, team=self)."""
        collectives.collect(self.core, dest, source, team=self)

    def fcollect(self, dest, source) -> None:
        """heap.fcollect(dest, source, team=self)."""
        collectives.fcollect(self.core, dest, source, team=self)

    def alltoall(self, dest, source) -> None:
        """heap.alltoall(dest, source, team=self)."""
        collectives.alltoall(self.core, dest, source, team=self)

    def alltoalls(self, dest, source, dst: int, sst: int, nelems: int) -> None:
        """heap.alltoalls(dest, source, dst, sst, nelems, team=self)."""
        collectives.alltoalls(self.core, dest, source, dst, sst, nelems, team=self)

    def reduce(self, dest, source, op: str = "sum") -> None:
        """heap.reduce(dest, source, op, team=self)."""
        collectives.reduce(self.core, dest, source, op, team=self)


def _member(heap: Core, team, what: str) -> Team:
    """`team` for a call that needs one: None is OpenSHMEM's SHMEM_TEAM_INVALID,
    what a split returns on the PEs it leaves out."""
    if team is None:
        raise TypeError(f"{what}: team is None (SHMEM_TEAM_INVALID, what a split returns on "
                        f"the PEs that are not members): only a team's members can call this")
    return _team(heap, team, f"{what}: team")


def _team(heap: Core, team, role: str) -> Team:
    """`team` checked to be a Team of `heap` (not only a Group: teams are the
    users' objects)."""
    same_heap(heap, team, role)
    if not isinstance(team, Team):
        raise TypeError(f"{role} must be a shmemvm Team, got {type(team).__name__} {team!r}")
    return team


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


#: this module's per-heap state: the teams made (HeapCore.feature)
TEAMS: FeatureKey[TeamRegistry] = FeatureKey("teams")


def _registry(heap: Core) -> TeamRegistry:
    """This heap's teams (a feature of the heap, closed at its finalize)."""
    return heap.calls.feature(TEAMS, TeamRegistry)


# -- the heap's team functions -----------------------------------------------------------------
def team_world(heap: Core) -> Team:
    """The team of every PE of the heap (OpenSHMEM's SHMEM_TEAM_WORLD); local.

    Returns:
        The same Team object at every call; its PE numbers are the heap's,
        its collectives and sync() are the heap's own (sync_all()).

    Raises:
        ShmemError: the heap is finalized.
    """
    heap.calls.check_usable()
    registry = _registry(heap)
    if registry.world is None:
        registry.world = Team(heap, heap.identity.comm, range(heap.identity.n_pes),
                              heap.calls.agreement, kind="world")
    return registry.world


def team_shared(heap: Core) -> Team:
    """The team of the PEs whose memory this PE maps directly: the PEs of its
    node (of its simulated node under SHMEMVM_NODE_SPLIT), in heap PE order
    (OpenSHMEM's SHMEM_TEAM_SHARED); local.

    Returns:
        The same Team object at every call; its collectives use the node path.

    Raises:
        ShmemError: the heap is finalized.
    """
    heap.calls.check_usable()
    registry = _registry(heap)
    if registry.shared is None:
        registry.shared = Team(heap, heap.identity.node, heap.identity.node_pes,
                               agreement(heap, heap.identity.node, "shared",
                                         tuple(heap.identity.node_pes)),
                               kind="shared")
    return registry.shared


def team_split_strided(heap: Core, parent: Team, start: int, stride: int, size: int,
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


def team_split_2d(heap: Core, parent: Team, xrange: int, xaxis_config=None,
                  yaxis_config=None) -> tuple[Team | None, Team | None]:
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


def team_my_pe(heap: Core, team: Team | None) -> int:
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
    return _team(heap, team, "team_my_pe: team").my_pe()


def team_n_pes(heap: Core, team: Team | None) -> int:
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
    return _team(heap, team, "team_n_pes: team").n_pes()


def team_translate_pe(heap: Core, src_team: Team | None, src_pe: int, dest_team: Team | None) -> int:
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
    return _team(heap, src_team, "team_translate_pe: src_team").translate_pe(src_pe,
                                                                                  dest_team)


def team_sync(heap: Core, team: Team) -> None:
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


def team_destroy(heap: Core, team: Team) -> None:
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
