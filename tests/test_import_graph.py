"""No import circle in the project: every import counts, at module level, inside a function
(a lazy one) or under ``if TYPE_CHECKING`` (a type-only one). A circle makes each module of
it a part of the others: none can be read, tested or moved alone, and a lazy import only
hides the knot from the interpreter."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("durable", "spacesd", "backends", "chaos", "scenarios", "reports", "tests")


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports anywhere in its text. ``from P import
    name`` is an import of ``P.name`` when that is a module, else of ``P``; importing
    ``P.Q.m`` runs ``P.Q``'s ``__init__`` first, so it imports every package above ``m``
    that is not above the importer too (those are running already: a package's own modules
    import their siblings freely)."""

    def known(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in found else known(base))
        mine = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
        direct = {t for t in targets if t is not None}
        parents = {p for t in direct for k in range(1, t.count(".") + 1)
                   if (p := t.rsplit(".", k)[0]) in found and p not in mine}
        graph[name] = (direct | parents) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_project_has_no_import_circle() -> None:
    graph = import_graph(modules(ROOT, PACKAGES))
    assert "chaos.run.runner" in graph and "spacesd.daemon" in graph  # the walk saw the project
    found = circles(graph)
    assert not found, "import circles (each module imports, maybe lazily or for types only, " \
        "one that leads back to it): " + "; ".join(
            " <-> ".join(c) + " (edges: " + ", ".join(
                f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) + ")"
            for c in found) + ". Move what both need into a module of its own, or pass it " \
        "in (a protocol, a callable) instead of importing the module that calls you"


def test_lazy_type_only_and_relative_imports_close_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from .sub.b import B\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("from pkg.a import thing\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    graph = import_graph(modules(tmp_path, ("pkg",)))
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"}
    assert circles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("")
    assert circles(import_graph(modules(tmp_path, ("pkg",)))) == []
    # A package whose __init__ imports a module that leads back to one of its own modules
    # through a module outside it: importing pkg.sub.b runs pkg.sub's __init__ first.
    (pkg / "sub" / "__init__.py").write_text("from . import e\n")
    (pkg / "sub" / "e.py").write_text("from pkg import c\n")
    (pkg / "c.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("")
    assert circles(import_graph(modules(tmp_path, ("pkg",)))) == [
        ["pkg.c", "pkg.sub", "pkg.sub.e"]]

