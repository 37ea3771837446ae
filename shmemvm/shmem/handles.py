"""shmem4py's Team and Ctx: handles to the heap's teams and communication
contexts (shmemvm.Team and shmemvm.Ctx, made by openshmem/teams.py and
contexts.py), not a second implementation of them. They are one module
because each makes the other (Team.create_ctx, Ctx.get_team).

TEAM_WORLD and TEAM_SHARED name the current default heap's predefined teams,
CTX_DEFAULT its default context (the heap itself), so they survive finalize()
and init(); a split or create gives a handle to the new shmemvm.Team or Ctx.
An invalid handle (TEAM_INVALID, CTX_INVALID, Team(), Ctx(), a destroyed
handle, a split this PE is not in) is falsy, equal to every invalid handle,
and raises RuntimeError (ShmemError) when used. destroy() leaves the module's
constants as they are; on any other handle it destroys what the handle names
(a split team, a created context) and makes the handle invalid.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from ..core.state import Context
from ..errors import ShmemError
from ..openshmem import contexts, rma, teams
from . import arrays


class Predefined:
    """What TEAM_WORLD, TEAM_SHARED and CTX_DEFAULT name: the team or context of
    that name of whichever heap is the default one."""

    def __init__(self, name: str):
        self.name = name

    def team(self) -> teams.Team:
        """The team this names on the default heap."""
        heap = arrays.heap()
        return {"world": heap.team_world, "shared": heap.team_shared}[self.name]()

    def __repr__(self) -> str:
        return self.name


WORLD = Predefined("world")
SHARED = Predefined("shared")


class Team:
    """A team of PEs (shmem4py's Team): TEAM_WORLD, TEAM_SHARED, or one made by
    split_strided/split_2d; a falsy Team is invalid (OpenSHMEM's
    SHMEM_TEAM_INVALID: a destroyed team, or a split this PE is not in).

    Args:
        team: None (an invalid team), another Team (a copy of its handle), or a
            shmemvm.Team.
    """

    def __init__(self, team: Any = None) -> None:
        if isinstance(team, Team):
            self._team = team._team
        elif team is None or isinstance(team, (Predefined, teams.Team)):
            self._team = team
        else:
            raise TypeError(f"Team() takes None, a Team or a shmemvm.Team, got "
                            f"{type(team).__name__}")

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Team):
            return NotImplemented
        return self._team is other._team

    def __hash__(self) -> int:
        return id(self._team)

    def __bool__(self) -> bool:
        return self._team is not None

    def __repr__(self) -> str:
        return f"<shmemvm.shmem.Team {self._team if self._team is not None else 'invalid'}>"

    def __enter__(self) -> "Team":
        return self

    def __exit__(self, *args: Any) -> None:
        self.destroy()

    def destroy(self) -> None:
        """Destroy the team (collective over it; shmem_team_destroy) and make this
        handle invalid. TEAM_WORLD and TEAM_SHARED themselves stay as they are;
        another handle to a predefined team just becomes invalid.

        Returns:
            None.

        Raises:
            ShmemError: as shmemvm.Team.destroy.
        """
        if self is TEAM_WORLD or self is TEAM_SHARED or self._team is None:
            return
        team, self._team = self._team, None
        if isinstance(team, teams.Team) and team.kind == "split":
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
            ValueError, TypeError: bad arguments (on every PE, as shmemvm's
                team_split_strided).
            SymmetryError: the PEs of this team asked for different splits.
        """
        parent = resolve(self)
        if size is None:
            size = 1   # a bad start or stride is then what the split reports, on every PE
            if type(start) is int and type(stride) is int and stride >= 1:
                size = max(1, len(range(start, parent.n_pes(), stride)))
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
        x, y = resolve(self).split_2d(xrange, xaxis_config, yaxis_config)
        return Team(x), Team(y)

    def get_config(self) -> Dict[str, int]:
        """The team's settings (shmem_team_get_config).

        Returns:
            A dict, e.g. {"num_contexts": 0}.

        Raises:
            ShmemError: the team is invalid.
        """
        return dict(resolve(self).get_config())

    def my_pe(self) -> int:
        """This PE's number in the team (shmem_team_my_pe).

        Returns:
            0..n_pes()-1.

        Raises:
            ShmemError: the team is invalid.
        """
        return resolve(self).my_pe()

    def n_pes(self) -> int:
        """The number of PEs in the team (shmem_team_n_pes).

        Returns:
            An int >= 1.

        Raises:
            ShmemError: the team is invalid.
        """
        return resolve(self).n_pes()

    def translate_pe(self, pe: Optional[int] = None, team: Optional["Team"] = None) -> int:
        """PE `pe` of this team as numbered in `team` (shmem_team_translate_pe).

        Args:
            pe: a PE of this team; None: this PE.
            team: the team to translate to; None: TEAM_WORLD.

        Returns:
            Its number in `team`, or -1 where it is not a member (or `team` is invalid).

        Raises:
            ShmemError: this team is invalid.
            ValueError: `pe` is out of range.
        """
        source = resolve(self)
        dest = TEAM_WORLD if team is None else team
        if not isinstance(dest, Team):
            raise TypeError(f"team must be a shmem.Team or None, got {type(dest).__name__}")
        return source.translate_pe(source.my_pe() if pe is None else pe,
                                   resolve(dest) if dest else None)

    def create_ctx(self, options: int = 0):
        """A context whose PE numbers are this team's (shmem_team_create_ctx).

        Args:
            options: CTX flags or 0.

        Returns:
            The new Ctx (shmem.Ctx).

        Raises:
            ShmemError: the team is invalid; ValueError: bad options.
        """
        return Ctx(resolve(self).create_ctx(int(options)))

    def sync(self) -> None:
        """Wait for every PE of the team (collective over it; shmem_team_sync).

        Returns:
            None.

        Raises:
            SymmetryError, PeerTimeoutError: as shmemvm.Team.sync.
        """
        resolve(self).sync()


TEAM_WORLD = Team(WORLD)
TEAM_SHARED = Team(SHARED)
TEAM_INVALID = Team(None)


def resolve(team: Team) -> teams.Team:
    """The shmemvm.Team a handle stands for, or ShmemError (a RuntimeError) where
    the handle is invalid."""
    handle = team._team
    if handle is None:
        raise ShmemError("this team is invalid (TEAM_INVALID: destroyed, or a split this PE "
                         "is not a member of)")
    return handle.team() if isinstance(handle, Predefined) else handle


def of_collective(team: Optional[Team]) -> Optional[teams.Team]:
    """The team a collective runs over: None for every PE (None or TEAM_WORLD)."""
    if team is None:
        return None
    if not isinstance(team, Team):
        raise TypeError(f"team must be a shmem.Team or None, got {type(team).__name__}")
    handle = team._team
    if handle is WORLD:
        return None
    if type(handle) is teams.Team:   # (a split team: resolve()'s answer, a frame sooner)
        return handle
    return resolve(team)


def size_of(team: Optional[Team]) -> int:
    """The number of PEs of a collective's team."""
    handle = of_collective(team)
    return arrays.heap().n_pes if handle is None else handle.n_pes()


# -- contexts -----------------------------------------------------------------------------------
class Ctx:
    """A communication context (shmem4py's Ctx); CTX_DEFAULT is the heap's own.
    A falsy Ctx is invalid (destroyed, or CTX_INVALID).

    Args:
        ctx: None (an invalid context), another Ctx (a copy of its handle), or
            a shmemvm.Ctx.
    """

    def __init__(self, ctx: Any = None) -> None:
        if isinstance(ctx, Ctx):
            self._ctx = ctx._ctx
        elif ctx is None or ctx is DEFAULT or isinstance(ctx, contexts.Ctx):
            self._ctx = ctx
        else:
            raise TypeError(f"Ctx() takes None, a Ctx or a shmemvm.Ctx, got "
                            f"{type(ctx).__name__}")

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Ctx):
            return NotImplemented
        return self._ctx is other._ctx

    def __hash__(self) -> int:
        return id(self._ctx)

    def __bool__(self) -> bool:
        return self._ctx is not None

    def __repr__(self) -> str:
        state = "invalid" if self._ctx is None else "default" if self._ctx is DEFAULT else \
            "created"
        return f"<shmemvm.shmem.Ctx {state}>"

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
            ValueError: bad options; ShmemError: an invalid team.
        """
        handle = of_collective(team)
        if handle is not None:
            return Ctx(handle.create_ctx(int(options)))
        return Ctx(arrays.heap().ctx_create(int(options)))

    def destroy(self) -> None:
        """Complete this context's operations and invalidate this handle
        (shmem_ctx_destroy). CTX_DEFAULT and CTX_INVALID stay as they are.

        Returns:
            None.

        Raises:
            ShmemError: as shmemvm.Ctx.destroy.
        """
        if self is CTX_DEFAULT or self._ctx is None:
            return
        ctx, self._ctx = self._ctx, None
        if isinstance(ctx, contexts.Ctx):
            ctx.destroy()

    def get_team(self) -> Team:
        """The team of this context (shmem_ctx_get_team).

        Returns:
            A Team handle; TEAM_WORLD's for CTX_DEFAULT and for contexts made
            without a team.

        Raises:
            ShmemError: the context is invalid.
        """
        handle = context(self)
        team = handle.team if isinstance(handle, contexts.Ctx) else None
        if team is None or team.kind == "world":
            return Team(TEAM_WORLD)
        return Team(team)

    def fence(self) -> None:
        """Order this context's puts to each PE (shmem_ctx_fence).

        Returns:
            None.

        Raises:
            ShmemError: the context is invalid.
        """
        complete(context(self), "fence")

    def quiet(self) -> None:
        """Complete this context's outstanding operations (shmem_ctx_quiet).

        Returns:
            None.

        Raises:
            ShmemError: the context is invalid.
        """
        complete(context(self), "quiet")


#: the default context's handle: the default heap itself (its own default context)
DEFAULT = Predefined("default")
CTX_DEFAULT = Ctx(DEFAULT)
CTX_INVALID = Ctx(None)


def context(ctx: Optional[Ctx]) -> Context:
    """What carries an operation on `ctx`: the heap (None, CTX_DEFAULT) or the
    shmemvm.Ctx; ShmemError where the handle is invalid."""
    if ctx is None:
        return arrays.core()
    if not isinstance(ctx, Ctx):
        raise TypeError(f"ctx must be a shmem.Ctx or None, got {type(ctx).__name__}")
    handle = ctx._ctx
    if handle is None:
        raise ShmemError("this context is invalid (CTX_INVALID or destroyed)")
    return arrays.core() if handle is DEFAULT else handle


def complete(handle: Context, how: str) -> None:
    """fence() or quiet() (`how`) on what context() gave: a Ctx's own, or the
    default context's (openshmem/rma.py)."""
    if isinstance(handle, contexts.Ctx):
        getattr(handle, how)()
    else:
        getattr(rma, how)(handle)
