"""The package's structure: no import circle anywhere in geodml, no private name imported across modules.

``python -m tests.test_structure`` prints the import graph's circles (and the private imports), the
same check the tests make. An import counts wherever it is written -- at the top of a module or
inside a function -- except under ``if TYPE_CHECKING:``, which never runs. ``import a.b`` and ``from
a.b import c`` are edges to the module ``a.b`` (and ``from a import b`` to ``a.b`` when that is a
module); a package's ``__init__`` is the module named by the package.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "geodml"


def modules() -> dict[str, Path]:
    """Every module of geodml by dotted name."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], list[str]]:
    """The geodml modules ``name`` imports (outside TYPE_CHECKING) and the private names it imports."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: set[str] = set()
    private: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name.split(".")[0] == "geodml" and a.name in known:
                        edges.add(a.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - child.level + 1] + ([base] if base else []))
                if base.split(".")[0] != "geodml":
                    continue
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    edges.add(sub if sub in known else base)
                    if a.name.startswith("_") and not a.name.startswith("__") and sub not in known:
                        private.append(f"{name}: from {base} import {a.name}")
            visit(child)

    visit(tree)
    edges.discard(name)
    return {e for e in edges if e in known}, private


def graph() -> tuple[dict[str, set[str]], list[str]]:
    known = modules()
    out, private = {}, []
    for name, path in known.items():
        out[name], p = imports(name, path, known)
        private += p
    return out, private


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                strong(w)
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
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return found


def test_no_import_circle_anywhere_in_geodml():
    g, _ = graph()
    assert len(g) > 50  # the checker sees the package
    assert circles(g) == []


def test_no_private_name_is_imported_across_modules():
    _, private = graph()
    assert private == []


def test_the_checker_finds_a_circle_and_a_private_import(tmp_path, monkeypatch):
    """A package of three modules, a -> b -> c -> a (c's import inside a function), and d importing
    a private name; a TYPE_CHECKING import makes no edge."""
    pkg = tmp_path / "geodml"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from geodml import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nimport geodml.c\nif TYPE_CHECKING:\n    import geodml.d\n")
    (pkg / "c.py").write_text("def f():\n    from geodml.a import x\n")
    (pkg / "d.py").write_text("from geodml.a import _hidden\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    g, private = graph()
    assert circles(g) == [["geodml.a", "geodml.b", "geodml.c"]]
    assert "geodml.d" not in g["geodml.b"]
    assert private == ["geodml.d: from geodml.a import _hidden"]


if __name__ == "__main__":
    g, private = graph()
    for c in circles(g):
        print("circle:", " <-> ".join(c))
    for p in private:
        print("private import:", p)
