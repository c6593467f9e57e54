"""Exports of a session: the recommended config (conf, sql, json) with its evidence, or in a
managed service's own form (rds, cloudsql, azure, cnpg, patroni: optimizer/managed.py)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select

from app.db import Database
from app.errors import ServiceError
from app.models import Sweep, Trial, TuningSession
from app.sessions.service import (
    best_vs_start,
    get_session,
    list_trials,
    pair,
    recommendation_base,
)
from app.sessions.summary import headline, resolution_note
from app.sessions.verdicts import moved_verdicts
from app.sweeps.service import sweep_header
from app.targets.service import get_target
from optimizer import managed
from optimizer.catalogue import CATALOGUE
from optimizer.checkpoints import CHECKPOINT_KNOBS
from optimizer.counters import ServerCounters
from optimizer.counters import summary as counters_summary
from optimizer.objective import lower_is_better, objective_kind
from optimizer.order import combine
from optimizer.render import Recommendation, claim_text, render_conf, render_json, render_sql


def recommendation(db: Database, session_id: int) -> Recommendation:
    sess = get_session(db, session_id)
    if sess.start_config is None or sess.best_config is None:
        raise ServiceError(
            409, f"session {session_id} has no measured config yet; poll until a trial is done"
        )
    trials = list_trials(db, session_id)
    target = get_target(db, sess.target_id)
    header: dict[str, object] = {
        "session": sess.id,
        "target": target.name,
        "server": (target.probe or {}).get("version", "?"),
        "status": sess.status,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    # the client sweep that concerns this session, as comments (see session_sweep)
    sweep = session_sweep(db, sess)
    if sweep is not None:
        header.update(sweep_header(sweep))
    unsafe = sorted(
        k for k in sess.best_config if k in CATALOGUE and CATALOGUE[k].durability_unsafe
    )
    if sess.request.get("allow_unsafe") and unsafe:
        # Flagged in every export even when the value stayed as it was: the session
        # was allowed to trade crash safety for speed, and the reader must know.
        header["WARNING"] = (
            "allow_unsafe: this session tuned durability-unsafe knobs ("
            + ", ".join(f"{k}={sess.best_config[k]}" for k in unsafe)
            + "); a crash can lose committed transactions or corrupt data where they are off"
        )
    objective = objective_kind(sess.request)
    said = headline(objective, sess.gain)
    if said and lower_is_better(objective):
        # the claim line below gives "fraction better"; for times, say it as time saved
        header["objective"] = f"{objective}: {said} (a gain below is the fraction of time saved)"
    labels, streams, status = best_vs_start(sess, trials)
    header.update(evidence_header(labels, streams, status))
    header.update(io_header(trials, sess.start_config, sess.best_config))
    seen = resolution_note(sess.notes)
    if seen:  # nothing recommended: the smallest effect the runs could have shown
        header["resolution"] = seen
    original = {**sess.start_config, **recommendation_base(sess)}
    if original != sess.start_config:
        header["baseline"] = (
            "start: heuristic: the session started from PGTune's values; its gain is measured "
            "against them, while 'original' below is the server's own settings before it"
        )
    return Recommendation.from_trials(
        objective=objective,
        original=original,
        recommended=sess.best_config,
        trials=_verdict_rows(trials, sess.start_config),
        overall_gain=sess.gain,
        overall_p_value=sess.gain_p_value,
        header=header,
        unsafe=unsafe,
        gain_status=sess.gain_status,
        overall_ci=pair(sess.gain_ci_low, sess.gain_ci_high),
        check=_check_text(trials),
        not_judged=not_judged(sess.notes or []),
    )


_NOT_JUDGED = re.compile(r"^([a-z_]+) not judged: ")


def not_judged(notes: list[Any]) -> dict[str, str]:
    """Checkpoint knobs the session set aside (optimizer/checkpoints.py), from its notes."""
    out: dict[str, str] = {}
    for text in notes:
        m = _NOT_JUDGED.match(str(text))
        if m is not None and m.group(1) in CHECKPOINT_KNOBS:
            out[m.group(1)] = str(text)
        long = _LONG_RUNS.match(str(text))
        if long is not None:  # judged after all, on runs that span a cycle
            for name in long.group(1).split(", "):
                out.pop(name, None)
    return out


_LONG_RUNS = re.compile(r"^long runs: ([a-z_, ]+) on runs of ")


def session_sweep(db: Database, sess: TuningSession) -> Sweep | None:
    """The client sweep an export of ``sess`` may speak of, or None.

    Only a sweep of the same target that finished before the session did: the one the
    session ran itself (clients "auto"), else the newest with a knee of the same workload
    (builtin, scripts, scale). A sweep of another workload, or one run after the session
    ended, says nothing about this session's config (a TPC-B sweep's max_connections
    warning once appeared in a TPC-H session's export).
    """
    end = sess.finished_at
    with db.session() as s:
        sweeps = list(
            s.scalars(
                select(Sweep)
                .where(
                    Sweep.target_id == sess.target_id,
                    Sweep.status == "succeeded",
                    Sweep.knee_clients.is_not(None),
                )
                .order_by(Sweep.id.desc())
            ).all()
        )
    wl = sess.request.get("workload", {})
    for sw in sweeps:
        if (sw.result or {}).get("session_id") == sess.id:
            return sw
    for sw in sweeps:
        if _before(sw.finished_at, end) and _same_workload(sw.request, wl):
            return sw
    return None


def _before(when: datetime | None, end: datetime | None) -> bool:
    return when is not None and (end is None or when <= end)


def _same_workload(sweep: dict[str, Any], wl: dict[str, Any]) -> bool:
    return (
        sweep.get("builtin") == wl.get("builtin")
        and (sweep.get("scripts") or None) == (wl.get("scripts") or None)
        and float(sweep.get("scale") or 0) == float(wl.get("scale") or 0)
    )


def _verdict_rows(
    trials: list[Trial], start: dict[str, str]
) -> list[tuple[str | tuple[str, ...] | None, str | None, float | None]]:
    """(knobs, verdict, gain) per trial, each verdict on the candidate it is about.

    A verdict decided on an incumbent re-run (C I I: the keep lands on the last I) belongs
    to the candidate before it: that knob was kept, with that gain.
    """
    rows: dict[int, list[Any]] = {
        t.index: [_changed_knobs(t, start), t.verdict, t.gain] for t in trials
    }
    for index, shown in moved_verdicts((t.index, t.role, t.verdict) for t in trials).items():
        rows[shown][1:], rows[index][1:] = rows[index][1:], [None, None]
    return [(k, v, g) for k, v, g in rows.values()]


def _changed_knobs(t: Trial, start: dict[str, str]) -> str | tuple[str, ...] | None:
    """The knob a trial changed; for several at once (the hints), every one it changed."""
    if t.knob is not None or t.role != "candidate":
        return t.knob
    return tuple(k for k, v in t.config.items() if start.get(k) != v)


def _check_text(trials: list[Trial]) -> str | None:
    runs = [t for t in trials if t.role.startswith("final-") and t.median_tps is not None]
    a = sum(t.role == "final-baseline" for t in runs)
    return f"{a} + {len(runs) - a} side-by-side runs" if runs else None


def evidence_header(
    labels: list[dict[str, Any]] | None, streams: list[dict[str, Any]] | None, status: str | None
) -> dict[str, str]:
    """Per-label and per-stream lines for an export's header (comments in conf and sql)."""
    out: dict[str, str] = {}
    for row in streams or []:
        out[f"stream {row['stream']} ({row['config']})"] = stream_line(row)
    if labels:
        out["mean latency per label, best vs start"] = status or ""
        for c in labels:
            out[f"  {c['stream']}/{c['label']}"] = label_line(c)
    return out


def io_header(
    trials: list[Trial], start: Mapping[str, Any], best: Mapping[str, Any]
) -> dict[str, str]:
    """The server's counters of the start and the best config's runs, one line each."""
    out: dict[str, str] = {}
    for label, config in (("start", start), ("best", best)):
        if label == "best" and dict(best) == dict(start):
            break
        runs = [
            c
            for t in trials
            if t.config == dict(config) and t.error is None and t.verdict != "rejected"
            for c in [ServerCounters.from_metrics(t.metrics)]
            if c is not None
        ]
        line = counters_summary(combine(runs))
        if line:
            out[f"server I/O, {label} config ({len(runs)} runs)"] = line
    return out


def _ms(x: Any) -> str:
    return "-" if x is None else f"{float(x):.3g} ms"


def stream_line(row: Mapping[str, Any]) -> str:
    tps = "-" if row.get("tps") is None else f"{row['tps']:.4g}"
    failed = "-" if row.get("failed") is None else f"{row['failed']:g}"
    return (
        f"tps {tps}, mean {_ms(row.get('mean_ms'))}, p95 {_ms(row.get('p95_ms'))}, "
        f"p99 {_ms(row.get('p99_ms'))}, failed {failed} ({row.get('runs', 0)} runs)"
    )


def label_line(c: Mapping[str, Any]) -> str:
    change = "-" if c.get("change") is None else f"{c['change']:+.1%}"
    ci = c.get("ci")
    interval = f" [{ci[0] - 1:+.1%}, {ci[1] - 1:+.1%}]" if ci else ""
    return f"{_ms(c.get('before_ms'))} -> {_ms(c.get('after_ms'))} {change}{interval}"


def export(db: Database, session_id: int, fmt: str) -> str:
    rec = recommendation(db, session_id)
    if fmt in managed.SERVICES:
        return managed_export(rec, fmt)
    if fmt == "sql":
        return render_sql(rec)
    if fmt == "json":
        doc = json.loads(render_json(rec))
        sess = get_session(db, session_id)
        labels, streams, status = best_vs_start(sess, list_trials(db, session_id))
        doc["gain_text"] = headline(objective_kind(sess.request), sess.gain)
        doc["per_label"], doc["per_stream"], doc["per_label_status"] = labels, streams, status
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    return render_conf(rec)


def managed_export(rec: Recommendation, fmt: str) -> str:
    """The changed knobs in a managed service's form; 422 when that form cannot hold them."""
    changes = [(n.name, n.recommended) for n in rec.changed()]
    h = rec.header
    header = [
        f"knobtune session {h.get('session', '?')}, tuned on {h.get('target', '?')} "
        f"({h.get('server', '?')}), {h.get('generated', '')}",
    ]
    claim = claim_text(rec)
    if claim:
        header.append(claim)
    if "WARNING" in rec.header:
        header.append(f"WARNING: {rec.header['WARNING']}")
    try:
        return managed.render(fmt, changes, header=header)
    except managed.ManagedFormatError as exc:
        raise ServiceError(422, f"cannot export as {fmt}: {exc}") from None
