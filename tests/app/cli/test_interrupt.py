"""Ctrl-C while the CLI follows a job: the cancel is posted until the service takes it,
also when it came while the job was being made.

Found in CI: under load a demo's session ran on for minutes after Ctrl-C, since the one
cancel the CLI posted was refused and never posted again. The service here is an httpx
transport (that refuses the first cancel, or takes the Ctrl-C during the POST that makes
the session): what is tested is the CLI's own bookkeeping."""

from __future__ import annotations

import signal
from typing import Any

import httpx
import pytest

from app.cli.follow import _CancelOnInterrupt, follow
from app.cli.shared import Api


def test_a_refused_cancel_is_posted_again_until_it_is_taken() -> None:
    posts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        posts.append(request.url.path)
        if len(posts) == 1:
            return httpx.Response(503, json={"detail": "busy: try again"})
        return httpx.Response(202, json={"status": "running", "phase": "cancelling"})

    api = Api(httpx.Client(transport=httpx.MockTransport(answer), base_url="http://knobtune"))
    said: list[str] = []
    before = signal.getsignal(signal.SIGINT)
    with _CancelOnInterrupt(api, "/api/v1/sessions/7/cancel", "interrupted", said.append) as ci:
        ci.poll()
        assert posts == []  # no interrupt, no cancel
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: the handler notes it, nothing raised
        ci.poll()
        assert not ci.sent
        ci.poll()
        assert ci.sent
        ci.poll()  # taken: never posted again
    assert posts == ["/api/v1/sessions/7/cancel"] * 2
    assert said[0] == "interrupted"
    assert "busy: try again" in said[1]
    assert "trying again" in said[1]
    assert len(said) == 2
    assert signal.getsignal(signal.SIGINT) is before  # the user's handler is back


def test_a_ctrl_c_while_the_session_is_being_made_cancels_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The Ctrl-C comes during the POST that makes the session: the CLI must not end there
    (the session would run on) but post the cancel once it knows the session's id."""
    calls: list[tuple[str, str]] = []
    state = {"status": "running", "phase": "baseline"}

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        session: dict[str, Any] = {"id": 7, "request": {}, "progress": {}, **state}
        if request.url.path == "/api/v1/sessions":
            signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, mid-request
            return httpx.Response(202, json=session)
        if request.url.path == "/api/v1/sessions/7/cancel":
            state.update(status="cancelled", phase="done")
            return httpx.Response(202, json=session)
        if request.url.path == "/api/v1/sessions/7/trials":
            return httpx.Response(200, json=[])
        return httpx.Response(200, json=session)

    api = Api(httpx.Client(transport=httpx.MockTransport(answer), base_url="http://knobtune"))
    before = signal.getsignal(signal.SIGINT)
    final = follow(api, {"target_id": 1}, lambda sess: f"session {sess['id']} started")
    assert final["status"] == "cancelled"
    assert calls[:2] == [("POST", "/api/v1/sessions"), ("POST", "/api/v1/sessions/7/cancel")]
    err = capsys.readouterr().err
    assert err.index("session 7 started") < err.index("interrupted: cancelling")
    assert signal.getsignal(signal.SIGINT) is before
