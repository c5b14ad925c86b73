"""The package's modules import each other without a circle (function-local imports count too)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "maskjax"


def imports_of(path: Path, modules: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("maskjax"):
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("maskjax")}
    return found & modules


def test_no_import_circle():
    paths = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    graph = {name: imports_of(path, set(paths)) - {name} for name, path in paths.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for dep in graph[name]:
            assert dep not in path, "import circle: " + " -> ".join([*path[path.index(dep) :], dep])
            if dep not in done:
                visit(dep, [*path, dep])
        done.add(name)

    for name in graph:
        visit(name, [name])


def test_the_library_never_imports_the_clis_and_each_study_cli_is_an_alias():
    """Layers: maskjax.cli sits on the library, never the reverse, and nothing in maskjax imports the
    checkout's experiments/ or benchmarks/; a study's CLI only binds its study to the driver; each
    experiments/ module is an alias of its program and imports nothing else."""
    for path in PACKAGE.rglob("*.py"):
        in_cli = path.is_relative_to(PACKAGE / "cli")
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            assert not any(n.startswith(("experiments", "benchmarks")) for n in names), path
            assert in_cli or not any(n.startswith("maskjax.cli") for n in names), path
    for study in ("boolean", "arithmetic", "vision", "language"):
        tree = ast.parse((PACKAGE / "cli" / f"{study}.py").read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert modules == {"maskjax.cli", f"maskjax.studies.{study}"}, (study, modules)
    for alias in (PACKAGE.parent / "experiments").glob("*.py"):
        if alias.name != "__init__.py":
            tree = ast.parse(alias.read_text())
            modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            target = "driver" if alias.stem == "cli" else alias.stem
            assert modules == {"experiments"} and (PACKAGE / "cli" / f"{target}.py").exists(), alias
