"""`python -m benchmarks check`: the stored results and the figures the docs quote.

  - every JSON under benchmarks/results/ validates against the one schema
    (benchmarks/schema.py), and history results live in results/history/;
  - every path under benchmarks/results/ that README.md or docs/*.md names
    (outside code blocks, and not as a command's --out/--json destination)
    exists, and a JSON one validates;
  - in the README's Performance section every paragraph or table that quotes a
    figure (µs, ms, GB/s, a ratio) names the stored result it comes from, and
    one that names a result of results/history/ says it is history;
  - every figure such a block quotes from results outside history/ is one of
    theirs (a median, a baseline's, a ratio, to the decimals quoted);
  - every stored result outside history/ describes the current code: no file
    under shmemvm/ changed since its commit (`git diff --name-only COMMIT HEAD --
    shmemvm/`; the problem gives the command that makes it again), and the
    host benchmarks' results say which of shmemvm's paths ran (settings.paths).

tests/unit/benchmarks/test_results.py runs the same checks in the
single-process test pass.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

from . import schema

ROOT = schema.ROOT
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
REFERENCE = re.compile(r"benchmarks/results/[\w./*-]+\.(?:json|png|md)")
FIGURE = re.compile(r"\d(?:[\d.,]*\d)?\s*(?:µs|us|ms|GB/s|×|x\b)")
DESTINATION = re.compile(r"(?:--out|--json|--plot|--markdown|>)\s*$")


def stored_results() -> list[str]:
    return sorted(glob.glob(os.path.join(schema.RESULTS, "**", "*.json"), recursive=True))


def check_results() -> list[str]:
    """Every stored result's problems, prefixed with its path."""
    problems = []
    for path in stored_results():
        rel = os.path.relpath(path, ROOT)
        try:
            doc = schema.load(path)
        except (OSError, ValueError) as exc:
            problems.append(f"{rel}: not readable JSON: {exc}")
            continue
        problems += [f"{rel}: {p}" for p in schema.validate(doc, path)]
    return problems


#: the benchmarks whose results record settings.paths (schema.heap_paths)
PATHS_RECORDED = ("host-suite", "host-vs-oshmem")


def stale(doc: dict, root: str = ROOT) -> str | None:
    """Why `doc` is older than the code it describes (files under shmemvm/ changed
    between its commit and HEAD of the checkout at `root`), or None."""
    commit = doc["code"]["commit"]
    try:
        diff = subprocess.run(["git", "-C", root, "diff", "--name-only", commit, "HEAD", "--",
                               "shmemvm/"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot tell whether it is current: git could not be run ({exc!r})"
    if diff.returncode != 0:
        return (f"its commit {commit[:10]} is not in this checkout's history "
                f"({diff.stderr.strip()[:200]}): run again: {doc['command']}")
    changed = diff.stdout.split()
    if not changed:
        return None
    shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
    return (f"made from {commit[:10]}, and shmemvm/ changed since ({shown}): its figures are "
            f"not of the current code; run again: {doc['command']}")


def current_problems(doc: dict, rel: str, root: str | None = ROOT) -> list[str]:
    """A stored result's problems as a description of the current code: stale
    (root None: not asked), or without settings.paths where its benchmark records
    them. History results are old by definition: none."""
    if doc.get("history"):
        return []
    problems = []
    if doc.get("benchmark") in PATHS_RECORDED and not (doc.get("settings") or {}).get("paths"):
        problems.append(f"{rel}: records no settings.paths (which of shmemvm's paths ran: the "
                        f"compiled piece, the agreement's transport); run again: "
                        f"{doc['command']}")
    if root is not None and (why := stale(doc, root)):
        problems.append(f"{rel}: {why}")
    return problems


def check_current() -> list[str]:
    """current_problems() of every stored result (benchmarks/results/, not history/)."""
    problems = []
    for path in stored_results():
        try:
            doc = schema.load(path)
        except (OSError, ValueError):
            continue   # check_results() names it
        if not schema.validate(doc, path):
            problems += current_problems(doc, os.path.relpath(path, ROOT))
    return problems


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def references(doc: str) -> list[tuple[int, str]]:
    """(line, path) of every stored result `doc` names as a source (not as the
    destination of a command)."""
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    found = []
    for number, line in _prose(text):
        for match in REFERENCE.finditer(line):
            if DESTINATION.search(line[:match.start()]):
                continue
            found.append((number, match.group(0)))
    return found


def check_references() -> list[str]:
    problems = []
    for doc in DOCS:
        for number, ref in references(doc):
            paths = glob.glob(os.path.join(ROOT, ref))
            if not paths:
                problems.append(f"{doc}:{number}: names {ref}, which does not exist")
                continue
            for path in paths:
                if path.endswith(".json"):
                    bad = schema.validate(schema.load(path), path)
                    if bad:
                        problems.append(f"{doc}:{number}: {ref} does not validate: {bad[0]}")
    return problems


def _blocks(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Paragraphs and tables (a table with the paragraph before it), as (first line, text)."""
    blocks, current, start = [], [], 0
    for number, line in lines + [(0, "")]:
        if line.strip():
            if not current:
                start = number
            current.append(line)
            continue
        if current:
            text = "\n".join(current)
            is_table = current[0].lstrip().startswith("|")
            if is_table and blocks and not blocks[-1][1].lstrip().startswith("|"):
                first, caption = blocks.pop()
                blocks.append((first, caption + "\n" + text))
            else:
                blocks.append((start, text))
            current = []
    return blocks


def _section(doc: str, section: str) -> list[tuple[int, str]]:
    """(line number, line) of the prose of `doc`'s `section` (a "## " heading)."""
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    chosen, inside = [], False
    for number, line in _prose(text):
        if line.startswith("## "):
            inside = line.strip() == section
            continue
        if inside:
            chosen.append((number, line))
    return chosen


def check_readme_figures(doc: str = "README.md", section: str = "## Performance") -> list[str]:
    """Every block of `section` that quotes a figure names its stored result."""
    problems = []
    for first, block in _blocks(_section(doc, section)):
        if not FIGURE.search(block):
            continue
        refs = REFERENCE.findall(block)
        if not refs:
            problems.append(f"{doc}:{first}: quotes a figure ({FIGURE.search(block).group(0)!r}) "
                            f"but names no stored result (benchmarks/results/...)")
        elif any("/history/" in r for r in refs) and "history" not in \
                REFERENCE.sub("", block).lower():
            problems.append(f"{doc}:{first}: quotes a result of results/history/ without "
                            f"saying it is history")
    return problems


NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
GOAL = re.compile(r"[≥≤<>]\s*$")


def _figures(result: dict) -> dict[str, set]:
    """A result's figures by what a quote of them ends with: times ("µs", "ms";
    its medians and baselines' in us), bandwidths ("GB/s"), and ratios ("×": each
    median/median ratio and its inverse)."""
    found: dict[str, set] = {"µs": set(), "ms": set(), "GB/s": set(), "×": set()}
    for m in result["measurements"]:
        medians = [m["value"].get("median"), ((m.get("baseline") or {}).get("value") or {})
                   .get("median")]
        for value in (v for v in medians if isinstance(v, (int, float)) and v > 0):
            if m["unit"] in ("us", "µs"):
                found["µs"].add(value)
                found["ms"].add(value / 1000)
            elif m["unit"] == "GB/s":
                found["GB/s"].add(value)
        if isinstance(m.get("ratio"), (int, float)) and m["ratio"] > 0:
            found["×"] |= {m["ratio"], 1 / m["ratio"]}
    found["us"], found["x"] = found["µs"], found["×"]
    return found


def _matches(figure: str, candidates: set) -> bool:
    """Whether `figure` ("249", "0.83", "1,221") is one of `candidates` rounded to
    the decimals quoted."""
    digits = figure.replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return any(round(c, decimals) == float(digits) for c in candidates)


def check_quoted_figures(doc: str = "README.md", section: str = "## Performance") -> list[str]:
    """Every figure of a block of `section` that names only current results (not
    history/) is one of theirs of its unit, to the decimals quoted (a median, a
    baseline's median, a ratio or its inverse); a goal (a figure after ≥, ≤, <, >)
    is not a figure of a result. A result made again thus fails the README's old
    figures here until they are copied from it."""
    problems = []
    for first, block in _blocks(_section(doc, section)):
        refs = [r for r in REFERENCE.findall(block) if r.endswith(".json")]
        if not refs or any("/history/" in r for r in refs):
            continue
        candidates: dict[str, set] = {}
        for ref in refs:
            for path in glob.glob(os.path.join(ROOT, ref)):
                for unit, values in _figures(schema.load(path)).items():
                    candidates.setdefault(unit, set()).update(values)
        quoted = REFERENCE.sub("", block)
        for match in FIGURE.finditer(quoted):
            if GOAL.search(quoted[:match.start()]):
                continue
            figure = NUMBER.match(match.group(0))
            unit = match.group(0)[figure.end():].strip() if figure else ""
            if figure and not _matches(figure.group(0), candidates.get(unit, set())):
                problems.append(f"{doc}:{first}: quotes {match.group(0)!r}, which is no figure "
                                f"of {', '.join(refs)} (copy it from the result made again)")
    return problems


def check_files(paths: list[str]) -> list[str]:
    """The problems of the results at `paths` (stored ones or not)."""
    problems = []
    for path in paths:
        try:
            doc = schema.load(path)
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: not readable JSON: {exc}")
            continue
        inside = schema.stored(path)
        problems += [f"{path}: {p}" for p in schema.validate(doc, path if inside else None,
                                                             stored=inside)]
    return problems


def main(argv: list[str]) -> int:
    """With paths: those results; without: every stored result and every docs reference."""
    if argv:
        problems, count = check_files(argv), len(argv)
    else:
        problems = (check_results() + check_references() + check_readme_figures()
                    + check_quoted_figures() + check_current())
        count = len(stored_results())
    for p in problems:
        print(p, file=sys.stderr)
    print(f"{count} results, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0
