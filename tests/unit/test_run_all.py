"""What the README says about the test suite is what runs: the skip budget it
quotes is tests/skip_budget's (which tests/run_all.sh enforces), with a line
for each of run_all.sh's phases; CI (.ci/run) runs the README's test command;
and the test files the README and docs/ name are there."""

import re

from util import REPO

BUDGET = REPO / "tests" / "skip_budget"


def _budget() -> dict[str, int]:
    lines = [line.split(None, 2) for line in BUDGET.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return {fields[0]: int(fields[1]) for fields in lines}


def _readme_budget() -> dict[str, int]:
    """The README's table of phases: rows `| \\`phase\\` | command | skips | why |`."""
    rows = re.findall(r"^\| `([\w-]+)` \|[^|\n]*\| (\d+) \|", (REPO / "README.md").read_text(),
                      re.MULTILINE)
    return {phase: int(skips) for phase, skips in rows}


def test_the_readme_quotes_the_skip_budget():
    assert _readme_budget() == _budget()


def test_every_phase_of_run_all_has_a_budget():
    """Each `phase NAME RANKS "${...}"` call of run_all.sh (n$n: the loop over 2, 4)."""
    script = (REPO / "tests" / "run_all.sh").read_text()
    phases = set()
    for name in re.findall(r'\bphase "?([\w$-]+)"? "?[\w$]+"? "\$\{', script):
        phases |= {name.replace("$n", n) for n in "124"}
    assert phases == set(_budget())


def _commands(lines) -> list[str]:
    """Shell lines without their comments, spaces folded; empty ones left out."""
    out = []
    for line in lines:
        command = " ".join(line.split(" #")[0].split())
        if command and not command.startswith("#"):
            out.append(command)
    return out


def _quick_start() -> list[str]:
    """The commands of the README's Quick start (its first code block)."""
    readme = (REPO / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start"):readme.index("## Using it")]
    block = quick_start.split("```bash\n", 1)[1].split("```", 1)[0]
    return _commands(block.splitlines())


def _ci_quick_start() -> list[str]:
    """.ci/run's commands after its line `# Quick start`."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    return _commands(lines[lines.index("# Quick start") + 1:])


def test_ci_runs_the_readmes_test_command():
    commands = [c for c in _quick_start() if c.startswith("tests/")]
    assert commands == ["tests/run_all.sh"]
    assert _ci_quick_start()[-1] == commands[0]


def test_ci_runs_the_quick_start_line_for_line():
    """CI's commands are the Quick start's, all of them and in order (a step only
    CI has, hip-python once, made the README's test command fail its skip budget
    for a reader who followed it): the Quick start alone passes the suite."""
    assert _quick_start()[0].startswith("python3 -m venv .venv")
    assert _ci_quick_start() == _quick_start()


def test_ci_runs_in_a_folder_named_shmemvm():
    """`git clone .../shmemvm` makes a folder named shmemvm, with .venv/ inside:
    CI runs there (a path test that took any /shmemvm/ for the package's once
    failed only so), whatever its own clone is called."""
    script = (REPO / ".ci" / "run").read_text()
    before = script[:script.index("\n# Quick start\n")]
    assert re.search(r'^cd "\$work/shmemvm"$', before, re.MULTILINE), before


def test_the_test_files_the_docs_name_exist():
    """The README and docs/ name test files by path; after a move they must follow."""
    named = set()
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        named |= {(doc.name, path) for path in
                  re.findall(r"\btests/[\w/]+\.(?:py|sh)\b", doc.read_text())}
    missing = sorted(f"{doc}: {path}" for doc, path in named if not (REPO / path).exists())
    assert named and missing == []


def test_ci_installs_as_the_readme_says():
    """CI's pip commands are the quick start's (a step only CI has hides a
    missing one from the README's readers), and both install in place: the
    tests run from the source tree, whose shmemvm/ would hide an installed
    copy and its compiled piece (CI once skipped every native test so)."""
    readme = (REPO / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start"):readme.index("## Using it")]
    pip = [" ".join(line.split("#")[0].split()) for line in quick_start.splitlines()
           if line.startswith("pip install")]
    ci = [" ".join(line.split("#")[0].split())
          for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert pip and all(command in ci for command in pip), (pip, ci)
    assert any(" -e " in command for command in pip)


def test_one_launch_form():
    """README, docs/ and the examples launch a program one way, `mpirun -n N python
    app.py` (the Quick start's): a second form (`python -m mpi4py app.py`) told
    readers one of them was less safe."""
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "examples").rglob("*.py"))]
    found = [f"{path.relative_to(REPO)}: {match}" for path in files
             for match in re.findall(r"python3? -m mpi4py [\w./-]+\.py", path.read_text())]
    assert found == []


def test_every_test_file_has_a_name_of_its_own():
    """pytest imports test files by their base name (the test folders are not
    packages): two files of one name stop the whole phase at collection."""
    names: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


def test_tests_that_start_mpi_jobs_live_in_jobs():
    """A test that starts MPI jobs of its own (through util's mpiexec or run_jobs)
    lives under tests/jobs/, which the `jobs` phase runs: under tests/unit/ it
    would make the one-process phase wait on jobs again (20 such files once
    made 888 s of its 907 s)."""
    found = []
    for path in sorted((REPO / "tests" / "unit").rglob("*.py")):
        found += [f"{path.relative_to(REPO)}: {call}" for call in
                  re.findall(r"\b(?:mpiexec|run_jobs)\(", path.read_text())]
    assert found == []


def _n4_tests() -> list[str]:
    """run_all.sh's N4_TESTS: the files and folders the n4 phase runs."""
    script = (REPO / "tests" / "run_all.sh").read_text()
    block = re.search(r"^N4_TESTS=\(\n(.*?)^\)", script, re.MULTILINE | re.DOTALL)
    assert block, "run_all.sh has no N4_TESTS=( ... ) list"
    return block.group(1).split()


def test_the_n4_phase_runs_what_the_readme_names():
    """The n4 phase runs only the files where 4 PEs prove more than 2 (issue 33,
    item 16: CI's time); the README names them, each is there, and the phase
    runs the list."""
    paths = _n4_tests()
    assert paths and all((REPO / path).exists() for path in paths), paths
    readme = (REPO / "README.md").read_text()
    paragraph = readme[readme.index("At 4 PEs run the files"):]
    paragraph = paragraph[:paragraph.index("Every other file runs")]
    named = set(re.findall(r"`(tests/mpi/[\w/.]+?)/?`", paragraph))
    assert named == {path.rstrip("/") for path in paths}
    script = (REPO / "tests" / "run_all.sh").read_text()
    assert re.search(r'phase n4 4 "\$\{MPI_PYTEST\[@\]\}" "\$\{N4_TESTS\[@\]\}"', script)


def test_every_test_that_needs_more_than_2_pes_runs_at_4():
    """A test that needs 3 or more PEs (mpi min_size) skips at 1 and 2: the n4
    phase must run its file, or it would run nowhere."""
    covered = [REPO / path for path in _n4_tests()]
    missing = []
    for path in sorted((REPO / "tests" / "mpi").rglob("test_*.py")):
        sizes = [int(n) for n in re.findall(r"min_size\s*=\s*(\d+)", path.read_text())]
        if any(n > 2 for n in sizes) and not any(
                path == place or place in path.parents for place in covered):
            missing.append(str(path.relative_to(REPO)))
    assert missing == []
