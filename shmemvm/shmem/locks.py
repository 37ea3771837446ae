"""Locks of the NumPy face: new_lock/del_lock, set_lock, test_lock,
clear_lock and the Lock object, over openshmem/locks.py (a ticket lock on one
int64 word; the NumPy face gives the word's bytes)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from ..openshmem import locks
from . import arrays, memory


def new_lock() -> np.ndarray:
    """A cleared symmetric lock (collective).

    Returns:
        An int64 symmetric array of size 1 (OpenSHMEM's `long lock = 0`).

    Raises:
        As alloc.
    """
    return memory.zeros(1, np.int64)


def del_lock(lock: np.ndarray) -> None:
    """Free a lock from new_lock (collective).

    Args:
        lock: the array.

    Returns:
        None.

    Raises:
        As free.
    """
    memory.free(lock)


def _word(lock, what: str) -> torch.Tensor:
    """The bytes of a lock (a one-element int64 symmetric array), or a clear error."""
    data = arrays.symmetric_bytes(lock, "lock")
    if lock.dtype.kind != "i" or lock.itemsize != 8 or lock.size != 1:
        raise TypeError(f"{what}: a lock is an int64 symmetric array of size 1 (new_lock()), "
                        f"got dtype {lock.dtype} and size {lock.size}")
    return data


def set_lock(lock: np.ndarray) -> None:
    """Acquire `lock`, waiting for it (shmem_set_lock).

    Args:
        lock: an int64 symmetric array of size 1, zeroed on every PE.

    Returns:
        None, holding the lock.

    Raises:
        TypeError, ValueError: not a lock; PeerTimeoutError as shmemvm.set_lock.
    """
    locks.acquire(arrays.core(), _word(lock, "set_lock"), "set_lock")


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
    return not locks.try_acquire(arrays.core(), _word(lock, "test_lock"), "test_lock")


def clear_lock(lock: np.ndarray) -> None:
    """Release `lock`, after completing this PE's puts (shmem_clear_lock).

    Args:
        lock: a lock this PE holds.

    Returns:
        None.

    Raises:
        As set_lock.
    """
    locks.release(arrays.core(), _word(lock, "clear_lock"), "clear_lock")


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
