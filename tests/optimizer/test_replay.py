"""python -m optimizer.replay FILE: offline verdicts through the live code path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from optimizer import replay
from optimizer.evidence import judge_streams
from optimizer.verdict import judge
from tests.optimizer.recorded import LONG_NICED, load, streams_of
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


# -- per-transaction runs -------------------------------------------------------------------
def _tx_run(run: dict[str, Any], shares: dict[str, float]) -> dict[str, Any]:
    keys = ("labels", "start_s", "latency_ms", "clients", "warmup_s", "failed")
    return {**{k: run[k] for k in keys}, "shares": shares}


def tx_cases() -> list[dict[str, Any]]:
    """Recorded long-query runs (bench/record_long.py): A B (real effect) and A A (no-op)."""
    data = load(LONG_NICED)
    a = [r for r in data["runs"] if r["config"] == "A"]
    b = [r for r in data["runs"] if r["config"] == "B"]
    sh = data["shares"]
    return [
        {"incumbent": [_tx_run(r, sh) for r in a], "candidate": [_tx_run(r, sh) for r in b]},
        {
            "incumbent": [_tx_run(r, sh) for r in a[0::2]],
            "candidate": [_tx_run(r, sh) for r in a[1::2]],
        },
    ]


def test_per_transaction_runs_are_judged_like_the_live_optimizer(tmp_path: Path) -> None:
    cases = tx_cases()
    # the same runs as stored StreamStats, and with another objective
    as_streams = [
        {side: [{"streams": [s.to_json() for s in streams_of(r, r["shares"])]} for r in c[side]]
         for side in ("incumbent", "candidate")}
        for c in cases
    ]  # fmt: skip
    geo = {**cases[0], "objective": "query_time_geomean"}
    f = tmp_path / "cases.json"
    f.write_text(json.dumps([*cases, *as_streams, geo]))
    out = subprocess.run(
        [sys.executable, "-m", "optimizer.replay", str(f)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 5
    assert lines[0]["keep"] is True  # work_mem 1MB -> 64MB
    assert lines[1]["keep"] is False  # A against A
    assert lines[2:4] == lines[0:2]  # raw transactions and StreamStats agree
    for case, line in zip([*cases, geo], [*lines[:2], lines[4]], strict=True):
        inc = [streams_of(r, r["shares"]) for r in case["incumbent"]]
        cand = [streams_of(r, r["shares"]) for r in case["candidate"]]
        v = judge_streams(inc, cand, objective=case.get("objective", "throughput"))
        assert (line["keep"], line["gain"], line["p_value"]) == (v.keep, v.gain, v.p_value)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ({"incumbent": [[1.0]], "candidate": [{"streams": []}]}, "streams must be a non-empty"),
        ({"incumbent": [[1.0], {"labels": ["q"], "start_s": [0.0], "latency_ms": [5.0]}]},
         "mixes per-second and per-transaction"),
        ({"incumbent": [[1.0]], "candidate": [{"labels": ["q"], "start_s": [0.0],
                                               "latency_ms": [5.0]}]}, "must both be per-second"),
        ({"incumbent": [{"labels": ["q"], "start_s": [0.0]}]}, "latency_ms must be lists"),
        ({"incumbent": [{"labels": ["q", "q"], "start_s": [0.0], "latency_ms": [1.0]}]},
         "equal length"),
        ({"incumbent": [{"labels": ["q"], "start_s": [0.0], "latency_ms": [-1.0]}]},
         "latency_ms has a value"),
        ({"incumbent": [{"labels": ["q"], "start_s": [0.0], "latency_ms": [1.0],
                         "clients": 0}]}, "clients must be"),
        ({"incumbent": [{"streams": [{"name": "x"}]}]}, "not a stream"),
        ({"incumbent": [[1.0]], "candidate": [[1.0]], "objective": "query_time_total"},
         "objective must be one of throughput, latency_p95"),
        ({"incumbent": ["x"], "candidate": [[1.0]]}, "or an object with streams"),
    ],
)  # fmt: skip
def test_bad_per_transaction_runs(case: dict[str, Any], message: str) -> None:
    case = {"candidate": [[1.0]], **case}
    with pytest.raises(replay.ReplayError, match=message):
        replay.replay_cases([case])
