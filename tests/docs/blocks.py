"""Shell blocks of README.md and docs/**/*.md, each under its marker.

Every fenced block in a shell language (sh, bash, shell, console) carries a marker on the
line right before its fence::

    <!-- command: NAME -->
    ```sh
    knobtune sessions
    ```

and some test runs it: :data:`tests.docs.registry.COMMANDS` maps NAME to that test, which
takes the block's text with :func:`command` (never a copy of it) and runs it at small sizes
in a fresh directory with the default settings. tests/docs/test_marked.py fails for a block
without a marker, a marker no test runs, and a test that does not read its block.
See docs/contributing.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT

SHELL = {"sh", "bash", "shell", "console"}
MARKER = re.compile(r"^<!-- command: ([a-z0-9][a-z0-9-]*) -->$")
FENCE = re.compile(r"^(```+|~~~+)\s*([A-Za-z0-9_+-]*)")


@dataclass(frozen=True)
class Block:
    path: Path  # relative to the repository
    line: int  # the fence's line, from 1
    lang: str
    name: str | None  # the marker's NAME, None without one
    text: str

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of the manual."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """Every fenced code block of one Markdown file, with the marker above it (if any)."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i].lstrip())
        if m is None:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        indent = len(lines[i]) - len(lines[i].lstrip())
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = "\n".join(ln[indent:] for ln in lines[i + 1 : j])
        before = lines[i - 1].strip() if i > 0 else ""
        marker = MARKER.match(before)
        out.append(
            Block(
                path=path.relative_to(ROOT),
                line=i + 1,
                lang=lang,
                name=marker.group(1) if marker else None,
                text=body,
            )
        )
        i = j + 1
    return out


def shell_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks_of(p) if b.lang in SHELL]


def command(name: str) -> str:
    """The text of the one shell block marked NAME (what a test runs)."""
    found = [b for b in shell_blocks() if b.name == name]
    assert found, f"no shell block is marked <!-- command: {name} --> in README.md or docs/"
    assert len(found) == 1, f"marker {name!r} is used {len(found)} times: " + ", ".join(
        b.where() for b in found
    )
    return found[0].text


def replace(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced; fails when the block no longer says ``old``.

    Tests shrink a shown command with this (a smaller scale, shorter runs, a sandbox's
    DSN), so that a block edited in the docs breaks its test instead of drifting away.
    """
    assert old in text, f"the block no longer contains {old!r}:\n{text}"
    return text.replace(old, new)
