"""Fault injection against the real service and real sandbox targets; prints one JSON document.

Every run uses a fresh sandbox target, a fresh metadata DB and a `knobtune serve`
subprocess (or the same app in-process, for the tests), starts a short session
(scale 1, 2 clients, 3 s runs), injects one fault and checks the outcome:

  sigkill_applying, sigkill_measuring, sigkill_restarting
      SIGKILL the service when the session's phase, polled over the API, shows it;
      start it again. The session must resume (attempts 2) and succeed.
  sigkill_restarting_unbootable
      the same while restarting into a shared_buffers the target cannot allocate
      (`ulimit -v` in its restart command): the server stays down with the candidate
      written, and the next process must start it with the snapshot's entries.
  target_killed_back, target_killed_gone
      SIGKILL the target's postmaster mid-benchmark and start it 2 s later, or only
      after the session gave up waiting for it (KNOBTUNE_TARGET_RETRY_S=4): the trial
      is recorded as failed; the session goes on, or fails and restores once it can.
  unbootable_candidate
      a shared_buffers candidate the target cannot allocate: rolled back, the server
      up, the bound narrowed (no later trial at or beyond it).
  metadata_db_outage
      the PostgreSQL metadata DB stopped for 8 s mid-benchmark: the session pauses.
  pgbench_missing, pgbench_logdir_unwritable, pgbench_killed
      a clear error on the trial and on the session (or a note, when it goes on).

Checked for every run: stored trials are 1..N, none lost or stored twice, the ones
stored before the fault unchanged after it, and a fresh optimizer replaying them asks
for exactly them (no trial run twice); at the end the target's pg_file_settings and the
effective values of the tuned knobs equal the snapshot ("targets left changed"). After
a SIGKILL, before the restart, each tuned knob is at its snapshot value, at the recorded
in-progress value or at the last stored trial's value.

    .venv/bin/python bench/faults.py                                  # all kinds, ~12 min
    .venv/bin/python bench/faults.py --runs 1 --kinds sigkill_restarting,metadata_db_outage
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import pwd
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.db import Database  # noqa: E402
from app.models import Trial, TuningSession  # noqa: E402
from app.postgres.sandbox import Sandbox, SandboxError  # noqa: E402
from app.postgres.target import TargetController  # noqa: E402
from app.postgres.units import same_value  # noqa: E402
from app.sessions.plan import session_optimizer  # noqa: E402
from app.sessions.schemas import SessionIn  # noqa: E402
from app.sessions.store import ReplayMismatch, SessionStore  # noqa: E402
from bench.common import run_main  # noqa: E402
from tests.helpers import ServiceProcess, file_settings  # noqa: E402

WORKLOAD = {"builtin": "tpcb-like", "scale": 1, "clients": 2, "jobs": 1, "duration_s": 3,
            "warmup_s": 1}  # fmt: skip
# the tests' runs: the checks are the same. Throttled (pgbench -R 100): what a scenario
# checks is what the service did about the fault, never a level, and a run flat out kept a
# CPU busy that the suite's other workers wait for
QUICK = {**WORKLOAD, "duration_s": 2, "rate": 100}
# shared_buffers 256MB boots under this limit, 512MB does not (the postmaster maps it all).
UNBOOTABLE_ULIMIT_KB = 600_000
FINAL = ("succeeded", "failed", "cancelled")


# -- services ------------------------------------------------------------------------------
class Api(Protocol):
    def get(self, url: str, **kw: Any) -> Any: ...
    def post(self, url: str, **kw: Any) -> Any: ...


class Service(ServiceProcess):
    """`knobtune serve` in a subprocess, with short leases so a restart resumes quickly."""

    def __init__(self, workdir: Path, db_url: str, env: dict[str, str] | None = None) -> None:
        super().__init__(
            workdir,
            KNOBTUNE_DATABASE_URL=db_url,
            KNOBTUNE_LEASE_SECONDS="3",
            KNOBTUNE_POLL_SECONDS="0.5",
            KNOBTUNE_TARGET_RETRY_S="20",
            **(env or {}),
        )
        self.api: Api = httpx.Client(base_url=self.url, timeout=30)
        self.can_kill = True

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class InProcessService:
    """The same app in this process (TestClient): no SIGKILL, but no interpreter start either."""

    def __init__(self, workdir: Path, db_url: str, env: dict[str, str] | None = None) -> None:
        self.workdir, self.db_url = workdir, db_url
        self.env = dict(env or {})
        self.can_kill = False
        self._saved: dict[str, str | None] = {}
        self._client: Any = None
        self.log_path = workdir / "service.log"

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def api(self) -> Api:
        assert self._client is not None
        return self._client  # type: ignore[no-any-return]

    def start(self) -> None:
        from fastapi.testclient import TestClient

        from app.main import create_app
        from app.settings import Settings

        for k, v in self.env.items():  # read by pgbench's runner at run time
            self._saved[k] = os.environ.get(k)
            os.environ[k] = v
        settings = Settings(
            database_url=self.db_url,
            work_dir=self.workdir,
            lease_seconds=3,
            poll_seconds=0.3,
            target_retry_s=float(self.env.get("KNOBTUNE_TARGET_RETRY_S", "20")),
        )
        self._client = TestClient(create_app(settings), raise_server_exceptions=False)
        self._client.__enter__()

    def kill(self) -> None:
        raise RuntimeError("an in-process service cannot be SIGKILLed")

    def stop(self) -> None:
        if self._client is not None:
            self._client.__exit__(None, None, None)
            self._client = None
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved.clear()

    def log_tail(self, n: int = 40) -> str:
        return ""


ServiceFactory = Callable[[Path, str, "dict[str, str] | None"], "Service | InProcessService"]


# -- observations ----------------------------------------------------------------------------
def get(api: Api, path: str) -> Any:
    """GET as JSON, or None while the service (or its metadata DB) does not answer."""
    try:
        r = api.get(path)
    except (httpx.HTTPError, OSError):
        return None
    return r.json() if r.status_code == 200 else None


def wait_until(
    api: Api, sid: int, cond: Callable[[dict[str, Any]], bool], timeout: float, poll: float = 0.03
) -> dict[str, Any]:
    """Poll the session until ``cond`` holds; an end before that is an error."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        s = get(api, f"/api/v1/sessions/{sid}")
        if s is not None:
            last = s
            if cond(s):
                return s
            if s["status"] in FINAL:
                raise RuntimeError(f"session ended before the fault could be injected: {s}")
        time.sleep(poll)
    raise RuntimeError(f"timed out waiting on session {sid}: {last}")


def wait_final(api: Api, sid: int, timeout: float = 300) -> dict[str, Any]:
    return wait_until(api, sid, lambda s: s["status"] in FINAL, timeout, poll=0.3)


def trials_of(api: Api, sid: int) -> list[dict[str, Any]]:
    got = get(api, f"/api/v1/sessions/{sid}/trials")
    return list(got or [])


KNOBS_WATCHED = ["shared_buffers", "work_mem", "max_wal_size", "checkpoint_completion_target"]


def effective(dsn: str) -> dict[str, Any]:
    return TargetController(dsn).probe(KNOBS_WATCHED).settings


def target_state(sb: Sandbox) -> tuple[list[tuple[Any, ...]], dict[str, str]]:
    rows = effective(sb.dsn)
    return file_settings(sb.dsn), {n: r.setting for n, r in rows.items()}


def wait_target_up(sb: Sandbox, timeout: float = 60) -> bool:
    return TargetController(sb.dsn).wait_until_up(timeout)


def start_sandbox(sb: Sandbox, timeout: float = 30) -> None:
    """Start a killed cluster: orphan backends may hold its shared memory for a moment."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sb.start()
            return
        except SandboxError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def kill_postmaster(sb: Sandbox) -> None:
    pid = sb._postmaster_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)


def children_named(ppid: int, name: str) -> list[int]:
    """Pids of ``ppid``'s children running ``name`` (found by parent pid, never by name alone)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if comm == name and int(fields[1]) == ppid:
            out.append(int(d.name))
    return out


def meta_row(db_url: str, sid: int) -> dict[str, Any]:
    """The session's row straight from the metadata DB (the API does not show `applied`)."""
    if db_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as c:
            row = c.execute("SELECT applied, snapshot FROM sessions WHERE id = ?", [sid]).fetchone()
        return {"applied": json.loads(row[0] or "null"), "snapshot": json.loads(row[1] or "null")}
    db = Database(db_url)
    try:
        with db.session() as s:
            sess = s.get(TuningSession, sid)
            assert sess is not None
            return {"applied": sess.applied, "snapshot": sess.snapshot}
    finally:
        db.dispose()


def replay_matches(db_url: str, sid: int) -> bool:
    """A fresh optimizer fed the stored trials in order asks for exactly them (as on resume).

    The session store's own replay (app/sessions/store.py), the one a resuming process runs.
    """
    db = Database(db_url)
    try:
        with db.session() as s:
            sess = s.get(TuningSession, sid)
            assert sess is not None
            data, request, seed = sess.snapshot, sess.request, sess.seed
        store = SessionStore(db, sid, owner=None)  # reads only
        if data is None:
            return not store.stored_trials()
        body = SessionIn.model_validate(request)
        opt = session_optimizer(body, data, seed, can_restart=True).optimizer
        try:
            store.replay(opt)
        except ReplayMismatch:
            return False
        return True
    finally:
        db.dispose()


def at_known_state(
    rows: dict[str, Any], snapshot: dict[str, str], applied: dict[str, str], last: dict[str, str]
) -> bool:
    """Each tuned knob's effective value is its snapshot, in-progress or last trial's value."""
    for name, row in rows.items():
        options = [d[name] for d in (snapshot, applied, last) if name in d]
        if name in applied and not any(same_value(v, row.setting, row) for v in options):
            return False
    return True


# -- one run ---------------------------------------------------------------------------------
@dataclass
class Run:
    kind: str
    ok: bool = False  # every check passed
    recovered: bool = False  # the session ended as it should (resumed, or failed cleanly)
    trials_lost: int = 0
    trials_duplicated: int = 0
    target_changed: bool = False
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def check_trials(run: Run, before: list[dict[str, Any]], final: list[dict[str, Any]]) -> None:
    idx = [t["index"] for t in final]
    run.trials_duplicated += len(idx) - len(set(idx))
    run.trials_lost += len(set(range(1, max(idx, default=0) + 1)) - set(idx))
    by_index = {t["index"]: t for t in final}
    for t in before:
        now = by_index.get(t["index"])
        keys = ("config", "started_at", "samples", "error", "verdict")
        if now is None or any(now[k] != t[k] for k in keys):
            run.trials_lost += 1  # gone or rewritten
            run.problems.append(f"trial {t['index']} stored before the fault changed")


def restart_method(sb: Sandbox, prefix: str) -> dict[str, Any]:
    """The operator's restart method for the scenario's sandbox (argv, no shell of ours).

    With a prefix (``ulimit -v ...;``: a candidate that cannot boot), the operator's own
    configuration wraps pg_ctl in ``sh -c``, as the cluster's OS user.
    """
    pg = sb.restart_method
    if not prefix:
        return pg.model_dump(by_alias=True)
    owner = pwd.getpwuid(sb.data_dir.stat().st_uid).pw_name
    return {
        "kind": "command",
        "argv": ["sh", "-c", f'{prefix}exec "$0" "$@"', *pg.full_argv()],
        "user": owner if os.geteuid() == 0 else None,
        "timeout_s": pg.timeout_s,
    }


class Scenario:
    """Shared setup of a run: sandbox target, service, session; checks at the end."""

    def __init__(
        self,
        kind: str,
        root: Path,
        factory: ServiceFactory,
        *,
        env: dict[str, str] | None = None,
        db_url: str | None = None,
        restart_prefix: str = "",
        quick: bool = False,
    ) -> None:
        self.run = Run(kind)
        self.workload = QUICK if quick else WORKLOAD
        self.dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))
        self.sb = Sandbox.create()
        self.db_url = db_url or f"sqlite:///{self.dir / 'meta.db'}"
        env = {**(env or {}), "KNOBTUNE_RESTART_METHODS": json.dumps(
            {"faults": restart_method(self.sb, restart_prefix)})}  # fmt: skip
        self.service = factory(self.dir, self.db_url, env)
        self.restart_prefix = restart_prefix
        self.t0 = time.monotonic()
        self.before = target_state(self.sb)
        self.sid = 0

    def close(self) -> None:
        self.service.stop()
        self.sb.destroy()
        self.run.seconds = round(time.monotonic() - self.t0, 1)

    def begin(self, knobs: list[str], max_trials: int = 6, **extra: Any) -> int:
        self.service.start()
        api = self.service.api
        r = api.post(
            "/api/v1/targets",
            json={
                "name": self.run.kind,
                "dsn": self.sb.dsn,
                # the workload never runs as a superuser (issue 40): a `knobtune serve`
                # process refuses this sandbox's superuser DSN without it
                "workload_dsn": self.sb.bench_dsn,
                "restart_method": "faults",
                "data_dir": str(self.sb.data_dir),
            },
        )
        assert r.status_code == 201, r.text
        # No PGTune hints: each scenario times its fault on a known walk (x4, then x2 steps),
        # and no final check unless asked (its 6 runs would triple the short sessions).
        body = {"target_id": r.json()["id"], "knobs": knobs, "max_trials": max_trials,
                "seed": 5, "workload": self.workload, "hints": False,
                "final_check_runs": 0, **extra}  # fmt: skip
        r = api.post("/api/v1/sessions", json=body)
        assert r.status_code == 202, r.text
        self.sid = int(r.json()["id"])
        return self.sid

    def finish(
        self, before_fault: list[dict[str, Any]], *, want: str = "succeeded", timeout: float = 300
    ) -> dict[str, Any]:
        run = self.run
        final = wait_final(self.service.api, self.sid, timeout)
        trials = trials_of(self.service.api, self.sid)
        run.details.update(
            status=final["status"],
            error=final["error"],
            attempts=final["attempts"],
            trials=len(trials),
            notes=final["notes"],
        )
        if final["status"] != want:
            run.problems.append(f"status {final['status']} (wanted {want}): {final['error']}")
        check_trials(run, before_fault, trials)
        if not replay_matches(self.db_url, self.sid):
            run.trials_duplicated += 1
            run.problems.append("the stored trials are not what a replay asks for")
        if not wait_target_up(self.sb, 30):
            run.target_changed = True
            run.problems.append("the target is down at the end")
        elif target_state(self.sb) != self.before:
            run.target_changed = True
            run.problems.append("the target's settings differ from the snapshot at the end")
        run.recovered = final["status"] == want and not run.target_changed
        return final

    def done(self) -> Run:
        r = self.run
        r.ok = r.recovered and not r.problems and not r.trials_lost and not r.trials_duplicated
        return r


@contextlib.contextmanager
def scenario(kind: str, root: Path, factory: ServiceFactory, **kw: Any) -> Iterator[Scenario]:
    sc = Scenario(kind, root, factory, **kw)
    try:
        yield sc
    except Exception as exc:  # a run that could not be carried out counts as a failure
        sc.run.problems.append(f"{type(exc).__name__}: {exc}")
        sc.run.details["service_log"] = sc.service.log_tail(15)
    finally:
        sc.close()


# -- the faults ------------------------------------------------------------------------------
PHASES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "applying": lambda s: s["phase"].startswith("applying ") and "=" in s["phase"],  # a candidate
    "measuring": lambda s: s["phase"].startswith(("measuring", "re-measuring")) and s["live_tps"],
    "restarting": lambda s: s["phase"].startswith("restarting the target"),
}


def sigkill(
    phase: str, root: Path, factory: ServiceFactory, *, unbootable: bool = False, nth: int = 0
) -> Run:
    kind = f"sigkill_{phase}" + ("_unbootable" if unbootable else "")
    prefix = f"ulimit -v {UNBOOTABLE_ULIMIT_KB}; " if unbootable else ""
    env = {"KNOBTUNE_TARGET_RETRY_S": "5"}
    with scenario(kind, root, factory, env=env, restart_prefix=prefix) as sc:
        knobs = (
            ["shared_buffers", "work_mem"]
            if phase == "restarting"
            else ["work_mem", "max_wal_size"]
        )
        sid = sc.begin(knobs)
        api = sc.service.api
        cond = PHASES[phase]
        # Later runs kill later in the session: trial 2, 3, 4 ... is the one in flight.
        after = 1 + nth
        s = wait_until(api, sid, lambda s: s["progress"]["trials_done"] >= after and cond(s), 180)
        sc.service.kill()
        sc.run.details["killed_in_phase"] = s["phase"]
        before = trials_of_db(sc.db_url, sid)
        # Before the restart: the target at a known state (once a detached pg_ctl is done).
        row = meta_row(sc.db_url, sid)
        if unbootable:
            time.sleep(3)  # the detached pg_ctl fails to start the candidate
            sc.run.details["target_down_after_kill"] = not TargetController(sc.sb.dsn).is_up()
        elif wait_target_up(sc.sb, 30):
            rows = effective(sc.sb.dsn)
            snap = row["snapshot"]["target"]["effective"]
            applied = (row["applied"] or {}).get("config") or {}
            last = before[-1]["config"] if before else {}
            if not at_known_state(rows, snap, applied, last):
                sc.run.problems.append("after the kill the target was in no recorded state")
        sc.service.start()
        final = sc.finish(before)
        if final["attempts"] < 2:
            sc.run.problems.append(f"not resumed by a second process: attempts {final['attempts']}")
        if unbootable and not any("interrupted restart" in n or "snapshot" in n
                                  for n in final["notes"]):  # fmt: skip
            sc.run.details["note"] = "the pg_ctl restart finished before the next process looked"
    return sc.done()


def trials_of_db(db_url: str, sid: int) -> list[dict[str, Any]]:
    """Stored trials as the API shows them, read while the service is dead."""
    db = Database(db_url)
    try:
        with db.session() as s:
            rows = s.query(Trial).filter(Trial.session_id == sid).order_by(Trial.index).all()
            from app.sessions.service import trial_out

            return [json.loads(trial_out(t).model_dump_json()) for t in rows]
    finally:
        db.dispose()


def target_killed(back: bool, root: Path, factory: ServiceFactory, quick: bool = False) -> Run:
    kind = "target_killed_back" if back else "target_killed_gone"
    env = {"KNOBTUNE_TARGET_RETRY_S": "20" if back else "4"}
    # A postmaster killed under a trial is started again by knobtune through the target's
    # restart method (issue 29); "gone" is a server that method cannot start.
    prefix = "" if back else "exit 3; "
    with scenario(kind, root, factory, env=env, quick=quick, restart_prefix=prefix) as sc:
        trials = (5 if quick else 6) if back else 8
        sid = sc.begin(["work_mem", "max_wal_size"], max_trials=trials)
        api = sc.service.api
        wait_until(api, sid, lambda s: s["progress"]["trials_done"] >= 2 and PHASES["measuring"](s),
                   180)  # fmt: skip
        before = trials_of(api, sid)
        kill_postmaster(sc.sb)
        if back:
            time.sleep(2)
            start_sandbox(sc.sb)
        else:
            s = wait_until(api, sid, lambda s: "unreachable" in s["phase"], 60, poll=0.3)
            sc.run.details["phase_while_down"] = s["phase"]
            start_sandbox(sc.sb)
        final = sc.finish(before, want="succeeded" if back else "failed")
        failed = [t for t in trials_of(api, sid) if t["error"]]
        sc.run.details["failed_trials"] = [t["error"][:160] for t in failed]
        if not failed:
            sc.run.problems.append("no trial was recorded as failed")
        if not back and "could not be started again" not in (final["error"] or ""):
            sc.run.problems.append(f"unclear session error: {final['error']}")
    return sc.done()


def unbootable_candidate(root: Path, factory: ServiceFactory, quick: bool = False) -> Run:
    prefix = f"ulimit -v {UNBOOTABLE_ULIMIT_KB}; "
    with scenario("unbootable_candidate", root, factory, restart_prefix=prefix, quick=quick) as sc:
        sid = sc.begin(["shared_buffers"], max_trials=5)
        sc.finish([])
        trials = trials_of(sc.service.api, sid)
        bad = [t for t in trials if t["value"] == "512MB"]
        sc.run.details["trials"] = [(t["value"], (t["error"] or "")[:120]) for t in trials]
        if not bad or "restart failed" not in (bad[0]["error"] or ""):
            sc.run.problems.append("the 512MB candidate was not recorded as failed to start")
        else:
            later = [t for t in trials if t["index"] > bad[0]["index"] and t["value"]]
            mb = [int(t["value"].removesuffix("MB")) for t in later if t["value"].endswith("MB")]
            if any(v >= 512 for v in mb) or any(t["value"].endswith("GB") for t in later):
                sc.run.problems.append("a value at or beyond the failed one was tried again")
    return sc.done()


def metadata_outage(
    root: Path, factory: ServiceFactory, outage_s: float = 8.0, quick: bool = False
) -> Run:
    meta = Sandbox.create()
    url = f"postgresql+psycopg://postgres:{meta.password}@127.0.0.1:{meta.port}/postgres"
    # a PostgreSQL metadata DB needs the key given (app/vault.py): a Fernet key
    env = {"KNOBTUNE_SECRET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode()}
    try:
        with scenario("metadata_db_outage", root, factory, db_url=url, env=env, quick=quick) as sc:
            sid = sc.begin(["work_mem", "max_wal_size"], max_trials=5 if quick else 6)
            api = sc.service.api
            wait_until(api, sid,
                       lambda s: s["progress"]["trials_done"] >= 2 and PHASES["measuring"](s),
                       180)  # fmt: skip
            before = trials_of(api, sid)
            meta.stop()
            time.sleep(outage_s)
            meta.start()
            final = sc.finish(before)
            sc.run.details["paused_not_restarted"] = final["attempts"] == 1
    finally:
        meta.destroy()
    return sc.done()


def pgbench_fault(what: str, root: Path, factory: ServiceFactory, quick: bool = False) -> Run:
    kind = f"pgbench_{what}"
    env: dict[str, str] = {}
    if what == "missing":
        env["KNOBTUNE_PGBENCH"] = "/nonexistent/pgbench"
    with scenario(kind, root, factory, env=env, quick=quick) as sc:
        if what == "logdir_unwritable":
            (sc.dir / "runs").write_text("a file where pgbench's log directories go\n")
        if what == "killed":
            sid = sc.begin(["work_mem"], max_trials=5)
            api = sc.service.api
            wait_until(api, sid, PHASES["measuring"], 120)
            pids = children_named(sc.service.pid, "pgbench")
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            sc.run.details["killed_pids"] = len(pids)
            final = sc.finish([])
            killed = [t for t in trials_of(api, sid) if "killed by SIGKILL" in (t["error"] or "")]
            if not killed or not any("killed by SIGKILL" in n for n in final["notes"]):
                sc.run.problems.append("the kill is not on a trial and in the session's notes")
        else:
            script = {"builtin": None, "scripts": [{"sql": "SELECT 1;"}], "init": False}
            sid = sc.begin(["work_mem"], max_trials=5, workload={**sc.workload, **script})
            final = sc.finish([], want="failed")
            trials = trials_of(sc.service.api, sid)
            needle = "pgbench" if what == "missing" else "writable work directory"
            sc.run.details["error"] = final["error"]
            if len(trials) != 1 or needle not in (trials[0]["error"] or ""):
                sc.run.problems.append(f"trial error unclear: {trials}")
            if needle not in (final["error"] or ""):
                sc.run.problems.append(f"session error unclear: {final['error']}")
    return sc.done()


KINDS: dict[str, Callable[[Path, ServiceFactory, int], Run]] = {
    "sigkill_applying": lambda r, f, i: sigkill("applying", r, f, nth=i),
    "sigkill_measuring": lambda r, f, i: sigkill("measuring", r, f, nth=i),
    "sigkill_restarting": lambda r, f, i: sigkill("restarting", r, f, nth=i),
    "sigkill_restarting_unbootable": lambda r, f, i: sigkill(
        "restarting", r, f, unbootable=True, nth=i
    ),
    "target_killed_back": lambda r, f, i: target_killed(True, r, f),
    "target_killed_gone": lambda r, f, i: target_killed(False, r, f),
    "unbootable_candidate": lambda r, f, i: unbootable_candidate(r, f),
    "metadata_db_outage": lambda r, f, i: metadata_outage(r, f),
    "pgbench_missing": lambda r, f, i: pgbench_fault("missing", r, f),
    "pgbench_logdir_unwritable": lambda r, f, i: pgbench_fault("logdir_unwritable", r, f),
    "pgbench_killed": lambda r, f, i: pgbench_fault("killed", r, f),
}
REPEATED = ("sigkill_applying", "sigkill_measuring", "sigkill_restarting")


def summarize(runs: list[Run]) -> dict[str, Any]:
    injected: dict[str, int] = {}
    for r in runs:
        injected[r.kind] = injected.get(r.kind, 0) + 1
    return {
        "faults_injected": injected,
        "sessions": len(runs),
        "sessions_recovered": sum(r.recovered for r in runs),
        "trials_lost": sum(r.trials_lost for r in runs),
        "trials_duplicated": sum(r.trials_duplicated for r in runs),
        "targets_left_changed": sum(r.target_changed for r in runs),
        "runs_with_problems": [r.kind for r in runs if not r.ok],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each SIGKILL phase (default 3)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    t0 = time.monotonic()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="knobtune-faults-") as tmp:
        for kind in kinds:
            for i in range(args.runs if kind in REPEATED else 1):
                run = KINDS[kind](Path(tmp), Service, i)
                status = "ok" if run.ok else f"PROBLEMS {run.problems}"
                print(f"{kind} #{i + 1}: {status} ({run.seconds:.0f} s)", file=sys.stderr)
                runs.append(run)
    doc = {**summarize(runs), "seconds": round(time.monotonic() - t0),
           "runs": [asdict(r) for r in runs]}  # fmt: skip
    text = json.dumps(doc, indent=2, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    run_main(main)
