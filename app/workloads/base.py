"""What a workload is to the runner: streams of pgbench clients, each with its scripts.

A workload (pgbench's builtin, the user's SQL, TPC-H, TPC-C, CH-benCHmark) prepares its
data in the target and then describes one benchmark run as one or more **streams**: each
stream is one pgbench process with its own scripts, clients and measurement (e.g. an OLTP
stream of TPC-C clients next to an analytic stream of CH-benCHmark queries). The runner
starts every stream of a run at once and gets per-stream, per-script evidence back; it
never branches on the workload's kind.

Scripts are labelled so that evidence is per transaction type or per query:

* several scripts, chosen by pgbench at random by weight: a transaction's label is its
  script's ``name`` (pgbench logs the script number of every transaction);
* a replay of a captured workload: the replay player logs every statement with its
  label's number, and the stream's scripts are the labels (name = label text);
* one script that runs queries in turn (TPC-H's power and throughput tests): the script
  keeps a per-client counter ``n`` (``-D n=0``, ``\\set n :n + 1``) and runs query
  ``sequence[(n - 1 + client_id * stride) % len(sequence)]``; the label of a client's k-th
  transaction (pgbench numbers them from 1 per client) follows from that, see
  :meth:`Stream.label`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from app.replay.plan import ReplayRun

Isolation = Literal["read committed", "repeatable read", "serializable"]


@dataclass(frozen=True)
class Script:
    """One pgbench script (pgbench's syntax: SQL and backslash meta-commands)."""

    name: str  # e.g. "new-order", "Q1"; unique within its stream
    sql: str
    weight: int = 1  # pgbench's -f file@weight


@dataclass(frozen=True)
class Stream:
    """One pgbench process of a run. ``name`` is unique within the workload."""

    name: str
    scripts: tuple[Script, ...] = ()
    builtin: str | None = None  # pgbench -b NAME (tpcb-like, simple-update, select-only)
    builtin_weight: int = 1
    clients: int = 1
    jobs: int = 1
    protocol: str = "simple"  # pgbench -M; pgbench's own default
    defines: Mapping[str, str] = field(default_factory=dict)  # pgbench -D name=value
    max_tries: int = 1  # pgbench --max-tries: retries of serialization failures and deadlocks
    isolation: Isolation | None = None  # default_transaction_isolation for its sessions
    # one script that runs queries in turn: the labels in order, and each client's offset
    sequence: tuple[str, ...] = ()
    stride: int = 0
    weight: float = 1.0  # this stream's weight in a weighted-geometric-mean objective
    # a captured workload's replay (app/workloads/replay.py): the replay player runs its
    # plan instead of pgbench running scripts; ``scripts`` are then its labels (a label's
    # weight: its calls in the measured window), in the player's script numbers
    replay: ReplayRun | None = None

    def script_names(self) -> list[str]:
        """Labels of pgbench's script numbers, in pgbench's order (builtin first)."""
        names = [f"builtin:{self.builtin}"] if self.builtin else []
        return names + [s.name for s in self.scripts]

    def label(self, client_id: int, txno: int, script_no: int) -> str:
        """The label of one logged transaction (``txno`` counts from 1 per client)."""
        if self.sequence:
            i = (txno - 1 + client_id * self.stride) % len(self.sequence)
            return self.sequence[i]
        names = self.script_names()
        return names[script_no] if 0 <= script_no < len(names) else f"script{script_no}"

    def design_weights(self) -> dict[str, float]:
        """The probability of each label per transaction, as designed (not as it happened)."""
        if self.sequence:
            share = 1.0 / len(self.sequence)
            out: dict[str, float] = {}
            for name in self.sequence:
                out[name] = out.get(name, 0.0) + share
            return out
        weights = ([self.builtin_weight] if self.builtin else []) + [s.weight for s in self.scripts]
        total = float(sum(weights))
        return {n: w / total for n, w in zip(self.script_names(), weights, strict=True)}


class Workload(Protocol):
    """A workload kind. Implementations live next to this module, one per kind."""

    def prepare(self, dsn: str) -> str | None:
        """Create and load the workload's data if it is not there yet (idempotent).

        Returns a short note for the session (what was loaded or re-used), or None.
        Raises ``WorkloadError`` with a message that says what to change.
        """
        ...

    def streams(self) -> list[Stream]:
        """The streams of one benchmark run."""
        ...

    def reset(self, dsn: str) -> None:
        """Undo what earlier runs changed in the data, before a measured run.

        Runs are only comparable on the same data. A workload whose data grows with the
        work done (TPC-C's orders) restores its loaded state here; one whose runs leave
        the data as they found it does nothing. Raises ``WorkloadError`` with a message
        that says what to change.
        """
        ...


class WorkloadError(RuntimeError):
    """A workload cannot be prepared or run as asked; the message says what to change."""


def in_turn_script(queries: Sequence[tuple[str, str]], stride: int) -> str:
    """One pgbench script that runs ``queries`` (name, SQL) in turn, one per transaction.

    Each client keeps a counter ``n`` (``-D n=0``) and its k-th transaction (k from 1) runs
    query ``(k - 1 + client_id * stride) % len(queries)``: what :meth:`Stream.label` computes.
    """
    if not queries:
        raise WorkloadError("give at least one query")
    lines = [
        "-- queries in turn: " + ", ".join(name for name, _ in queries),
        "\\set n :n + 1",
        f"\\set q (:n - 1 + :client_id * {stride}) % {len(queries)}",
    ]
    for i, (name, sql) in enumerate(queries):
        lines.append(f"\\if :q = {i}" if i == 0 else f"\\elif :q = {i}")
        lines.append(f"-- {name}")
        lines.append(sql.strip().rstrip(";") + ";")
    lines.append("\\endif")
    return "\n".join(lines) + "\n"
