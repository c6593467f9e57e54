"""Sizes of the biggest units of the code: files, classes, and functions over 80 lines.

    .venv/bin/python bench/sizes.py [--top N] [--min-function 80] [paths ...]

Lines are physical lines (a class or function from its ``def``/``class`` line to its
last line, decorators excluded), counted by ``ast``: the same figures on any checkout,
so the numbers before and after a refactoring are comparable (issue 26).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def units(paths: list[Path]) -> tuple[list[tuple[int, str]], ...]:
    files: list[tuple[int, str]] = []
    classes: list[tuple[int, str]] = []
    functions: list[tuple[int, str]] = []
    for base in paths:
        for path in sorted(base.rglob("*.py")) if base.is_dir() else [base]:
            text = path.read_text()
            rel = path.relative_to(ROOT)
            files.append((len(text.splitlines()), str(rel)))
            tree = ast.parse(text)
            stack: list[tuple[ast.AST, str]] = [(tree, "")]
            while stack:
                node, prefix = stack.pop()
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                        name = f"{prefix}{child.name}"
                        n = (child.end_lineno or child.lineno) - child.lineno + 1
                        bucket = classes if isinstance(child, ast.ClassDef) else functions
                        bucket.append((n, f"{rel}:{child.lineno} {name}"))
                        stack.append((child, f"{name}."))
                    else:
                        stack.append((child, prefix))
    return files, classes, functions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=["app", "optimizer"])
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--min-function", type=int, default=80)
    args = ap.parse_args()
    files, classes, functions = units([ROOT / p for p in args.paths])
    print(f"{len(files)} files, {sum(n for n, _ in files)} lines in {', '.join(args.paths)}")
    print(f"\nbiggest files (top {args.top}):")
    for n, name in sorted(files, reverse=True)[: args.top]:
        print(f"  {n:5d}  {name}")
    print(f"\nbiggest classes (top {args.top}):")
    for n, name in sorted(classes, reverse=True)[: args.top]:
        print(f"  {n:5d}  {name}")
    long = sorted((u for u in functions if u[0] > args.min_function), reverse=True)
    print(f"\nfunctions over {args.min_function} lines: {len(long)}")
    for n, name in long:
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
