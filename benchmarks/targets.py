"""The host-side performance targets, evaluated on a run's measurements
(each ratio is a median over the baseline's median, as measured)."""

from __future__ import annotations

from .names import BARRIER, LOCAL, MPI_PUT
from .schema import baseline_median, baseline_name, median


def evaluate(records: list[dict]) -> list[dict]:
    """One entry per target that the measurements can answer:
    {target, ratio, limit, better, status, detail}."""
    results = []

    def add(target, ratio, limit, better, detail):
        ok = ratio >= limit if better == "higher" else ratio <= limit
        results.append({"target": target, "ratio": ratio, "limit": limit, "better": better,
                        "status": "PASS" if ok else "MISS", "detail": detail})

    def find(name, baseline, **params):
        return [r for r in records if r["name"] == name and baseline_name(r) == baseline
                and all(r["params"].get(k) == v for k, v in params.items())]

    bw = [r for op in ("put", "get") for r in find(f"{op}.bandwidth", LOCAL)
          if r["params"]["bytes"] >= 1 << 20]
    if bw:
        worst = min(bw, key=lambda r: r["ratio"])
        add("put/get >= 1 MiB: bandwidth >= 0.8x local copy", worst["ratio"], 0.8, "higher",
            f"worst {worst['name'].split('.')[0]} of {worst['params']['bytes']} B: "
            f"{median(worst):.3g} vs {baseline_median(worst):.3g} GB/s")
    lat = find("put.latency", MPI_PUT, bytes=8)
    if lat:
        r = lat[0]
        add("put of 8 B: latency <= 2x MPI Put+Flush", r["ratio"], 2.0, "lower",
            f"{median(r):.3g} vs {baseline_median(r):.3g} us")
    cached = [r for r in find("malloc.latency", BARRIER, kind="cached")]
    if cached:
        worst = max(cached, key=lambda r: r["ratio"])
        add("malloc of a cached size: latency <= 3x MPI.Barrier", worst["ratio"], 3.0, "lower",
            f"worst {worst['params']['bytes']} B: {median(worst):.3g} vs "
            f"{baseline_median(worst):.3g} us")
    live = [r for r in records if r["name"] == "malloc.live_latency"]
    if live:
        top = max(live, key=lambda r: r["params"]["live"])
        if top["params"]["live"] > min(r["params"]["live"] for r in live):
            add(f"malloc with {top['params']['live']} live allocations: <= 1.3x "
                f"{baseline_name(top)}", top["ratio"], 1.3, "lower",
                f"{median(top):.3g} vs {baseline_median(top):.3g} us")
    return results


def format_results(results: list[dict], n_pes: int) -> str:
    lines = [f"targets at {n_pes} PEs:"]
    for r in results:
        sign = ">=" if r["better"] == "higher" else "<="
        lines.append(f"  {r['status']}  {r['target']}: ratio {r['ratio']:.3g} "
                     f"(needs {sign} {r['limit']:g}; {r['detail']})")
    return "\n".join(lines)
