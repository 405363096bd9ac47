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


def layout_rows(layout: str) -> dict[str, str]:
    """docs/layout.md's table: the path in a row's first cell -> the row."""
    return {line.split("`")[1]: line for line in layout.splitlines() if line.startswith("| `")}


def test_docs_layout_names_every_module_in_its_own_package_row():
    """docs/layout.md cannot drift from the tree: every package of cospec_local has a row, and
    every module is named in its own package's row (a module moved to another package fails)."""
    repo = PACKAGE.parent
    rows = layout_rows((repo / "docs" / "layout.md").read_text(encoding="utf-8"))
    packages = sorted({p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts})
    misplaced = []
    for package in packages:
        row = rows.get(str(package.relative_to(repo)) + "/")
        if row is None:
            misplaced.append(f"{package.relative_to(repo)}/ has no row")
            continue
        misplaced += [str(p.relative_to(repo)) for p in sorted(package.glob("*.py"))
                      if p.name != "__init__.py" and f"`{p.name}`" not in row]
    assert misplaced == [], f"name these in their package's row of docs/layout.md: {misplaced}"


def test_docs_layout_names_every_native_source():
    repo = PACKAGE.parent
    layout = (repo / "docs" / "layout.md").read_text(encoding="utf-8")
    missing = [str(p.relative_to(repo)) for p in sorted((repo / "native").rglob("*.cpp"))
               if f"`{p.relative_to(repo)}`" not in layout and f"`{p.name}`" not in layout]
    assert missing == [], f"name these in docs/layout.md: {missing}"


def test_no_two_modules_share_a_name_across_the_conversion_code_and_its_entry_points():
    """converters/ (entry points) and cospec_local/formats/ (their code) use different names, so a
    name says which one it is."""
    repo = PACKAGE.parent
    entry_points = {p.name for p in (repo / "converters").glob("*.py")} - {"__init__.py"}
    code = {p.name for p in (PACKAGE / "formats").glob("*.py")}
    assert entry_points & code == set()


def test_every_module_and_bench_tool_is_in_the_layout():
    """docs/layout.md names every module of the package and every tool and experiment of bench/."""
    root = PACKAGE.parent
    layout = (root / "docs" / "layout.md").read_text(encoding="utf-8")
    named = {p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    named |= {p.name for p in (root / "bench").glob("*.py")}
    named |= {p.name for p in (root / "bench" / "experiments").iterdir() if p.suffix == ".py" or p.is_dir()}
    missing = sorted(n for n in named if f"`{n}`" not in layout and f"`{n}/`" not in layout)
    assert missing == []
