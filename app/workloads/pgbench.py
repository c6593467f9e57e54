"""pgbench's own workload: its builtin script and/or the user's SQL scripts, one stream."""

from __future__ import annotations

from dataclasses import dataclass

from app.postgres.pgbench import PgbenchError, init_data
from app.workloads.base import Isolation, Script, Stream, WorkloadError

MAIN = "main"  # the name of the one stream


@dataclass(frozen=True)
class PgbenchWorkload:
    """Today's WorkloadIn as a :class:`~app.workloads.base.Workload`."""

    builtin: str | None
    builtin_weight: int
    scripts: tuple[tuple[str, int], ...]  # (sql, weight)
    scale: int
    init: bool
    clients: int
    jobs: int
    protocol: str
    isolation: Isolation | None = None
    max_tries: int = 1

    def prepare(self, dsn: str) -> str | None:
        """``pgbench -i`` at the scale when asked to and the tables do not hold it yet."""
        if not self.init:
            return None
        try:
            loaded = init_data(dsn, self.scale)
        except PgbenchError as exc:
            raise WorkloadError(str(exc)) from exc
        if loaded:
            return f"pgbench tables loaded at scale {self.scale}"
        return f"pgbench tables of scale {self.scale} were there already: re-used"

    def reset(self, dsn: str) -> None:
        """Nothing: TPC-B-like runs only append to pgbench_history, which none of them
        reads, and the user's own scripts are the user's to keep comparable."""

    def streams(self) -> list[Stream]:
        return [
            Stream(
                name=MAIN,
                # script names: 1-based as the user listed them
                scripts=tuple(
                    Script(name=f"script{i}", sql=sql, weight=w)
                    for i, (sql, w) in enumerate(self.scripts, start=1)
                ),
                builtin=self.builtin,
                builtin_weight=self.builtin_weight,
                clients=self.clients,
                jobs=self.jobs,
                protocol=self.protocol,
                max_tries=self.max_tries,
                isolation=self.isolation,
            )
        ]
