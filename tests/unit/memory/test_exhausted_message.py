"""HeapExhaustedError says why a request that looks as if it fits does not:
requests round up to a power of two, and the heap size that would hold it
(issue 33 item 10: three 300 MiB tensors in a 1 GiB heap got "it does not fit")."""

import pytest

from shmemvm import HeapExhaustedError
from shmemvm.memory.buddy import Pow2Allocator

MiB, GiB = 1 << 20, 1 << 30


def test_three_300_mib_requests_in_a_1_gib_heap_say_the_rounding_and_the_size_needed():
    allocator = Pow2Allocator(GiB, 64 << 10, 4 * GiB, 64, 16 * MiB)
    allocator.allocate(300 * MiB)
    allocator.allocate(300 * MiB)
    with pytest.raises(HeapExhaustedError) as info:
        allocator.allocate(300 * MiB)
    message = str(info.value)
    assert "round up to a power of two" in message, message
    assert "300 MiB -> 512 MiB" in message, message
    # 1 GiB held by the two 512 MiB blocks, plus this one's 512 MiB
    assert "a heap size of at least 1.5 GiB" in message, message
    assert "SHMEMVM_HEAP_SIZE" in message and "heap_size=" in message, message


def test_a_request_larger_than_the_heap_says_the_size_it_needs():
    allocator = Pow2Allocator(GiB, 64 << 10, 4 * GiB, 64, 16 * MiB)
    with pytest.raises(HeapExhaustedError) as info:
        allocator.allocate(1200 * MiB)
    message = str(info.value)
    assert "1.172 GiB -> 2 GiB" in message and "exceeds the whole heap" in message, message
    assert "a heap size of at least 2 GiB" in message, message


def test_a_power_of_two_request_does_not_talk_of_rounding():
    allocator = Pow2Allocator(GiB, 64 << 10, 4 * GiB, 64, 16 * MiB)
    allocator.allocate(GiB)
    with pytest.raises(HeapExhaustedError) as info:
        allocator.allocate(GiB)
    message = str(info.value)
    assert "round up" not in message and "a heap size of at least 2 GiB" in message, message
