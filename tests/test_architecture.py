"""The shape of the house: imports flow one way, and no source file grows into a god file.

Read over the AST of ``src/rewind`` (nothing is imported), so the check also sees imports
inside functions and under ``TYPE_CHECKING``: a lazy import is still a dependency.
docs/architecture.md explains the layers.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "secrets", "faults"),
    ("core", "logs", "javacheck"),
    ("config",),
    ("catalog", "kafka"),
    ("spec", "ledger"),
    ("groups", "dualwrite", "openlineage"),
    ("translate",),
    ("spark",),
    ("history", "tables"),
    ("sinks",),
    ("job", "reconsume"),
    ("verify", "doctor", "embedded"),
    ("shadow", "ops"),
    ("console", "progress", "output"),
    ("demo",),
    ("cli",),
)
"""Bottom first. A module may import its own package and packages of lower layers only."""

RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


@dataclass(frozen=True)
class Import:
    source: str  # module that imports, e.g. rewind.sinks.iceberg
    target: str  # module imported, e.g. rewind.job.faults
    line: int
    lazy: bool

    def where(self) -> str:
        kind = "inside a function or TYPE_CHECKING" if self.lazy else "at module level"
        return f"{self.source}:{self.line} imports {self.target} ({kind})"


def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree; each check walks every source file, so each file is parsed once
    for them all (a file a test writes is parsed again once it changes)."""
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parse(path: Path, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = SRC) -> list[Import]:
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = parsed(path)
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.If)
            if isinstance(child, ast.Import):
                found.extend(Import(name, a.name, child.lineno, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative: resolve against the importing package
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    target = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    target = child.module or ""
                for alias in child.names:  # `from rewind import faults` imports rewind.faults
                    sub = f"{target}.{alias.name}"
                    path = root / sub.replace(".", "/")
                    is_module = path.with_suffix(".py").exists() or path.is_dir()
                    found.append(Import(name, sub if is_module else target, child.lineno, lazy))
            visit(child, inner)

    visit(tree, False)
    return [i for i in found if i.target == "rewind" or i.target.startswith("rewind.")]


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def all_imports() -> list[Import]:
    return [i for path in sorted((SRC / "rewind").rglob("*.py")) for i in imports_of(path)]


def upward(imports: list[Import]) -> list[str]:
    """Every import of a package in the same or a higher layer than the importer's."""
    bad = []
    for imp in imports:
        src, dst = package_of(imp.source), package_of(imp.target)
        if src == dst:
            continue
        if dst == "":
            bad.append(f"{imp.where()}: import from the package's own module instead of `rewind`")
        elif RANK[dst] >= RANK[src]:
            bad.append(f"{imp.where()}: layer {LAYERS[RANK[src]]} may not import layer {LAYERS[RANK[dst]]}")
    return bad


def test_every_package_has_a_layer() -> None:
    packages = {package_of(module_name(p)) for p in (SRC / "rewind").rglob("*.py")} - {""}
    assert not packages - set(RANK), f"add these packages to LAYERS: {sorted(packages - set(RANK))}"


def test_imports_flow_one_way() -> None:
    bad = upward(all_imports())
    why = "imports that run upward (move the shared part down, see docs/architecture.md)"
    assert not bad, why + ":\n" + "\n".join(bad)


def test_the_check_sees_upward_imports_even_when_lazy(tmp_path: Path) -> None:
    """The checker itself: an upward import inside a function, a relative one, and one under
    TYPE_CHECKING are all reported; a downward one is not."""
    pkg = tmp_path / "rewind"
    (pkg / "sinks").mkdir(parents=True)
    (pkg / "sinks" / "x.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from rewind.core.ranges import OffsetRange\n"
        "if TYPE_CHECKING:\n    from rewind.verify import report\n"
        "def f():\n    from ..job import faults\n"
    )
    bad = upward(imports_of(pkg / "sinks" / "x.py", root=tmp_path))
    assert [b.split(":")[1].split(" ")[0] for b in bad] == ["4", "6"]
    assert "rewind.job" in bad[1] and "inside a function" in bad[1]


MAX_LINES = 600
"""No source file grows past this; split along the file's own seams (see docs/architecture.md)."""


def runtime_imports(path: Path, root: Path = SRC) -> set[str]:
    """Modules of rewind that ``path`` imports when it runs: at module level or inside a
    function, but not under ``TYPE_CHECKING`` (type-only imports cannot form a runtime cycle)."""
    known = {module_name(p, root) for p in (root / "rewind").rglob("*.py")}
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name in known)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    out.add(sub if sub in known else child.module)
            visit(child)

    visit(parsed(path))
    return {m for m in out if m in known} - {module_name(path, root)}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of more than one module that import each other in a loop (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in order:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                cycles.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in order:
            connect(v)
    return cycles


def import_cycles(root: Path = SRC) -> list[list[str]]:
    """Strongly connected groups of more than one module in the runtime import graph."""
    return strongly_connected(
        {module_name(p, root): runtime_imports(p, root) for p in (root / "rewind").rglob("*.py")}
    )


def all_imports_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Each module of rewind and the modules it imports in any way: at module level, inside a
    function or under ``TYPE_CHECKING``, absolute or relative."""
    paths = list((root / "rewind").rglob("*.py"))
    known = {module_name(p, root) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path, root)
        graph[name] = set()
        for imp in imports_of(path, root):
            target = imp.target
            while target not in known and "." in target:  # a name of a module: the module
                target = target.rpartition(".")[0]
            if target in known and target != name:
                graph[name].add(target)
    return graph


KNOWN_CIRCLES: tuple[frozenset[str], ...] = ()
"""Circles known and still open, each as the set of its modules: none. Remove an entry when its
circle is gone; a circle may shrink inside its entry, never grow out of it."""


def test_no_module_imports_itself_through_others_even_for_type_hints() -> None:
    """No circle of imports, counting those under ``TYPE_CHECKING``: files that name each other
    only for type hints still cannot be read, moved or tested one without the other. Move the
    shared type down (or into a small module of its own), or take a Protocol of the caller."""
    circles = strongly_connected(all_imports_graph())
    new = [c for c in circles if not any(set(c) <= known for known in KNOWN_CIRCLES)]
    assert not new, "modules that import each other in a circle (type-only imports count):\n" + "\n".join(
        " <-> ".join(c) for c in new
    )


def test_the_known_circles_are_still_there() -> None:
    """An entry of KNOWN_CIRCLES whose circle is gone is removed, so none can come back unseen."""
    circles = [set(c) for c in strongly_connected(all_imports_graph())]
    gone = [sorted(known) for known in KNOWN_CIRCLES if not any(c <= known for c in circles)]
    assert not gone, f"these circles are broken: remove them from KNOWN_CIRCLES: {gone}"


def test_no_module_imports_itself_through_others() -> None:
    """In-function imports are for laziness only, never to hide a cycle."""
    assert import_cycles() == []


def test_the_cycle_check_finds_a_cycle_behind_an_in_function_import(tmp_path: Path) -> None:
    pkg = tmp_path / "rewind" / "sinks"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from rewind.sinks.b import f\nfrom rewind.sinks import c\n")
    (pkg / "b.py").write_text("def f():\n    from rewind.sinks import a\n")  # a cycle, hidden
    # a type-only import back is not a cycle at run time
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rewind.sinks import a\n"
    )
    assert import_cycles(tmp_path) == [["rewind.sinks.a", "rewind.sinks.b"]]


def test_the_circle_check_counts_type_only_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "rewind" / "sinks"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from rewind.sinks.b import f\n")
    (pkg / "b.py").write_text(  # a type-only import back: a circle all the same
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rewind.sinks.a import A\n"
        "def f(): ...\n"
    )
    (pkg / "c.py").write_text("from . import a\n")  # one way only
    assert import_cycles(tmp_path) == []
    assert strongly_connected(all_imports_graph(tmp_path)) == [["rewind.sinks.a", "rewind.sinks.b"]]


@pytest.mark.parametrize(
    "path", sorted((SRC / "rewind").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC))
)
def test_no_source_file_is_a_god_file(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(SRC)} has {lines} lines (at most {MAX_LINES})"


LAZY_REASON = "# lazy:"
"""How an import inside a function says why it is there: ``# lazy: <the cost it avoids>``, as a
trailing comment on the import or in the comment just above a run of consecutive imports."""

LAZY_REASON_EXEMPT: tuple[str, ...] = ()


def imports_without_a_reason(path: Path, root: Path = SRC) -> list[str]:
    """``file:line`` of every import inside a function (nested ones and those under an ``if
    TYPE_CHECKING`` in a function too) that carries no ``# lazy:`` comment, neither trailing on
    the import nor in the comment just above the run of consecutive imports it belongs to."""
    lines = path.read_text().splitlines()
    where = path.relative_to(root)
    missing: list[str] = []

    def says_why(stmts: list[ast.stmt], i: int) -> bool:
        node = stmts[i]
        if any(LAZY_REASON in lines[n - 1] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)):
            return True
        first = i  # the run of imports this one belongs to, one line after the other
        while (
            first > 0
            and isinstance(stmts[first - 1], ast.Import | ast.ImportFrom)
            and ((stmts[first - 1].end_lineno or 0) + 1 == stmts[first].lineno)
        ):
            first -= 1
        above = stmts[first].lineno - 2  # the comment just above the run, over one or more lines
        while above >= 0 and lines[above].strip().startswith("#"):
            if lines[above].strip().startswith(LAZY_REASON):
                return True
            above -= 1
        return False

    def visit(node: ast.AST, in_function: bool) -> None:
        for field in ("body", "orelse", "finalbody", "handlers"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for i, child in enumerate(stmts):
                if in_function and isinstance(child, ast.Import | ast.ImportFrom) and not says_why(stmts, i):
                    missing.append(f"{where}:{child.lineno}: {ast.unparse(child)}")
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(parsed(path), False)
    return missing


def test_every_import_inside_a_function_says_why() -> None:
    """An import inside a function is there to keep a cost off import time (pyspark, pyarrow,
    confluent_kafka, --help...), and says which: ``# lazy: avoids pyarrow at import``. Anything
    else (a light module, the standard library) belongs at the top of the module."""
    missing = [
        line
        for path in sorted((SRC / "rewind").rglob("*.py"))
        if not str(path.relative_to(SRC)).startswith(LAZY_REASON_EXEMPT)
        for line in imports_without_a_reason(path)
    ]
    assert not missing, "imports inside a function without a `# lazy: <cost avoided>` comment:\n" + "\n".join(
        missing
    )


def test_the_reason_check_sees_nested_and_type_only_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "rewind"
    pkg.mkdir()
    (pkg / "x.py").write_text(
        "import json\n"  # module level: no reason needed
        "def f():\n"
        "    # lazy: avoids pyspark at import\n"
        "    import pyspark\n"
        "    from pyspark.sql import Row\n"  # same run as the line above: covered
        "\n"
        "    import pyarrow\n"  # 7: a new run, no reason
        "    import numpy  # lazy: avoids numpy at import\n"
        "    def g():\n"
        "        import pandas\n"  # 10: nested, no reason
        "    if TYPE_CHECKING:\n"
        "        from pyarrow import Table\n"  # 12: type-only inside a function, no reason
        "async def h():\n"
        "    try:\n"
        "        import fastavro  # lazy: avoids fastavro at import\n"
        "    except ImportError:\n"
        "        import orjson\n"  # 17
    )
    missing = imports_without_a_reason(pkg / "x.py", root=tmp_path)
    assert [m.split(":")[1] for m in missing] == ["7", "10", "12", "17"]
