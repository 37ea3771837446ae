"""Hello, symmetric memory: every PE puts a greeting into its right neighbour's
buffer, then checks with get that its own greeting arrived there.

    mpirun -n 4 python examples/hello.py
"""

import torch

import shmemvm


def main() -> None:
    with shmemvm.init(heap_size="64M") as heap:
        me, n = shmemvm.my_pe(), shmemvm.n_pes()
        right = (me + 1) % n
        inbox = shmemvm.zeros(4, torch.int64)           # the same object on every PE
        greeting = torch.tensor([me, right, n, 42], device=heap.device)

        shmemvm.put(inbox, greeting, right)              # one-sided: right does nothing
        shmemvm.barrier_all()                            # all puts complete and visible

        left = (me - 1) % n
        assert inbox.tolist() == [left, me, n, 42], inbox
        echo = torch.empty(4, dtype=torch.int64)
        shmemvm.get(echo, inbox, right)                  # read it back from the neighbour
        assert echo.tolist() == greeting.tolist(), echo
        direct = shmemvm.ptr(inbox, right)               # or just look: a view of its memory
        reachable = "a direct view" if direct is not None else "MPI only (another node)"
        print(f"PE {me}/{n}: got {inbox.tolist()} from PE {left}; PE {right} is {reachable} "
              f"[{heap.backend.name} backend]")


if __name__ == "__main__":
    main()
