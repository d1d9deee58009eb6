"""Figures of the package's import graph: modules, internal import edges, cycles (top-level and
function-local imports counted), largest file, and the function-local imports.

    python benchmarks/import_graph.py [--list-local]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "ablate"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(importer: str, is_package: bool, node: ast.AST, modules: set[str]) -> list[str]:
    """The internal modules an import statement names (a `from X import y` counts X.y when it is a module)."""
    targets = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = importer if is_package else importer.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            targets.append(name)
    return targets


def scan():
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(f): f for f in files}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    local: list[tuple[str, int, str, str]] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        lines = path.read_text().splitlines()
        is_package = path.name == "__init__.py"

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if isinstance(child, ast.ImportFrom) and child.module == "__future__":
                        continue
                    targets = [t for t in resolve(name, is_package, child, set(modules)) if t != name]
                    edges[name].update(targets)
                    if in_function:
                        line = lines[child.lineno - 1]
                        reason = line.partition("#")[2].strip()
                        local.append((str(path.relative_to(ROOT)), child.lineno, ast.unparse(child), reason))
                visit(child, inside)

        visit(tree, False)
    return modules, edges, local


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """The index of the import-linter layer (pyproject.toml, 0 = the top) that holds `module`, None if none."""
    for index, names in enumerate(layers):
        if any(module == n or module.startswith(n + ".") for n in names):
            return index
    return None


def upward(edges: dict[str, set[str]]) -> tuple[list[str], list[tuple[str, str]]]:
    """The modules in no layer, and the imports (top-level or inside a function) that run back up a layer."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(c for c in config if c["type"] == "layers")
    layers = [[n.strip() for n in layer.split(":")] for layer in contract["layers"]]
    unplaced = sorted(m for m in edges if m != PACKAGE and layer_of(m, layers) is None)
    up = sorted((a, b) for a, targets in edges.items() for b in targets
                if None not in (layer_of(a, layers), layer_of(b, layers)) and layer_of(b, layers) < layer_of(a, layers))
    return unplaced, up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list-local", action="store_true", help="list every function-local import")
    args = parser.parse_args()
    modules, edges, local = scan()
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules.items()}
    largest = max(sizes, key=sizes.get)
    found = cycles(edges)
    print(f"modules: {len(modules)}")
    print(f"internal import edges: {sum(len(t) for t in edges.values())}")
    print(f"cycles: {len(found)}" + "".join(f"\n  {len(c)} modules: {', '.join(c)}" for c in found))
    unplaced, up = upward(edges)
    print(f"modules in no layer: {len(unplaced)}" + "".join(f"\n  {m}" for m in unplaced))
    print(f"imports back up a layer: {len(up)}" + "".join(f"\n  {a} -> {b}" for a, b in up))
    print(f"largest file: {modules[largest].relative_to(ROOT)} ({sizes[largest]} lines)")
    print(f"files over 400 lines: {sum(s > 400 for s in sizes.values())}")
    print(f"function-local imports: {len(local)} ({sum(bool(r) for *_, r in local)} with a reason beside them)")
    if args.list_local:
        for path, line, text, reason in local:
            print(f"  {path}:{line}: {text}" + (f"  # {reason}" if reason else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
