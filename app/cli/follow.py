"""Following a job until it ends: a session's live view (a table on a terminal, a line
per trial elsewhere) and the phases of a sweep, capture or comparison; Ctrl-C or SIGTERM
cancels the job meanwhile."""

from __future__ import annotations

import functools
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from app.cli.shared import Api, CliError
from app.sessions.verdicts import moved_verdicts
from optimizer.objective import in_units, objective_kind


def follow(
    api: Api, body: dict[str, Any], announce: Callable[[dict[str, Any]], str]
) -> dict[str, Any]:
    """Start a session (``body``: its request), say ``announce(session)`` ("session N ..."),
    then show trials and progress until it ends; Ctrl-C cancels it cleanly.

    On a terminal: a live table with a progress bar. Otherwise (logs, pipes): one
    line per finished trial, so the output reads well after the fact.
    """
    # The handler before the POST: a Ctrl-C while the session is being made, or right
    # after "session N" appeared, must cancel it too. Outside it, a Ctrl-C during the POST
    # left the session running, and one after the line was printed was lost where the CLI
    # inherited SIGINT ignored (a test runner's worker): the session ran to its end.
    with _CancelOnInterrupt(
        api,
        None,  # known once the session is
        "interrupted: cancelling; the target is being restored...",
        functools.partial(print, file=sys.stderr),
    ) as interrupt:
        started = api.call("POST", "/api/v1/sessions", json=body)
        session_id = started["id"]
        interrupt.cancel_path = f"/api/v1/sessions/{session_id}/cancel"
        print(announce(started), file=sys.stderr)
        from rich.console import Console

        console = Console(stderr=True)
        view = _LiveView(console) if console.is_terminal else _LineView(console)
        with view:
            while True:
                interrupt.poll()
                # The trials first: a trial and the session's re-estimated plan are stored
                # together, so the session read after them has planned at least their
                # trials (read the other way round, the last trial line of a session that
                # ended early showed the plan from before it: "9/11"). Once it has ended,
                # its trials again: one may have been stored between the two reads.
                trials = api.call("GET", f"/api/v1/sessions/{session_id}/trials")
                sess = api.call("GET", f"/api/v1/sessions/{session_id}")
                ended = sess["status"] in ("succeeded", "failed", "cancelled")
                if ended:
                    trials = api.call("GET", f"/api/v1/sessions/{session_id}/trials")
                view.update(sess, trials)
                if ended:
                    return dict(sess)
                time.sleep(1.0)


def follow_job(api: Api, path: str, on_interrupt: str) -> dict[str, Any]:
    """Poll the background job at ``path`` (a capture, sweep or comparison) until it ends,
    printing its phase as it changes; Ctrl-C or SIGTERM post ``path``/cancel once, saying
    ``on_interrupt``, and the loop goes on until the job has ended."""
    last = ""
    say = functools.partial(print, file=sys.stderr)
    with _CancelOnInterrupt(api, f"{path}/cancel", on_interrupt, say) as interrupt:
        while True:
            interrupt.poll()
            job: dict[str, Any] = api.call("GET", path)
            if job["phase"] != last:
                print(f"  {job['phase']}", file=sys.stderr)
                last = job["phase"]
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            time.sleep(1.0)


class _CancelOnInterrupt:
    """While a job is followed, Ctrl-C or SIGTERM (timeout, systemd, kill) cancels it: the
    cancel is posted until the service takes it, since a busy service may refuse it once
    (a cancel lost there would leave the job running while the user waits)."""

    def __init__(
        self, api: Api, cancel_path: str | None, message: str, say: Callable[[str], object]
    ) -> None:
        self.api, self.cancel_path, self.message, self.say = api, cancel_path, message, say
        self.interrupted = self.sent = self.announced = self.retrying = False
        self._old: dict[int, Any] = {}

    def _on_signal(self, _sig: int, _frame: Any) -> None:
        self.interrupted = True

    def __enter__(self) -> _CancelOnInterrupt:
        self._old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def poll(self) -> None:
        """Post the cancel if an interrupt came and the service has not taken it yet (once
        the job's cancel_path is known)."""
        if not self.interrupted or self.sent or self.cancel_path is None:
            return
        if not self.announced:
            self.say(self.message)
            self.announced = True
        try:
            self.api.call("POST", self.cancel_path)
        except CliError as exc:
            # e.g. the job ended meanwhile (409: the loop sees its status next) or the
            # service was busy: try again on the next poll
            if not self.retrying:
                self.say(f"the cancel was not taken yet ({exc}); trying again")
                self.retrying = True
            return
        self.sent = True


def _trial_cells(
    t: dict[str, Any], trials: list[dict[str, Any]], objective: str = "throughput"
) -> list[str]:
    # one sign per result, in the objective's units: a query time that fell reads -20%
    gain = f"{in_units(objective, t['gain']) * 100:+.1f}%" if t["gain"] is not None else ""
    med = t["samples"]["median_tps"]
    verdict = t["verdict"] or ("failed" if t["error"] else "")
    shown = moved_verdicts((c["index"], c["role"], c["verdict"]) for c in trials).get(t["index"])
    if shown is not None:
        # decided on an incumbent re-run (C I I): say which candidate it was about
        about = next(c for c in trials if c["index"] == shown)
        verdict += f" {about['knob'] or ''} {about['value'] or ''}".rstrip()
    return [
        str(t["index"]),
        t["knob"] or f"({t['role']})",
        t["value"] or "",
        f"{med:.1f}" if med is not None else "-",
        gain,
        verdict,
    ]


def _progress_line(sess: dict[str, Any], done: int | None = None) -> str:
    """ "9/14 trials, ETA 65 s": ``done`` is the trial the line is about (never behind it)."""
    prog = sess["progress"]
    done = prog["trials_done"] if done is None else done
    planned = max(prog["trials_planned"] or 0, done) or "?"
    eta = f", ETA {prog['eta_s']:.0f} s" if prog["eta_s"] is not None else ""
    now = f", now {sess['live_tps'][-1]:.0f} tps" if sess["live_tps"] else ""
    return f"{done}/{planned} trials{eta}{now}"


class _LiveView:
    def __init__(self, console: Any) -> None:
        from rich.live import Live

        self.live = Live(console=console, refresh_per_second=2)

    def __enter__(self) -> _LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def update(self, sess: dict[str, Any], trials: list[dict[str, Any]]) -> None:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(title=f"session {sess['id']}: {sess['status']} - {sess['phase']}")
        for col in ("#", "knob", "value", "median tps", "gain", "verdict"):
            table.add_column(col, justify="right" if col in ("#", "median tps", "gain") else "left")
        objective = objective_kind(sess["request"])
        for t in trials[-15:]:
            table.add_row(*_trial_cells(t, trials, objective))
        prog = sess["progress"]
        done = max(prog["trials_done"], len(trials))  # fetched a moment apart
        total = max(prog["trials_planned"] or 1, done, 1)
        bar = ProgressBar(total=total, completed=done, width=40)
        self.live.update(Group(table, bar, _progress_line(sess, done)))


class _LineView:
    def __init__(self, console: Any) -> None:
        self.console = console
        self.shown = 0
        self.phase = ""

    def __enter__(self) -> _LineView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, sess: dict[str, Any], trials: list[dict[str, Any]]) -> None:
        objective = objective_kind(sess["request"])
        for t in trials[self.shown :]:
            idx, knob, value, med, gain, verdict = _trial_cells(t, trials, objective)
            self.console.print(
                f"trial {idx:>3}  {knob} {value}  {med} tps  {gain}  {verdict}  "
                f"[{_progress_line(sess, t['index'])}]",
                highlight=False,
                soft_wrap=True,  # one line per trial, whatever the width
            )
        self.shown = len(trials)
        if sess["phase"] != self.phase and sess["status"] in ("succeeded", "failed", "cancelled"):
            self.console.print(f"session {sess['id']}: {sess['status']} ({sess['phase']})")
        self.phase = sess["phase"]
