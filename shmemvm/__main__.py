"""`python -m shmemvm info`: version, what it runs on (Python, torch, MPI, NumPy,
Triton, the GPU bindings), backends available here, whether the compiled piece
is built, and settings."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform

from . import backends, config, native
from ._version import __version__

#: distributions whose versions `info` shows (None where not installed)
_DEPENDENCIES = ("torch", "mpi4py", "numpy", "triton", "cuda-bindings", "hip-python")


def _versions() -> dict:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _DEPENDENCIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    try:
        from mpi4py import MPI
        # the first line, its padding collapsed ("MPICH Version:      5.0.2")
        versions["MPI"] = " ".join(MPI.Get_library_version().splitlines()[0].split())
    except Exception as exc:  # noqa: BLE001 - a broken MPI is what info must show
        versions["MPI"] = f"unavailable ({exc})"
    return versions


def _settings() -> dict:
    """config.SETTINGS with each one's value here; a value the table refuses is
    shown with the error it raises (info reports it rather than failing on it)."""
    shown = {}
    for name, entry in config.SETTINGS.items():
        value = config.raw(name)
        try:
            config.setting(name)
            problem = None
        except ValueError as exc:
            problem = str(exc)
        shown[name] = {"value": value, "default": entry.default, "meaning": entry.meaning,
                       "accepted": entry.accepted, "error": problem}
    return shown


def info() -> dict:
    return {
        "version": __version__,
        "versions": _versions(),
        "backends": {name: backends.available(name) for name in ("host", "cuda", "hip")},
        "native": native.built(),
        "settings": _settings(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmemvm")
    parser.add_argument("command", choices=["info"], nargs="?", default="info")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    data = info()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"shmemvm {data['version']}")
    print("running on: " + ", ".join(f"{name} {version or '(not installed)'}"
                                      for name, version in data["versions"].items()))
    print("backends: " + ", ".join(f"{n} ({'available' if ok else 'not available'})"
                                   for n, ok in data["backends"].items()))
    print("compiled piece (CPU atomics and loads, the board): "
          + (f"built ({data['native']})" if data["native"] else
             "not built: the pure Python paths (pip install builds it; a source tree "
             "on sys.path hides an installed copy)"))
    print("settings (environment variable = value   [default] meaning; accepted values):")
    for name, entry in data["settings"].items():
        print(f"  {name} = {entry['value']!r:10} [{entry['default']}] {entry['meaning']}; "
              f"accepts {entry['accepted']}")
        if entry["error"]:
            print(f"    REFUSED: {entry['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
