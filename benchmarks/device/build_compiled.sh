#!/usr/bin/env bash
# shmemvm's compiled pieces built in place, for a machine where the package is used
# from its source tree without pip (the device machine: no PyPI there). Run from the
# repository root: meson builds every extension (meson.build) and each is copied
# where the package imports it; where meson fails, gcc builds each module from its
# C file (the one defining PyInit_<name>) and the other C files of its folder.
#
#     bash benchmarks/device/build_compiled.sh        (PY: the Python, python3's)
set -u
PY=${PY:-$(command -v python3)}
rm -rf /tmp/svbuild
MESON=meson; command -v meson >/dev/null || MESON="$PY -m mesonbuild.mesonmain"
if $MESON setup /tmp/svbuild --buildtype=release >/tmp/svbuild.log 2>&1 \
        && $MESON compile -C /tmp/svbuild >>/tmp/svbuild.log 2>&1; then
    # each extension where the package imports it (meson's install path, under shmemvm/)
    $MESON introspect /tmp/svbuild --installed | $PY -c '
import json, shutil, sys
for built, installed in json.load(sys.stdin).items():
    if built.endswith(".so") and "/shmemvm/" in installed:
        dest = "shmemvm/" + installed.split("/shmemvm/", 1)[1]
        shutil.copy(built, dest)
        print("built", dest)'
else
    tail -20 /tmp/svbuild.log
    echo "meson failed: gcc on each module's C file (a file defining PyInit_<name>), with"
    echo "the files of its folder that define none (a module's other sources)"
    for c in shmemvm/native/*.c shmemvm/backends/*.c; do
        dir=$(dirname "$c")
        mod=$(grep -o 'PyInit_[A-Za-z0-9_]*' "$c" | head -1 | cut -c8-)
        [ -n "$mod" ] && gcc -O2 -shared -fPIC -std=c11 -D_GNU_SOURCE $(python3-config --includes) \
            "$c" $(grep -L PyInit_ "$dir"/*.c) -o "$dir/$mod$(python3-config --extension-suffix)" \
            && echo "built $dir/$mod"
    done
fi
