"""The code's layout (issue #24): no import circles among the package's modules, and modules small enough to read."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "autograd_lens"
LIMIT = 400  # lines
# Modules still over the limit, each capped at its size when the limit was set: they may shrink, not grow.
OVER: dict[str, int] = {}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """Modules of the package that ``name`` imports, at any depth of its code (imports inside functions count;
    those under ``if TYPE_CHECKING:`` do not)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                return
            self.generic_visit(node)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in modules else target)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

    Visitor().visit(ast.parse(path.read_text()))
    # a module importing its own package (or a parent package) is not a circle of the package's modules
    return {other for other in found if other in modules and other != name and not name.startswith(other + ".")}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _circles(graph) == []


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_modules_stay_small():
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    too_long = {name: size for name, size in sizes.items() if size > OVER.get(name, LIMIT)}
    assert too_long == {}


def _map_block() -> str:
    """The package's part of docs/architecture.md's layout block (the first fenced block after "## Layout", up to
    its ``benchmarks/`` line)."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    layout = text[text.index("## Layout"):]
    start = layout.index("```") + 3
    block = layout[start:layout.index("```", start)]
    return block[:block.index("\nbenchmarks/")]


def test_the_module_map_names_every_module():
    """docs/architecture.md's map names every module and ES module of the package (a file's name, ``steps.py``;
    the package's own entries by name too), and names none that is gone."""
    import re

    block = _map_block()
    files = [path for path in PACKAGE.rglob("*") if path.suffix in (".py", ".js") and path.name != "__init__.py"]
    unnamed = sorted(str(path.relative_to(PACKAGE)) for path in files
                     if not re.search(rf"(?<![\w/]){re.escape(path.stem)}(\.py|\.js)?\b", block))
    assert unnamed == [], f"add these to docs/architecture.md's map: {unnamed}"
    names = {path.name for path in files} | {"__init__.py"}
    gone = sorted({name for name in re.findall(r"\b([\w]+\.py)\b", block)} - names)
    assert gone == [], f"named in docs/architecture.md's map, not in the package: {gone}"
    assert {path.relative_to(PACKAGE).parts[0] for path in files if len(path.relative_to(PACKAGE).parts) > 1} <= \
        {word.rstrip("/") for word in re.findall(r"^  (\w+/)", block, re.M)}  # every sub-package has its line


def test_the_map_check_finds_a_missing_module(monkeypatch):
    monkeypatch.setattr(__import__(__name__), "_map_block", lambda: "capture/ steps.py")
    try:
        test_the_module_map_names_every_module()
    except AssertionError as problem:
        assert "add these" in str(problem) and "views/chain.py" in str(problem)
    else:
        raise AssertionError("a map naming two modules passed")
