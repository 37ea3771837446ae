"""Every repository path the README and docs/ name exists (issue 33 item 7:
docs/device.md pointed to shmemvm/device_allreduce.py, which never existed)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOTS = ("shmemvm", "tests", "benchmarks", "examples", "docs", "tools")

#: a path that starts at one of ROOTS: letters, digits, _ . - / and a glob's *
#: (a trailing dot or comma is the sentence's, `<...>` or `{...}` a placeholder)
PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w./*-]*[\w*/])" % "|".join(ROOTS))


#: what a command will write, not what the repository holds: `--out PATH`, `# writes PATH`,
#: and anything in benchmarks/out/ (the benchmarks' output folder, ignored by git)
OUTPUT = re.compile(r"(--out[ =]|writes )$")
OUTPUT_FOLDERS = ("benchmarks/out/",)


def named_paths(text: str) -> list[str]:
    """The repository paths `text` names, less the outputs a command writes."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1)
        after = text[match.end():match.end() + 1]
        if after and after in "<{":      # a placeholder follows: tests/mpi/<layer>/
            continue
        if (OUTPUT.search(text[max(0, match.start() - 8):match.start()])
                or path.startswith(OUTPUT_FOLDERS)):
            continue
        found.append(path.rstrip("/"))
    return found


def exists(path: str) -> bool:
    if "*" in path:
        return any(REPO.glob(path))
    return (REPO / path).exists()


def test_the_scan_finds_paths():
    """The scan itself works: it reads paths in the forms the docs write them."""
    text = ("see `shmemvm/node/anchor.py`, tests/mpi/<layer>/, (benchmarks/results/x.json). "
            "and docs/performance.md, shmemvm.core.profile, not/shmemvm/x.py "
            "--out benchmarks/out/y.json # writes benchmarks/results/z.json")
    assert named_paths(text) == ["shmemvm/node/anchor.py", "benchmarks/results/x.json",
                                 "docs/performance.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_doc_names_exists(doc):
    missing = sorted({path for path in named_paths(doc.read_text()) if not exists(path)})
    assert not missing, f"{doc.relative_to(REPO)} names paths that do not exist: {missing}"
