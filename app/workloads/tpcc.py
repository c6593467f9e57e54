"""TPC-C built in: schema, spec-shaped data and the five transactions as pgbench scripts.

Written from the TPC-C specification 5.11: tables and cardinalities (clause 1.3, 4.3.3.1),
the random functions (2.1.6 NURand, 4.3.2.3 last-name syllables), the transaction profiles
(2.4 new-order, 2.5 payment, 2.6 order-status, 2.7 delivery, 2.8 stock-level) and the mix
(5.2.3; here pgbench weights 45/43/4/4/4). It is a TPC-C-like workload for tuning, not an
audited TPC-C: no terminals, keying or think times (pgbench clients run flat out), the home
warehouse is drawn per transaction, and delivery runs in the foreground.

New-order and delivery loop over order lines / districts, which pgbench scripts cannot, so
they are plpgsql functions installed by :meth:`Tpcc.prepare`; the pgbench script draws the
inputs, calls the function in an explicit transaction and COMMITs, or ROLLBACKs when
new-order met its unused item (2.4.2.3: 1% of new-orders). No error escapes to pgbench
(it would abort the client); serialization failures and deadlocks are retried by pgbench
when ``max_tries > 1``. Payment, order-status and stock-level are plain SQL scripts, so the
protocol (``-M prepared``) matters to them as it would to an application.

Data is generated server-side with INSERT ... SELECT over generate_series in one
transaction (see :meth:`Tpcc.prepare` for figures). A marker table ``knobtune_tpcc`` holding
the warehouse count is written in that transaction, so a half-finished load is never
re-used.

Re-use and comparability: the workload changes its data as it runs. New-order adds an
order and ~10 lines (~1 KB; ~6 MB a minute at the 5,800 tpmC of 1 warehouse and 8 clients
on 2 cores); delivery removes up to 10 NEW-ORDER rows per call (~40 per 100 transactions
against ~44.5 added), so NEW-ORDER grows slowly and ORDER/ORDER-LINE/HISTORY grow with the
work done. Every measured run therefore starts from the loaded cardinalities
(:meth:`Tpcc.reset`), and a second ``prepare`` re-uses the data the same way; drop
``knobtune_tpcc`` (or change ``warehouses``) to reload from scratch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from app.postgres.connect import connect_target
from app.postgres.dsn import mask_dsn, scrub
from app.workloads.base import Isolation, Script, Stream, WorkloadError

ITEMS = 100_000
DISTRICTS = 10  # per warehouse
CUSTOMERS = 3_000  # per district
ORDERS = 3_000  # per district; the last NEW_ORDERS of them are undelivered
NEW_ORDERS = 900
FIRST_UNDELIVERED = ORDERS - NEW_ORDERS + 1  # o_id 2101
UNUSED_ITEM = ITEMS + 1  # 2.4.1.5: the rollback's "unused value" of OL_I_ID

# NURand's C constants (2.1.6): C_LAST at load and at run time differ by 66, inside the
# allowed delta [65, 119] minus {96, 112} (2.1.6.1).
C_LAST_LOAD = 157
C_LAST_RUN = C_LAST_LOAD + 66
C_ID = 259
OL_I_ID = 7911

SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")

MARKER = "knobtune_tpcc"
TABLES = (
    "order_line",
    "new_order",
    "orders",
    "history",
    "customer",
    "district",
    "stock",
    "item",
    "warehouse",
)
# CH-benCHmark's tables live on the same schema: a reload of TPC-C drops them too, so the
# analytic side never joins old suppliers to new stock.
CH_TABLES = ("supplier", "nation", "region", "knobtune_chbench")

TRANSACTION_MIX = {
    "new-order": 45,
    "payment": 43,
    "order-status": 4,
    "delivery": 4,
    "stock-level": 4,
}

# -- schema (clause 1.3), keys (1.3.1) and the secondary indexes the transactions need -----
SCHEMA = """
CREATE TABLE warehouse (
    w_id int NOT NULL, w_name varchar(10), w_street_1 varchar(20), w_street_2 varchar(20),
    w_city varchar(20), w_state char(2), w_zip char(9), w_tax numeric(4,4),
    w_ytd numeric(12,2));
CREATE TABLE district (
    d_id int NOT NULL, d_w_id int NOT NULL, d_name varchar(10), d_street_1 varchar(20),
    d_street_2 varchar(20), d_city varchar(20), d_state char(2), d_zip char(9),
    d_tax numeric(4,4), d_ytd numeric(12,2), d_next_o_id int);
CREATE TABLE customer (
    c_id int NOT NULL, c_d_id int NOT NULL, c_w_id int NOT NULL, c_first varchar(16),
    c_middle char(2), c_last varchar(16), c_street_1 varchar(20), c_street_2 varchar(20),
    c_city varchar(20), c_state char(2), c_zip char(9), c_phone char(16), c_since timestamp,
    c_credit char(2), c_credit_lim numeric(12,2), c_discount numeric(4,4),
    c_balance numeric(12,2), c_ytd_payment numeric(12,2), c_payment_cnt int,
    c_delivery_cnt int, c_data varchar(500));
CREATE TABLE history (
    h_c_id int, h_c_d_id int, h_c_w_id int, h_d_id int, h_w_id int, h_date timestamp,
    h_amount numeric(6,2), h_data varchar(24));
CREATE TABLE new_order (no_o_id int NOT NULL, no_d_id int NOT NULL, no_w_id int NOT NULL);
CREATE TABLE orders (
    o_id int NOT NULL, o_d_id int NOT NULL, o_w_id int NOT NULL, o_c_id int,
    o_entry_d timestamp, o_carrier_id int, o_ol_cnt int, o_all_local int);
CREATE TABLE order_line (
    ol_o_id int NOT NULL, ol_d_id int NOT NULL, ol_w_id int NOT NULL, ol_number int NOT NULL,
    ol_i_id int, ol_supply_w_id int, ol_delivery_d timestamp, ol_quantity int,
    ol_amount numeric(6,2), ol_dist_info char(24));
CREATE TABLE item (
    i_id int NOT NULL, i_im_id int, i_name varchar(24), i_price numeric(5,2),
    i_data varchar(50));
CREATE TABLE stock (
    s_i_id int NOT NULL, s_w_id int NOT NULL, s_quantity int,
    s_dist_01 char(24), s_dist_02 char(24), s_dist_03 char(24), s_dist_04 char(24),
    s_dist_05 char(24), s_dist_06 char(24), s_dist_07 char(24), s_dist_08 char(24),
    s_dist_09 char(24), s_dist_10 char(24), s_ytd int, s_order_cnt int, s_remote_cnt int,
    s_data varchar(50));
"""

# After the data: building an index once is faster than maintaining it row by row.
INDEXES = """
ALTER TABLE warehouse ADD PRIMARY KEY (w_id);
ALTER TABLE district ADD PRIMARY KEY (d_w_id, d_id);
ALTER TABLE customer ADD PRIMARY KEY (c_w_id, c_d_id, c_id);
ALTER TABLE new_order ADD PRIMARY KEY (no_w_id, no_d_id, no_o_id);
ALTER TABLE orders ADD PRIMARY KEY (o_w_id, o_d_id, o_id);
ALTER TABLE order_line ADD PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number);
ALTER TABLE item ADD PRIMARY KEY (i_id);
ALTER TABLE stock ADD PRIMARY KEY (s_w_id, s_i_id);
-- payment and order-status by last name (2.5.2.2, 2.6.2.2), ordered by c_first
CREATE INDEX customer_name ON customer (c_w_id, c_d_id, c_last, c_first);
-- order-status: the customer's most recent order (2.6.2.2)
CREATE INDEX orders_customer ON orders (o_w_id, o_d_id, o_c_id, o_id);
"""

# Random functions of clause 2.1 / 4.3.2, used by the loader and the transactions.
FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION tpcc_rand(lo int, hi int) RETURNS int
LANGUAGE sql VOLATILE AS $$ SELECT lo + floor(random() * (hi - lo + 1))::int $$;

-- 2.1.6: NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x
CREATE OR REPLACE FUNCTION tpcc_nurand(a int, x int, y int, c int) RETURNS int
LANGUAGE sql VOLATILE AS $$
    SELECT (((tpcc_rand(0, a) | tpcc_rand(x, y)) + c) % (y - x + 1)) + x $$;

-- 4.3.2.2 a-string of random length [lo, hi] (hex digits suffice: only lengths matter)
CREATE OR REPLACE FUNCTION tpcc_astring(lo int, hi int) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT substr(repeat(md5(random()::text), (hi + 31) / 32), 1, tpcc_rand(lo, hi)) $$;

CREATE OR REPLACE FUNCTION tpcc_nstring(len int) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT lpad(floor(random() * 10 ^ least(len, 15))::bigint::text, least(len, 15), '0')
           || repeat('0', greatest(len - 15, 0)) $$;

-- 4.3.2.7: zip = 4 random digits then '11111'
CREATE OR REPLACE FUNCTION tpcc_zip() RETURNS text
LANGUAGE sql VOLATILE AS $$ SELECT tpcc_nstring(4) || '11111' $$;

-- 4.3.2.2: state is a 2-character a-string; letters and digits, so CH-benCHmark's
-- ascii(substr(c_state, 1, 1)) names one of its 62 nations
CREATE OR REPLACE FUNCTION tpcc_state() RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT substr(s, tpcc_rand(1, 62), 1) || substr(s, tpcc_rand(1, 62), 1)
    FROM (SELECT '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'::text) t(s)
$$;

-- 4.3.3.1: I_DATA / S_DATA: a-string [26, 50], 10% with "ORIGINAL" at a random position.
-- Given the string, so that it inlines (a call per row of a non-inlined function made
-- the item and stock inserts 2x slower).
CREATE OR REPLACE FUNCTION tpcc_data(s text) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN random() < 0.1
                THEN overlay(s PLACING 'ORIGINAL' FROM tpcc_rand(1, length(s) - 7))
                ELSE s END $$;

-- 4.3.2.3: C_LAST from a number 0..999, one syllable per digit
CREATE OR REPLACE FUNCTION tpcc_last_name(n int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT s[n / 100 % 10 + 1] || s[n / 10 % 10 + 1] || s[n % 10 + 1]
    FROM (SELECT ARRAY[{", ".join(f"'{s}'" for s in SYLLABLES)}]) t(s) $$;

-- 2.4.2: the New-Order transaction. Returns 1 to COMMIT, 0 when an item number is unused
-- (the caller then ROLLBACKs, 2.4.2.3). Order lines are drawn here (2.4.1.5): items by
-- NURand(8191, 1, 100000), 1% supplied by another warehouse when there is one, quantity
-- 1..10. They are processed in (supply warehouse, item) order: two new-orders then lock
-- stock rows in the same order and do not deadlock each other.
CREATE OR REPLACE FUNCTION tpcc_new_order(
    p_w int, p_d int, p_c int, p_ol_cnt int, p_rbk int, p_warehouses int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    items int[]; supply int[]; qty int[];
    all_local int := 1; v_w_tax numeric; v_d_tax numeric; v_o_id int;
    discount numeric; total numeric := 0; k int; n int := 0; r record;
    price numeric; dist text;
BEGIN
    FOR k IN 1 .. p_ol_cnt LOOP
        items[k] := tpcc_nurand(8191, 1, {ITEMS}, {OL_I_ID});
        supply[k] := p_w;
        IF p_warehouses > 1 AND random() < 0.01 THEN
            supply[k] := tpcc_rand(1, p_warehouses - 1);
            IF supply[k] >= p_w THEN supply[k] := supply[k] + 1; END IF;
            all_local := 0;
        END IF;
        qty[k] := tpcc_rand(1, 10);
    END LOOP;
    IF p_rbk = 1 THEN
        items[p_ol_cnt] := {UNUSED_ITEM};
    END IF;
    SELECT w.w_tax INTO v_w_tax FROM warehouse w WHERE w.w_id = p_w;
    UPDATE district SET d_next_o_id = d_next_o_id + 1
        WHERE d_w_id = p_w AND d_id = p_d
        RETURNING district.d_tax, district.d_next_o_id - 1 INTO v_d_tax, v_o_id;
    SELECT c_discount INTO discount FROM customer
        WHERE c_w_id = p_w AND c_d_id = p_d AND c_id = p_c;
    INSERT INTO orders VALUES (v_o_id, p_d, p_w, p_c, now(), NULL, p_ol_cnt, all_local);
    INSERT INTO new_order VALUES (v_o_id, p_d, p_w);
    FOR r IN SELECT t.i, t.s, t.q FROM unnest(items, supply, qty) AS t(i, s, q)
             ORDER BY t.s, t.i LOOP
        n := n + 1;
        SELECT i_price INTO price FROM item WHERE i_id = r.i;
        IF NOT FOUND THEN
            RETURN 0;
        END IF;
        UPDATE stock SET
            s_quantity = CASE WHEN s_quantity - r.q >= 10 THEN s_quantity - r.q
                              ELSE s_quantity - r.q + 91 END,
            s_ytd = s_ytd + r.q,
            s_order_cnt = s_order_cnt + 1,
            s_remote_cnt = s_remote_cnt + (r.s <> p_w)::int
        WHERE s_w_id = r.s AND s_i_id = r.i
        RETURNING CASE p_d WHEN 1 THEN s_dist_01 WHEN 2 THEN s_dist_02 WHEN 3 THEN s_dist_03
                           WHEN 4 THEN s_dist_04 WHEN 5 THEN s_dist_05 WHEN 6 THEN s_dist_06
                           WHEN 7 THEN s_dist_07 WHEN 8 THEN s_dist_08 WHEN 9 THEN s_dist_09
                           ELSE s_dist_10 END INTO dist;
        INSERT INTO order_line VALUES
            (v_o_id, p_d, p_w, n, r.i, r.s, NULL, r.q, r.q * price, dist);
        total := total + r.q * price;
    END LOOP;
    -- 2.4.2.2: the terminal shows total * (1 - discount) * (1 + v_w_tax + v_d_tax)
    total := total * (1 - discount) * (1 + v_w_tax + v_d_tax);
    RETURN 1;
END $$;

-- 2.7.4: the Delivery transaction for one warehouse: the oldest undelivered order of each
-- district. A district without one is skipped (2.7.4.2). Returns the districts delivered.
CREATE OR REPLACE FUNCTION tpcc_delivery(p_w int, p_carrier int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    d int; o int; c int; amount numeric; delivered int := 0;
BEGIN
    FOR d IN 1 .. {DISTRICTS} LOOP
        DELETE FROM new_order
            WHERE no_w_id = p_w AND no_d_id = d AND no_o_id = (
                SELECT min(no_o_id) FROM new_order WHERE no_w_id = p_w AND no_d_id = d)
            RETURNING no_o_id INTO o;
        CONTINUE WHEN o IS NULL;
        UPDATE orders SET o_carrier_id = p_carrier
            WHERE o_w_id = p_w AND o_d_id = d AND o_id = o
            RETURNING o_c_id INTO c;
        WITH lines AS (
            UPDATE order_line SET ol_delivery_d = now()
            WHERE ol_w_id = p_w AND ol_d_id = d AND ol_o_id = o
            RETURNING ol_amount)
        SELECT coalesce(sum(ol_amount), 0) INTO amount FROM lines;
        UPDATE customer SET c_balance = c_balance + amount,
                            c_delivery_cnt = c_delivery_cnt + 1
            WHERE c_w_id = p_w AND c_d_id = d AND c_id = c;
        delivered := delivered + 1;
    END LOOP;
    RETURN delivered;
END $$;
"""

# -- population (clause 4.3.3.1) for warehouses 1..:w, in one transaction ----------------
LOAD = f"""
INSERT INTO item
SELECT i, tpcc_rand(1, 10000), tpcc_astring(14, 24), tpcc_rand(100, 10000) / 100.0,
       tpcc_data(x.s)
FROM generate_series(1, {ITEMS}) i, LATERAL (SELECT tpcc_astring(26, 50 + 0 * i)) x(s);  -- per row

INSERT INTO warehouse
SELECT w, tpcc_astring(6, 10), tpcc_astring(10, 20), tpcc_astring(10, 20),
       tpcc_astring(10, 20), tpcc_state(), tpcc_zip(), tpcc_rand(0, 2000) / 10000.0, 300000
FROM generate_series(1, %(w)s) w;

INSERT INTO district
SELECT d, w, tpcc_astring(6, 10), tpcc_astring(10, 20), tpcc_astring(10, 20),
       tpcc_astring(10, 20), tpcc_state(), tpcc_zip(), tpcc_rand(0, 2000) / 10000.0, 30000,
       {ORDERS + 1}
FROM generate_series(1, %(w)s) w, generate_series(1, {DISTRICTS}) d;

INSERT INTO customer
SELECT c, d, w, tpcc_astring(8, 16), 'OE',
       tpcc_last_name(CASE WHEN c <= 1000 THEN c - 1
                           ELSE tpcc_nurand(255, 0, 999, {C_LAST_LOAD}) END),
       tpcc_astring(10, 20), tpcc_astring(10, 20), tpcc_astring(10, 20), tpcc_state(),
       tpcc_zip(), tpcc_nstring(16), now(), CASE WHEN random() < 0.1 THEN 'BC' ELSE 'GC' END,
       50000, tpcc_rand(0, 5000) / 10000.0, -10, 10, 1, 0, tpcc_astring(300, 500)
FROM generate_series(1, %(w)s) w, generate_series(1, {DISTRICTS}) d,
     generate_series(1, {CUSTOMERS}) c;

INSERT INTO history
SELECT c, d, w, d, w, now(), 10, tpcc_astring(12, 24)
FROM generate_series(1, %(w)s) w, generate_series(1, {DISTRICTS}) d,
     generate_series(1, {CUSTOMERS}) c;

-- O_C_ID: a random permutation of the customers of each district
INSERT INTO orders
SELECT o, d, w, row_number() OVER (PARTITION BY w, d ORDER BY random()), now(),
       CASE WHEN o < {FIRST_UNDELIVERED} THEN tpcc_rand(1, 10) END, tpcc_rand(5, 15), 1
FROM generate_series(1, %(w)s) w, generate_series(1, {DISTRICTS}) d,
     generate_series(1, {ORDERS}) o;

INSERT INTO order_line
SELECT o_id, o_d_id, o_w_id, n, tpcc_rand(1, {ITEMS}), o_w_id,
       CASE WHEN o_id < {FIRST_UNDELIVERED} THEN o_entry_d END, 5,
       CASE WHEN o_id < {FIRST_UNDELIVERED} THEN 0 ELSE tpcc_rand(1, 999999) / 100.0 END,
       tpcc_astring(24, 24)
FROM orders, generate_series(1, o_ol_cnt) n;

INSERT INTO new_order
SELECT o_id, o_d_id, o_w_id FROM orders WHERE o_id >= {FIRST_UNDELIVERED};

INSERT INTO stock
SELECT i, w, tpcc_rand(10, 100),
       tpcc_astring(24, 24), tpcc_astring(24, 24), tpcc_astring(24, 24),
       tpcc_astring(24, 24), tpcc_astring(24, 24), tpcc_astring(24, 24),
       tpcc_astring(24, 24), tpcc_astring(24, 24), tpcc_astring(24, 24),
       tpcc_astring(24, 24), 0, 0, 0, tpcc_data(x.s)
FROM generate_series(1, %(w)s) w, generate_series(1, {ITEMS}) i,
     LATERAL (SELECT tpcc_astring(26, 50 + 0 * i)) x(s);  -- per row
"""


# -- back to the loaded state before a measured run (see Tpcc.reset) ----------------------
RESET = f"""
DELETE FROM order_line WHERE ol_o_id > {ORDERS};
DELETE FROM new_order WHERE no_o_id > {ORDERS};
DELETE FROM orders WHERE o_id > {ORDERS};
UPDATE district SET d_next_o_id = {ORDERS + 1} WHERE d_next_o_id <> {ORDERS + 1};
-- the loaded undelivered orders that deliveries delivered: undelivered again
INSERT INTO new_order
SELECT o_id, o_d_id, o_w_id FROM orders
WHERE o_id >= {FIRST_UNDELIVERED} AND o_carrier_id IS NOT NULL
ON CONFLICT DO NOTHING;
UPDATE orders SET o_carrier_id = NULL
WHERE o_id >= {FIRST_UNDELIVERED} AND o_carrier_id IS NOT NULL;
UPDATE order_line SET ol_delivery_d = NULL
WHERE ol_o_id >= {FIRST_UNDELIVERED} AND ol_delivery_d IS NOT NULL;
-- payments' rows: the loaded ones all carry the load transaction's now()
DELETE FROM history WHERE h_date > (SELECT min(h_date) FROM history);
"""


# -- the five transactions as pgbench scripts -----------------------------------------------
def _nurand(a: int, x: int, y: int, c: int) -> str:
    """NURand (2.1.6) as a pgbench expression."""
    return f"((((random(0, {a}) | random({x}, {y})) + {c}) % ({y} - {x} + 1)) + {x})"


_HOME = "\\set w_id random(1, :warehouses)\n\\set d_id random(1, 10)\n"

# 2.5.1.2 / 2.6.1.2: 60% of payments and order-statuses select the customer by last name
# (NURand(255, 0, 999) through the syllables), 40% by C_ID (NURand(1023, 1, 3000)). Of the
# customers with that name, the one at position ceil(n / 2) ordered by C_FIRST.
_CUSTOMER = f"""\\set y random(1, 100)
\\set c_id {_nurand(1023, 1, CUSTOMERS, C_ID)}
\\set c_num {_nurand(255, 0, 999, C_LAST_RUN)}
"""
_BY_NAME = """\\if :y <= 60
SELECT c_id FROM customer
 WHERE c_w_id = :c_w_id AND c_d_id = :c_d_id AND c_last = tpcc_last_name(:c_num)
 ORDER BY c_first
 OFFSET (SELECT (count(*) - 1) / 2 FROM customer
          WHERE c_w_id = :c_w_id AND c_d_id = :c_d_id AND c_last = tpcc_last_name(:c_num))
 LIMIT 1 \\gset
\\endif
"""

NEW_ORDER = f"""-- TPC-C 2.4 New-Order
{_HOME}\\set c_id {_nurand(1023, 1, CUSTOMERS, C_ID)}
\\set ol_cnt random(5, 15)
\\set rbk random(1, 100)
BEGIN;
SELECT tpcc_new_order(:w_id, :d_id, :c_id, :ol_cnt, :rbk, :warehouses) AS ok \\gset
\\if :ok
COMMIT;
\\else
ROLLBACK;
\\endif
"""

# 2.5.1.2: 85% of customers pay at their home warehouse; 15% at another (remote) one, when
# there is another. Amount 1.00..5000.00 (2.5.1.3).
PAYMENT = f"""-- TPC-C 2.5 Payment
{_HOME}\\set x random(1, 100)
\\set c_w_id :w_id
\\set c_d_id :d_id
\\if :warehouses > 1 and :x <= 15
\\set c_d_id random(1, 10)
\\set c_w_id random(1, :warehouses - 1)
\\if :c_w_id >= :w_id
\\set c_w_id :c_w_id + 1
\\endif
\\endif
{_CUSTOMER}\\set cents random(100, 500000)
BEGIN;
UPDATE warehouse SET w_ytd = w_ytd + :cents * 0.01 WHERE w_id = :w_id
 RETURNING w_street_1, w_street_2, w_city, w_state, w_zip;
UPDATE district SET d_ytd = d_ytd + :cents * 0.01 WHERE d_w_id = :w_id AND d_id = :d_id
 RETURNING d_street_1, d_street_2, d_city, d_state, d_zip;
{_BY_NAME}UPDATE customer SET
  c_balance = c_balance - :cents * 0.01,
  c_ytd_payment = c_ytd_payment + :cents * 0.01,
  c_payment_cnt = c_payment_cnt + 1,
  c_data = CASE WHEN c_credit = 'BC' THEN left(concat_ws(' ', c_id, c_d_id, c_w_id,
             :d_id::int, :w_id::int, :cents * 0.01) || ' ' || c_data, 500) ELSE c_data END
 WHERE c_w_id = :c_w_id AND c_d_id = :c_d_id AND c_id = :c_id
 RETURNING c_first, c_middle, c_last, c_street_1, c_street_2, c_city, c_state, c_zip,
           c_phone, c_since, c_credit, c_credit_lim, c_discount, c_balance;
INSERT INTO history
SELECT :c_id::int, :c_d_id::int, :c_w_id::int, :d_id::int, :w_id::int, now(),
       :cents * 0.01, w_name || '    ' || d_name
  FROM warehouse, district WHERE w_id = :w_id AND d_w_id = :w_id AND d_id = :d_id;
COMMIT;
"""

ORDER_STATUS = f"""-- TPC-C 2.6 Order-Status
{_HOME}\\set c_w_id :w_id
\\set c_d_id :d_id
{_CUSTOMER}BEGIN;
{_BY_NAME}SELECT c_balance, c_first, c_middle, c_last FROM customer
 WHERE c_w_id = :w_id AND c_d_id = :d_id AND c_id = :c_id;
SELECT coalesce(max(o_id), 0) AS o_id FROM orders
 WHERE o_w_id = :w_id AND o_d_id = :d_id AND o_c_id = :c_id \\gset
SELECT o_entry_d, o_carrier_id FROM orders
 WHERE o_w_id = :w_id AND o_d_id = :d_id AND o_id = :o_id;
SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d FROM order_line
 WHERE ol_w_id = :w_id AND ol_d_id = :d_id AND ol_o_id = :o_id;
COMMIT;
"""

DELIVERY = """-- TPC-C 2.7 Delivery (run in the foreground here, not queued)
\\set w_id random(1, :warehouses)
\\set carrier random(1, 10)
BEGIN;
SELECT tpcc_delivery(:w_id, :carrier);
COMMIT;
"""

# 2.8.1.2: threshold 10..20; 2.8.2.2: the items of the district's last 20 orders whose
# stock is below the threshold
STOCK_LEVEL = f"""-- TPC-C 2.8 Stock-Level
{_HOME}\\set threshold random(10, 20)
BEGIN;
SELECT d_next_o_id AS next_o_id FROM district WHERE d_w_id = :w_id AND d_id = :d_id \\gset
SELECT count(DISTINCT s_i_id) FROM order_line, stock
 WHERE ol_w_id = :w_id AND ol_d_id = :d_id
   AND ol_o_id < :next_o_id AND ol_o_id >= :next_o_id - 20
   AND s_w_id = :w_id AND s_i_id = ol_i_id AND s_quantity < :threshold;
COMMIT;
"""

SCRIPTS = {
    "new-order": NEW_ORDER,
    "payment": PAYMENT,
    "order-status": ORDER_STATUS,
    "delivery": DELIVERY,
    "stock-level": STOCK_LEVEL,
}


def tpm_c(new_orders: int, seconds: float) -> float:
    """New-order transactions per minute (TPC-C's tpmC, 5.4.1), from a count over a time.

    Count committed and rolled-back new-orders alike, as the spec does (the 1% rollbacks
    are completed business transactions).
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    if new_orders < 0:
        raise ValueError(f"new_orders must be >= 0, got {new_orders}")
    return new_orders * 60.0 / seconds


def _connect(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return connect_target(dsn, connect_timeout=10)
    except psycopg.Error as exc:
        raise WorkloadError(
            f"cannot connect to {mask_dsn(dsn)} to prepare the data: {scrub(str(exc), dsn)}"
        ) from exc


def loaded_warehouses(conn: psycopg.Connection[tuple[object, ...]], marker: str) -> int | None:
    """The warehouse count a finished load recorded in ``marker``, or None."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (marker,)).fetchone()
    if not row or not row[0]:
        return None
    got = conn.execute(f"SELECT warehouses FROM {marker} LIMIT 1").fetchone()
    return int(str(got[0])) if got else None


def vacuum_analyze(dsn: str, tables: tuple[str, ...], *, analyze: bool = True) -> None:
    with connect_target(dsn, autocommit=True, connect_timeout=10) as conn:
        for t in tables:
            conn.execute(f"VACUUM {'ANALYZE ' if analyze else ''}{t}")


@dataclass(frozen=True)
class Tpcc:
    """TPC-C at ``warehouses`` (see the module docstring for what is and is not TPC-C).

    ``clients`` pgbench clients run the standard mix; ``isolation`` sets the sessions'
    default_transaction_isolation, ``max_tries`` lets pgbench retry serialization failures
    and deadlocks, ``protocol`` is pgbench's -M.
    """

    warehouses: int = 1
    clients: int = 8
    isolation: Isolation | None = None
    max_tries: int = 10
    protocol: str = "simple"

    def __post_init__(self) -> None:
        if self.warehouses < 1:
            raise WorkloadError(f"warehouses must be >= 1, got {self.warehouses}")
        if self.clients < 1:
            raise WorkloadError(f"clients must be >= 1, got {self.clients}")
        if self.max_tries < 1:
            raise WorkloadError(f"max_tries must be >= 1, got {self.max_tries}")
        if self.protocol not in ("simple", "extended", "prepared"):
            raise WorkloadError(
                f"protocol must be simple, extended or prepared, got {self.protocol!r}"
            )

    def prepare(self, dsn: str) -> str | None:
        """Load the data unless a finished load at this warehouse count is there.

        One warehouse (~600,000 rows, 120 MB) loads in 9 s on an idle 2-core sandbox
        and ~30 s with the cores busy; 4 warehouses (2.1 M rows, 421 MB) in 52 s busy
        (bench/tpcc.py);
        the functions are (re)installed every time, so a re-used database runs today's
        transaction code.
        """
        w = self.warehouses
        with _connect(dsn) as conn:
            try:
                have = loaded_warehouses(conn, MARKER)
                conn.execute(FUNCTIONS)
                conn.commit()
                if have == w:
                    return f"TPC-C {_plural(w)} re-used"
                t0 = time.monotonic()
                for t in (*CH_TABLES, MARKER, *TABLES):
                    conn.execute(f"DROP TABLE IF EXISTS {t} CASCADE")
                conn.execute(SCHEMA)
                conn.execute(LOAD.replace("%(w)s", str(w)))
                conn.execute(INDEXES)
                conn.execute(f"CREATE TABLE {MARKER} (warehouses int, loaded_at timestamptz)")
                conn.execute(f"INSERT INTO {MARKER} VALUES (%s, now())", (w,))
                conn.commit()
            except psycopg.Error as exc:
                raise WorkloadError(
                    f"loading TPC-C at {_plural(w)} failed: {scrub(str(exc), dsn)}; "
                    "check the database has room (~100 MB per warehouse) and the user may "
                    "create tables and functions"
                ) from exc
        vacuum_analyze(dsn, TABLES)
        rows = self._rows(dsn)
        return f"TPC-C {_plural(w)} loaded: {rows:,} rows in {time.monotonic() - t0:.0f} s"

    @staticmethod
    def _rows(dsn: str) -> int:
        with connect_target(dsn, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT sum(n_live_tup)::bigint FROM pg_stat_user_tables WHERE relname = ANY(%s)",
                (list(TABLES),),
            ).fetchone()
        return int(str(row[0])) if row and row[0] is not None else 0

    def reset(self, dsn: str) -> None:
        """Back to the loaded cardinalities: the orders, order lines and history rows runs
        added go, the loaded undelivered orders are undelivered again, then VACUUM so that
        the next run re-uses the space instead of growing the tables.

        Without it the analytic queries drift with time, not with the config: at 2
        warehouses and ~700 tps new-order adds ~190,000 order lines a minute to the
        600,000 loaded, and in CH-benCHmark's confirmation (bench/e2e.py CH1) the same
        config's level fell from 18.8 to 15.7 over 4 rounds. Balances, YTD figures and
        stock quantities stay as the runs left them: they change no table's size or plan.
        """
        try:
            with connect_target(dsn, connect_timeout=10) as conn:
                conn.execute(RESET)
            vacuum_analyze(dsn, TABLES, analyze=False)
        except psycopg.Error as exc:
            raise WorkloadError(
                f"restoring TPC-C's loaded data before a run failed: {scrub(str(exc), dsn)}"
            ) from exc

    def scripts(self) -> tuple[Script, ...]:
        return tuple(
            Script(name, SCRIPTS[name], weight) for name, weight in TRANSACTION_MIX.items()
        )

    def streams(self) -> list[Stream]:
        return [
            Stream(
                name="oltp",
                scripts=self.scripts(),
                clients=self.clients,
                protocol=self.protocol,
                defines={"warehouses": str(self.warehouses)},
                max_tries=self.max_tries,
                isolation=self.isolation,
            )
        ]


def _plural(w: int) -> str:
    return f"{w} warehouse" if w == 1 else f"{w} warehouses"
