"""The host-side performance targets, evaluated on a run's records."""

from __future__ import annotations

from .malloc import BARRIER
from .putget import LOCAL, MPI_PUT


def evaluate(records: list[dict]) -> list[dict]:
    """One entry per target that the records can answer:
    {target, ratio, limit, better, status, detail}."""
    results = []

    def add(target, ratio, limit, better, detail):
        ok = ratio >= limit if better == "higher" else ratio <= limit
        results.append({"target": target, "ratio": ratio, "limit": limit, "better": better,
                        "status": "PASS" if ok else "MISS", "detail": detail})

    def find(name, baseline, **params):
        return [r for r in records if r["name"] == name and r["baseline_name"] == baseline
                and all(r["params"].get(k) == v for k, v in params.items())]

    bw = [r for op in ("put", "get") for r in find(f"{op}.bandwidth", LOCAL)
          if r["params"]["bytes"] >= 1 << 20]
    if bw:
        worst = min(bw, key=lambda r: r["ratio"])
        add("put/get >= 1 MiB: bandwidth >= 0.8x local copy", worst["ratio"], 0.8, "higher",
            f"worst {worst['name'].split('.')[0]} of {worst['params']['bytes']} B: "
            f"{worst['value']:.3g} vs {worst['baseline_value']:.3g} GB/s")
    lat = find("put.latency", MPI_PUT, bytes=8)
    if lat:
        r = lat[0]
        add("put of 8 B: latency <= 2x MPI Put+Flush", r["ratio"], 2.0, "lower",
            f"{r['value']:.3g} vs {r['baseline_value']:.3g} us")
    cached = [r for r in find("malloc.latency", BARRIER, kind="cached")]
    if cached:
        worst = max(cached, key=lambda r: r["ratio"])
        add("malloc of a cached size: latency <= 3x MPI.Barrier", worst["ratio"], 3.0, "lower",
            f"worst {worst['params']['bytes']} B: {worst['value']:.3g} vs "
            f"{worst['baseline_value']:.3g} us")
    live = [r for r in records if r["name"] == "malloc.live_latency"]
    if live:
        top = max(live, key=lambda r: r["params"]["live"])
        if top["params"]["live"] > min(r["params"]["live"] for r in live):
            add(f"malloc with {top['params']['live']} live allocations: <= 1.3x "
                f"{top['baseline_name']}", top["ratio"], 1.3, "lower",
                f"{top['value']:.3g} vs {top['baseline_value']:.3g} us")
    return results


def format_results(results: list[dict], n_pes: int) -> str:
    lines = [f"targets at {n_pes} PEs:"]
    for r in results:
        sign = ">=" if r["better"] == "higher" else "<="
        lines.append(f"  {r['status']}  {r['target']}: ratio {r['ratio']:.3g} "
                     f"(needs {sign} {r['limit']:g}; {r['detail']})")
    return "\n".join(lines)
