"""PNG charts of a host-suite result (matplotlib is imported only here). Every
point is a median (benchmarks/schema.py)."""

from __future__ import annotations

import os

from .names import BARRIER, LOCAL, MPI_GET, MPI_PUT, RAW_BACK, RAW_UNBACK
from .schema import baseline_median, baseline_name, median


def _series(records, name, baseline, key="bytes", **params):
    rows = [r for r in records if r["name"] == name and baseline_name(r) == baseline
            and all(r["params"].get(k) == v for k, v in params.items())]
    rows.sort(key=lambda r: r["params"][key])
    return ([r["params"][key] for r in rows], [median(r) for r in rows],
            [baseline_median(r) for r in rows])


def _size_label(n, _pos=None):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def matplotlib_missing() -> str | None:
    """None where matplotlib can be imported, else a message saying what to install
    (the command lines check this before they measure or read anything)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return (f"--plot needs matplotlib, which cannot be imported here ({exc}); install "
                f"it with: pip install matplotlib (or, from the checkout: pip install "
                f"--no-build-isolation -e \".[bench]\"; an install without -e would replace "
                f"the editable one, and the benchmarks would then measure the pure Python "
                f"paths)")
    return None


def plot_run(doc: dict, directory: str, stem: str | None = None) -> list[str]:
    """Write the charts of one run (the JSON document) into `directory`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    records, n = doc["measurements"], doc["settings"]["n_pes"]
    backend = doc["settings"].get("backend", "host")
    stem = stem or f"{backend}-{n}pe"
    os.makedirs(directory, exist_ok=True)
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    load = doc["machine"]["load_average"]
    fig.suptitle(f"shmemvm {backend} backend, {n} PEs on one machine "
                 f"({doc['machine']['cores']}-core {doc['machine']['cpu']}; load average "
                 f"{load['start'][0]:.1f} -> {load['end'][0]:.1f}; medians; commit "
                 f"{doc['code']['commit'][:10]})", fontsize=10)

    # bandwidth
    ax = axes[0][0]
    sizes, put, local = _series(records, "put.bandwidth", LOCAL)
    if sizes:
        _, get, _ = _series(records, "get.bandwidth", LOCAL)
        _, _, mput = _series(records, "put.bandwidth", MPI_PUT)
        _, _, mget = _series(records, "get.bandwidth", MPI_GET)
        ax.plot(sizes, put, "o-", label="shmemvm put")
        ax.plot(sizes, get, "s-", label="shmemvm get")
        ax.plot(sizes, local, "k--", label="torch copy_ (local)")
        ax.plot(sizes, mput, "^:", label="MPI Put+Flush")
        ax.plot(sizes, mget, "v:", label="MPI Get+Flush")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(_size_label))
        ax.set_xlabel("bytes")
        ax.set_ylabel("GB/s")
        ax.set_title("put/get bandwidth (PE 0 -> PE 1)")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)

        # small-size latency
        ax = axes[0][1]
        small = [i for i, s in enumerate(sizes) if s <= 64 * 1024]
        _, put_us, local_us = _series(records, "put.latency", LOCAL)
        _, get_us, _ = _series(records, "get.latency", LOCAL)
        _, _, mput_us = _series(records, "put.latency", MPI_PUT)
        _, _, mget_us = _series(records, "get.latency", MPI_GET)
        xs = [sizes[i] for i in small]
        for ys, style, label in ((put_us, "o-", "shmemvm put"), (get_us, "s-", "shmemvm get"),
                                 (local_us, "k--", "torch copy_ (local)"),
                                 (mput_us, "^:", "MPI Put+Flush"),
                                 (mget_us, "v:", "MPI Get+Flush")):
            ax.plot(xs, [ys[i] for i in small], style, label=label)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(_size_label))
        ax.set_ylim(bottom=0)
        ax.set_xlabel("bytes")
        ax.set_ylabel("us per call")
        ax.set_title("put/get latency, small sizes")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    else:
        axes[0][0].set_visible(False)
        axes[0][1].set_visible(False)

    # collective latency
    ax = axes[0][2]
    bars = []
    for r in records:
        if r["name"] in ("malloc.latency", "free.latency") and r["params"].get("kind") == "cached" \
                and baseline_name(r) == BARRIER:
            bars.append((f"{r['name'].split('.')[0]} {_size_label(r['params']['bytes'])}",
                         median(r), baseline_median(r)))
    if bars:
        labels = ["MPI.Barrier"] + [b[0] for b in bars]
        values = [min(b[2] for b in bars)] + [b[1] for b in bars]
        colors = ["gray"] + ["tab:blue" if b[0].startswith("malloc") else "tab:orange"
                             for b in bars]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)), labels, rotation=30, fontsize=8, ha="right")
        ax.set_ylabel("us per call (slowest PE)")
        ax.set_title("collective malloc/free, cached size")
        ax.grid(True, axis="y", alpha=0.3)
    else:
        ax.set_visible(False)

    # fresh segments
    ax = axes[1][0]
    fresh, fm, fb = _series(records, "malloc.latency", RAW_BACK, kind="fresh segment")
    if fresh:
        _, ff, fu = _series(records, "free+trim.latency", RAW_UNBACK, kind="fresh segment")
        x = range(len(fresh))
        w = 0.2
        ax.bar([i - 1.5 * w for i in x], fm, w, label="malloc (fresh segment)")
        ax.bar([i - 0.5 * w for i in x], fb, w, label="raw create+map+set_access")
        ax.bar([i + 0.5 * w for i in x], ff, w, label="free + trim")
        ax.bar([i + 1.5 * w for i in x], fu, w, label="raw unmap+release")
        ax.set_xticks(list(x), [_size_label(s) for s in fresh])
        ax.set_yscale("log")
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 30)  # room for the legend above the bars
        ax.set_ylabel("us per call (slowest PE)")
        ax.set_title("fresh segments vs raw backend calls")
        ax.legend(fontsize=7, ncol=2, loc="upper center")
        ax.grid(True, axis="y", alpha=0.3)
    else:
        ax.set_visible(False)

    # live allocations
    ax = axes[1][1]
    live = sorted((r for r in records if r["name"] == "malloc.live_latency"),
                  key=lambda r: r["params"]["live"])
    if live:
        counts = [r["params"]["live"] for r in live]
        ax.plot(counts, [median(r) for r in live], "o-", label="malloc 1 KiB")
        frees = sorted((r for r in records if r["name"] == "free.live_latency"),
                       key=lambda r: r["params"]["live"])
        ax.plot(counts, [median(r) for r in frees], "s-", label="free 1 KiB")
        ax.axhline(median(live[0]) * 1.3, color="red", ls=":", lw=1, label="1.3x malloc at "
                   f"{counts[0]}")
        ax.set_xscale("log")
        top = max([median(r) for r in live + frees] + [median(live[0]) * 1.3])
        ax.set_ylim(0, top * 1.1)
        ax.set_xlabel("live allocations")
        ax.set_ylabel("us per call (slowest PE)")
        ax.set_title("latency vs live allocations")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    else:
        ax.set_visible(False)

    # footprint
    ax = axes[1][2]
    phys = [r for r in records if r["name"] == "footprint.physical_per_requested"]
    used = [r for r in records if r["name"] == "footprint.in_use_per_requested"]
    if phys:
        labels = ["requested\n(peak live)", "shmemvm\nmapped", "shmemvm\nin use", "bump\narena"]
        values = [1.0, median(phys[0]), median(used[0]) if used else 0, baseline_median(phys[0])]
        ax.bar(range(4), values, color=["gray", "tab:blue", "tab:cyan", "tab:red"])
        ax.set_xticks(range(4), labels, fontsize=8)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("physical bytes per requested byte")
        ax.set_title("footprint, transformer training steps")
        ax.grid(True, axis="y", alpha=0.3)
    else:
        ax.set_visible(False)

    fig.tight_layout()
    path = os.path.join(directory, f"{stem}.png")
    _save_small(fig, path)
    plt.close(fig)
    return [path]


def _save_small(fig, path: str) -> None:
    """PNG with a 64-colour palette where Pillow is there (a third of the size)."""
    import io
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=64)
    try:
        from PIL import Image
    except ImportError:
        with open(path, "wb") as out:
            out.write(buffer.getvalue())
        return
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=64).save(path, optimize=True)
