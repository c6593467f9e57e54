"""Offline verdicts on recorded runs: ``python -m optimizer.replay FILE``.

FILE is a JSON list of cases ``{"incumbent": [run, ...], "candidate": [run, ...]}``, the
runs of each side in the order they ran. A run is one of

* a list of per-second values, warm-up removed (throughput, or p95 latencies with
  ``"objective": "latency_p95"``);
* ``{"streams": [StreamStat, ...]}``: per-transaction evidence as the service stores it
  (optimizer/evidence.py ``StreamStat.to_json``);
* ``{"labels": [...], "start_s": [...], "latency_ms": [...]}``: a run's transactions (their
  label, start in seconds since the run began, latency), with optional ``"clients"``
  (default 1), ``"shares"`` (designed share per label; default equal over the labels seen),
  ``"warmup_s"`` (default 0) and ``"failed"`` (failed transactions per label).

All runs of a case are of one form. A case may also set ``"min_gain"`` and
``"objective"`` (per-second runs: throughput, latency_p95; per-transaction runs also
query_time_geomean, query_time_total). For every case one JSON line ``{"keep": bool,
"gain": float, "p_value": float | null}`` is printed, computed with the live optimizer's
defaults: :func:`optimizer.verdict.judge` on per-second runs,
:func:`optimizer.evidence.judge_streams` (levels by :func:`~optimizer.evidence.run_level`,
as the descent does when a measurement carries streams) on per-transaction runs. A bad
file prints one error line on stderr and exits with status 2 (nothing on stdout).

This is the only module of ``optimizer`` that does I/O: it reads the file it is given.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from optimizer.evidence import StreamStat, judge_streams, summarize_stream
from optimizer.objective import OBJECTIVE_KINDS
from optimizer.verdict import Verdict, judge

TX_KEYS = ("labels", "start_s", "latency_ms")


class ReplayError(ValueError):
    """The input file is not a valid list of replay cases."""


def _number(v: Any) -> bool:
    # bool is an int in Python but not a sample
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


def _samples(run: Any, where: str) -> list[float]:
    if not run:
        raise ReplayError(f"{where} must be a non-empty list of numbers")
    for v in run:
        if not _number(v):
            raise ReplayError(f"{where} has a non-numeric value {v!r}")
        if v < 0:
            raise ReplayError(f"{where} has a negative value {v!r}")
    return [float(v) for v in run]


def _transactions(run: dict[str, Any], where: str) -> tuple[StreamStat, ...]:
    missing = [k for k in TX_KEYS if not isinstance(run.get(k), list)]
    if missing:
        raise ReplayError(
            f"{where}: {', '.join(missing)} must be lists (one entry per transaction)"
        )
    labels, start, lat = (run[k] for k in TX_KEYS)
    if not len(labels) == len(start) == len(lat):
        raise ReplayError(f"{where}: labels, start_s and latency_ms must be of equal length")
    if not all(isinstance(x, str) for x in labels):
        raise ReplayError(f"{where}: labels must be strings")
    for key, values in (("start_s", start), ("latency_ms", lat)):
        bad = next((v for v in values if not _number(v) or v < 0), None)
        if bad is not None:
            raise ReplayError(f"{where}: {key} has a value that is not a number >= 0: {bad!r}")
    shares = run.get("shares") or dict.fromkeys(sorted(set(labels)), 1.0)
    failed = run.get("failed") or {}
    clients = run.get("clients", 1)
    warmup = run.get("warmup_s", 0.0)
    if not isinstance(shares, dict) or not all(_number(v) for v in shares.values()):
        raise ReplayError(f"{where}: shares must map labels to numbers")
    if not isinstance(failed, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in failed.values()
    ):
        raise ReplayError(f"{where}: failed must map labels to counts")
    if not (isinstance(clients, int) and not isinstance(clients, bool) and clients >= 1):
        raise ReplayError(f"{where}: clients must be an integer >= 1")
    if not _number(warmup) or warmup < 0:
        raise ReplayError(f"{where}: warmup_s must be a number >= 0")
    try:
        stream = summarize_stream(
            "run",
            clients=clients,
            shares=shares,
            start_s=start,
            latency_ms=lat,
            labels=labels,
            failed=failed,
            warmup_s=float(warmup),
        )
    except ValueError as exc:
        raise ReplayError(f"{where}: {exc}") from None
    return (stream,)


def _streams(run: dict[str, Any], where: str) -> tuple[StreamStat, ...]:
    streams = run.get("streams")
    if not isinstance(streams, list) or not streams:
        raise ReplayError(f"{where}: streams must be a non-empty list of streams")
    try:
        return tuple(StreamStat.from_json(s) for s in streams)
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise ReplayError(f"{where}: not a stream ({type(exc).__name__}: {exc})") from None


def _runs(case: dict[str, Any], side: str, where: str) -> tuple[str, list[Any]]:
    """("second", per-second lists) or ("transaction", stream tuples) for one side."""
    runs = case.get(side)
    if not isinstance(runs, list) or not runs:
        raise ReplayError(f"{where}: {side!r} must be a non-empty list of runs")
    kinds: set[str] = set()
    out: list[Any] = []
    for j, run in enumerate(runs):
        at = f"{where}: {side} run {j + 1}"
        if isinstance(run, list):
            kinds.add("second")
            out.append(_samples(run, at))
        elif isinstance(run, dict) and "streams" in run:
            kinds.add("transaction")
            out.append(_streams(run, at))
        elif isinstance(run, dict):
            kinds.add("transaction")
            out.append(_transactions(run, at))
        else:
            raise ReplayError(
                f"{at} must be a non-empty list of numbers, or an object with streams or "
                "with labels, start_s and latency_ms"
            )
    if len(kinds) > 1:
        raise ReplayError(f"{where}: {side} mixes per-second and per-transaction runs")
    return kinds.pop(), out


def replay_cases(cases: Any) -> list[Verdict]:
    """Judge every case; ReplayError on malformed input (validated before anything is judged)."""
    if not isinstance(cases, list):
        raise ReplayError("the file must hold a JSON list of cases")
    prepared = []
    for i, case in enumerate(cases):
        where = f"case {i + 1}"
        if not isinstance(case, dict):
            raise ReplayError(f"{where}: must be an object with 'incumbent' and 'candidate'")
        kind_i, inc = _runs(case, "incumbent", where)
        kind_c, cand = _runs(case, "candidate", where)
        if kind_i != kind_c:
            raise ReplayError(
                f"{where}: incumbent and candidate runs must both be per-second lists or "
                "both per-transaction objects"
            )
        min_gain = case.get("min_gain", 0.02)
        if not _number(min_gain) or min_gain < 0:
            raise ReplayError(f"{where}: min_gain must be a number >= 0")
        objective = case.get("objective", "throughput")
        allowed = ("throughput", "latency_p95") if kind_i == "second" else OBJECTIVE_KINDS
        if objective not in allowed:
            raise ReplayError(
                f"{where}: objective must be one of {', '.join(allowed)} for per-{kind_i} runs"
            )
        prepared.append((kind_i, inc, cand, float(min_gain), objective))
    out = []
    for i, (kind, inc, cand, min_gain, objective) in enumerate(prepared):
        try:
            if kind == "second":
                out.append(judge(inc, cand, min_gain=min_gain, objective=objective))
            else:
                out.append(judge_streams(inc, cand, min_gain=min_gain, objective=objective))
        except ValueError as exc:
            raise ReplayError(f"case {i + 1}: {exc}") from exc
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m optimizer.replay FILE", file=sys.stderr)
        return 2
    path = args[0]
    try:
        with open(path, encoding="utf-8") as fh:
            cases = json.load(fh)
        verdicts = replay_cases(cases)
    except OSError as exc:
        print(f"error: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        print(f"error: {path} is not valid JSON: {exc}", file=sys.stderr)
        return 2
    except (ReplayError, RecursionError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    for v in verdicts:
        p = v.p_value if v.p_value is not None and math.isfinite(v.p_value) else None
        print(json.dumps({"keep": v.keep, "gain": v.gain, "p_value": p}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
