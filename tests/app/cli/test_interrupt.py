"""Ctrl-C while the CLI follows a job: the cancel is posted until the service takes it.

Found in CI: under load a demo's session ran on for minutes after Ctrl-C, since the one
cancel the CLI posted was refused and never posted again. The service here is an httpx
transport that refuses the first cancel: what is tested is the CLI's own bookkeeping."""

from __future__ import annotations

import signal

import httpx

from app.cli import Api, _CancelOnInterrupt


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
