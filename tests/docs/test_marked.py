"""Every shell block of README.md and docs/ carries a marker, and a test runs each marker."""

from __future__ import annotations

import ast
import re
from collections import Counter

from tests.docs.blocks import SHELL, blocks_of, pages, shell_blocks
from tests.docs.registry import COMMANDS
from tests.helpers import ROOT

# an unlabelled block that starts like one of these is a command in disguise
LOOKS_LIKE_A_COMMAND = re.compile(r"^\s*(\$ |knobtune |\.venv/|curl |bash |python|export )")


def test_every_shell_block_has_a_marker() -> None:
    missing = [b.where() for b in shell_blocks() if b.name is None]
    assert not missing, (
        "shell blocks without a '<!-- command: NAME -->' line right above the fence "
        f"(docs/contributing.md): {missing}"
    )


def test_no_command_hides_in_an_unlabelled_block() -> None:
    hidden = [
        b.where()
        for p in pages()
        for b in blocks_of(p)
        if b.lang not in SHELL
        and b.lang in ("", "text")
        and LOOKS_LIKE_A_COMMAND.match(b.text)
        and not b.text.lstrip().startswith(("session ", "trial "))
    ]
    assert not hidden, f"commands in blocks not marked as shell: {hidden}"


def test_marker_names_are_unique() -> None:
    counts = Counter(b.name for b in shell_blocks() if b.name)
    assert [n for n, c in counts.items() if c > 1] == []


def test_every_marker_is_run_by_a_registered_test_that_reads_it() -> None:
    names = {b.name for b in shell_blocks() if b.name}
    unregistered = sorted(names - set(COMMANDS))
    assert not unregistered, (
        f"markers no test runs (add them to tests/docs/registry.py): {unregistered}"
    )
    for name, node in COMMANDS.items():
        path, func = node.split("::")
        tree = ast.parse((ROOT / path).read_text())
        fn = next(
            (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func),
            None,
        )
        assert fn is not None, f"{name}: {node} does not exist"
        literals = {
            n.value
            for n in ast.walk(fn)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        assert name in literals, f"{node} never reads its block {name!r} (command({name!r}))"


def test_the_registry_names_no_block_that_is_gone() -> None:
    names = {b.name for b in shell_blocks() if b.name}
    assert sorted(set(COMMANDS) - names) == []
