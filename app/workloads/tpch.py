"""TPC-H built in: data from DuckDB's dbgen, the 22 queries run by pgbench in turn.

Data. ``prepare(dsn)`` generates the TPC-H data at ``scale`` with DuckDB's tpch extension
(``CALL dbgen(sf=...)``, in memory), writes one table at a time as CSV into a temporary
directory and streams it into the target with ``COPY ... FROM STDIN (FREEZE)``. The 8
tables have the spec's column types (clause 1.4), their primary keys and the indexes a DBA
adds on foreign-key columns (l_partkey+l_suppkey, l_suppkey, o_custkey, ps_suppkey,
s_nationkey, c_nationkey, n_regionkey; l_orderkey and ps_partkey lead a primary key). No
foreign-key constraints: the data is generated consistent and they only slow the load.
Everything up to the indexes is one transaction, so an interrupted load leaves nothing
behind; the marker table ``knobtune_tpch`` says which scale is loaded and is set to
``ready`` only after ``VACUUM ANALYZE``, so a load interrupted after its commit is redone,
never re-used. Tables of those names that knobtune did not create are never dropped.

Queries. The text is DuckDB 1.5.5's ``tpch_queries()`` (kept verbatim in
:mod:`app.workloads.tpch_queries`), i.e. the spec's validation substitution parameters:
the queries are fixed, every run asks the same 22 questions. DuckDB already prints them
in a dialect PostgreSQL 15 accepts: dates as ``CAST('1998-09-02' AS date)`` with the
interval arithmetic done (Q1's ``date '1998-12-01' - interval '90' day`` is 1998-09-02),
``extract(year FROM ...)``, Q15's view as a CTE (PostgreSQL materializes it once because
it is referenced twice, like the view), ``LIMIT`` instead of the spec's row counts. The
adaptations made here:

* Q11: the spec's FRACTION is 0.0001 / SF (clause 2.4.11.3); DuckDB prints the SF 1 value
  0.0001000000 whatever the scale, so it is replaced by 0.0001 / ``scale`` (else, at
  SF 0.01, its HAVING threshold would be 100 times lower than the spec's).

Default set: all 22. Measured at SF 1 on a fresh sandbox with PostgreSQL 15's default
configuration (shared_buffers 128 MB, work_mem 4 MB), one run each right after the load,
on 2 cores shared with other jobs (``bench/tpch_scale.py --scale 1``), in seconds:

    Q1 7.4   Q2 1.0   Q3 1.9   Q4 0.8   Q5 2.1   Q6 1.0   Q7 4.8   Q8 1.1
    Q9 7.7   Q10 2.6  Q11 0.6  Q12 2.1  Q13 2.2  Q14 1.8  Q15 1.7  Q16 1.4
    Q17 4.4  Q18 14.4 Q19 0.4  Q20 1.4  Q21 7.1  Q22 0.7             pass: 69 s

Q17 and Q20, whose correlated subqueries on lineitem can run for minutes on PostgreSQL,
finish in seconds with the indexes above, so none is left out of the default set.

Load at SF 1: 8,661,245 rows in 199 s (dbgen, COPY, 8 primary keys + 7 indexes, VACUUM
ANALYZE), 1,671 MB (pg_database_size); peak RSS of the loading process 2.5 GB (DuckDB
holds the generated tables in memory). A second prepare() at the same scale takes 0.03 s.
Smaller scales, same bench and machine: SF 0.3 loads in 122 s, 507 MB, pass 30 s; SF 0.2
in 53-80 s, 341 MB, pass 13-20 s (times vary ~2x with what else runs on the 2 cores); a
60 s pgbench power run at SF 0.2 (``--bench 60``) logged 78 queries, 3.5 passes.

Streams. Power mode: one pgbench client runs the set in order, one query per transaction.
Throughput mode: ``clients`` clients run it concurrently, client c starting at query
``c * stride`` (stride = len(set) // clients): a rotation of the order, the simple form of
the spec's permuted orders per query stream (clause 5.3.5.4 / Appendix A). Both use ONE
pgbench script: ``-D n=0``, ``\\set n :n + 1`` and an ``\\if`` chain over
``(n - 1 + client_id * stride) % len(set)``, so the query of each logged transaction is
exactly :meth:`Stream.label`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import pathlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql as pgsql

from app.postgres.connect import connect_target
from app.postgres.dsn import mask_dsn, scrub
from app.workloads.base import Script, Stream, WorkloadError, in_turn_script
from app.workloads.tpch_queries import DUCKDB_QUERIES

QUERY_NAMES: tuple[str, ...] = tuple(f"Q{i}" for i in range(1, 23))
# All 22: none is pathologically slow on PostgreSQL 15 at SF 1 (module docstring).
DEFAULT_QUERIES: tuple[str, ...] = QUERY_NAMES
PROTOCOLS = ("simple", "extended", "prepared")
# DuckDB generates in memory: 2.5 GB peak RSS at SF 1 (measured), so SF 10 needs ~25 GB
MAX_SCALE = 10.0
# pg_database_size per unit of scale: 1,671 MB at SF 1 (measured, module docstring)
DB_MB_PER_SF = 1700.0
# Below SF 0.008 DuckDB's dbgen repeats partsupp keys (100 duplicates at SF 0.001-0.005,
# measured), which the primary key rejects.
MIN_SCALE = 0.01

MARKER = "knobtune_tpch"
# pg_advisory_lock key: two prepare() calls on one database take turns
_LOCK_KEY = 0x6B74_7470_6368  # "ktpch"

# Spec clause 1.4.1: identifiers are integer, decimals numeric(15,2), fixed texts char(n).
TABLES: dict[str, str] = {
    "region": """
        r_regionkey integer NOT NULL, r_name char(25) NOT NULL, r_comment varchar(152),
        PRIMARY KEY (r_regionkey)""",
    "nation": """
        n_nationkey integer NOT NULL, n_name char(25) NOT NULL, n_regionkey integer NOT NULL,
        n_comment varchar(152), PRIMARY KEY (n_nationkey)""",
    "supplier": """
        s_suppkey integer NOT NULL, s_name char(25) NOT NULL, s_address varchar(40) NOT NULL,
        s_nationkey integer NOT NULL, s_phone char(15) NOT NULL,
        s_acctbal numeric(15, 2) NOT NULL, s_comment varchar(101) NOT NULL,
        PRIMARY KEY (s_suppkey)""",
    "customer": """
        c_custkey integer NOT NULL, c_name varchar(25) NOT NULL,
        c_address varchar(40) NOT NULL, c_nationkey integer NOT NULL,
        c_phone char(15) NOT NULL, c_acctbal numeric(15, 2) NOT NULL,
        c_mktsegment char(10) NOT NULL, c_comment varchar(117) NOT NULL,
        PRIMARY KEY (c_custkey)""",
    "part": """
        p_partkey integer NOT NULL, p_name varchar(55) NOT NULL, p_mfgr char(25) NOT NULL,
        p_brand char(10) NOT NULL, p_type varchar(25) NOT NULL, p_size integer NOT NULL,
        p_container char(10) NOT NULL, p_retailprice numeric(15, 2) NOT NULL,
        p_comment varchar(23) NOT NULL, PRIMARY KEY (p_partkey)""",
    "partsupp": """
        ps_partkey integer NOT NULL, ps_suppkey integer NOT NULL,
        ps_availqty integer NOT NULL, ps_supplycost numeric(15, 2) NOT NULL,
        ps_comment varchar(199) NOT NULL, PRIMARY KEY (ps_partkey, ps_suppkey)""",
    "orders": """
        o_orderkey integer NOT NULL, o_custkey integer NOT NULL,
        o_orderstatus char(1) NOT NULL, o_totalprice numeric(15, 2) NOT NULL,
        o_orderdate date NOT NULL, o_orderpriority char(15) NOT NULL,
        o_clerk char(15) NOT NULL, o_shippriority integer NOT NULL,
        o_comment varchar(79) NOT NULL, PRIMARY KEY (o_orderkey)""",
    "lineitem": """
        l_orderkey integer NOT NULL, l_partkey integer NOT NULL, l_suppkey integer NOT NULL,
        l_linenumber integer NOT NULL, l_quantity numeric(15, 2) NOT NULL,
        l_extendedprice numeric(15, 2) NOT NULL, l_discount numeric(15, 2) NOT NULL,
        l_tax numeric(15, 2) NOT NULL, l_returnflag char(1) NOT NULL,
        l_linestatus char(1) NOT NULL, l_shipdate date NOT NULL, l_commitdate date NOT NULL,
        l_receiptdate date NOT NULL, l_shipinstruct char(25) NOT NULL,
        l_shipmode char(10) NOT NULL, l_comment varchar(44) NOT NULL,
        PRIMARY KEY (l_orderkey, l_linenumber)""",
}
# Foreign-key columns a DBA indexes (the leading columns of the primary keys are covered).
INDEXES: tuple[tuple[str, str], ...] = (
    ("lineitem", "l_partkey, l_suppkey"),
    ("lineitem", "l_suppkey"),
    ("orders", "o_custkey"),
    ("partsupp", "ps_suppkey"),
    ("supplier", "s_nationkey"),
    ("customer", "c_nationkey"),
    ("nation", "n_regionkey"),
)

_Q11_FRACTION = "0.0001000000"


def postgres_query(name: str, scale: float) -> str:
    """Query ``name`` (``"Q1"``..``"Q22"``) in PostgreSQL's dialect, for data at ``scale``."""
    try:
        text = DUCKDB_QUERIES[name].strip()
    except KeyError:
        raise WorkloadError(
            f"unknown TPC-H query {name!r}; choose among {', '.join(QUERY_NAMES)}"
        ) from None
    if name == "Q11":
        if text.count(_Q11_FRACTION) != 1:  # DuckDB changed its text: adapt again
            raise WorkloadError("Q11's FRACTION is not where DuckDB 1.5.5 prints it")
        text = text.replace(_Q11_FRACTION, f"{0.0001 / scale:.10f}")
    return text if text.endswith(";") else text + ";"


def tpch_extension() -> pathlib.Path:
    """The path of DuckDB's tpch extension, as installed from PyPI."""
    spec = importlib.util.find_spec("duckdb_extension_tpch")
    if spec is None or spec.origin is None:
        raise WorkloadError(
            "DuckDB's tpch extension is not installed; pip install duckdb==1.5.5 "
            "duckdb-extension-tpch==1.5.5"
        )
    base = pathlib.Path(spec.origin).parent
    found = next(base.rglob("tpch.duckdb_extension"), None)
    if found is None:
        raise WorkloadError(f"no tpch.duckdb_extension under {base}; reinstall the package")
    return found


@contextlib.contextmanager
def _generated(scale: float) -> Iterator[Any]:
    """A DuckDB connection holding the TPC-H tables at ``scale``."""
    import duckdb

    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")  # it would draw on our stderr
        con.execute(f"LOAD '{tpch_extension()}'")
        con.execute("CALL dbgen(sf = ?)", [scale])
        yield con
    except duckdb.Error as exc:
        raise WorkloadError(f"DuckDB could not generate TPC-H SF {scale:g}: {exc}") from None
    finally:
        con.close()


def generated_counts(scale: float) -> dict[str, int]:
    """Rows per table that DuckDB's dbgen makes at ``scale`` (what prepare() loads)."""
    with _generated(scale) as con:
        return {t: int(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in TABLES}


def _message(exc: psycopg.Error, dsn: str) -> str:
    """The server's one-line message (without the LINE/caret context), password masked."""
    return scrub(exc.diag.message_primary or str(exc).strip(), dsn)


@dataclass(frozen=True)
class Tpch:
    """The TPC-H workload (see the module docstring)."""

    scale: float = 1.0
    mode: Literal["power", "throughput"] = "power"
    clients: int = 1
    queries: tuple[str, ...] | None = None
    protocol: str = "simple"

    def __post_init__(self) -> None:
        if not (isinstance(self.scale, int | float) and MIN_SCALE <= self.scale <= MAX_SCALE):
            raise WorkloadError(
                f"TPC-H scale must be in [{MIN_SCALE:g}, {MAX_SCALE:g}], got {self.scale!r} "
                "(SF 1 is ~1.7 GB in PostgreSQL and needs ~2.5 GB of RAM to generate)"
            )
        if self.mode not in ("power", "throughput"):
            raise WorkloadError(f"TPC-H mode must be 'power' or 'throughput', got {self.mode!r}")
        if self.clients < 1:
            raise WorkloadError(f"clients must be >= 1, got {self.clients}")
        if self.mode == "power" and self.clients != 1:
            raise WorkloadError(
                f"the power test runs one client, got clients={self.clients}; "
                "use mode='throughput' for concurrent query streams"
            )
        if self.protocol not in PROTOCOLS:
            raise WorkloadError(
                f"unknown protocol {self.protocol!r}; choose one of {', '.join(PROTOCOLS)}"
            )
        if self.queries is not None:
            if not self.queries:
                raise WorkloadError("give at least one TPC-H query, or None for the default set")
            unknown = [q for q in self.queries if q not in QUERY_NAMES]
            if unknown:
                raise WorkloadError(
                    f"unknown TPC-H queries {', '.join(map(repr, unknown))}; "
                    f"choose among {', '.join(QUERY_NAMES)}"
                )

    @property
    def query_set(self) -> tuple[str, ...]:
        return self.queries if self.queries is not None else DEFAULT_QUERIES

    # -- streams -------------------------------------------------------------------
    def stride(self) -> int:
        if self.mode == "power":
            return 0
        return max(1, len(self.query_set) // self.clients)

    def script(self) -> str:
        """The pgbench script: one query of the set per transaction, in turn."""
        bodies = [(name, postgres_query(name, self.scale)) for name in self.query_set]
        return in_turn_script(bodies, self.stride())

    def streams(self) -> list[Stream]:
        return [
            Stream(
                name="tpch",
                scripts=(Script(name="tpch", sql=self.script()),),
                clients=1 if self.mode == "power" else self.clients,
                protocol=self.protocol,
                defines={"n": "0"},
                sequence=self.query_set,
                stride=self.stride(),
            )
        ]

    # -- data ------------------------------------------------------------------------
    def reset(self, dsn: str) -> None:
        """Nothing: the queries only read."""

    def prepare(self, dsn: str) -> str | None:
        try:
            conn = connect_target(dsn, autocommit=True)
        except psycopg.Error as exc:
            raise WorkloadError(
                f"cannot connect to {mask_dsn(dsn)}: {scrub(str(exc), dsn)}"
            ) from None
        try:
            with conn:
                conn.execute("SELECT pg_advisory_lock(%s)", [_LOCK_KEY])
                reused = self._reusable(conn)
                if reused is not None:
                    return reused
                return self._load(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise WorkloadError(
                f"cannot create the TPC-H tables: {_message(exc, dsn)}; connect as a "
                "user that may create tables in the first schema of its search_path (e.g. the "
                "database owner, or GRANT CREATE ON SCHEMA public)"
            ) from None
        except (pg_errors.DiskFull, pg_errors.OutOfMemory) as exc:
            raise WorkloadError(
                f"the target ran out of space loading TPC-H SF {self.scale:g} "
                f"(about {self._estimated_mb():,} MB needed): {_message(exc, dsn)}; "
                "free space on the target or choose a smaller scale"
            ) from None
        except psycopg.Error as exc:
            raise WorkloadError(
                f"loading TPC-H SF {self.scale:g} into {mask_dsn(dsn)} failed: {_message(exc, dsn)}"
            ) from None

    def _estimated_mb(self) -> int:
        return max(1, math.ceil(DB_MB_PER_SF * self.scale))

    def _reusable(self, conn: psycopg.Connection[Any]) -> str | None:
        """The note for data already loaded at this scale, or None (then it is reloaded)."""
        present = [
            t
            for t in TABLES
            if conn.execute("SELECT to_regclass(%s)", [t]).fetchone() not in (None, (None,))
        ]
        marker = conn.execute("SELECT to_regclass(%s)", [MARKER]).fetchone()
        if marker in (None, (None,)):
            if present:
                raise WorkloadError(
                    f"tables {', '.join(present)} exist but knobtune did not load them "
                    f"(no {MARKER} table); drop them or use another database for TPC-H"
                )
            return None
        row = conn.execute(
            f"SELECT scale, state, rows, loaded_at FROM {MARKER} ORDER BY loaded_at DESC LIMIT 1"
        ).fetchone()
        if row is None or row[1] != "ready" or len(present) != len(TABLES):
            return None
        if not math.isclose(float(row[0]), self.scale, rel_tol=1e-9):
            return None
        return (
            f"TPC-H SF {self.scale:g} re-used: {int(row[2]):,} rows loaded {row[3]:%Y-%m-%d %H:%M}"
        )

    def _load(self, conn: psycopg.Connection[Any]) -> str:
        t0 = time.monotonic()
        rows = 0
        try:
            tmp = tempfile.TemporaryDirectory(prefix="knobtune-tpch-")
        except OSError as exc:
            raise WorkloadError(
                f"cannot make a temporary directory for the generated data: {exc}; "
                "set TMPDIR to a writable directory"
            ) from None
        with conn.transaction():
            # our own session only: a big sort memory speeds up the index builds, and a
            # target's statement_timeout must not cut the load
            conn.execute("SET LOCAL maintenance_work_mem = '256MB'")
            conn.execute("SET LOCAL statement_timeout = 0")
            # the DDL first: a missing privilege shows before any data is generated
            for t in (*TABLES, MARKER):
                conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(t)))
            conn.execute(
                f"CREATE TABLE {MARKER} (scale float8 NOT NULL, state text NOT NULL, "
                "rows bigint NOT NULL, seconds float8, loaded_at timestamptz NOT NULL "
                "DEFAULT now())"
            )
            for table, columns in TABLES.items():
                conn.execute(f"CREATE TABLE {table} ({columns})")
            with tmp as tmpdir, _generated(self.scale) as duck:
                for table in TABLES:
                    rows += self._copy(conn, duck, table, pathlib.Path(tmpdir))
            for table, cols in INDEXES:
                name = f"{table}_{cols.replace(', ', '_')}_idx"
                conn.execute(f"CREATE INDEX {name} ON {table} ({cols})")
            conn.execute(
                f"INSERT INTO {MARKER} (scale, state, rows) VALUES (%s, 'loaded', %s)",
                [self.scale, rows],
            )
        conn.execute("VACUUM ANALYZE " + ", ".join(TABLES))
        seconds = time.monotonic() - t0
        conn.execute(f"UPDATE {MARKER} SET state = 'ready', seconds = %s", [seconds])
        return f"TPC-H SF {self.scale:g} loaded: {rows:,} rows in {seconds:.0f} s"

    @staticmethod
    def _copy(conn: psycopg.Connection[Any], duck: Any, table: str, tmpdir: pathlib.Path) -> int:
        """Stream one generated table into the target through a CSV file; its row count."""
        path = tmpdir / f"{table}.csv"
        try:
            duck.execute(f"COPY {table} TO '{path}' (FORMAT csv, HEADER false, DELIMITER '|')")
        except Exception as exc:  # duckdb.IOException and friends: the temp disk is full
            raise WorkloadError(
                f"cannot write the generated {table} to {tmpdir}: {exc}; free space there "
                "or set TMPDIR to a directory with room"
            ) from None
        # FREEZE: the table was created in this transaction, so its rows can be written
        # frozen and all-visible (VACUUM then has nothing to rewrite)
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY {table} FROM STDIN (FORMAT csv, DELIMITER '|', FREEZE)") as cp,
            path.open("rb") as f,
        ):
            while chunk := f.read(1 << 20):
                cp.write(chunk)
        path.unlink()
        return int(duck.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
