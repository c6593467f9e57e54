"""CH-benCHmark built in: TPC-C's transactions next to TPC-H-like queries on the same data.

From "The Mixed Workload CH-benCHmark" (Cole et al., DBTest 2011) and the query text its
authors publish (db.in.tum.de/research/projects/CHbenCHmark): the TPC-C schema plus
SUPPLIER (10,000), NATION (62) and REGION (5); stock items map to suppliers by
``mod(s_w_id * s_i_id, 10000)`` and customers to nations by the first character of
``c_state``. Here that stock mapping is a stored generated column ``stock.s_su_suppkey``
(the same value), so the planner has statistics for the join instead of an expression.

The queries below are the published ones adapted to PostgreSQL 15 and this schema: table
names ``orders``/``order_line``/``new_order``, the supplier join through
``s_su_suppkey``, timestamps written as dates (pgbench would read ``:00`` inside a literal
as a variable), and the published upper bound '2020-01-01' of Q6/Q12/Q14 moved to
'2100-01-01': on data loaded today (TPC-C's O_ENTRY_D is the load time) the published
bound selects no row and the query would measure an empty scan.

A run has two streams: "oltp" (the TPC-C mix) and "olap": each olap client runs the
queries in turn, from its own offset in the sequence (see ``Stream.label``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from app.postgres.connect import connect_target
from app.postgres.dsn import scrub
from app.workloads.base import Isolation, Script, Stream, WorkloadError, in_turn_script
from app.workloads.tpcc import Tpcc, loaded_warehouses, vacuum_analyze

MARKER = "knobtune_chbench"
SUPPLIERS = 10_000

# The 62 nations (keys: the ASCII codes of 0-9, A-Z, a-z, what ``c_state`` starts with)
# over the 5 regions; the queries name Germany, Cambodia and Europe.
REGIONS = ("Africa", "America", "Asia", "Australia", "Europe")
NATIONS: tuple[tuple[str, str], ...] = (
    *(
        (n, "Europe")
        for n in (
            "Germany", "France", "Italy", "Spain", "United Kingdom", "Netherlands", "Belgium",
            "Switzerland", "Austria", "Sweden", "Norway", "Denmark", "Finland", "Poland",
            "Portugal", "Greece", "Ireland", "Czech Republic", "Hungary", "Romania",
        )
    ),
    *(
        (n, "Asia")
        for n in (
            "China", "Japan", "India", "Indonesia", "Vietnam", "Thailand", "Cambodia",
            "Malaysia", "Philippines", "Korea", "Pakistan", "Bangladesh", "Saudi Arabia",
            "Iran", "Iraq",
        )
    ),
    *(
        (n, "America")
        for n in (
            "United States", "Canada", "Mexico", "Brazil", "Argentina", "Chile", "Peru",
            "Colombia", "Venezuela", "Cuba", "Ecuador", "Uruguay",
        )
    ),
    *(
        (n, "Africa")
        for n in (
            "Egypt", "Nigeria", "Kenya", "Morocco", "Algeria", "Ethiopia", "South Africa",
            "Ghana", "Tanzania", "Mozambique",
        )
    ),
    *((n, "Australia") for n in ("Australia", "New Zealand", "Fiji", "Papua New Guinea", "Samoa")),
)  # fmt: skip
NATION_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

SCHEMA = """
CREATE TABLE region (r_regionkey int PRIMARY KEY, r_name char(55), r_comment char(152));
CREATE TABLE nation (
    n_nationkey int PRIMARY KEY, n_name char(25), n_regionkey int, n_comment char(152));
CREATE TABLE supplier (
    su_suppkey int PRIMARY KEY, su_name char(25), su_address varchar(40), su_nationkey int,
    su_phone char(15), su_acctbal numeric(12,2), su_comment char(101));
ALTER TABLE stock ADD COLUMN s_su_suppkey int
    GENERATED ALWAYS AS (mod(s_w_id * s_i_id, 10000)) STORED;
"""

LOAD = f"""
INSERT INTO supplier
SELECT s, 'Supplier#' || lpad(s::text, 9, '0'), tpcc_astring(10, 40),
       ascii(substr('{NATION_CHARS}', tpcc_rand(1, 62), 1)), tpcc_nstring(15),
       tpcc_rand(-99999, 999999) / 100.0, tpcc_astring(25, 100)
FROM generate_series(0, {SUPPLIERS - 1}) s;
"""

# name -> SQL. Source: the published CH-benCHmark query of the same number (see the module
# docstring for the adaptations every query shares).
QUERIES: dict[str, str] = {
    # Q1: pricing summary of delivered order lines by line number
    "Q1": """SELECT ol_number, sum(ol_quantity) AS sum_qty, sum(ol_amount) AS sum_amount,
       avg(ol_quantity) AS avg_qty, avg(ol_amount) AS avg_amount, count(*) AS count_order
FROM order_line
WHERE ol_delivery_d > '2007-01-02'
GROUP BY ol_number ORDER BY ol_number""",
    # Q3: unshipped orders with the highest value, customers of states starting with 'A'
    "Q3": """SELECT ol_o_id, ol_w_id, ol_d_id, sum(ol_amount) AS revenue, o_entry_d
FROM customer, new_order, orders, order_line
WHERE c_state LIKE 'A%' AND c_id = o_c_id AND c_w_id = o_w_id AND c_d_id = o_d_id
  AND no_w_id = o_w_id AND no_d_id = o_d_id AND no_o_id = o_id
  AND ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id
  AND o_entry_d > '2007-01-02'
GROUP BY ol_o_id, ol_w_id, ol_d_id, o_entry_d
ORDER BY revenue DESC, o_entry_d""",
    # Q4: orders by line count that have a line delivered after the order was entered
    "Q4": """SELECT o_ol_cnt, count(*) AS order_count
FROM orders
WHERE o_entry_d >= '2007-01-02'
  AND EXISTS (SELECT * FROM order_line
              WHERE o_id = ol_o_id AND o_w_id = ol_w_id AND o_d_id = ol_d_id
                AND ol_delivery_d >= o_entry_d)
GROUP BY o_ol_cnt ORDER BY o_ol_cnt""",
    # Q5: revenue by nation in Europe, customer and supplier of the same nation
    "Q5": """SELECT n_name, sum(ol_amount) AS revenue
FROM customer, orders, order_line, stock, supplier, nation, region
WHERE c_id = o_c_id AND c_w_id = o_w_id AND c_d_id = o_d_id
  AND ol_o_id = o_id AND ol_w_id = o_w_id AND ol_d_id = o_d_id
  AND ol_w_id = s_w_id AND ol_i_id = s_i_id AND s_su_suppkey = su_suppkey
  AND ascii(substr(c_state, 1, 1)) = su_nationkey
  AND su_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'Europe'
  AND o_entry_d >= '2007-01-02'
GROUP BY n_name ORDER BY revenue DESC""",
    # Q6: revenue of delivered lines in a quantity range
    "Q6": """SELECT sum(ol_amount) AS revenue
FROM order_line
WHERE ol_delivery_d >= '1999-01-01' AND ol_delivery_d < '2100-01-01'
  AND ol_quantity BETWEEN 1 AND 100000""",
    # Q9: profit by supplier nation and year for items whose data ends in 'bb'
    "Q9": """SELECT n_name, extract(year FROM o_entry_d) AS l_year, sum(ol_amount) AS sum_profit
FROM item, stock, supplier, order_line, orders, nation
WHERE ol_i_id = s_i_id AND ol_supply_w_id = s_w_id AND s_su_suppkey = su_suppkey
  AND ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id AND ol_i_id = i_id
  AND su_nationkey = n_nationkey AND i_data LIKE '%bb'
GROUP BY n_name, l_year ORDER BY n_name, l_year DESC""",
    # Q10: customers with the most revenue from delivered orders, with their nation
    "Q10": """SELECT c_id, c_last, sum(ol_amount) AS revenue, c_city, c_phone, n_name
FROM customer, orders, order_line, nation
WHERE c_id = o_c_id AND c_w_id = o_w_id AND c_d_id = o_d_id
  AND ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id
  AND o_entry_d >= '2007-01-02' AND o_entry_d <= ol_delivery_d
  AND n_nationkey = ascii(substr(c_state, 1, 1))
GROUP BY c_id, c_last, c_city, c_phone, n_name
ORDER BY revenue DESC""",
    # Q12: high and low carrier counts by order line count
    "Q12": """SELECT o_ol_cnt,
       sum(CASE WHEN o_carrier_id = 1 OR o_carrier_id = 2 THEN 1 ELSE 0 END) AS high_line_count,
       sum(CASE WHEN o_carrier_id <> 1 AND o_carrier_id <> 2 THEN 1 ELSE 0 END)
           AS low_line_count
FROM orders, order_line
WHERE ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id
  AND o_entry_d <= ol_delivery_d AND ol_delivery_d < '2100-01-01'
GROUP BY o_ol_cnt ORDER BY o_ol_cnt""",
    # Q13: customers by their number of orders with a high carrier id
    "Q13": """SELECT c_count, count(*) AS custdist
FROM (SELECT c_id, count(o_id)
      FROM customer LEFT OUTER JOIN orders
           ON c_w_id = o_w_id AND c_d_id = o_d_id AND c_id = o_c_id AND o_carrier_id > 8
      GROUP BY c_id) AS c_orders (c_id, c_count)
GROUP BY c_count ORDER BY custdist DESC, c_count DESC""",
    # Q14: the share of promotional items' revenue
    "Q14": """SELECT 100.00 * sum(CASE WHEN i_data LIKE 'PR%' THEN ol_amount ELSE 0 END)
       / (1 + sum(ol_amount)) AS promo_revenue
FROM order_line, item
WHERE ol_i_id = i_id AND ol_delivery_d >= '2007-01-02' AND ol_delivery_d < '2100-01-02'""",
    # Q18: large orders (total above 200) with their customers
    "Q18": """SELECT c_last, c_id, o_id, o_entry_d, o_ol_cnt, sum(ol_amount) AS amount_sum
FROM customer, orders, order_line
WHERE c_id = o_c_id AND c_w_id = o_w_id AND c_d_id = o_d_id
  AND ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id
GROUP BY o_id, o_w_id, o_d_id, c_id, c_last, o_entry_d, o_ol_cnt
HAVING sum(ol_amount) > 200
ORDER BY amount_sum DESC, o_entry_d""",
    # Q19: revenue of three item/quantity/warehouse combinations (a disjunction of joins)
    "Q19": """SELECT sum(ol_amount) AS revenue
FROM order_line, item
WHERE (ol_i_id = i_id AND i_data LIKE '%a' AND ol_quantity >= 1 AND ol_quantity <= 10
       AND i_price BETWEEN 1 AND 400000 AND ol_w_id IN (1, 2, 3))
   OR (ol_i_id = i_id AND i_data LIKE '%b' AND ol_quantity >= 1 AND ol_quantity <= 10
       AND i_price BETWEEN 1 AND 400000 AND ol_w_id IN (1, 2, 4))
   OR (ol_i_id = i_id AND i_data LIKE '%c' AND ol_quantity >= 1 AND ol_quantity <= 10
       AND i_price BETWEEN 1 AND 400000 AND ol_w_id IN (1, 5, 3))""",
}


@dataclass(frozen=True)
class Chbench:
    """CH-benCHmark at ``warehouses``: ``oltp_clients`` TPC-C clients next to
    ``olap_clients`` clients running ``queries`` (default: all of :data:`QUERIES`) in turn.
    Either client count may be 0 (a pure OLTP or pure OLAP run on the same data)."""

    warehouses: int = 1
    oltp_clients: int = 4
    olap_clients: int = 1
    isolation: Isolation | None = None
    max_tries: int = 10
    queries: tuple[str, ...] | None = None
    protocol: str = "simple"

    def __post_init__(self) -> None:
        self._tpcc()  # validates warehouses, max_tries, protocol
        if self.oltp_clients < 0 or self.olap_clients < 0:
            raise WorkloadError("oltp_clients and olap_clients must be >= 0")
        if self.oltp_clients == 0 and self.olap_clients == 0:
            raise WorkloadError("give oltp_clients or olap_clients (or both) > 0")
        if self.queries is not None:
            if not self.queries:
                raise WorkloadError(f"queries is empty; choose from {', '.join(QUERIES)}")
            unknown = [q for q in self.queries if q not in QUERIES]
            if unknown:
                raise WorkloadError(
                    f"unknown CH-benCHmark queries {', '.join(unknown)}; "
                    f"choose from {', '.join(QUERIES)}"
                )

    def _tpcc(self) -> Tpcc:
        return Tpcc(
            warehouses=self.warehouses,
            clients=max(self.oltp_clients, 1),
            isolation=self.isolation,
            max_tries=self.max_tries,
            protocol=self.protocol,
        )

    def sequence(self) -> tuple[str, ...]:
        return self.queries if self.queries is not None else tuple(QUERIES)

    def prepare(self, dsn: str) -> str | None:
        """TPC-C's data (loaded or re-used), then the CH tables unless already there."""
        note = f"CH-benCHmark: {self._tpcc().prepare(dsn)}"
        t0 = time.monotonic()
        with connect_target(dsn, connect_timeout=10) as conn:
            try:
                # TPC-C's reload drops the CH tables and this marker with them
                if loaded_warehouses(conn, MARKER) == self.warehouses:
                    return f"{note}; CH tables re-used"
                for t in ("supplier", "nation", "region", MARKER):
                    conn.execute(f"DROP TABLE IF EXISTS {t}")
                conn.execute("ALTER TABLE stock DROP COLUMN IF EXISTS s_su_suppkey")
                conn.execute(SCHEMA)
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO region VALUES (%s, %s, tpcc_astring(31, 115))",
                        list(enumerate(REGIONS)),
                    )
                    cur.executemany(
                        "INSERT INTO nation VALUES (%s, %s, %s, tpcc_astring(31, 114))",
                        [
                            (ord(ch), name, REGIONS.index(region))
                            for ch, (name, region) in zip(NATION_CHARS, NATIONS, strict=True)
                        ],
                    )
                conn.execute(LOAD)
                conn.execute(f"CREATE TABLE {MARKER} (warehouses int, loaded_at timestamptz)")
                conn.execute(f"INSERT INTO {MARKER} VALUES (%s, now())", (self.warehouses,))
                conn.commit()
            except psycopg.Error as exc:
                raise WorkloadError(
                    f"loading CH-benCHmark's tables failed: {scrub(str(exc), dsn)}"
                ) from exc
        vacuum_analyze(dsn, ("supplier", "nation", "region", "stock"))
        return f"{note}; CH tables loaded in {time.monotonic() - t0:.0f} s"

    def reset(self, dsn: str) -> None:
        """TPC-C's (the CH tables are only read)."""
        self._tpcc().reset(dsn)

    def streams(self) -> list[Stream]:
        out: list[Stream] = []
        if self.oltp_clients:
            out.append(self._tpcc().streams()[0])
        if self.olap_clients:
            seq = self.sequence()
            stride = max(1, len(seq) // self.olap_clients)
            out.append(
                Stream(
                    name="olap",
                    scripts=(
                        Script("queries", in_turn_script([(q, QUERIES[q]) for q in seq], stride)),
                    ),
                    clients=self.olap_clients,
                    protocol=self.protocol,
                    defines={"n": "0"},
                    # a retried query would advance the client's counter twice and shift
                    # every later label; a failed one is counted and the sequence goes on
                    max_tries=1,
                    isolation=self.isolation,
                    sequence=seq,
                    stride=stride,
                )
            )
        return out
