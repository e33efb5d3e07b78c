"""devcluster's modules import each other as a tree: no cycle, and no import inside a function
to dodge one (function-level imports only for slow optional ones, e.g. the kubernetes client,
and the package's lazy entry points)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "devcluster"
# (file, imported module) pairs allowed inside a function, and why
LATE_OK = {
    ("__init__.py", "devcluster"): "runpy: `python -m devcluster.build` must not import it twice",
    ("__init__.py", "devcluster.__main__"): "runpy: `python -m devcluster` is __main__",
    ("cluster.py", "kubernetes"): "slow optional import (ClusterInfo.api_client)",
    ("images.py", "importlib.metadata"): "optional: only to pick a pip flag",
}


def _module(path: Path) -> str:
    return "devcluster" if path.stem == "__init__" else f"devcluster.{path.stem}"


def _imports(path: Path) -> tuple[set[str], list[tuple[str, int]]]:
    """(devcluster modules imported anywhere in the file, function-level imports)."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found: set[str] = set()
    late: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == "devcluster":  # from devcluster import cluster
                names += [f"devcluster.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {n for n in names if n.startswith("devcluster.")}
        if id(node) not in top:
            late += [(n, node.lineno) for n in names[:1]]
    return found, late


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p)[0] for p in sorted(PACKAGE.glob("*.py"))}


def test_devcluster_imports_form_no_cycle() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, f"import cycle: {' -> '.join([*path, module])}"
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in graph:
        visit(module, [])


def test_no_function_level_import_dodges_a_cycle() -> None:
    late = {(p.name, name, line) for p in sorted(PACKAGE.glob("*.py"))
            for name, line in _imports(p)[1]}
    unexpected = [f"devcluster/{f}:{line} imports {name}" for f, name, line in sorted(late)
                  if (f, name) not in LATE_OK]
    assert not unexpected, unexpected


def test_the_shared_pieces_live_in_small_leaf_modules() -> None:
    graph = _graph()
    for leaf in ("errors", "net", "kwok", "realnode_config", "build", "pki", "relay"):
        assert graph[f"devcluster.{leaf}"] == set(), leaf
    assert graph["devcluster.kubeapi"] == {"devcluster.errors"}
    assert graph["devcluster.supervisor"] == {"devcluster.errors"}
    assert graph["devcluster.waiting"] == {"devcluster.errors"}
    # the part modules import only downwards
    assert "devcluster.cluster" not in graph["devcluster.nodes"] | graph["devcluster.dra"]
    assert "devcluster.nodes" not in graph["devcluster.dra"]
