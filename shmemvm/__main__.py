"""`python -m shmemvm info`: version, backends available here, and settings."""

from __future__ import annotations

import argparse
import json

from . import __version__, backends, config


def info() -> dict:
    return {
        "version": __version__,
        "backends": {name: backends.available(name) for name in ("host", "cuda", "hip")},
        "settings": {name: {"value": config.setting(name), "default": default, "meaning": meaning}
                     for name, (default, meaning) in config.SETTINGS.items()},
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
    print("backends: " + ", ".join(f"{n} ({'available' if ok else 'not available'})"
                                   for n, ok in data["backends"].items()))
    print("settings (environment variable = value   [default] meaning):")
    for name, entry in data["settings"].items():
        print(f"  {name} = {entry['value']!r:10} [{entry['default']}] {entry['meaning']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
