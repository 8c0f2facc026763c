"""The layering of the packages: dependencies point one way (devices <- kernels <- tune <- model, ladder <- game <-
train <- cli), so the import graph between packages has no cycle. Lazy imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import tilewise

ROOT = Path(tilewise.__file__).parent
# a package may import only packages of a lower layer (or itself)
LAYERS = {"errors": 0, "files": 0, "quant": 1, "devices": 1, "kernels": 2, "tune": 3, "model": 4, "ladder": 4,
          "game": 5, "train": 6, "cli": 7}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tilewise"


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the files that import it."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in ROOT.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        src = "cli" if path.name == "__main__.py" else package_of(module)  # entry points are CLI
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tilewise":
                targets = [f"{node.module}.{a.name}" if node.module == "tilewise" else node.module for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "tilewise"]
            else:
                continue
            for t in targets:
                if t == "tilewise.__version__":
                    continue  # the version string is a leaf every package may name
                dst = "tilewise" if t == "tilewise" else package_of(t)
                if dst != src and src != "tilewise":  # the top-level facade (tilewise.load) sits above all
                    edges.setdefault((src, dst), []).append(str(path.relative_to(ROOT)))
    return edges


def test_every_package_is_in_a_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages |= {p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert packages == set(LAYERS), "a new top-level package needs its place in the layering"


def test_dependencies_point_down():
    up = {edge: files for edge, files in import_edges().items()
          if (edge[1] == "tilewise" and edge[0] != "cli") or (edge[1] in LAYERS and LAYERS[edge[1]] >= LAYERS[edge[0]])}
    assert not up, f"imports against the layering: {up}"


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for a, b in import_edges():
        graph.setdefault(a, set()).add(b)
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in graph.get(node, ()):
            assert seen.get(nxt) != 1, f"import cycle: {' -> '.join([*path, node, nxt])}"
            if nxt not in seen:
                visit(nxt, [*path, node])
        seen[node] = 2

    for node in list(graph):
        if node not in seen:
            visit(node, [])


def test_the_checker_sees_a_back_edge(tmp_path, monkeypatch):
    """The layering test must be able to fail: a kernel module importing the tuner is caught."""
    fake = tmp_path / "tilewise"
    (fake / "kernels").mkdir(parents=True)
    (fake / "tune").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "kernels" / "__init__.py").write_text("")
    (fake / "tune" / "__init__.py").write_text("")
    (fake / "kernels" / "bad.py").write_text("def f():\n    from tilewise.tune.engine import Engine\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    edges = import_edges()
    assert ("kernels", "tune") in edges and LAYERS["tune"] >= LAYERS["kernels"]
