"""The attnlab package's own imports (python/attnlab/*.py), read from the
source: each module imports the others at its top, never inside a function
(where an import can hide a cycle), and no chain of them leads back to where
it started. A name imported from the package itself (`from . import x`, x not
a module of it, nor _C, the compiled extension) is an import of
attnlab/__init__.py, which imports the rest.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "python", "attnlab")
MODULES = sorted(f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py"))
EXTENSION = "_C"


def _imports(module):
    """(the modules of the package that `module` imports, at its top or
    anywhere else, the lines of the imports it makes inside functions or
    classes)."""
    tree = ast.parse(open(os.path.join(PACKAGE, module + ".py"), encoding="utf-8").read())
    imported, nested = set(), []

    def targets(node):
        if node.module:  # from .x import a, b
            return {node.module.split(".")[0]}
        # from . import x
        return {a.name if a.name in MODULES else "__init__" for a in node.names if a.name != EXTENSION}

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            imported |= targets(node) & set(MODULES)
            if node not in tree.body:
                nested.append(node.lineno)
    return imported, nested


def test_no_import_inside_a_function():
    nested = {m: lines for m in MODULES for lines in [_imports(m)[1]] if lines}
    assert nested == {}, f"package imports inside functions (module: lines): {nested}"


def test_no_import_cycle():
    graph = {m: _imports(m)[0] for m in MODULES}
    done, path = set(), []

    def visit(m):
        if m in path:
            raise AssertionError("an import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        path.append(m)
        for n in sorted(graph[m]):
            visit(n)
        path.pop()
        done.add(m)

    for m in MODULES:
        visit(m)
    assert {"blocksparse", "dynamic_mask", "_tensors"} <= set(MODULES)
    assert "_tensors" in graph["blocksparse"] and "_tensors" in graph["dynamic_mask"]
