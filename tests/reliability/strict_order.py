"""Strictly increasing tags (order = "strict") checked from outside, on the real binary.

Three leafd nodes on one new database (MariaDB or PostgreSQL), one strict tag. Client threads on
every node send INCR and INCRBY, pipelined; each request's send time and reply time are taken
from this machine's one monotonic clock (time.monotonic_ns: before the write, after the reply is
parsed). The guarantee: if the reply to one request arrived before another request was sent, on
any nodes, every ID of the second is larger than every ID of the first; and no ID repeats. The
check sorts by send time and sweeps the replies that came before each send.

Faults in the same run: one node SIGKILLed and restarted, one SIGSTOPped for 1.5 s and resumed,
the third's path to the database (a TCP proxy) frozen for 2 s, then its connections reset.
`--period` runs the same check on a daily tag (Asia/Shanghai) across a midnight: every node under
libfaketime, their clocks a second apart, one SIGKILLed and restarted; it also checks that the
new day starts at sequence 1 and that no node serves the old day after the new one's first reply.
`--pause` SIGSTOPs one node six times for 4 s under load (whichever moment it is in, often
holding the row lock mid-transaction): the database aborts a transaction idle for 2 s, so the
other two nodes must serve again within each pause; IDs/s of the others per pause are printed.
`--bench` instead measures IDs/s and latency of the strict tag against a trend-increasing tag on
the same database, 1 and 3 nodes, pipeline 1 and 32, and prints a Markdown table.

    python3 tests/reliability/strict_order.py LEAFD_BIN mysql|postgres [--seconds S] [--bench|--period|--pause]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

SERVERS = {"mysql": ("127.0.0.1", 3306, "root"), "postgres": ("127.0.0.1", 5432, "postgres")}


def sql(dialect, statement):
    host, port, user = SERVERS[dialect]
    if dialect == "mysql":
        cmd = ["mysql", f"-u{user}", f"-h{host}", f"-P{port}", "-N", "-e", statement]
    else:
        cmd = ["psql", "-h", host, "-p", str(port), "-U", user, "-d", "postgres", "-X", "-q",
               "-v", "ON_ERROR_STOP=1", "-c", statement]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def database_url(dialect, name, via=None):
    """The database's URL; `via` a local port (a proxy) instead of the server's."""
    host, port, user = SERVERS[dialect]
    port = via or port
    if dialect == "mysql":
        return f"mysql://{user}@{host}:{port}/{name}?ssl-mode=disabled"
    return f"postgres://{user}@{host}:{port}/{name}?sslmode=disable"


class Client(threading.Thread):
    """One connection to one node: batches of `depth` commands (INCR, every fifth batch one
    INCRBY 5), each request recorded as (send_ns, reply_ns, first_id, last_id, node)."""

    def __init__(self, node, key, depth, stop, with_incrby=True):
        super().__init__(daemon=True)
        self.node, self.key, self.depth, self.stop = node, key, depth, stop
        self.with_incrby = with_incrby
        self.records, self.errors, self.latencies = [], [], []

    def run(self):
        conn, batches = None, 0
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = leafd.RespConnection(self.node.port, timeout=5)
                batches += 1
                block = 5 if self.with_incrby and batches % 5 == 0 else 0
                commands = [("INCRBY", self.key, block) if block and i == 0 else ("INCR", self.key)
                            for i in range(self.depth)]
                sent = time.monotonic_ns()
                conn.send(commands)
                for command in commands:
                    reply = conn.read_reply()
                    got = time.monotonic_ns()
                    if isinstance(reply, int):
                        n = int(command[2]) if command[0] == "INCRBY" else 1
                        self.records.append((sent, got, reply - n + 1, reply, self.node.name))
                        self.latencies.append(got - sent)
                    else:
                        self.errors.append(str(reply))
            except (OSError, ValueError):
                # A node killed or stopped: requests whose replies never came prove nothing.
                if conn is not None:
                    try:
                        conn.close()
                    except OSError:
                        pass
                conn = None
                time.sleep(0.05)
        if conn is not None:
            conn.close()


def check(records):
    """(violations, repeats, first violation text): every request must be above everything
    whose reply arrived before it was sent."""
    ids = set()
    repeats = 0
    for _, _, first, last, _ in records:
        for i in range(first, last + 1):
            if i in ids:
                repeats += 1
            ids.add(i)
    by_reply = sorted(records, key=lambda r: r[1])
    violations, example, j, highest, highest_rec = 0, None, 0, -1, None
    for rec in sorted(records, key=lambda r: r[0]):
        while j < len(by_reply) and by_reply[j][1] < rec[0]:
            if by_reply[j][3] > highest:
                highest, highest_rec = by_reply[j][3], by_reply[j]
            j += 1
        if rec[2] <= highest:
            violations += 1
            if example is None:
                example = (f"{rec[4]} sent at {rec[0]} got {rec[2]}..{rec[3]}, but {highest_rec[4]}"
                           f"'s reply {highest_rec[3]} arrived at {highest_rec[1]}")
    return violations, repeats, example, len(ids)


def judge(records, errors, failures, allowed_errors=()):
    """The checks every run makes: real-time order, repeats, and no error reply but UNAVAILABLE
    (or one containing a text of `allowed_errors`); adds to `failures`, returns the counts."""
    violations, repeats, example, distinct = check(records)
    if violations:
        failures.append(f"{violations} real-time order violations, e.g. {example}")
    if repeats:
        failures.append(f"{repeats} repeated IDs")
    unexpected = [e for e in errors if not e.startswith("UNAVAILABLE")
                  and not any(text in e for text in allowed_errors)]
    if unexpected:
        failures.append(f"unexpected error replies: {unexpected[:3]}")
    return violations, repeats, distinct


def start_nodes(binary, work, url, count, tag, order, prefix="n", seed=None, envs=None, urls=None):
    """`count` nodes on `url` (or node i on urls[i] when given)."""
    config = {"segment": {"adaptive_step": True},
              "segment.tags": [seed or {"tag": tag, "step": 1000, "order": order}],
              "snowflake": {"coordinator": "static", "worker_id": 1}}
    nodes = [leafd.Node(binary, work, f"{prefix}{i}", storage_url=(urls or {}).get(i, url),
                        config=config, env=(envs or {}).get(i))
             for i in range(count)]
    for node in nodes:
        node.start()
    for node in nodes:
        node.wait_ready(30)
    return nodes


def run_order_test(binary, dialect, seconds, order="strict"):
    started = time.monotonic()
    name = f"leafd_strict_{os.getpid()}"
    sql(dialect, f"CREATE DATABASE {name}")
    work = tempfile.mkdtemp(prefix="leafd-strict-")
    nodes = []
    failures = []
    host, port, _ = SERVERS[dialect]
    proxy = leafd.TcpProxy((host, port), "n2-database")
    try:
        # n2 reaches the database through a proxy: its path is frozen, then cut.
        nodes = start_nodes(binary, work, database_url(dialect, name), 3, "strict", order,
                            urls={2: database_url(dialect, name, via=proxy.port)})
        stop = threading.Event()
        clients = [Client(node, "segment:strict", depth, stop)
                   for node in nodes for depth in (1, 1, 8, 32)]
        for client in clients:
            client.start()
        time.sleep(seconds / 3)
        nodes[0].kill()  # SIGKILL under load, then back
        nodes[0].start()
        nodes[0].wait_ready(30)
        time.sleep(seconds / 3)
        nodes[1].pause()  # SIGSTOP: its requests wait; no lease to lose
        time.sleep(1.5)
        nodes[1].resume()
        time.sleep(seconds / 6)
        # n2's path to the database frozen 2 s (past the load timeout: what it sent waits, and
        # a transaction holding the row lock stalls every node), then its connections reset.
        proxy.pause()
        time.sleep(2)
        proxy.drop_connections()
        proxy.resume()
        time.sleep(seconds / 6)
        stop.set()
        for client in clients:
            client.join(15)
        records = [r for c in clients for r in c.records]
        errors = [e for c in clients for e in c.errors]
        violations, repeats, distinct = judge(records, errors, failures)
        per_node = {n.name: sum(1 for r in records if r[4] == n.name) for n in nodes}
        print(f"  {dialect}: {len(records)} requests ({distinct} IDs) from 3 nodes {per_node}, "
              f"pipelines 1/8/32, SIGKILL + restart of n0, SIGSTOP 1.5 s of n1, n2's database "
              f"path frozen 2 s then reset; "
              f"real-time order violations {violations}, repeats {repeats}, error replies {len(errors)}")
        if len(records) < 1000:
            failures.append(f"only {len(records)} requests answered")
    finally:
        leafd.stop_all(nodes)
        proxy.close()
        sql(dialect, f"DROP DATABASE IF EXISTS {name}")
        subprocess.run(["rm", "-rf", work], check=False)
    leafd.print_outcome(f"strict_order {dialect}", failures, started)
    return not failures


# The database aborts a transaction idle this long (leafd's storage::session), so a paused lock
# holder blocks the others at most about this long (plus the retry's pause).
IDLE_BOUND_S = 2.0
PAUSE_S = 4.0


def run_pause_test(binary, dialect):
    """n0 SIGSTOPped six times for 4 s under load; in each pause the other nodes serve again
    after the idle-transaction bound. Every reply checked for real-time order and repeats."""
    started = time.monotonic()
    name = f"leafd_pause_{os.getpid()}"
    sql(dialect, f"CREATE DATABASE {name}")
    work = tempfile.mkdtemp(prefix="leafd-pause-")
    nodes, failures = [], []
    try:
        nodes = start_nodes(binary, work, database_url(dialect, name), 3, "strict", "strict")
        stop = threading.Event()
        clients = [Client(node, "segment:strict", depth, stop)
                   for node in nodes for depth in (1, 1, 8)]
        for client in clients:
            client.start()
        time.sleep(1.0)
        pauses = []
        for _ in range(6):
            time.sleep(0.5 + (os.getpid() % 7) / 10)
            began = time.monotonic_ns()
            nodes[0].pause()
            time.sleep(PAUSE_S)
            nodes[0].resume()
            pauses.append((began, time.monotonic_ns()))
            time.sleep(1.0)
        stop.set()
        for client in clients:
            client.join(15)
        records = [r for c in clients for r in c.records]
        errors = [e for c in clients for e in c.errors]
        violations, repeats, distinct = judge(records, errors, failures)
        rates, after_bound = [], []
        for began, ended in pauses:
            others = [r for r in records if r[4] != nodes[0].name and began <= r[1] <= ended]
            ids = sum(r[3] - r[2] + 1 for r in others)
            rates.append(round(ids / ((ended - began) / 1e9)))
            late = began + int((IDLE_BOUND_S + 1.0) * 1e9)
            after_bound.append(sum(1 for r in others if r[1] >= late))
        print(f"  {dialect} pause: {len(records)} requests ({distinct} IDs), n0 SIGSTOPped 6 x "
              f"{PAUSE_S:.0f} s; the other nodes' IDs/s in each pause {rates}; their replies in "
              f"the last {PAUSE_S - IDLE_BOUND_S - 1:.0f} s of each pause {after_bound}; real-time "
              f"order violations {violations}, repeats {repeats}, error replies {len(errors)}")
        stalled = [i for i, n in enumerate(after_bound) if n == 0]
        if stalled:
            failures.append(f"the other nodes served nothing after the {IDLE_BOUND_S} s bound "
                            f"in pauses {stalled}")
    finally:
        leafd.stop_all(nodes)
        sql(dialect, f"DROP DATABASE IF EXISTS {name}")
        subprocess.run(["rm", "-rf", work], check=False)
    leafd.print_outcome(f"strict_order pause {dialect}", failures, started)
    return not failures


SHANGHAI = 8 * 3600
DIGITS = 6


def run_period_test(binary, dialect, seconds, digits=DIGITS):
    """A daily tag across Shanghai's midnight: node clocks (libfaketime) reach it 4 s, 3 s and
    4 s after the start, n1 a second behind the others; n0 SIGKILLed and restarted right after
    the boundary. With few `digits` (1: nine numbers a day) the load uses each day up at once:
    each day must then have served exactly its numbers 1..9, each once, and the refusals must
    be the period's own (`period … has used all`, `… numbers left, fewer than …`)."""
    started = time.monotonic()
    name = f"leafd_period_{os.getpid()}"
    sql(dialect, f"CREATE DATABASE {name}")
    work = tempfile.mkdtemp(prefix="leafd-period-")
    now = time.time()
    # The next Shanghai midnight at least 4 s away, as an offset from the real clock.
    midnight = (int((now + SHANGHAI + 4) // 86400) + 1) * 86400 - SHANGHAI
    ahead = int(midnight - now - 4)
    envs = {0: leafd.faketime_env(f"+{ahead}"), 1: leafd.faketime_env(f"+{ahead - 1}"),
            2: leafd.faketime_env(f"+{ahead}")}
    day = time.strftime("%Y%m%d", time.gmtime(midnight + SHANGHAI - 1))
    next_day = time.strftime("%Y%m%d", time.gmtime(midnight + SHANGHAI))
    seed = {"tag": "ord", "step": 100, "period": "daily", "time_zone": "Asia/Shanghai",
            "sequence_digits": digits, "prefix": "ORD"}
    nodes, failures = [], []
    try:
        nodes = start_nodes(binary, work, database_url(dialect, name), 3, "ord", "strict",
                            seed=seed, envs=envs)
        stop = threading.Event()
        clients = [Client(node, "segment:ord", depth, stop)
                   for node in nodes for depth in (1, 1, 8, 32)]
        for client in clients:
            client.start()
        time.sleep(max(0.0, midnight - time.time() - ahead + 0.3))
        nodes[0].kill()  # SIGKILL just past the boundary, then back
        nodes[0].start()
        nodes[0].wait_ready(30)
        time.sleep(max(1.0, seconds - (time.monotonic() - started)))
        stop.set()
        for client in clients:
            client.join(15)
        records = [r for c in clients for r in c.records]
        errors = [e for c in clients for e in c.errors]
        period_refusal = ("has used all its", "sequence numbers left, fewer than")
        violations, repeats, distinct = judge(records, errors, failures,
                                              period_refusal if digits < DIGITS else ())
        scale = 10 ** digits
        days = {}
        for _, _, first, last, _ in records:
            days.setdefault(str(first // scale), []).append(first % scale)
        print(f"  {dialect} period: {len(records)} requests ({distinct} IDs) from 3 nodes across "
              f"{day}/{next_day} midnight in Shanghai (clocks: n1 1 s behind), SIGKILL + restart "
              f"of n0; IDs per day { {d: len(v) for d, v in days.items()} }; real-time order "
              f"violations {violations}, repeats {repeats}, error replies {len(errors)}")
        if set(days) != {day, next_day}:
            failures.append(f"days served {sorted(days)}, expected {day} and {next_day}")
        elif min(days[next_day]) != 1 or min(days[day]) != 1:
            failures.append(f"a day did not start at 1: {min(days[day])}, {min(days[next_day])}")
        elif digits < DIGITS:
            # The old day's numbers are all used up long before the kill; numbers of the new
            # day that n0 had allocated when it was killed are never served, so the new day may
            # miss some. Never one twice, never past the last.
            for d in (day, next_day):
                served = sorted(s for first, last in
                                [(r[2], r[3]) for r in records if str(r[2] // scale) == d]
                                for s in range(first % scale, last % scale + 1))
                whole = list(range(1, scale))
                if (d == day and served != whole) or len(set(served)) != len(served) \
                        or not set(served) <= set(whole):
                    failures.append(f"{d} served sequence numbers {served}, expected 1..{scale - 1} once each")
        first_new = min((r[1] for r in records if str(r[2] // scale) == next_day), default=None)
        late_old = [r for r in records if str(r[2] // scale) == day and first_new is not None
                    and r[0] > first_new]
        if late_old:
            failures.append(f"{len(late_old)} requests sent after the first {next_day} reply got "
                            f"{day}, e.g. {late_old[0]}")
    finally:
        leafd.stop_all(nodes)
        sql(dialect, f"DROP DATABASE IF EXISTS {name}")
        subprocess.run(["rm", "-rf", work], check=False)
    leafd.print_outcome(f"strict_order period {dialect} ({digits} digits)", failures, started)
    return not failures


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else 0


def run_bench(binary, dialect, seconds):
    rows = []
    for order in ("trend", "strict"):
        for count in (1, 3):
            for depth in (1, 32):
                name = f"leafd_bench_{os.getpid()}_{order}_{count}_{depth}"
                sql(dialect, f"CREATE DATABASE {name}")
                work = tempfile.mkdtemp(prefix="leafd-strict-bench-")
                nodes = []
                try:
                    nodes = start_nodes(binary, work, database_url(dialect, name), count, "t", order)
                    stop = threading.Event()
                    clients = [Client(node, "segment:t", depth, stop, with_incrby=False)
                               for node in nodes for _ in range(4)]
                    for client in clients:
                        client.start()
                    time.sleep(0.5)
                    for client in clients:
                        client.records.clear()
                        client.latencies.clear()
                    began = time.monotonic()
                    time.sleep(seconds)
                    stop.set()
                    elapsed = time.monotonic() - began
                    for client in clients:
                        client.join(15)
                    ids = sum(len(c.records) for c in clients)
                    lat = [x for c in clients for x in c.latencies]
                    rows.append((order, count, depth, ids / elapsed,
                                 percentile(lat, 0.5) / 1e6, percentile(lat, 0.99) / 1e6))
                finally:
                    leafd.stop_all(nodes)
                    sql(dialect, f"DROP DATABASE IF EXISTS {name}")
                    subprocess.run(["rm", "-rf", work], check=False)
    print(f"\n{dialect}, {seconds} s each, 4 clients per node (Python), IDs/s and request latency "
          f"(a pipelined request's latency is its batch's):\n")
    print("| tag | nodes | pipeline | IDs/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for order, count, depth, rate, p50, p99 in rows:
        print(f"| {order} | {count} | {depth} | {rate:,.0f} | {p50:.2f} | {p99:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("dialect", choices=sorted(SERVERS))
    parser.add_argument("--seconds", type=float, default=9)
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--period", action="store_true",
                        help="a daily tag across a midnight, clocks a second apart")
    parser.add_argument("--digits", type=int, default=DIGITS,
                        help="--period: sequence digits (1: nine numbers a day, used up at once)")
    parser.add_argument("--pause", action="store_true",
                        help="SIGSTOP a node 6 x 4 s; the others must serve within each pause")
    parser.add_argument("--order", default="strict", choices=("strict", "trend"),
                        help="trend: show that the check catches a trend-increasing tag")
    args = parser.parse_args()
    if args.bench:
        run_bench(args.binary, args.dialect, args.seconds)
        return
    if args.period:
        sys.exit(0 if run_period_test(args.binary, args.dialect, args.seconds, args.digits) else 1)
    if args.pause:
        sys.exit(0 if run_pause_test(args.binary, args.dialect) else 1)
    sys.exit(0 if run_order_test(args.binary, args.dialect, args.seconds, args.order) else 1)


main()
