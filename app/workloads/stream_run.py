"""A workload's stream on pgbench: the run that runs it (``bench_spec``) and what its
transaction log says (``stream_stat``, each transaction under its label as
:meth:`Stream.label` gives it).

Glue between pgbench (app/postgres/pgbench.py), the streams (app/workloads/base.py) and
optimizer/evidence.py, which stays free of I/O.
"""

from __future__ import annotations

import numpy as np

from app.postgres.pgbench import BenchResult, BenchSpec, pgbench_jobs
from app.workloads.base import Stream
from optimizer.evidence import StreamStat, summarize_stream


def bench_spec(
    stream: Stream, *, duration_s: int, warmup_s: int, rate: float | None = None
) -> BenchSpec:
    """The pgbench run of one stream (every stream of a run: same duration and warm-up).

    A replay stream runs the replay player on its plan (no scripts, no rate: the capture
    sets the pace); its scripts only name the labels of what it logs.
    """
    if stream.replay is not None:
        return BenchSpec(
            builtin=None,
            scripts=None,
            clients=stream.clients,
            jobs=stream.clients,
            duration_s=duration_s,
            warmup_s=warmup_s,
            isolation=stream.isolation,
            replay=stream.replay,
            # every statement logged: a label that ran once must not be lost to sampling
            log_sampling=1.0,
        )
    return BenchSpec(
        builtin=stream.builtin,
        builtin_weight=stream.builtin_weight,
        scripts=[(s.sql, s.weight) for s in stream.scripts] or None,
        clients=stream.clients,
        jobs=pgbench_jobs(stream.jobs, stream.clients),
        duration_s=duration_s,
        warmup_s=warmup_s,
        protocol=stream.protocol,
        rate=rate,
        defines=dict(stream.defines),
        max_tries=stream.max_tries,
        isolation=stream.isolation,
        # queries in turn are few and long: keep every one (sampling is for OLTP volume)
        log_sampling=1.0 if stream.sequence else None,
    )


def _labels(stream: Stream, client: np.ndarray, txno: np.ndarray, script: np.ndarray) -> np.ndarray:
    """Each logged transaction's label, as :meth:`Stream.label` gives it (vectorised)."""
    if stream.sequence:
        seq = np.array(stream.sequence, dtype=object)
        idx = (txno.astype(np.int64) - 1 + client.astype(np.int64) * stream.stride) % len(seq)
        picked: np.ndarray = seq[idx]
        return picked
    names = stream.script_names()
    lookup = np.array([*names, "?"], dtype=object)
    s = script.astype(np.int64)
    out = lookup[np.where((s >= 0) & (s < len(names)), s, len(names))]
    bad = out == "?"
    if bad.any():  # a script number pgbench should not log: named as Stream.label names it
        out[bad] = [f"script{int(x)}" for x in s[bad]]
    return out


def stream_stat(stream: Stream, result: BenchResult, warmup_s: float) -> StreamStat | None:
    """A stream's :class:`StreamStat` from its run; None when its log holds nothing."""
    tx = result.tx
    if tx is None or (len(tx) == 0 and tx.failed_script.size == 0):
        return None
    labels = _labels(stream, tx.client, tx.txno, tx.script)
    failed: dict[str, int] = {}
    if tx.failed_script.size:
        # a failed transaction's number is not logged: in-turn streams count it under the
        # script's own name (outside the designed labels, it does not move their means)
        names = stream.script_names()
        for no in tx.failed_script.astype(np.int64):
            if stream.sequence:
                name = names[0] if names else "script0"
            else:
                name = names[no] if 0 <= no < len(names) else f"script{no}"
            failed[name] = failed.get(name, 0) + 1
    shares = stream.design_weights()
    for name in failed:
        shares.setdefault(name, 0.0)
    return summarize_stream(
        stream.name,
        clients=stream.clients,
        shares=shares,
        start_s=tx.start_s,
        latency_ms=tx.latency_ms,
        labels=[str(x) for x in labels],
        failed=failed,
        warmup_s=warmup_s,
        weight=stream.weight,
    )
