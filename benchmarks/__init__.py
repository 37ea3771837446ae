"""Benchmarks of shmemvm, each against a baseline measured in the same run.

Run from a checkout's root (the benchmarks are not part of the installed
package; the library keeps only its opt-in step timing, shmemvm/core/profile.py):

    mpirun -n 2 python -m benchmarks [all|putget|malloc|live|footprint ...]
           [--quick] [--json PATH] [--plot DIR] [--allow-dirty]
    python -m benchmarks report RUN.json ... --markdown PATH
    python -m benchmarks host-vs-oshmem [--pes 2,4] [--node-split] [--rounds 3] --json PATH
    python -m benchmarks host-vs-oshmem --pes 2,4,8,16 --rows goal --out-dir DIR
    python -m benchmarks check [RESULT.json ...]
    python benchmarks/bench_alloc.py | bench_gpu.py | bench_triton.py | bench_vs_nvshmem.py

What is here:
    schema.py        the one format of every stored result, and its check
    check.py         stored results and the docs' references to them
    cli.py           the host suite's command line; its families, one module each:
      putget.py        put/get bandwidth and latency vs a local copy and MPI one-sided
      malloc.py        collective malloc/free vs MPI.Barrier and the raw backend calls
      live.py          malloc latency vs the number of live allocations
      footprint.py     physical bytes per requested byte vs a bump allocator
    common.py, names.py   timing loops and the run; the baselines' names
    targets.py, report.py, plot.py   the suite's targets, markdown summary, charts
    host_vs_oshmem.py   issue 24's comparison with shmem4py on Open MPI's OSHMEM,
      shmem4py_ops.py    the one script it runs under each implementation
      oshmem_scaling.py  issue 30's goal over PE counts: marks, the barrier's
                         scaling, the table and chart over the counts
      device/oshmem_scaling.sh   all of it on the 16-core device machine
      device/gpu_tests.sh        the CUDA backend's tests on the device machine
    bench_alloc.py   the allocator alone, in one process
    bench_gpu.py, bench_triton.py, bench_vs_nvshmem.py   two GPUs: put/get and
                     malloc vs raw copies, the device API, NVSHMEM4Py
    results/         stored results (clean commits only); results/history/ older ones

Importing this package imports nothing (MPI starts with benchmarks.cli).
"""
