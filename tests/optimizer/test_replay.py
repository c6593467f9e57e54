"""python -m optimizer.replay FILE: offline verdicts through the live code path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer import replay
from optimizer.verdict import judge
from tests.optimizer.test_verdict import recorded

ROOT = Path(__file__).resolve().parents[2]


def cases() -> list[dict[str, list[list[float]]]]:
    runs = recorded()
    same = runs["tpcb_default"]
    return [
        {"incumbent": same[:2], "candidate": same[2:4]},
        {"incumbent": runs["sort_wm4MB"][:2], "candidate": runs["sort_wm16MB"][:2]},
    ]


def test_cli_end_to_end(tmp_path: Path) -> None:
    f = tmp_path / "cases.json"
    f.write_text(json.dumps(cases()))
    out = subprocess.run(
        [sys.executable, "-m", "optimizer.replay", str(f)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [set(d) for d in lines] == [{"keep", "gain", "p_value"}] * 2
    assert lines[0]["keep"] is False
    assert lines[1]["keep"] is True
    assert lines[1]["gain"] > 0.3
    # exactly what the live optimizer's verdict function says
    for case, line in zip(cases(), lines, strict=True):
        v = judge(case["incumbent"], case["candidate"])
        assert (line["keep"], line["gain"], line["p_value"]) == (v.keep, v.gain, v.p_value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"incumbent": []}', "JSON list"),
        ("[1]", "case 1: must be an object"),
        ('[{"incumbent": [[1, 2]]}]', "'candidate' must be a non-empty list"),
        ('[{"incumbent": [[1, "a"]], "candidate": [[1]]}]', "non-numeric"),
        ('[{"incumbent": [[1, true]], "candidate": [[1]]}]', "non-numeric"),
        ('[{"incumbent": [[1, NaN]], "candidate": [[1]]}]', "non-numeric"),
        ('[{"incumbent": [[1, -1]], "candidate": [[1]]}]', "negative"),
        ('[{"incumbent": [[]], "candidate": [[1]]}]', "run 1 must be a non-empty list"),
        ('[{"incumbent": [[1]], "candidate": [[1]], "objective": "x"}]', "objective"),
    ],
)
def test_bad_file_exits_2_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    assert replay.main([str(f)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert message in err


def test_missing_file_and_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert replay.main([]) == 2
    assert "usage" in capsys.readouterr().err
