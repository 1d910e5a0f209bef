"""No module outside ``backends/`` compares a backend's name: it asks the backend's
descriptor (``backends.descriptor``) or checks a provider protocol, so that a new backend
is a package and a line in ``chaos.space_providers``, not a hunt through the campaign."""

from __future__ import annotations

import ast
from pathlib import Path

from chaos.space_providers import BACKENDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("durable", "chaos", "scenarios", "reports")


def _compared_names(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for side in sides:
            names = ([side] if isinstance(side, ast.Constant) else
                     list(side.elts) if isinstance(side, ast.Tuple | ast.List | ast.Set) else [])
            found += [(node.lineno, n.value) for n in names
                      if isinstance(n, ast.Constant) and n.value in BACKENDS]
    return found


def test_no_module_outside_backends_compares_a_backend_name() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line}: compares {name!r}"
                 for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
                 for line, name in _compared_names(ast.parse(path.read_text()))]
    assert not offenders, ("ask the backend's descriptor (chaos.space_providers.backend) or "
                           "a provider protocol instead:\n" + "\n".join(offenders))


def test_the_guard_sees_a_comparison() -> None:
    tree = ast.parse("if spec.backend == 'microvm' or b in ('local', 'x'): pass")
    assert _compared_names(tree) == [(1, "microvm"), (1, "local")]
