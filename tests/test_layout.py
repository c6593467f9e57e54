"""The import graph of app/ has no cycle, counting every import (issue 26).

Every module of ``app/`` is parsed with ``ast``; every ``import``/``from ... import`` of
an ``app`` module is an edge, wherever it stands: at the top, inside a function, under
``TYPE_CHECKING``. A function-level import hides a cycle from the interpreter, not from
the design: this test sees it. ``from app.x import y`` is an edge to ``app.x.y`` when that
is a module, otherwise to ``app.x``; importing ``app.x.y`` also runs ``app/x/__init__.py``,
so it is an edge to that package too (unless the importer lives inside it).

    .venv/bin/python tests/test_layout.py     # prints the cycles, exits 1 if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "app"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: str = PACKAGE) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        # relative: from the importer's package, one level up per extra dot
        parts = importer.split(".")
        parts = parts if is_pkg else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, base] if base else parts)
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def import_graph(package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the app modules it imports (all imports, at any depth of the file)."""
    mods = modules(package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(node, name, is_pkg):
                if target not in mods:
                    continue
                graph[name].add(target)
                parts = target.split(".")
                for i in range(1, len(parts)):
                    pkg = ".".join(parts[:i])
                    # a package the importer lives in is being imported already
                    if pkg in mods and not (name == pkg or name.startswith(pkg + ".")):
                        graph[name].add(pkg)
    for name in graph:
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def describe(graph: dict[str, set[str]], comp: list[str]) -> str:
    members = set(comp)
    edges = [f"{a} -> {b}" for a in comp for b in sorted(graph[a] & members)]
    return f"{len(comp)} modules: " + "; ".join(edges)


def test_graph_sees_function_level_imports(tmp_path: Path) -> None:
    """The parser finds an import inside a function (the kind that hid the old cycle)."""
    tree = ast.parse("def f():\n    from app.x import y\n    import app.z\n")
    found = [
        t
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for t in _targets(n, "app.m", False)
    ]
    assert found == ["app.x", "app.x.y", "app.z"]


def test_no_import_cycle_in_app() -> None:
    graph = import_graph()
    assert len(graph) > 30  # every module of app/ was read
    found = cycles(graph)
    assert not found, "import cycles in app/:\n" + "\n".join(describe(graph, c) for c in found)


def test_optimizer_never_imports_app() -> None:
    for name, path in modules("optimizer").items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for t in _targets(node, name, path.name == "__init__.py"):
                    assert t.split(".")[0] != "app", f"{name} imports {t}"


# The edges that speak HTTP; below them, services say what to change in the domain's words
# (a ServiceError's ``fix``) and app/api/errors.py adds the REST call.
EDGES = ("app.api", "app.web", "app.cli", "app.main", "app.reports")


def test_services_never_name_a_rest_path() -> None:
    for name, path in modules().items():
        if name.startswith(EDGES):
            continue
        assert "/api/v1" not in path.read_text(), f"{name} names a REST path"


def test_domains_read_each_other_through_services_not_routes() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith(("app.api", "app.web", "app.main")):
            continue
        edge = sorted(d for d in deps if d.startswith(("app.api", "app.web")))
        assert not edge, f"{name} imports {edge}: the HTTP edge, from below it"


if __name__ == "__main__":
    g = import_graph()
    n_edges = sum(len(v) for v in g.values())
    found = cycles(g)
    print(f"{len(g)} modules of app/, {n_edges} import edges (top-level and in functions)")
    for c in found:
        print("cycle:", describe(g, c))
    print(f"{len(found)} cycle(s)")
    sys.exit(1 if found else 0)
