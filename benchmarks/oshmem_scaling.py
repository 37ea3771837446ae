"""Issue 30's goal over PE counts, for benchmarks/host_vs_oshmem.py's results.

    - every time at most GOAL_TIME x OSHMEM's, every bandwidth at least
      GOAL_BANDWIDTH x, at every PE count (mark_goal() marks a row of a result's
      summary table);
    - a barrier at the largest PE count at most GOAL_BARRIER_SCALING x one at the
      smallest (16 and 2 PEs in issue 30), for each implementation
      (barrier_scaling() adds it as a measurement: the barrier at the largest
      count, its baseline the barrier at the smallest, measured in the same run);
    - scaling_markdown() and write_scaling_chart(): one table and one chart over
      the results of one run, one result per PE count.

Nothing here launches anything; it reads what host_vs_oshmem.build() made.
"""

from __future__ import annotations

import os

GOAL_TIME = 1.5          # shmemvm's time / OSHMEM's, at most
GOAL_BANDWIDTH = 1.0     # shmemvm's bandwidth / OSHMEM's, at least
GOAL_BARRIER_SCALING = 3.0   # barrier at the largest PE count / at the smallest, at most
IMPLS = {"shmemvm": "shmemvm.shmem", "torch": "shmemvm torch API",
         "oshmem": "shmem4py 1.0 on Open MPI OSHMEM"}


def goal_of(unit: str) -> tuple[str, float]:
    """(comparison, bound) of a row's ratio to OSHMEM: bandwidths ">=", times "<="."""
    return (">=", GOAL_BANDWIDTH) if unit == "GB/s" else ("<=", GOAL_TIME)


def meets(ratio: float | None, unit: str) -> bool | None:
    """Whether a ratio to OSHMEM meets the goal (None: no ratio)."""
    if ratio is None:
        return None
    op, bound = goal_of(unit)
    return ratio >= bound if op == ">=" else ratio <= bound


def mark_goal(row: dict, faces) -> None:
    """The goal and, for each face with a ratio to OSHMEM, whether it meets it."""
    op, bound = goal_of(row["unit"])
    row["goal"] = f"{op} {bound:g}x OSHMEM"
    for impl in faces:
        if f"{impl}_ratio" in row:
            row[f"{impl}_meets_goal"] = meets(row[f"{impl}_ratio"], row["unit"])


def barrier_scaling(run, samples: dict, small: int, large: int) -> dict:
    """Add one measurement per implementation: barrier_all at `large` PEs (µs),
    its baseline the same at `small` PEs; `samples` is {impl: {n_pes: [µs]}}.
    Returns the summary {impl: {ratio, goal, meets_goal, n_pes}}."""
    out = {}
    for impl, by_n in samples.items():
        if not by_n.get(small) or not by_n.get(large):
            continue
        m = run.add("barrier_all scaling", {"face": IMPLS.get(impl, impl), "n_pes": large,
                                            "against_n_pes": small,
                                            "goal": f"<= {GOAL_BARRIER_SCALING:g}"},
                    "us", by_n[large], f"barrier_all at {small} PEs (same run)", by_n[small],
                    "lower")
        ratio = m["ratio"]
        out[impl] = {"n_pes": [small, large], "ratio": ratio,
                     "goal": f"<= {GOAL_BARRIER_SCALING:g}",
                     "meets_goal": None if ratio is None else ratio <= GOAL_BARRIER_SCALING}
    return out


def _cell(ratio: float | None, unit: str) -> str:
    if ratio is None:
        return "n/a"
    ok = "" if meets(ratio, unit) is None else (" ✓" if meets(ratio, unit) else " ✗")
    if unit == "GB/s":
        return f"{ratio:.2f} of it{ok}"
    return (f"{ratio:.2g}×" if ratio >= 1 else f"{1 / ratio:.2g}× faster") + ok


def scaling_markdown(docs: list[dict], impl: str = "shmemvm", label=str) -> str:
    """Issue 30's table over the results `docs` (one per PE count, not split):
    `impl`'s ratio to OSHMEM at each count (✓ where it meets the goal), and
    OSHMEM's figure at each; then the barrier's scaling where measured. `label`
    names an operation from its key."""
    rows = [r for d in docs for r in d["summary"]["table"] if not r["node_split"]]
    counts = sorted({r["n_pes"] for r in rows})
    ops = list(dict.fromkeys(r["operation"] for r in rows))
    by = {(r["operation"], r["n_pes"]): r for r in rows}
    face = IMPLS[impl]
    out = [f"{face} against OSHMEM (ratio of medians; goal: times ≤ {GOAL_TIME:g}×, "
           f"bandwidths ≥ {GOAL_BANDWIDTH:g}×; ✓ met, ✗ not)", "",
           "| operation | " + " | ".join(f"{n} PEs" for n in counts)
           + " | OSHMEM at " + " / ".join(map(str, counts)) + " PEs |",
           "|---|" + "---:|" * len(counts) + "---|"]
    for op in ops:
        cells, peer = [], []
        unit = next(by[(op, n)]["unit"] for n in counts if (op, n) in by)
        for n in counts:
            r = by.get((op, n), {})
            cells.append(_cell(r.get(f"{impl}_ratio"), unit))
            v = r.get("oshmem")
            peer.append("n/a" if v is None else f"{v:.3g}")
        out.append(f"| {label(op)} | " + " | ".join(cells) + f" | {' / '.join(peer)} "
                   f"{'GB/s' if unit == 'GB/s' else 'µs'} |")
    for d in docs:
        for name, s in (d["summary"].get("barrier_scaling") or {}).items():
            small, large = s["n_pes"]
            ratio = "n/a" if s["ratio"] is None else f"{s['ratio']:.2f}"
            met = "met" if s["meets_goal"] else "not met"
            out.append(f"\nbarrier_all at {large} PEs / at {small} PEs, "
                       f"{IMPLS.get(name, name)}: {ratio} (goal {s['goal']}: {met})")
    return "\n".join(out) + "\n"


def write_scaling_chart(docs: list[dict], path: str, label=str) -> bool:
    """Slowdown against OSHMEM over the PE count, one line per operation, a panel
    per face, the goal drawn; and barrier_all's time per implementation over the
    PE count. False (nothing written) without any ratio to OSHMEM. `label` names an
    operation from its key."""
    rows = [r for d in docs for r in d["summary"]["table"] if not r["node_split"]]
    faces = [impl for impl in ("shmemvm", "torch")
             if any(r.get(f"{impl}_ratio") for r in rows)]
    if not faces:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["n_pes"] for r in rows})
    ops = list(dict.fromkeys(r["operation"] for r in rows))
    fig, axes = plt.subplots(1, len(faces) + 1, figsize=(6.5 * (len(faces) + 1), 6.5),
                             squeeze=False)
    colors = plt.get_cmap("tab20").colors
    for ax, impl in zip(axes[0], faces):
        for i, op in enumerate(ops):
            points = [(r["n_pes"], r[f"{impl}_ratio"]) for r in rows
                      if r["operation"] == op and r.get(f"{impl}_ratio")]
            if points:
                xs, ys = zip(*points)
                bandwidth = next(r["unit"] for r in rows if r["operation"] == op) == "GB/s"
                ax.plot(xs, [1 / y if bandwidth else y for y in ys], marker="o",
                        ls="--" if bandwidth else "-", label=label(op),
                        color=colors[i % len(colors)])
        ax.axhline(GOAL_TIME, color="red", ls=":", lw=1, label=f"goal (time): {GOAL_TIME:g}x")
        ax.axhline(1 / GOAL_BANDWIDTH, color="black", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("PEs")
        ax.set_ylabel("slowdown against OSHMEM (median; >1 slower; bandwidth dashed)")
        ax.set_title(IMPLS[impl], fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for impl in ("oshmem", "shmemvm", "torch"):
        points = [(r["n_pes"], r.get(impl)) for r in rows
                  if r["operation"] == "barrier_all" and r.get(impl)]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=IMPLS[impl])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("PEs")
    ax.set_ylabel("barrier_all, µs (median)")
    ax.set_title(f"barrier_all (goal: at {counts[-1]} PEs at most "
                 f"{GOAL_BARRIER_SCALING:g}x at {counts[0]})", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    first = docs[0]
    fig.suptitle(f"shmemvm vs shmem4py on OSHMEM over PE counts, {first['date'][:16]} UTC, "
                 f"commit {(first['code']['commit'] or '?')[:10]}, "
                 f"{first['machine']['cores']} cores", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True
