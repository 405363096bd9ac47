"""The package's import structure: cospec_local never imports the converters' entry points, and
no two of its modules import each other (directly or around a loop), at module level or inside
functions."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cospec_local"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The cospec_local / converters modules `path` imports anywhere in its code."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            out.add(stem)
            out.update(f"{stem}.{alias.name}" for alias in node.names)  # `from . import x` names a module
    return {m for m in out if m.split(".")[0] in ("cospec_local", "converters")}


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def test_the_package_never_imports_the_converters_entry_points():
    offenders = {name: sorted(m for m in imports_of(p) if m.split(".")[0] == "converters")
                 for name, p in ((module_name(p), p) for p in PACKAGE.rglob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_import_cycles_between_modules():
    graph = import_graph()
    # A package's __init__ importing its own modules is how a package exports; leave those edges out.
    graph = {m: {d for d in deps if not (m.count(".") < d.count(".") and d.startswith(m + "."))}
             for m, deps in graph.items()}
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_docs_layout_names_every_module_and_native_source():
    """docs/layout.md cannot drift from the tree: every module of the package (but a package's
    __init__.py) and every C++ source of the engine is named there."""
    repo = PACKAGE.parent
    layout = (repo / "docs" / "layout.md").read_text(encoding="utf-8")
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts]
    sources = sorted((repo / "native").rglob("*.cpp"))
    missing = [str(p.relative_to(repo)) for p in modules + sources if f"`{p.name}`" not in layout and
               f"`{p.relative_to(repo)}`" not in layout]
    assert missing == [], f"name these in docs/layout.md: {missing}"
