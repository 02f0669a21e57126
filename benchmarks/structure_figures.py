"""The structure figures of docs/measurements/restructure.md: module count, largest module, functions over 60 lines.

Run from the repository root: `python benchmarks/structure_figures.py`.
"""

import ast
import pathlib

root = pathlib.Path("src/mlrepro")
modules = sorted(root.rglob("*.py"))
sizes = [(len(p.read_text().splitlines()), str(p)) for p in modules]
print("modules", len(modules))
print("largest", max(sizes))
long = []
for p in modules:
    for node in ast.walk(ast.parse(p.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
            long.append((node.end_lineno - node.lineno + 1, f"{p}:{node.lineno} {node.name}"))
print("functions over 60 lines", len(long))
for length, where in sorted(long, reverse=True):
    print(f"  {length:4d} {where}")
