"""Point-to-point synchronization of the NumPy face: wait_until, test and
their _all/_any/_some (and _vector) forms on symmetric arrays of any integer
type (int8..uint64: 'b', 'h', 'i', 'l', 'q' and their unsigned types).

Each hands openshmem/waits.py the variables' word and bytes (arrays.py): one
variable to wait_for/test_word, a vector (any contiguous array, in memory
order; empty too) to a Condition, waited for or checked there, as the torch
face's are.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch

from ..openshmem import waits
from ..openshmem.words import Word
from . import arrays
from .atomics import element, word_of
from .constants import CMP, Number, cmp_name


def _ivar(ivar, what: str) -> tuple[Word, torch.Tensor]:
    word, where = element(ivar, what, "ivar", writable=False)
    waits.check_word(word, what, "ivar")
    return word, where


def _condition(ivars, cmp, values, status, what: str, vector: bool) -> waits.Condition:
    where = arrays.symmetric_bytes(ivars, "ivars", writable=False)
    word = word_of(ivars.dtype, what, "ivars")
    if vector and isinstance(values, np.ndarray):
        values = values.reshape(-1).tolist()
    if isinstance(status, np.ndarray):
        status = status.reshape(-1).tolist()
    return waits.Condition(arrays.core(), word, where, cmp_name(cmp), values, status, what,
                           vector)


def wait_until(ivar: np.ndarray, cmp: CMP, value: Number) -> None:
    """Wait until this PE's ivar compares `cmp` to `value` (shmem_wait_until).

    Args:
        ivar: a symmetric array of size 1 (any integer type).
        cmp: a CMP value, "==" and the like, or "eq" and the like.
        value: the integer to compare with.

    Returns:
        None.

    Raises:
        TypeError, ValueError: as shmemvm.wait_until.
    """
    word, where = _ivar(ivar, "wait_until")
    waits.wait_for(arrays.core(), word, where, cmp_name(cmp), value, None, "wait_until")


def wait_until_all(ivars: np.ndarray, cmp: CMP, value: Number,
                   status: Optional[Sequence[int]] = None) -> None:
    """Wait until every element of ivars not excluded by status compares `cmp` to
    `value` (shmem_wait_until_all).

    Args:
        ivars: a contiguous symmetric array (any integer type).
        cmp: a CMP value or name.
        value: the integer to compare with.
        status: None, or one int per element (nonzero excludes it).

    Returns:
        None.

    Raises:
        TypeError, ValueError: as shmemvm.wait_until_all.
    """
    c = _condition(ivars, cmp, value, status, "wait_until_all", False)
    waits.wait(arrays.core(), c, "all")


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
    c = _condition(ivars, cmp, value, status, "wait_until_any", False)
    return waits.wait(arrays.core(), c, "any")


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
    c = _condition(ivars, cmp, value, status, "wait_until_some", False)
    return waits.wait(arrays.core(), c, "some")


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
    c = _condition(ivars, cmp, values, status, "wait_until_all_vector", True)
    waits.wait(arrays.core(), c, "all")


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
    c = _condition(ivars, cmp, values, status, "wait_until_any_vector", True)
    return waits.wait(arrays.core(), c, "any")


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
    c = _condition(ivars, cmp, values, status, "wait_until_some_vector", True)
    return waits.wait(arrays.core(), c, "some")


def test(ivar: np.ndarray, cmp: CMP, value: Number) -> bool:
    """Whether this PE's ivar compares `cmp` to `value` now (shmem_test).

    Args:
        ivar, cmp, value: as wait_until.

    Returns:
        True when it does.

    Raises:
        As wait_until.
    """
    word, where = _ivar(ivar, "test")
    return waits.test_word(arrays.core(), word, where, cmp_name(cmp), value, "test")


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
    c = _condition(ivars, cmp, value, status, "test_all", False)
    return waits.check(c, "all")


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
    c = _condition(ivars, cmp, value, status, "test_any", False)
    return waits.check(c, "any")


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
    c = _condition(ivars, cmp, value, status, "test_some", False)
    return waits.check(c, "some")


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
    c = _condition(ivars, cmp, values, status, "test_all_vector", True)
    return waits.check(c, "all")


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
    c = _condition(ivars, cmp, values, status, "test_any_vector", True)
    return waits.check(c, "any")


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
    c = _condition(ivars, cmp, values, status, "test_some_vector", True)
    return waits.check(c, "some")
