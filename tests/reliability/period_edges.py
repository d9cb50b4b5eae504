"""Period and strict tags at the ends of their space and under every admin command, on the real
binary: three nodes under libfaketime, their clocks 40 s before midnight in Asia/Shanghai, on a
new SQLite file, MariaDB or PostgreSQL database.

Checked, every ID of every node collected (no repeat; every period ID dated the day its node's
clock was in):
  * INCRBY larger than what is left of the day: refused whole, nothing taken;
  * 150 concurrent INCRs (50 pipelined per node) of a tag with one sequence digit: exactly the
    day's nine numbers, the others refused; after midnight the next day's nine, from 1;
  * SKIP, STEP, SPLIT, SKIPALL on period tags from a node two hours before midnight: within the
    period, SPLIT refused, no month 13; a SKIP 30 s before midnight skips the next day's
    numbers too (a node ahead may have served them before a restore) and serves them early;
  * the failover margin (MariaDB, PostgreSQL: the rows' writer changed as a lossy failover
    leaves it): within the period;
  * a node listing a strict tag without `order = "strict"`: refused, the strict nodes' IDs in
    order;
  * strict and period tags created at run time, served by nodes that do not list them.

    python3 tests/reliability/period_edges.py LEAFD_BIN sqlite|mysql|postgres
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

LEAD_S = 40
SHANGHAI = 8 * 3600
SERVERS = {"mysql": "mysql://root@127.0.0.1:3306", "postgres": "postgres://postgres@127.0.0.1:5432"}


def sql(dialect, statement, database=None):
    if dialect == "mysql":
        cmd = ["mysql", "-uroot", "-h127.0.0.1", "-N", "-e", statement] + ([database] if database else [])
    else:
        cmd = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", database or "postgres", "-X", "-q",
               "-v", "ON_ERROR_STOP=1", "-c", statement]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def period_tag(tag, calendar, digits):
    return {"tag": tag, "step": 100, "period": calendar, "time_zone": "Asia/Shanghai",
            "sequence_digits": digits, "prefix": "ORD"}


def days_around(midnight):
    """The Shanghai dates (YYYYMMDD) before and after `midnight` (UNIX seconds)."""
    return (time.strftime("%Y%m%d", time.gmtime(midnight + SHANGHAI - 1)),
            time.strftime("%Y%m%d", time.gmtime(midnight + SHANGHAI)))


def run(binary, dialect):
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix=f"leafd-period-edges-{dialect}-")
    name = f"leafd_period_edges_{os.getpid()}"
    if dialect == "sqlite":
        url = f"sqlite://{work}/leafd.db"
    else:
        sql(dialect, f"CREATE DATABASE {name}")
        url = f"{SERVERS[dialect]}/{name}"
    now = time.time()
    midnight = (int((now + SHANGHAI + LEAD_S + 5) // 86400) + 1) * 86400 - SHANGHAI
    offset = int(midnight - now - LEAD_S)
    day, next_day = days_around(midnight)
    tags = [period_tag("ord", "daily", 4), period_tag("one", "daily", 1),
            period_tag("mon", "monthly", 4), {"tag": "plain", "step": 100},
            {"tag": "s", "step": 100, "order": "strict"}]
    failures, nodes, issued = [], [], []

    def node(label, seeds, worker, behind_s=0):
        config = {"segment": {"failover_margin": 1000}, "segment.tags": seeds,
                  "snowflake": {"coordinator": "static", "worker_id": worker}}
        n = leafd.Node(binary, work, label, url, config=config,
                       env=leafd.faketime_env(f"{offset - behind_s:+d}"))
        nodes.append(n)
        return n.start().wait_ready(30)

    def call(n, *args):
        """One command; an integer reply of INCR/INCRBY is an ID and kept."""
        with leafd.RespConnection(n.port) as c:
            reply = c.call(*args)
        if isinstance(reply, int) and args[0] in ("INCR", "INCRBY"):
            issued.append((n.name, args, reply))
        if isinstance(reply, bytes):
            reply = reply.decode()
        return reply

    def expect(what, reply, wanted):
        ok = wanted(reply) if callable(wanted) else reply == wanted
        if not ok:
            failures.append(f"{what}: got {reply!r}")

    def burst(tag):
        """50 INCRs pipelined on each node at once: the IDs and the error replies."""
        results = []

        def one(n):
            with leafd.RespConnection(n.port) as c:
                results.extend((n.name, r) for r in c.pipeline([("INCR", f"segment:{tag}")] * 50))
        threads = [threading.Thread(target=one, args=(n,)) for n in nodes[:3]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        ids = sorted(r for _, r in results if isinstance(r, int))
        issued.extend((who, ("INCR", f"segment:{tag}"), r) for who, r in results if isinstance(r, int))
        return ids, [str(r) for _, r in results if not isinstance(r, int)]

    try:
        a, b, c = (node(f"n{i}", tags, i + 1) for i in range(3))
        # The end of the day: a block larger than what is left takes nothing.
        expect("first INCR", call(a, "INCR", "segment:ord"), int(f"{day}0001"))
        expect("INCRBY past the day", str(call(a, "INCRBY", "segment:ord", 100000)),
               lambda r: f"period {day} has 9998 sequence numbers left, fewer than the 100000 asked" in r)
        expect("INCR after it", call(b, "INCR", "segment:ord"), int(f"{day}0002"))
        ids, errors = burst("one")
        expect("150 INCRs of one digit", ids, [int(f"{day}{s}") for s in range(1, 10)])
        expect("their refusals", [e for e in errors if f"period {day} has used all its 9" not in e], [])
        # Admin commands on period tags, from a node whose clock is two hours before midnight
        # (nearer, a skip also takes the next day's numbers: below).
        early = node("early", tags, 8, behind_s=7200)
        call(early, "LEAF.TAG", "SKIP", "ord", 10)
        expect("INCR after SKIP 10", call(c, "INCR", "segment:ord"), int(f"{day}0013"))
        expect("STEP", call(a, "LEAF.TAG", "STEP", "mon", 50), "OK")
        expect("SPLIT of a period tag", str(call(a, "LEAF.TAG", "SPLIT", "mon", 2, 0, 100)),
               lambda r: "cannot be split" in r)
        month = day[:6]
        expect("monthly INCR", call(b, "INCR", "segment:mon"), int(f"{month}0001"))
        if dialect != "sqlite":
            # As a lossy failover leaves the row: written last by another instance.
            sql(dialect, "UPDATE leaf_alloc SET writer = 'a-lost-primary' WHERE biz_tag = 'ord'",
                name)
            expect("INCR after the failover margin", call(a, "INCR", "segment:ord"),
                   int(f"{day}1014"))
        call(early, "LEAF.TAG", "SKIPALL", 1000000000)
        expect("monthly INCR after SKIPALL", str(call(a, "INCR", "segment:mon")),
               lambda r: f"period {month} has used all" in r)
        # A node listing the strict tag without order = "strict".
        trend = node("trend", [{"tag": "s", "step": 100}], 9)
        strict_ids = [call((a, b)[i % 2], "INCR", "segment:s") for i in range(100)]
        expect("strict IDs in order", all(x < y for x, y in zip(strict_ids, strict_ids[1:])), True)
        expect("the trend node", str(call(trend, "INCR", "segment:s")),
               lambda r: "records strict order (order:strict)" in r)
        # Created at run time, served by nodes that do not list them.
        expect("CREATE ORDER strict", call(a, "LEAF.TAG", "CREATE", "rs", 100, "ORDER", "strict"), "OK")
        expect("CREATE PERIOD", call(a, "LEAF.TAG", "CREATE", "rd", 100, "PERIOD", "daily", "ZONE",
                                     "Asia/Shanghai", "DIGITS", 4, "PREFIX", "INV"), "OK")
        expect("run-time strict", [call(n, "INCR", "segment:rs") for n in (b, c, b)], [1, 2, 3])
        expect("run-time period", call(c, "INCR", "segment:rd"), int(f"{day}0001"))
        expect("its code", call(b, "LEAF.CODE", "rd"), f"INV{day}0002")
        # Within a minute of midnight a SKIP also skips the next day's first numbers, and the
        # row is left there: served (a day early, as by a node whose clock is ahead) from them.
        expect("CREATE nx", call(a, "LEAF.TAG", "CREATE", "nx", 100, "PERIOD", "daily", "ZONE",
                                 "Asia/Shanghai", "DIGITS", 4), "OK")
        expect("nx today", call(b, "INCR", "segment:nx"), int(f"{day}0001"))
        call(a, "LEAF.TAG", "SKIP", "nx", 5)
        expect("nx after a SKIP 5 before midnight", call(c, "INCR", "segment:nx"),
               int(f"{next_day}0006"))
        # Past midnight: the next day from 1, with all its numbers.
        time.sleep(max(0.0, midnight - (time.time() + offset) + 1.5))
        ids, _ = burst("one")
        expect("150 INCRs after midnight", ids, [int(f"{next_day}{s}") for s in range(1, 10)])
        expect("next day", call(a, "INCR", "segment:ord"), int(f"{next_day}0001"))
        # Every ID: none twice in its tag, every period ID of the day its request was in.
        values = [(args[1], r) for _, args, r in issued]
        if len(set(values)) != len(values):
            failures.append(f"repeated IDs: {len(values) - len(set(values))}")
        for who, args, r in issued:
            if args[1] in ("segment:ord", "segment:one", "segment:rd", "segment:nx") and \
                    not str(r).startswith((day, next_day)):
                failures.append(f"{who} {args}: {r} is dated neither {day} nor {next_day}")
        print(f"  {dialect}: {len(values)} IDs from {len(nodes)} nodes around {day}/{next_day} "
              f"midnight in Shanghai; repeats {len(values) - len(set(values))}", flush=True)
    finally:
        leafd.stop_all(nodes)
        if dialect != "sqlite":
            sql(dialect, f"DROP DATABASE IF EXISTS {name}")
        shutil.rmtree(work, ignore_errors=True)
    return leafd.print_outcome(f"period_edges {dialect}", failures, started)


if __name__ == "__main__":
    sys.exit(0 if run(os.path.abspath(sys.argv[1]), sys.argv[2]) else 1)
