"""tests/AREAS.md answers "where is X tested" once: every name of the module API
(shmemvm.api.__all__) is in exactly one area, each area names one file, every
file it names exists, and every test file of tests/ is named there (a new file
is placed in the index when it is added)."""

import re

from shmemvm import api
from util import REPO

AREAS = REPO / "tests" / "AREAS.md"
PATH = r"tests/[\w/]+\.py"


def _area_rows() -> list[list[str]]:
    """The API table's rows as cells: area, names, tested in, also."""
    text = AREAS.read_text()
    table = text[text.index("## API areas"):text.index("## Every test file")]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == ["area", "names", "tested in", "also"], rows[0]
    return rows[1:]


def test_every_api_name_is_in_exactly_one_area():
    seen: dict[str, list[str]] = {}
    for area, names, *_ in _area_rows():
        for name in re.findall(r"`([^`]+)`", names):
            seen.setdefault(name, []).append(area)
    twice = {name: areas for name, areas in seen.items() if len(areas) > 1}
    missing = sorted(set(api.__all__) - set(seen))
    assert twice == {} and missing == [], (twice, missing)


def test_each_area_names_one_file():
    rows = _area_rows()
    assert rows
    for area, _, tested_in, _ in rows:
        assert len(re.findall(PATH, tested_in)) == 1, (area, tested_in)


def test_the_index_names_every_test_file_and_only_files_that_exist():
    named = set(re.findall(PATH, AREAS.read_text()))
    files = {str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py")}
    assert sorted(named - files) == [], "tests/AREAS.md names these, which are not there " \
        "(moved or removed: change their names in it)"
    assert sorted(files - named) == [], "tests/AREAS.md does not list these test files: add " \
        "each to its folder's row (and to an area's row where it owns one)"
