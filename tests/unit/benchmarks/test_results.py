"""Every stored benchmark result is of the one schema (benchmarks/schema.py), and
every figure the README and docs quote names one that exists (single process,
no MPI, about a second)."""

from __future__ import annotations

import copy
import os

import pytest

from benchmarks import check, schema

RESULTS = check.stored_results()


def test_there_are_stored_results():
    assert RESULTS, f"no JSON under {schema.RESULTS}"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: os.path.relpath(p, schema.RESULTS))
def test_every_stored_result_validates(path):
    assert schema.validate(schema.load(path), path) == []


def test_results_outside_history_come_from_clean_commits():
    for path in RESULTS:
        doc = schema.load(path)
        if not doc["history"]:
            assert doc["code"]["clean"] or doc["code"]["allow_dirty"], path


def test_every_result_the_docs_name_exists_and_validates():
    assert check.check_references() == []


def test_every_readme_performance_figure_names_its_result():
    assert check.check_readme_figures() == []


def _good() -> dict:
    m = schema.measurement("put.latency", {"bytes": 8}, "us", [2.0, 3.0, 4.0], "MPI Put",
                           [1.0, 1.5, 2.0], "lower")
    return {"schema": schema.SCHEMA, "benchmark": "test", "command": "cmd",
            "date": "2026-12-01T00:00:00+00:00",
            "code": {"commit": "a" * 40, "clean": True, "changed": [], "allow_dirty": False,
                     "shmemvm": None},
            "machine": {"cpu": "x", "cores": 2, "load_average": {"start": [1.0, 1.0, 1.0],
                                                                 "end": [1.0, 1.0, 1.0]}},
            "versions": {"python": "3"}, "settings": {}, "method": "m", "measurements": [m],
            "notes": [], "summary": {}, "history": False}


def test_the_validator_accepts_a_good_result_and_its_ratio_is_median_over_median():
    doc = _good()
    assert schema.validate(doc) == []
    m = doc["measurements"][0]
    assert m["ratio"] == pytest.approx(3.0 / 1.5) and m["ratio_of"] == "median/median"
    assert m["value"] == {"median": 3.0, "min": 2.0, "max": 4.0, "q1": 2.5, "q3": 3.5, "n": 3}


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d["measurements"][0].update(ratio=1.0 / 1.0), "not median/median"),
    (lambda d: d["measurements"][0].update(ratio_of="min/min"), "median with median"),
    (lambda d: d["measurements"][0]["value"].pop("median"), "no median"),
    (lambda d: [d["measurements"][0]["value"].pop(k) for k in ("min", "q1")], "min and max"),
    (lambda d: d["measurements"][0]["value"].update(n=0), "number of samples"),
    (lambda d: d["code"].update(commit="abc1234"), "full 40-digit"),
    (lambda d: d["code"].update(clean=False), "dirty tree without --allow-dirty"),
    (lambda d: d["machine"]["load_average"].update(end=None), "load_average.end"),
    (lambda d: d.update(history=True), "history_reason"),
    (lambda d: d.update(extra=1), "unknown top-level key"),
    (lambda d: d.update(measurements=[]), "non-empty"),
])
def test_the_validator_finds_what_is_wrong(breakage, message):
    doc = copy.deepcopy(_good())
    breakage(doc)
    problems = schema.validate(doc)
    assert any(message in p for p in problems), problems


def test_history_results_belong_in_history(tmp_path):
    doc = _good()
    doc.update(history=True, history_reason="made from a dirty tree")
    outside = os.path.join(schema.RESULTS, "x.json")
    inside = os.path.join(schema.HISTORY, "x.json")
    assert any("belongs in" in p for p in schema.validate(doc, outside))
    assert schema.validate(doc, inside) == []
    doc["history"] = False
    assert any("must be marked history" in p for p in schema.validate(doc, inside))


def test_a_readme_figure_without_its_result_is_found(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text(
        "# x\n\n## Performance\n\nA put takes 3.1 µs.\n\n"
        "A get takes 2 µs (`benchmarks/results/history/a.json`).\n\n"
        "A get takes 2 µs (history: `benchmarks/results/history/a.json`).\n\n"
        "Another table:\n\n| a | b |\n|---|---|\n| 1 µs | 2 µs |\n\n"
        "```\nmpirun ... # 5 µs\n```\n\n## Other\n\n7 µs here is not checked.\n")
    monkeypatch.setattr(check, "ROOT", str(tmp_path))
    problems = check.check_readme_figures()
    assert len(problems) == 3, problems
    assert "README.md:5:" in problems[0] and "names no stored result" in problems[0]
    assert "without saying it is history" in problems[1]
    assert "README.md:11:" in problems[2]   # a table counts with the paragraph before it


def test_check_names_the_problems_of_given_files(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    schema.write(_good(), str(good))
    broken = _good()
    broken["measurements"][0]["ratio_of"] = "min/min"
    schema.write(broken, str(bad))
    assert check.check_files([str(good)]) == []
    problems = check.check_files([str(bad), str(tmp_path / "missing.json")])
    assert len(problems) == 2 and "median with median" in problems[0], problems
    assert check.main([str(good)]) == 0 and check.main([str(bad)]) == 1


def _git(root, *args):
    import subprocess
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


def test_check_finds_a_result_older_than_the_code_it_describes(tmp_path):
    """`python -m benchmarks check` fails on a stored result whose commit is behind
    the code: files under shmemvm/ changed since (git diff --name-only COMMIT HEAD)."""
    (tmp_path / "shmemvm").mkdir()
    (tmp_path / "shmemvm" / "heap.py").write_text("a = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    doc = _good()
    doc["code"]["commit"] = _git(tmp_path, "rev-parse", "HEAD")
    doc["command"] = "mpirun -n 2 python -m benchmarks --json benchmarks/results/x.json"
    assert check.stale(doc, str(tmp_path)) is None
    (tmp_path / "README.md").write_text("docs only\n")        # not code: still current
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "docs")
    assert check.stale(doc, str(tmp_path)) is None
    (tmp_path / "shmemvm" / "heap.py").write_text("a = 2\n")
    _git(tmp_path, "commit", "-q", "-am", "code")
    problem = check.stale(doc, str(tmp_path))
    assert problem and "shmemvm/heap.py" in problem and doc["command"] in problem, problem
    doc["code"]["commit"] = "f" * 40
    assert "not in this checkout's history" in check.stale(doc, str(tmp_path))


def test_check_wants_a_result_to_say_which_paths_ran():
    doc = _good()
    doc["benchmark"] = "host-suite"
    assert any("settings.paths" in p for p in check.current_problems(doc, "x.json", None))
    doc["settings"]["paths"] = {"backend": "host", "compiled_piece": "/x.so", "native": True,
                                "agreement": "board", "atomics": "cpu", "shmemvm": "/x"}
    assert check.current_problems(doc, "x.json", None) == []
    doc["history"] = True        # history results are old by definition
    assert check.current_problems(dict(doc, settings={}), "x.json", None) == []


def test_every_readme_figure_is_one_of_the_result_it_names():
    assert check.check_quoted_figures() == []


def test_a_readme_figure_that_is_not_its_results_is_found(tmp_path, monkeypatch):
    """A figure quoted from a current result must be one of its medians or ratios
    (to the decimals quoted, in its unit): a result made again leaves the old
    figures wrong, and check says which."""
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    schema.write(_good(), str(results / "x.json"))      # put 3.0 us, MPI Put 1.5 us, ratio 2.0
    (tmp_path / "README.md").write_text(
        "# x\n\n## Performance\n\n"
        "A put takes 3.0 µs, 2.0× MPI's 1.5 µs (goal ≤ 3×; `benchmarks/results/x.json`).\n\n"
        "A put takes 3.5 µs, 0.50× (`benchmarks/results/x.json`).\n\n"
        "A put: 2.9 µs (history: `benchmarks/results/history/x.json`).\n")
    monkeypatch.setattr(check, "ROOT", str(tmp_path))
    problems = check.check_quoted_figures()
    assert len(problems) == 1 and "README.md:7:" in problems[0], problems
    assert "'3.5 µs'" in problems[0]           # 0.50x: the inverse of the ratio, accepted
