"""Exceptions raised by shmemvm. Every message says what was asked, what was
found and what to change. And Attempts, for releasing what must all be tried."""


class ShmemError(RuntimeError):
    """Base class of shmemvm's errors."""


class HeapExhaustedError(ShmemError):
    """The physical budget (heap size) cannot hold the request."""


class SymmetryError(ShmemError):
    """PEs made different collective calls, or the same call with different arguments."""


class PeerTimeoutError(ShmemError):
    """A peer did not take part in a collective within the configured time."""


class PeerDeadError(ShmemError):
    """A wait cannot end because a PE that could end it is dead (on the node: its
    process is gone; off the node: it has not answered for the timeout) or has
    left the heap (its heap broke or closed), and no other PE can: raised on
    every PE that waits (issue 25)."""


class DeadlockError(ShmemError):
    """Every PE waits (wait_until and its family, signal_wait_until, set_lock)
    and nothing has changed for the heap's timeout, so no wait can end: raised
    on every PE, naming each PE's wait."""


class UnsupportedError(ShmemError):
    """The backend cannot do what was asked (for example import foreign memory)."""


class NotSymmetricError(ShmemError, ValueError):
    """A tensor (or NumPy array) that is not a live symmetric one of this heap
    was used as one. Raised as itself for memory that never was this heap's
    (a local tensor, memory of another allocator or another heap); raised as
    its subclass FreedTensorError for this heap's memory that was freed. So
    `except NotSymmetricError` catches both, `except FreedTensorError` only
    the freed case. Docstrings name NotSymmetricError wherever either can be
    raised."""


class FreedTensorError(NotSymmetricError):
    """A NotSymmetricError for a tensor of this heap whose block was freed (by
    free() or realloc()), or a view of one, or a tensor made from an address
    inside the heap that is no live allocation."""


class ResourceLimitError(ShmemError):
    """A per-process or system limit that segments use up was reached: file
    descriptors (RLIMIT_NOFILE, fs.file-max) or memory mappings
    (vm.max_map_count). The message names the limit and the settings that
    lower the heap's use of it; the call was undone on every PE."""


class Attempts:
    """Steps that must all run whatever fails (unmapping and releasing what the
    allocator already forgot): attempt() runs one and keeps the first failure,
    raise_first() raises it once every step was tried."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        self.failure: Exception | None = None

    def attempt(self, step, *args) -> Exception | None:
        """step(*args); its failure (also kept, if the first), or None."""
        try:
            step(*args)
        except Exception as exc:  # noqa: BLE001 - raised by raise_first, after the rest
            self.failure = self.failure or exc
            return exc
        return None

    def raise_first(self) -> None:
        if self.failure is not None:
            raise self.failure


# -- message text ------------------------------------------------------------------------
def plural(count: int, noun: str) -> str:
    """'1 PE', '2 PEs': a count and its noun, agreeing."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def clip(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: whole, or cut at the last word
    boundary that leaves room for ' ...' (mid-word only where one word is
    longer than the room), for another error's text embedded in a message."""
    text = str(text)
    if len(text) <= limit:
        return text
    room = max(0, limit - 4)
    cut = text[:room]
    if text[room] != " " and " " in cut:
        cut = cut[:cut.rindex(" ")]
    return cut.rstrip() + " ..."
