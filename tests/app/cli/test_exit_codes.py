"""The CLI's exit status tells a session's outcomes apart (docs/cli.md's table), each from
a real session outcome: `knobtune tune` on a simulated world (tests/app/cli/world.py)
whose session ends confirmed, with no change, unconfirmed, failed or cancelled. The exit
status and the API's `outcome` come from one function, so they agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import cli
from app.cli import shared
from app.sessions.summary import OUTCOMES, outcome, summary
from tests.app.cli.world import World
from tests.app.runs.fake import FakeEnv, Faults
from tests.optimizer.sim import flat_surface, reporting_surface


@pytest.fixture
def reporting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    return World(tmp_path, monkeypatch, reporting_surface())  # work_mem 16MB: +44%


def _outcome_of(world: World, sid: int) -> str | None:
    out = world.session(sid)["outcome"]
    assert out in OUTCOMES
    return str(out)


def test_a_confirmed_gain_exits_0(reporting: World, capsys: pytest.CaptureFixture[str]) -> None:
    code = reporting.tune("--knobs", "work_mem", "--no-hints", "--max-trials", "30", "--seed", "3")
    assert _outcome_of(reporting, 1) == "confirmed"
    assert code == shared.EXIT_OK == 0
    assert "confirmed by the final check" in capsys.readouterr().out


def test_no_change_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flat = World(tmp_path, monkeypatch, flat_surface())  # every candidate is a no-op
    code = flat.tune("--max-trials", "14", "--seed", "1")
    assert _outcome_of(flat, 1) == "no-change"
    assert code == shared.EXIT_NO_CHANGE == 3


def test_an_unconfirmed_gain_exits_4(reporting: World, capsys: pytest.CaptureFixture[str]) -> None:
    # no final check: whatever the walk kept stays unconfirmed
    code = reporting.tune(
        "--knobs", "work_mem", "--no-hints", "--max-trials", "16", "--final-check-runs", "0"
    )
    assert _outcome_of(reporting, 1) == "unconfirmed"
    assert code == shared.EXIT_UNCONFIRMED == 4
    assert "UNCONFIRMED" in capsys.readouterr().out


def test_a_failed_session_exits_5(reporting: World, capsys: pytest.CaptureFixture[str]) -> None:
    env = FakeEnv(reporting.surface, faults=Faults(fail={1, 2}))  # the baseline fails twice
    code = reporting.tune("--knobs", "work_mem", env=env)
    assert _outcome_of(reporting, 1) == "failed"
    assert code == shared.EXIT_FAILED == 5
    err = capsys.readouterr().err
    assert "knobtune: session failed: the baseline could not be measured twice" in err


def test_a_cancelled_session_exits_130(
    reporting: World, capsys: pytest.CaptureFixture[str]
) -> None:
    env = FakeEnv(reporting.surface, faults=Faults(cancel=3))  # cancelled through the API
    code = reporting.tune("--knobs", "work_mem", "--no-hints", env=env)
    assert _outcome_of(reporting, 1) == "cancelled"
    assert code == shared.EXIT_INTERRUPTED == 130
    assert "cancelled: the target was restored" in capsys.readouterr().err


def test_usage_errors_exit_2_and_other_errors_1(
    reporting: World, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as parsed:  # argparse's own
        cli.main(["tune", "--target", reporting.target, "--max-trials", "many"])
    assert parsed.value.code == shared.EXIT_USAGE == 2
    # options that do not go together are usage errors too; nothing was started
    assert cli.main(["tune", "--target", "x", "--dsn", "host=/nowhere"]) == 2
    assert "give --target NAME" in capsys.readouterr().err
    # a command that could not do its job: 1, saying why
    assert reporting.cli("tune", "--target", "nope", "--knobs", "work_mem") == shared.EXIT_ERROR
    assert "no target 'nope'" in capsys.readouterr().err
    assert reporting.cli("status", "99") == 1
    assert reporting.next_id() == 1  # no session was made


def test_jobs_above_clients_is_a_usage_error(
    reporting: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """--jobs above --clients is refused as the API's 422 refuses it (it was capped
    silently): a usage error that says what to change; no target, no session."""
    assert reporting.tune("--jobs", "3") == shared.EXIT_USAGE  # world.TUNE has --clients 2
    assert capsys.readouterr().err.strip() == (
        "knobtune: --jobs (3) must not exceed --clients (2): pgbench runs at most one thread "
        "per client; give --jobs 2 or less, or more --clients"
    )
    assert reporting.next_id() == 1  # no session was made


def test_the_exit_status_outcome_and_summary_agree() -> None:
    """Every (status, claim, changed?) a session can end in: the outcome the API and the
    exit status give is what the summary's first words say."""
    start, moved = {"work_mem": "4MB"}, {"work_mem": "16MB"}
    words = {
        "confirmed": "Found a better configuration",
        "no-change": "No change recommended",
        "unconfirmed": "Unconfirmed",
        "failed": "The session failed",
    }
    for status in ("succeeded", "failed"):
        for claim in (None, "none", "confirmed", "not-credible", "no-change", "unconfirmed"):
            for best in (start, moved):
                got = outcome(status, claim, start, best)
                assert got in OUTCOMES
                text = summary(
                    session_id=1, status=status, objective="throughput", gain_status=claim,
                    gain=0.2, ci=(0.1, 0.3), start=start, best=best, trials=9,
                )  # fmt: skip
                assert text.startswith(words[str(got)]), (status, claim, best, text)
                assert shared.EXIT_BY_OUTCOME[str(got)] != shared.EXIT_USAGE
    assert outcome("cancelled", "confirmed", start, moved) == "cancelled"
    assert outcome("running", None, start, moved) is None
    assert len(set(shared.EXIT_BY_OUTCOME.values())) == len(OUTCOMES)


def test_values_the_service_refuses_are_a_usage_error(
    reporting: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --clients the workload's default applies, which the API checks: its 422 is
    the options' fault, so the CLI exits 2 with the API's words (it exited 1)."""
    code = reporting.cli("tune", "--target", reporting.target, "--jobs", "64", "--no-hints")
    assert code == shared.EXIT_USAGE
    err = capsys.readouterr().err
    assert "jobs (64) must not exceed clients" in err, err
    assert reporting.next_id() == 1  # no session was made
