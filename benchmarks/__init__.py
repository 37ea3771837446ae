"""Benchmarks of shmemvm, each against a baseline measured in the same run.

Run from a checkout's root (the benchmarks are not part of the installed
package):

    mpirun -n 2 python -m benchmarks [all|putget|malloc|live|footprint ...]
           [--quick] [--json PATH] [--plot DIR]
    python -m benchmarks report RUN.json ... --markdown PATH

Families (one module each): putget (bandwidth/latency vs a local copy and MPI
one-sided on a shared window), malloc (collective malloc/free vs MPI.Barrier
and the raw backend calls), live (malloc latency vs live allocations),
footprint (physical bytes per requested byte vs a bump allocator).
Records are {name, params, value, unit, baseline_name, baseline_value, ratio};
PE 0 prints and writes, and logs progress on stderr.

Importing this package imports nothing (MPI starts with benchmarks.cli).
"""
