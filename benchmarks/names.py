"""The host suite's baseline names, shared by the families that measure them and
the report, plot and targets that look them up (without importing MPI)."""

LOCAL = "torch copy_ (local)"
MPI_PUT = "MPI Put+Flush (shared window)"
MPI_GET = "MPI Get+Flush (shared window)"
BARRIER = "MPI.Barrier"
RAW_BACK = "backend create+map+set_access"
RAW_UNBACK = "backend unmap+release"
RAW_CYCLE = "backend create+map+set_access+unmap+release"
