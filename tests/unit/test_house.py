"""The house as built: the package's layers (shmemvm/__init__.py draws them)
import only downward, no import circle, no module uses another module's
private names, and no library file grows past 1,000 lines.

Read from the source with `ast`, imports inside functions included: a
lazy import is an import all the same."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "shmemvm"

#: the layers, lowest first: a module may import from its own layer and below
LAYERS = [
    {"errors", "config", "_version", "_docs", "vocabulary"},
    {"backends"},
    {"_args", "thread_levels", "native"},
    {"memory"},
    {"agreement"},
    {"node"},
    {"transport"},
    {"core"},
    {"openshmem"},
    {"heap"},
    {"device"},
    {"api"},
    {"shmem", "rc", "triton", "__main__", "__init__"},
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}

#: private names of other libraries that the library uses on purpose, and why
FOREIGN_PRIVATES = {
    "_C": "torch._C._storage_Use_Count: how many references hold a storage (ownership.py)",
    "_cdata": "a torch storage's handle, for that count",
    "_shmemvm_freed": "the mark the heap leaves on a tensor it freed (its own attribute)",
    "_exit": "os._exit: global_exit must not run exit handlers",
    "_value2member_map_": "enum's lookup of a value, for messages",
    "_getframe": "sys._getframe",
    "_count": "_thread._count(): the interpreter's count of its threads, also those "
              "`threading` does not list (agreement/process.py)",
    "_cuda_isCurrentStreamCapturing": "torch._C's test for a CUDA graph capture in progress",
    "_replace": "a NamedTuple's copy with fields changed (a public method, underscored)",
    "_autograd": "torch._C._autograd._profiler_enabled: whether a torch profiler records "
                 "(core/trace.py; the flag record_function checks, with no public name)",
    "_profiler_enabled": "that flag",
    "_is_profiler_enabled": "torch.autograd.profiler's Python-level copy of that flag, "
                            "read by core/trace.py's wrappers at every call (a few ns)",
}


def _modules() -> dict[str, Path]:
    """Every module of the package: its Python files, and its compiled ones (by
    their C source, which has no imports to read)."""
    found = {}
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.c")]:
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(("shmemvm",) + parts)] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> list[str]:
    """The shmemvm modules a `from ... import ...` reaches."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if node.level:
        base = package.split(".")
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("shmemvm"):
        return []
    reached = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        reached.append(sub if sub in MODULES else target)
    return reached


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        edges = graph.setdefault(module, set())
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                edges.update(_resolve(module, path, node))
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names
                             if alias.name.startswith("shmemvm"))
    return graph


GRAPH = _imports()


def test_every_layer_is_named():
    assert {_layer(module) for module in MODULES} <= set(RANK), \
        {_layer(module) for module in MODULES} - set(RANK)


def test_imports_point_down():
    upward = []
    for module, targets in GRAPH.items():
        for target in targets:
            if target == "shmemvm" and module != "shmemvm":
                upward.append(f"{module} imports the package root")
            elif RANK[_layer(target)] > RANK[_layer(module)]:
                upward.append(f"{module} ({_layer(module)}) imports {target} ({_layer(target)})")
    assert not upward, "\n".join(sorted(upward))


def test_no_import_circle():
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):   # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in GRAPH.get(module, ()):
            if target == module:
                circles.append([module])
            elif target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not circles, circles


def _own_names(tree: ast.Module) -> set[str]:
    """Every name a module defines: at module level, as class members, and as
    attributes of self."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_uses_another_modules_private_names():
    uses = []
    for module, path in MODULES.items():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text())
        own = _own_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias, target in zip(node.names, _resolve(module, path, node)):
                    # a private module (_args, a compiled _native) is the package's; a
                    # private name is its module's
                    if _is_private(alias.name) and not target.endswith("." + alias.name):
                        uses.append(f"{module}: from {target} import {alias.name}")
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                receiver = node.value
                if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                    continue
                if node.attr in own or node.attr in FOREIGN_PRIVATES:
                    continue   # this module's own private name, or a foreign one allowed above
                uses.append(f"{module}:{node.lineno}: .{node.attr}")
    assert not uses, "\n".join(uses)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_library_file_is_over_1000_lines(module):
    """(C files too: the compiled piece is to stay small.)"""
    lines = MODULES[module].read_text().count("\n")
    assert lines <= 1000, f"{MODULES[module]} has {lines} lines: split it by concept"


# -- the core behind one door (issue 29) -------------------------------------------------------
#: the core's parts (core/state.py's HeapCore): what no routine reaches through
CORE_PARTS = {"local", "peers", "exchange", "window", "channel", "liveness", "agreement",
              "routes", "completion", "backend", "anchor", "comm", "node", "locator"}
#: where the routines and the faces above them live (everything outside core/ that holds a core)
ROUTINE_LAYERS = {"openshmem", "shmem", "heap", "api", "device"}


def _core_receiver(node: ast.expr, names=("heap", "core", "h")) -> bool:
    """Whether `node` names a heap's core as the routines hold it: `heap`, `core`,
    `h` (in openshmem/; above it `heap` is the SymmetricHeap), `x.core`,
    `x._core`, `core_of(...)`, `arrays.core()`."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in ("core", "_core")
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Name) and func.id == "core_of") or \
            (isinstance(func, ast.Attribute) and func.attr == "core")
    return False


def _protocol_members(tree: ast.Module, name: str) -> dict[str, str | None]:
    """The members of Protocol class `name` of core/door.py (its Protocol bases'
    too), each with its annotation's name where it has one (a facet's type)."""
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    members: dict[str, str | None] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id != "Protocol":
            members.update(_protocol_members(tree, base.id))
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            kind = node.annotation
            members[node.target.id] = kind.id if isinstance(kind, ast.Name) else None
        elif isinstance(node, ast.FunctionDef):
            members[node.name] = None
    return members


def _door() -> tuple[set[str], dict[str, set[str]]]:
    """core/door.py's Core Protocol: its members (all a routine may use of the
    core), and its facets (members typed by a Protocol of door.py) with theirs."""
    tree = ast.parse((PACKAGE / "core" / "door.py").read_text())
    protocols = {node.name for node in tree.body if isinstance(node, ast.ClassDef) and any(
        isinstance(base, ast.Name) and base.id == "Protocol" for base in node.bases)}
    members = _protocol_members(tree, "Core")
    facets = {name: set(_protocol_members(tree, kind)) for name, kind in members.items()
              if kind in protocols}
    return set(members), facets


def _facet_receiver(node: ast.expr, facets, names=("heap", "core", "h")) -> str | None:
    """The facet `node` names (`heap.where`), or None."""
    if isinstance(node, ast.Attribute) and node.attr in facets and \
            _core_receiver(node.value, names):
        return node.attr
    return None


def test_no_reach_through_a_part_of_the_core():
    """No `heap.<part>.<x>` chain outside core/, nor `heap.<facet>.<part>.<x>`:
    what a routine needs of a part is a member of the Core Protocol (or of
    one of its facets)."""
    _, facets = _door()
    chains = []
    for module, path in MODULES.items():
        if path.suffix != ".py" or _layer(module) not in ROUTINE_LAYERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr in CORE_PARTS
                    and (_core_receiver(node.value.value)
                         or _facet_receiver(node.value.value, facets))):
                chains.append(f"{module}:{node.lineno}: .{node.value.attr}.{node.attr}")
    assert not chains, "\n".join(chains)


def test_the_routines_use_the_core_through_its_door_only():
    """Every attribute of a core that openshmem/ and the faces above it use is a
    member of the Core Protocol (core/door.py), the one typed door, and every
    attribute they use of one of its facets (`heap.where.locate`) is a member
    of that facet's Protocol."""
    door, facets = _door()
    assert {"identity", "lock", "calls", "where", "memory"} <= door
    assert {"agree", "check_usable"} <= facets["calls"] and "allocate" in facets["memory"] \
        and "locate" in facets["where"]
    assert len(door) <= 10, f"the Core Protocol has {len(door)} members: group them (issue 29)"
    outside = []
    for module, path in MODULES.items():
        if path.suffix != ".py" or _layer(module) not in ROUTINE_LAYERS - {"heap"}:
            continue
        names = ("heap", "core", "h") if _layer(module) == "openshmem" else ("core",)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or node.attr.startswith("__"):
                continue
            facet = _facet_receiver(node.value, facets, names)
            if facet is not None:
                if node.attr not in facets[facet]:
                    outside.append(f"{module}:{node.lineno}: .{facet}.{node.attr}")
            elif _core_receiver(node.value, names) and node.attr not in door:
                outside.append(f"{module}:{node.lineno}: .{node.attr}")
    assert not outside, "\n".join(outside)


def test_the_parts_are_for_tests_and_debugging_only():
    """core/state.py's parts_of() (a heap's parts, for tests) is named by no
    library module outside core/: the routines' way in is the Core door."""
    users = [f"{module}:{node.lineno}" for module, path in MODULES.items()
             if path.suffix == ".py" and _layer(module) != "core"
             for node in ast.walk(ast.parse(path.read_text()))
             if (isinstance(node, ast.Name) and node.id == "parts_of")
             or (isinstance(node, ast.Attribute) and node.attr == "parts_of")
             or (isinstance(node, ast.alias) and node.name == "parts_of")]
    assert not users, "\n".join(users)


# -- where an operation goes is decided in transport/ (issue 29) -----------------------------
#: what a branch on the route, the compiled piece or the backend's kind names
BRANCH_NAMES = {"Route", "native", "built", "cpu_copies", "cpu_atomics", "kernel_atomics",
                "backend_name", "AtomicPath"}
#: the layers whose operations are routed: the routines, the faces and the transport
ROUTED_LAYERS = {"openshmem", "shmem", "transport", "api", "heap"}
#: where the route is decided, once per heap (what the others consult)
ROUTE_DECIDED = {"shmemvm.transport.route"}


def _branching_files() -> dict[str, list[int]]:
    """module -> lines of its branches (if, while, a conditional expression, a
    boolean operation) whose test names the route, the compiled piece or the
    backend's kind."""
    found: dict[str, list[int]] = {}
    for module, path in MODULES.items():
        if path.suffix != ".py" or _layer(module) not in ROUTED_LAYERS or \
                module in ROUTE_DECIDED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.If, ast.While, ast.IfExp)):
                tests = [node.test]
            elif isinstance(node, ast.BoolOp):
                tests = node.values
            else:
                continue
            for test in tests:
                names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)} | \
                        {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
                if names & BRANCH_NAMES:
                    found.setdefault(module, []).append(node.lineno)
    return found


def test_route_native_and_backend_branching_is_in_at_most_two_files():
    """How an operation reaches a PE (the route, the compiled piece, the
    backend's kind) is decided in transport/route.py and consulted in at most 2
    files of the routines, the faces and the transport (issue 29): today
    transport/target.py (locate()) and transport/nodecoll.py (the compiled
    node collectives)."""
    found = _branching_files()
    assert len(found) <= 2, "\n".join(f"{module}: lines {lines}"
                                      for module, lines in sorted(found.items()))
