"""Full disks and lost commits under load. Every ID every node hands out is collected and checked:
no segment ID twice (across all nodes and connections), none above the tag's max_id in the
database after the run (a node owns (max_id - step, max_id] only once that allocation is
committed), each connection's segment IDs strictly increasing (INCR and INCRBY mixed), no
snowflake ID twice, and the nodes serving again at the end of the run. Error replies are allowed
and counted by their first word.

Scenarios:
  state-dir            one node, SQLite on the normal disk, its state_dir (segment marks,
                       snowflake fence) on an 8 MB tmpfs that is filled to 100% under load
  shared-sqlite        two nodes on one SQLite file on an 8 MB tmpfs filled to 100% under load
                       (each node's state_dir on the normal disk)
  mysql-commit-kill    (with --mysql) two nodes on a fresh database; node A reaches it through a
  postgres-commit-kill (with --postgres) proxy that kills the connection at ~40% of the COMMITs:
                       half before forwarding the COMMIT (rolled back), half after it (committed,
                       reply lost)
Load on each node: 6 connections of pipelined INCR, one of INCR with an occasional INCRBY of
2500 (above the step of 1000), one of SNOWFLAKE, 10 commands per batch. The tmpfs scenarios run
3 s, fill the tmpfs, hold it full 7 s (taking back any page freed), free it and run 7 s more (the
segment load back-off reaches 5 s, so the nodes must have had the chance to retry before the
last 2 s, in which both must serve again). Mounting needs root: without it the tmpfs scenarios
print SKIPPED. Loopback only, about a minute in all. Each SQL run creates and drops its own
database (mysql / psql command-line clients).

usage: full_disk.py LEAFD_BIN [--mysql mysql://root@127.0.0.1:3306]
                              [--postgres postgres://postgres@127.0.0.1:5432] [--only SCENARIO]...
Seed: FULL_DISK_SEED (printed).
"""
import argparse
import collections
import contextlib
import errno
import os
import random
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

TAG = "fulldisk"
STEP = 1000
# A fixed step, so loads (and commits) keep coming every few hundred IDs all run long.
NODE_CONFIG = {"segment": {"adaptive_step": False}}
TMPFS_SIZE = "8m"
BEFORE_FILL, FULL_FOR, AFTER_FREE = 3.0, 7.0, 7.0
SQL_LOAD_SECONDS = 8.0
KILL_RATIO = 0.4
LAST_WINDOW = 2.0


class Skip(Exception):
    pass


# --- tmpfs and filling it -----------------------------------------------------------------------

def mount_tmpfs(path):
    os.makedirs(path, exist_ok=True)
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", path],
                                capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Skip(f"cannot run mount: {e}")
    if result.returncode != 0:
        reason = result.stderr.strip() or f"mount exited with status {result.returncode}"
        raise Skip(f"cannot mount a tmpfs (needs root): {reason}")


def unmount(path):
    if subprocess.run(["umount", path], capture_output=True, timeout=20).returncode != 0:
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=20)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class DiskFiller:
    """Fills a file system to 100% with a file of zeros, then keeps it full: a thread takes back
    every page freed (by leafd truncating or deleting a file) every couple of milliseconds,
    as another busy writer of the disk would."""

    def __init__(self, mountpoint):
        self.path = os.path.join(mountpoint, "filler")
        self.fd = None
        self.written = 0
        self.stop = threading.Event()
        self.thread = None

    def _write_until_full(self, chunk):
        while True:
            try:
                n = os.write(self.fd, chunk)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    return
                raise
            self.written += n
            if n < len(chunk):
                chunk = chunk[n:]

    def fill(self):
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._write_until_full(bytes(1 << 20))
        self._write_until_full(bytes(4096))
        self._write_until_full(bytes(1))
        self.thread = threading.Thread(target=self._keep_full, daemon=True)
        self.thread.start()

    def _keep_full(self):
        page = bytes(4096)
        while not self.stop.wait(0.002):
            try:
                self._write_until_full(page)
            except OSError:
                return

    def free(self):
        self.stop.set()
        if self.thread:
            self.thread.join(5)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# --- a proxy that kills connections at COMMIT ---------------------------------------------------

class _CommitConnection(leafd.ProxiedConnection):
    def __init__(self, proxy, client, server):
        super().__init__(proxy, client, server)
        self.swallow = False  # set before an "after" COMMIT is forwarded: its reply is dropped
        self.reply_seen = threading.Event()


class CommitKillProxy(leafd.TcpProxy):
    """TCP proxy on 127.0.0.1 to a database. Once armed, each client->server chunk holding a
    COMMIT (sqlx sends it as a text query: MySQL COM_QUERY, PostgreSQL simple Query) is, at
    random, passed on (1 - ratio), or the connection is killed on both sides (ratio): half of
    those "before" (the COMMIT is not forwarded: the server rolls the transaction back), half
    "after" (the COMMIT is forwarded, the server's reply swallowed, then the kill)."""

    PATTERNS = {
        "mysql": b"\x07\x00\x00\x00\x03COMMIT",         # length 7, sequence 0, COM_QUERY
        "postgres": b"Q\x00\x00\x00\x0bCOMMIT\x00",       # Query, length 11
    }
    connection_class = _CommitConnection

    def __init__(self, dialect, target_host, target_port, ratio, rng):
        self.pattern = self.PATTERNS[dialect]
        self.ratio, self.rng = ratio, rng
        self.killed = {"before": 0, "after": 0}
        self.after_without_reply = 0
        self.commits = 0  # seen while armed
        self.armed = threading.Event()
        super().__init__((target_host, target_port), name="commit-kill")

    def decide(self):
        with self.lock:
            self.commits += 1
            r = self.rng.random()
        if r < self.ratio / 2:
            return "before"
        if r < self.ratio:
            return "after"
        return None

    def count(self, mode, got_reply=True):
        with self.lock:
            self.killed[mode] += 1
            if not got_reply:
                self.after_without_reply += 1

    def from_client(self, conn, data):
        if self.armed.is_set() and self.pattern in data:
            mode = self.decide()
            if mode == "before":
                self.count("before")
                return False
            if mode == "after":
                conn.swallow = True
                conn.to_server(data)
                got_reply = conn.reply_seen.wait(2)
                self.count("after", got_reply)
                return False
        conn.to_server(data)
        return True

    def from_server(self, conn, data):
        if conn.swallow:
            conn.reply_seen.set()
            return True
        conn.to_client(data)
        return True


# --- SQL databases through their command-line clients -------------------------------------------

class SqlDatabase:
    """A fresh, uniquely named database on a MariaDB/MySQL or PostgreSQL server."""

    def __init__(self, dialect, base_url):
        self.dialect = dialect
        self.base = base_url.rstrip("/")
        parts = urllib.parse.urlsplit(self.base)
        if parts.path not in ("", "/"):
            raise SystemExit(f"--{dialect}: give the URL without a database name: {base_url}")
        self.parts = parts
        self.user = urllib.parse.unquote(parts.username or ("root" if dialect == "mysql" else "postgres"))
        self.password = urllib.parse.unquote(parts.password) if parts.password else None
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (3306 if dialect == "mysql" else 5432)
        self.name = f"leafd_fulldisk_{os.getpid()}_{secrets.token_hex(3)}"
        self.created = False

    def url(self, port=None, plain=False):
        """leafd's storage URL of the database, optionally through 127.0.0.1:port and without TLS
        (the proxy must see the protocol's bytes)."""
        netloc = self.parts.netloc
        if port is not None:
            userinfo = netloc.rpartition("@")[0]
            netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        url = f"{self.parts.scheme}://{netloc}/{self.name}"
        if plain:
            url += "?ssl-mode=disabled" if self.dialect == "mysql" else "?sslmode=disable"
        return url

    def run(self, sql, database=None):
        env = dict(os.environ)
        if self.dialect == "mysql":
            cmd = ["mysql", "-u", self.user, "-h", self.host, "-P", str(self.port), "-N", "-B", "-e", sql]
            if database:
                cmd.append(database)
            if self.password:
                env["MYSQL_PWD"] = self.password
        else:
            cmd = ["psql", "-h", self.host, "-p", str(self.port), "-U", self.user, "-d", database or "postgres",
                   "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]
            env["PGCONNECT_TIMEOUT"] = "10"
            if self.password:
                env["PGPASSWORD"] = self.password
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed on {sql!r}: {result.stderr.strip()}")
        return result.stdout.strip()

    def create(self):
        self.run(f"CREATE DATABASE `{self.name}`" if self.dialect == "mysql" else f'CREATE DATABASE "{self.name}"')
        self.created = True

    def drop(self):
        if self.created:
            self.run(f"DROP DATABASE IF EXISTS `{self.name}`" if self.dialect == "mysql"
                     else f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            self.created = False

    def max_id(self, tag):
        out = self.run(f"SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'", database=self.name)
        return int(out) if out else None


def sqlite_max_id(path, tag):
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as db:
        row = db.execute("SELECT max_id FROM leaf_alloc WHERE biz_tag = ?", (tag,)).fetchone()
    return row[0] if row else None


# --- running and checking -----------------------------------------------------------------------

class Run:
    """The loaders of one scenario and the moments of its phases (time.monotonic())."""

    def __init__(self, nodes, rng):
        self.nodes = nodes
        self.stop = threading.Event()
        self.loaders = [l for node in nodes for l in leafd.standard_load(node, TAG, self.stop, rng=rng)]
        self.full_from = self.full_until = self.end = None

    def __enter__(self):
        for loader in self.loaders:
            loader.start()
        return self

    def __exit__(self, *exc):
        self.end = time.monotonic()
        self.stop.set()
        for loader in self.loaders:
            loader.join(20)
        hung = [l.name for l in self.loaders if l.is_alive()]
        if hung:
            raise RuntimeError(f"load threads did not stop: {hung}")

    def of(self, node):
        return [l for l in self.loaders if l.node is node]


def check(label, run, max_id, failures, extra="", require_recent=None):
    """Prints the scenario's summary and details; returns the list of failures.
    require_recent: the nodes that must have served in the last LAST_WINDOW seconds."""
    report = leafd.IdReport(run.loaders, max_id)
    failures = report.failures() + failures
    print(report.summary(f"full-disk {label}", extra), flush=True)
    recent_from = run.end - LAST_WINDOW
    for node in run.nodes:
        loaders = run.of(node)
        segment = sum(l.segment_count() for l in loaders)
        snowflake = sum(len(l.snowflakes) for l in loaders)
        recent = [sum(x) for x in zip(*(l.served_between(recent_from) for l in loaders))]
        full = ""
        if run.full_from is not None:
            while_full = [sum(x) for x in zip(*(l.served_between(run.full_from, run.full_until) for l in loaders))]
            full = f", while full {while_full[0]} + {while_full[1]}"
        drops = sum(sum(l.drops.values()) for l in loaders)
        blocks = sum(len(l.blocks) for l in loaders)
        print(f"  {node.name}: {segment} segment (in {blocks} INCRBY blocks and single INCRs) + "
              f"{snowflake} snowflake IDs{full}, "
              f"last {LAST_WINDOW:g} s {recent[0]} + {recent[1]}, "
              f"{sum(l.connections for l in loaders)} connections ({drops} lost)", flush=True)
        status = node.died()
        if status is not None:
            failures.append(f"{node.name} exited by itself during the run (status {status})")
        if require_recent is None or node in require_recent:
            if recent[0] == 0:
                failures.append(f"{node.name} served no segment ID in the last {LAST_WINDOW:g} s of the run")
            if recent[1] == 0:
                failures.append(f"{node.name} served no snowflake ID in the last {LAST_WINDOW:g} s of the run")
    print(f"  database max_id {max_id}, highest segment ID served {report.highest}", flush=True)
    for kind, text in sorted(report.error_examples.items()):
        print(f"  error {kind}: {text}", flush=True)
    if report.drop_reasons:
        print(f"  lost connections: {dict(report.drop_reasons.most_common(4))}", flush=True)
    if failures:
        for node in run.nodes:
            print(f"  last log lines of {node.name} ({node.log_path}):\n{node.log_tail(10)}", flush=True)
    return failures


def truncate_wal(path):
    """Checkpoints the SQLite database and truncates its write-ahead log to nothing, so the
    commits that follow must grow the file: once the disk is full they fail. (A log that has
    reached its checkpoint size is rewritten in place, and a full disk would never be felt.)"""
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as db:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        raise RuntimeError(f"could not truncate the write-ahead log of {path}")


def fault_seen(run):
    """A scenario whose full disk failed no write tested nothing: that is a failure too."""
    errors = sum((l.errors for l in run.loaders), collections.Counter())
    if errors["UNAVAILABLE"] == 0:
        return ["the full disk failed no write (no UNAVAILABLE reply): the fault was not exercised"]
    return []


def start_nodes(nodes):
    """One after the other (the first migrates the database), then the tag."""
    for node in nodes:
        node.start().wait_ready()
    nodes[0].create_tag(TAG, STEP)
    for node in nodes[1:]:
        node.create_tag(TAG, STEP)


def run_with_full_disk(nodes, mountpoint, rng, before_fill=None):
    run = Run(nodes, rng)
    filler = DiskFiller(mountpoint)
    try:
        with run:
            time.sleep(BEFORE_FILL)
            if before_fill is not None:
                before_fill()
            before = free_bytes(mountpoint)
            run.full_from = time.monotonic()
            filler.fill()
            left = free_bytes(mountpoint)
            print(f"  filled {mountpoint}: {filler.written / 2**20:.1f} MiB of zeros "
                  f"({before / 2**20:.1f} MiB were free, {left} bytes left)", flush=True)
            time.sleep(FULL_FOR)
            filler.free()
            run.full_until = time.monotonic()
            time.sleep(AFTER_FREE)
    finally:
        filler.free()
    return run


def scenario_state_dir(binary, work, rng):
    state = os.path.join(work, "state-tmpfs")
    mount_tmpfs(state)
    nodes = []
    try:
        node = leafd.Node(binary, work, "node", f"sqlite://{work}/db/leafd.db", state_dir=state,
                          config=NODE_CONFIG)
        nodes.append(node)
        start_nodes(nodes)
        run = run_with_full_disk(nodes, state, rng)
        leafd.stop_all(nodes)
        return check("state-dir", run, sqlite_max_id(f"{work}/db/leafd.db", TAG), fault_seen(run))
    finally:
        for n in nodes:
            n.kill()
        unmount(state)


def scenario_shared_sqlite(binary, work, rng):
    mnt = os.path.join(work, "db-tmpfs")
    mount_tmpfs(mnt)
    nodes = []
    try:
        url = f"sqlite://{mnt}/leafd.db"
        for name in ("a", "b"):
            nodes.append(leafd.Node(binary, work, name, url, state_dir=os.path.join(work, name, "state"),
                                    config=NODE_CONFIG))
        start_nodes(nodes)
        db = f"{mnt}/leafd.db"
        run = run_with_full_disk(nodes, mnt, rng, before_fill=lambda: truncate_wal(db))
        leafd.stop_all(nodes)
        return check("shared-sqlite", run, sqlite_max_id(db, TAG), fault_seen(run))
    finally:
        for n in nodes:
            n.kill()
        unmount(mnt)


def scenario_commit_kill(dialect, base_url, binary, work, rng):
    db = SqlDatabase(dialect, base_url)
    proxy = None
    nodes = []
    try:
        db.create()
        proxy = CommitKillProxy(dialect, db.host, db.port, KILL_RATIO, random.Random(rng.random()))
        # B first and direct (it migrates the fresh database), then A through the proxy.
        b = leafd.Node(binary, work, f"{dialect}-b", db.url(), config=NODE_CONFIG)
        a = leafd.Node(binary, work, f"{dialect}-a", db.url(port=proxy.port, plain=True), config=NODE_CONFIG)
        nodes.extend([b, a])
        start_nodes(nodes)
        proxy.armed.set()  # not before: a start (migration, worker lease) must not be killed
        run = Run([a, b], rng)
        with run:
            time.sleep(SQL_LOAD_SECONDS)
        proxy.armed.clear()
        leafd.stop_all(nodes)
        failures = []
        for mode, killed in proxy.killed.items():
            if killed < 1:
                failures.append(f"no COMMIT was killed {mode} it reached the server "
                                f"({proxy.commits} COMMITs seen by the proxy)")
        if sum(l.segment_count() for l in run.of(a)) == 0:
            failures.append(f"{a.name} (through the proxy) served no segment ID at all")
        extra = (f", killed commits before {proxy.killed['before']} after {proxy.killed['after']} "
                 f"of {proxy.commits}")
        if proxy.after_without_reply:
            extra += f" ({proxy.after_without_reply} 'after' kills saw no reply within 2 s)"
        return check(f"{dialect}-commit-kill", run, db.max_id(TAG), failures, extra, require_recent=[b])
    finally:
        for n in nodes:
            n.kill()
        if proxy:
            proxy.close()
        try:
            db.drop()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print(f"  could not drop database {db.name}: {e}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--mysql", help="e.g. mysql://root@127.0.0.1:3306 (no database name)")
    parser.add_argument("--postgres", help="e.g. postgres://postgres@127.0.0.1:5432 (no database name)")
    parser.add_argument("--only", action="append", default=[],
                        help="run only this scenario (state-dir, shared-sqlite, mysql-commit-kill, "
                             "postgres-commit-kill); repeatable")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    if not leafd.wait_for_file(binary, 60):
        raise SystemExit(f"no leafd binary at {binary}")
    seed = int(os.environ.get("FULL_DISK_SEED", time.time_ns() % 2**32))
    print(f"full-disk: seed {seed} (FULL_DISK_SEED), {binary}", flush=True)
    rng = random.Random(seed)

    scenarios = [("state-dir", lambda work: scenario_state_dir(binary, work, rng)),
                 ("shared-sqlite", lambda work: scenario_shared_sqlite(binary, work, rng))]
    if args.mysql:
        scenarios.append(("mysql-commit-kill",
                          lambda work: scenario_commit_kill("mysql", args.mysql, binary, work, rng)))
    if args.postgres:
        scenarios.append(("postgres-commit-kill",
                          lambda work: scenario_commit_kill("postgres", args.postgres, binary, work, rng)))
    if args.only:
        unknown = set(args.only) - {name for name, _ in scenarios}
        if unknown:
            raise SystemExit(f"unknown or not enabled scenario(s): {sorted(unknown)}")
        scenarios = [s for s in scenarios if s[0] in args.only]

    # SIGTERM (a CI time limit) runs the finally blocks: nodes killed, tmpfs unmounted, databases dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    failed, skipped, keep = [], [], False
    work_root = tempfile.mkdtemp(prefix="leafd-full-disk-")
    try:
        for name, scenario in scenarios:
            work = os.path.join(work_root, name)
            os.makedirs(work)
            started = time.monotonic()
            try:
                failures = scenario(work)
            except Skip as e:
                print(f"SKIPPED {name}: {e}", flush=True)
                skipped.append(name)
                continue
            except (leafd.NodeError, RuntimeError, OSError, subprocess.TimeoutExpired, sqlite3.Error) as e:
                failures = [f"{type(e).__name__}: {e}"]
            if not leafd.print_outcome(name, failures, started):
                keep = True
                failed.append(name)
    finally:
        if keep:
            print(f"full-disk: node logs kept in {work_root}", flush=True)
        else:
            shutil.rmtree(work_root, ignore_errors=True)
    if failed:
        raise SystemExit(f"full-disk: FAILED {', '.join(failed)}")
    ran = len(scenarios) - len(skipped)
    print(f"full-disk: all {ran} scenarios run passed" + (f" ({len(skipped)} skipped)" if skipped else ""),
          flush=True)


if __name__ == "__main__":
    main()
