"""README's sample result is a real run's, and what the CLI prints for it.

The run is stored in bench/results/demo/<date>/: the demo's stdout and the session's record
(`--out`'s knobtune-session-1.json, the API's session). The CLI's own end-of-session code
renders the record again here: it must print the stored output line for line, README's
block (under "How to read the result") must be its first lines (a line may stop at " ..."),
and the demo's page shows it whole. A change of the CLI's format fails this test until the
sample is run and stored again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli.sessions import report, report_lines
from app.cli.shared import EXIT_BY_OUTCOME
from tests.helpers import ROOT

RUN = ROOT / "bench" / "results" / "demo" / "2026-11-28"  # the run README shows


def _readme_sample() -> list[str]:
    """The lines of README's first text block under "How to read the result"."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```text", lines.index("## How to read the result"))
    return lines[start + 1 : lines.index("```", start + 1)]


def test_readmes_sample_is_what_the_cli_prints_for_the_stored_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run, shown = RUN, _readme_sample()
    printed = (run / "stdout.txt").read_text().splitlines()
    record = json.loads((run / "knobtune-session-1.json").read_text())

    # the CLI's end of a demo, on the stored session (no --out: it writes nothing)
    code = report(None, record, None, force=False, demo=True)  # type: ignore[arg-type]
    again = capsys.readouterr().out.splitlines()
    assert again[:-1] == report_lines(record)
    assert again[-1].startswith("no file written: --out DIR keeps")
    assert code == EXIT_BY_OUTCOME[record["outcome"]]

    # the stored output is that, then the files --out wrote
    result, files = printed[: len(again) - 1], printed[len(again) - 1 :]
    assert result == report_lines(record)
    assert files == [
        f"{what}: demo/knobtune-session-1.{ext}"
        for what, ext in (("config", "conf"), ("chart", "svg"), ("record", "json"))
    ]
    for name in ("knobtune-session-1.conf", "knobtune-session-1.svg", "stderr.txt"):
        assert (run / name).is_file()

    # README shows the result's first lines (what was found, how sure, what next), a long
    # line cut at " ..."
    assert 3 <= len(shown) <= len(result), (shown, result)
    for ours, theirs in zip(shown, result[: len(shown)], strict=True):
        if ours.endswith(" ..."):
            assert theirs.startswith(ours[: -len(" ...")]), (ours, theirs)
        else:
            assert ours == theirs


def test_the_demo_page_shows_the_stored_run_whole() -> None:
    page = (ROOT / "docs" / "results" / "demo.md").read_text()
    run = RUN
    assert f"```text\n{(run / 'stdout.txt').read_text().rstrip()}\n```" in page
    progress = [
        ln
        for ln in (run / "stderr.txt").read_text().splitlines()
        if ln.startswith(("trial ", "session "))
    ]
    assert "\n".join(progress) in page
    assert (run / "knobtune-session-1.conf").read_text().rstrip() in page
    assert (ROOT / "docs" / "results" / "img" / "demo-chart.svg").read_text() == (
        run / "knobtune-session-1.svg"
    ).read_text()
    assert f"exit status was {EXIT_BY_OUTCOME[_outcome(run)]}" in page


def _outcome(run: Path) -> str:
    return str(json.loads((run / "knobtune-session-1.json").read_text())["outcome"])
