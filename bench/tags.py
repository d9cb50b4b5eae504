#!/usr/bin/env python3
"""Helpers of bench/tags.sh (what many segment tags cost): make and drop a database, fill
leaf_alloc with N tags, run redis-benchmark against leafd for a given time, allocate on the
database directly as leafd does, and check leafd's replies. One subcommand each:

    tags.py create  DIALECT BASE_URL NAME      a fresh database on the server (mysql, postgres)
    tags.py drop    DIALECT BASE_URL NAME      drop it (no error when it is gone)
    tags.py fill    DIALECT TARGET N [STEP]    insert tags t000000000000 … t<N-1> into leaf_alloc
    tags.py load    PORT N CLIENTS SECONDS     redis-benchmark INCR segment:t__rand_int__ for SECONDS;
                                               prints "requests/s p50_ms p99_ms requests wall_s error_runs"
                                               (TAGS_BENCH_VERBOSE=1: each run on stderr)
    tags.py direct  DIALECT TARGET N CLIENTS SECONDS
                                               CLIENTS processes allocating by hand on random rows;
                                               prints "allocations/s allocations errors"
    tags.py info    DIALECT BASE_URL           the server's version and commit durability settings
    tags.py check   PORT N [REPLIES] [TAGS] [CONNECTIONS]
                                               INCR on a sample of tags from several connections:
                                               every reply an integer, no (tag, ID) twice, each
                                               connection's IDs of a tag increasing; prints
                                               "replies errors repeats" and exits 1 on any failure

TARGET is the SQLite file for sqlite, else the database's URL (mysql://user[:pw]@host:port/db,
postgres://…; its query is ignored). Standard library, plus pymysql for mysql and psycopg2 for
postgres (bench/tags.sh installs them when missing).
"""
import multiprocessing
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse


VERBOSE = bool(os.environ.get("TAGS_BENCH_VERBOSE"))


def tag_name(i):
    # redis-benchmark's __rand_int__ is a 12-digit zero-padded number below -r
    return f"t{i:012d}"


# --- databases ------------------------------------------------------------------------------

def connect(dialect, target, database=None, autocommit=False):
    """A DB-API connection; `database` overrides the URL's (None: the URL's own path)."""
    if dialect == "sqlite":
        # isolation_level=None: the statements below say BEGIN/COMMIT themselves. leafd opens the
        # file in WAL mode with SQLite's default synchronous=FULL (sqlx sets neither else).
        conn = sqlite3.connect(target, timeout=5.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn
    url = urllib.parse.urlsplit(target)
    name = database if database is not None else url.path.lstrip("/")
    user = urllib.parse.unquote(url.username or "")
    password = urllib.parse.unquote(url.password or "")
    if dialect == "mysql":
        import pymysql
        return pymysql.connect(host=url.hostname or "127.0.0.1", port=url.port or 3306,
                               user=user or "root", password=password,
                               database=name or None, autocommit=autocommit)
    if dialect == "postgres":
        import psycopg2
        conn = psycopg2.connect(host=url.hostname or "127.0.0.1", port=url.port or 5432,
                                user=user or "postgres", password=password,
                                dbname=name or "postgres", sslmode="disable")
        conn.autocommit = autocommit
        return conn
    sys.exit(f"unknown dialect {dialect}")


def create(dialect, base, name):
    conn = connect(dialect, base, database="", autocommit=True)
    conn.cursor().execute(f"CREATE DATABASE {name}")
    conn.close()


def drop(dialect, base, name):
    conn = connect(dialect, base, database="", autocommit=True)
    force = " WITH (FORCE)" if dialect == "postgres" else ""
    conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}{force}")
    conn.close()


def fill(dialect, target, n, step=1000):
    """N rows in one transaction, the way that is fastest on each database. The other columns
    (writer, opaque, exclusive_max, split) stay NULL, as in a table Leaf itself filled."""
    conn = connect(dialect, target)
    cur = conn.cursor()
    if dialect == "sqlite":
        cur.execute("BEGIN")
        cur.executemany(
            "INSERT INTO leaf_alloc (biz_tag, max_id, step, description, update_time) "
            "VALUES (?, 0, ?, 'bench', CURRENT_TIMESTAMP)",
            ((tag_name(i), step) for i in range(n)))
        cur.execute("COMMIT")
    elif dialect == "postgres":
        cur.execute(
            "INSERT INTO leaf_alloc (biz_tag, max_id, step, description, update_time) "
            "SELECT 't' || lpad(i::text, 12, '0'), 0, %s, 'bench', now() "
            "FROM generate_series(0, %s - 1) AS i", (step, n))
        conn.commit()
    else:
        # multi-row INSERTs of 5,000 rows (well under max_allowed_packet)
        batch = 5000
        for lo in range(0, n, batch):
            rows = range(lo, min(n, lo + batch))
            cur.execute(
                "INSERT INTO leaf_alloc (biz_tag, max_id, step, description, update_time) VALUES "
                + ",".join(["(%s, 0, %s, 'bench', NOW())"] * len(rows)),
                [v for i in rows for v in (tag_name(i), step)])
        conn.commit()
    cur.execute("SELECT COUNT(*) FROM leaf_alloc")
    count = cur.fetchone()[0]
    conn.close()
    if count != n:
        sys.exit(f"leaf_alloc has {count} rows after inserting {n}")


# --- direct allocations ---------------------------------------------------------------------

def allocate_loop(dialect, target, n, clients, index, seconds, barrier, results):
    """One client: allocations on random rows until the shared start + SECONDS. Client `index`
    uses only the rows i with i % clients == index when there are enough, so concurrent clients
    touch distinct rows (as leafd's loads of distinct tags do); with fewer rows than clients
    they share them (one tag: every client on the one row)."""
    try:
        conn = connect(dialect, target)
    except Exception as e:
        print(f"client {index} cannot connect: {e}", file=sys.stderr)
        barrier.barrier.abort()  # the others and the parent stop waiting
        return
    cur = conn.cursor()
    now = "CURRENT_TIMESTAMP" if dialect == "sqlite" else "now()"
    mark = "?" if dialect == "sqlite" else "%s"
    update = f"UPDATE leaf_alloc SET max_id = max_id + step, update_time = {now} WHERE biz_tag = {mark}"
    select = f"SELECT max_id, step FROM leaf_alloc WHERE biz_tag = {mark}"
    own = (n - index + clients - 1) // clients if n >= clients else 0
    rng = random.Random()
    done = errors = 0
    start = barrier.wait_start()
    deadline = start + seconds
    last = start
    while time.time() < deadline:
        i = index + clients * rng.randrange(own) if own else rng.randrange(n)
        tag = tag_name(i)
        try:
            if dialect == "sqlite":
                cur.execute("BEGIN IMMEDIATE")  # take the write lock first, as leafd's UPDATE does
            elif dialect == "mysql":
                conn.begin()
            # psycopg2 begins the transaction itself at the first statement
            cur.execute(update, (tag,))
            cur.execute(select, (tag,))
            if cur.fetchone() is None:
                raise RuntimeError(f"no row {tag}")
            if dialect == "sqlite":
                cur.execute("COMMIT")
            else:
                conn.commit()
            done += 1
            last = time.time()
        except Exception:  # a lock timeout, a deadlock: counted, rolled back, next row
            errors += 1
            try:
                if dialect == "sqlite":
                    cur.execute("ROLLBACK")
                else:
                    conn.rollback()
            except Exception:
                pass
    results.put((done, errors, last))
    conn.close()


class StartLine:
    """All clients connect first, then start together: the time counts allocations only."""

    def __init__(self, ctx, parties):
        self.barrier = ctx.Barrier(parties + 1)
        self.start = ctx.Value("d", 0.0)

    def wait_start(self):
        self.barrier.wait(timeout=120)
        return self.start.value

    def release(self):
        self.start.value = time.time() + 0.05
        self.barrier.wait(timeout=120)
        return self.start.value


def direct(dialect, target, n, clients, seconds):
    # processes, not threads: the GIL must not be what bounds the rate
    ctx = multiprocessing.get_context("fork")
    line = StartLine(ctx, clients)
    results = ctx.Queue()
    # daemon: ended with this process when it is stopped
    procs = [ctx.Process(target=allocate_loop, args=(dialect, target, n, clients, i, seconds, line, results),
                         daemon=True)
             for i in range(clients)]
    for p in procs:
        p.start()
    try:
        start = line.release()
    except threading.BrokenBarrierError:
        sys.exit("a direct client could not connect")
    done = errors = 0
    end = start + seconds
    for _ in procs:
        d, e, last = results.get(timeout=seconds + 120)
        done += d
        errors += e
        end = max(end, last)
    # up to the last commit: a client's last allocation may end after SECONDS (a lock wait)
    wall = end - start
    for p in procs:
        p.join(timeout=10)
    print(f"{done / wall:.0f} {done} {errors}")


# --- leafd under redis-benchmark ------------------------------------------------------------

def run_benchmark(cmd, timeout, used_seeds):
    """Runs one redis-benchmark; returns (exit status, output). redis-benchmark seeds the
    generator behind __rand_int__ with time(NULL) ^ getpid(), so a run a second after another
    whose pid is one more often has the same seed ((s + 1) ^ (p + 1) == s ^ p for even s and p)
    and draws the same tags, all warm by then. So it is started through
    `sh -c 'read; exec …'` (exec keeps the pid) and let go only when its seed, in this second
    and the next, is one no earlier run had: else another sh is started for another pid."""
    for _ in range(1000):
        proc = subprocess.Popen(["sh", "-c", 'read go && exec "$@"', "sh"] + cmd, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        now = time.time()
        if now - int(now) > 0.9:  # too near the next second to know which one it will read
            time.sleep(int(now) + 1.0 - now)
            now = time.time()
        seeds = {int(now) ^ proc.pid, (int(now) + 1) ^ proc.pid}
        if not seeds & used_seeds:
            break
        proc.kill()
        proc.communicate()
    used_seeds |= seeds
    try:
        out, _ = proc.communicate("go\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, ""
    return proc.returncode, out


def load(port, n, clients, seconds):
    """redis-benchmark has no time bound and prints nothing when interrupted, so the load runs
    as successive redis-benchmarks of about a second each (sized from the previous one's rate,
    which grows as tags warm up) until SECONDS have passed. redis-benchmark exits at the first
    error reply: such a run counts in error_runs and the next one starts (leafd's own counters,
    read by tags.sh, count the requests and errors exactly). requests/s here is the completed
    runs' requests over the wall time; p50/p99 come from the completed runs' merged latency
    distributions (each run's count at or below a latency is a lower bound between its points,
    so the merged percentile is an upper bound, never above the largest of the runs' own)."""
    start = time.monotonic()
    batch = clients * 10
    total = 0
    error_runs = 0
    used_seeds = set()
    dists, p50s, p99s = [], [], []
    limit = max(60, 4 * seconds)
    while True:
        cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
               "-n", str(batch), "-r", str(n), "INCR", "segment:t__rand_int__"]
        status, text = run_benchmark(cmd, limit, used_seeds)
        completed = False
        if status is None:
            sys.exit(f"redis-benchmark of {batch} requests did not finish in {limit} s: leafd stalled")
        done = re.search(r"(\d+) requests completed in ([\d.]+) seconds", text)
        summary = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*\n\s*" + r"\s+".join([r"([\d.]+)"] * 6), text)
        error = re.search(r"^Error from server.*", text, re.M)
        if error:
            error_runs += 1
            if VERBOSE or error_runs == 1:  # the first one says what went wrong
                print(f"run of {batch}: {error.group(0)[:300]}", file=sys.stderr)
        elif status != 0 or not done or not summary:
            said = [l.strip() for l in re.split(r"[\r\n]", text) if l.strip() and "rps=" not in l]
            sys.exit(f"redis-benchmark failed ({status}): {said[-1][:300] if said else 'no output'}")
        else:
            total += int(done.group(1))
            p50s.append(float(summary.group(3)))
            p99s.append(float(summary.group(5)))
            dists.append(sorted((float(l), int(c)) for l, c in
                                re.findall(r"[\d.]+% <= ([\d.]+) milliseconds \(cumulative count (\d+)\)", text)))
            rate = int(done.group(1)) / max(float(done.group(2)), 0.001)
            completed = True
        elapsed = time.monotonic() - start
        if VERBOSE and completed:
            print(f"run of {batch}: {done.group(1)} in {done.group(2)} s, {elapsed:.2f} s elapsed", file=sys.stderr)
        left = seconds - elapsed
        if left <= 0.05:
            break
        if completed:
            batch = max(clients, int(rate * min(1.0, left)))
    wall = time.monotonic() - start

    def merged(p, own):
        if not own:
            return float("nan")
        if len(dists) == 1:
            return own[0]
        points = sorted({l for d in dists for l, _ in d})
        for lat in points:
            at_or_below = sum(max([c for l, c in d if l <= lat], default=0) for d in dists)
            if at_or_below >= p * total:
                return max(min(own), min(lat, max(own)))
        return max(own)

    def ms(value):
        return "-" if value != value else f"{value:.3f}"  # NaN: no run completed

    print(f"{total / wall:.0f} {ms(merged(0.5, p50s))} {ms(merged(0.99, p99s))} {total} {wall:.2f} {error_runs}")


# --- correctness ----------------------------------------------------------------------------

def encode(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def read_line(f):
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed")
    return line[:-2]


def check(port, n, replies=2000, tags=200, connections=4):
    """REPLIES INCRs over TAGS tags (a random sample, or all of them when there are fewer) from
    CONNECTIONS connections at once."""
    sample = random.sample(range(n), min(n, tags))
    per = replies // connections
    lock = threading.Lock()
    seen = {}  # (tag, id) -> connection
    failures = []
    counts = {"replies": 0, "errors": 0, "repeats": 0}

    def client(index):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            f = sock.makefile("rb")
            last = {}
            rng = random.Random()
            for _ in range(per):
                tag = tag_name(rng.choice(sample))
                sock.sendall(encode("INCR", "segment:" + tag))
                reply = read_line(f)
                with lock:
                    counts["replies"] += 1
                    if not reply.startswith(b":"):
                        counts["errors"] += 1
                        if len(failures) < 5:
                            failures.append(f"{tag}: {reply[:200].decode(errors='replace')}")
                        continue
                    value = int(reply[1:])
                    if (tag, value) in seen:
                        counts["repeats"] += 1
                        if len(failures) < 5:
                            failures.append(f"{tag}: ID {value} twice (connections {seen[(tag, value)]} and {index})")
                    seen[(tag, value)] = index
                    if tag in last and value <= last[tag]:
                        failures.append(f"{tag}: ID {value} after {last[tag]} on one connection")
                    last[tag] = value
            sock.close()
        except OSError as e:
            with lock:
                failures.append(f"connection {index}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{counts['replies']} {counts['errors']} {counts['repeats']}")
    if failures or counts["replies"] != per * connections:
        for line in failures[:10]:
            print(line, file=sys.stderr)
        sys.exit(1)


def info(dialect, base):
    """The server's version and the settings that decide what a durable commit costs."""
    conn = connect(dialect, base, database="", autocommit=True)
    cur = conn.cursor()
    if dialect == "mysql":
        cur.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin")
        v, flush, sync_binlog, log_bin = cur.fetchone()
        name = re.sub(r"^([0-9.]+)-MariaDB.*", r"MariaDB \1", v)
        print(f"{name if name != v else 'MySQL ' + v}: innodb_flush_log_at_trx_commit={flush}, "
              f"sync_binlog={sync_binlog}, log_bin={log_bin}")
    else:
        settings = []
        for key in ("server_version", "synchronous_commit", "fsync", "commit_delay"):
            cur.execute(f"SHOW {key}")
            settings.append(cur.fetchone()[0])
        print(f"PostgreSQL {settings[0].split()[0]}: synchronous_commit={settings[1]}, "
              f"fsync={settings[2]}, commit_delay={settings[3]}")
    conn.close()


def main(argv):
    # stopped by bench/tags.sh: exit normally, so that subprocess.run kills its redis-benchmark
    # and multiprocessing its daemon clients
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not argv:
        sys.exit(__doc__)
    cmd, args = argv[0], argv[1:]
    if cmd == "create":
        create(*args)
    elif cmd == "drop":
        drop(*args)
    elif cmd == "fill":
        fill(args[0], args[1], int(args[2]), *(int(a) for a in args[3:]))
    elif cmd == "load":
        load(int(args[0]), int(args[1]), int(args[2]), float(args[3]))
    elif cmd == "direct":
        direct(args[0], args[1], int(args[2]), int(args[3]), float(args[4]))
    elif cmd == "info":
        info(*args)
    elif cmd == "check":
        check(int(args[0]), *(int(a) for a in args[1:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
