"""Soak: mixed segment (MariaDB) and snowflake (ZooKeeper) load at a moderate rate for
DURATION seconds while a private MariaDB server and a private ZooKeeper server are really
stopped and started again, periodically. Checks: no duplicate ID, no error other than the
documented UNAVAILABLE window, resident memory flat (within 10% after warm-up), exit code 0.

The script runs its own mariadbd (on a temporary data directory, --skip-grant-tables, loopback
only) and its own ZooKeeper (scripts/zookeeper.sh), so restarting them never disturbs other
tests or the machine's own servers.

usage: soak.py LEAFD_BIN [DURATION=60]
  e.g. soak.py target/release/leafd 600
"""
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

binary = os.path.abspath(sys.argv[1])
duration = int(sys.argv[2]) if len(sys.argv) > 2 else 60
repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Restart schedule (seconds into each period): the database goes down at DB_DOWN and comes
# back at DB_UP of every DB_PERIOD; ZooKeeper likewise.
DB_PERIOD, DB_DOWN, DB_UP = 20, 5, 8
ZK_PERIOD, ZK_DOWN, ZK_UP = 25, 13, 17


class MariaDB:
    """A private mariadbd on 127.0.0.1 that can be stopped (SIGTERM) and started again."""

    def __init__(self, work):
        self.dir = f"{work}/mariadb"
        self.port = leafd.free_port()
        self.proc = None
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={self.dir}",
                        "--user=root", "--skip-test-db", "--auth-root-authentication-method=normal"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self):
        self.proc = subprocess.Popen(
            ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={self.dir}", "--user=root",
             f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.dir}/sock",
             f"--pid-file={self.dir}/pid", "--skip-grant-tables", "--skip-log-bin",
             "--innodb-buffer-pool-size=32M", f"--log-error={self.dir}/error.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        leafd.wait_for_port(self.port, 60)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)

    def sql(self, statement):
        subprocess.run(["mysql", "-uroot", "-h127.0.0.1", f"-P{self.port}", "-e", statement],
                       check=True)


class ZooKeeper:
    """A private ZooKeeper (scripts/zookeeper.sh) restarted on the same port and data."""

    def __init__(self, work):
        self.dir = f"{work}/zookeeper"
        self.port = None

    def start(self):
        out = subprocess.run([f"{repo}/scripts/zookeeper.sh", "start", self.dir]
                             + ([str(self.port)] if self.port else []),
                             check=True, capture_output=True, text=True).stdout.strip()
        self.port = int(out.rsplit(":", 1)[1])

    def stop(self):
        subprocess.run([f"{repo}/scripts/zookeeper.sh", "stop", self.dir], check=True)


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    work = tempfile.mkdtemp()
    db, zk = MariaDB(work), ZooKeeper(work)
    db.start()
    zk.start()
    try:
        run(work, db, zk)
    finally:
        for server in (db, zk):
            try:
                server.stop()
            except Exception:
                pass
        shutil.rmtree(work, ignore_errors=True)


def run(work, db, zk):
    db.sql("CREATE DATABASE soak")
    node = leafd.Node(binary, work, "leafd", f"mysql://root@127.0.0.1:{db.port}/soak", config={
        "storage": {"acquire_timeout_ms": 500},
        "segment": {"load_timeout_ms": 500},
        "segment.tags": [{"tag": "soak", "step": 200}],
        "snowflake": {"coordinator": "zookeeper"},
        "snowflake.zookeeper": {"connect": f"127.0.0.1:{zk.port}", "cluster": "soak",
                                "cache_file": f"{work}/worker.json", "session_timeout_ms": 4000,
                                "lease_ms": 20000},
    })
    try:
        node.start().wait_ready(30)
    except leafd.NodeError as e:
        raise SystemExit(str(e))
    stop = threading.Event()
    errors, unavailable, unavailable_kinds = [], [0], set()
    lock = threading.Lock()

    def on_error(reply):
        line = "-" + reply
        with lock:
            if line.startswith("-UNAVAILABLE"):
                unavailable[0] += 1
                unavailable_kinds.add(line.split(":")[0])
            else:
                errors.append(line)

    def client(n):
        """INCR segment:soak (n even) or SNOWFLAKE, 5 a batch, 5 ms apart, no reply timeout."""
        kind = leafd.INCR if n % 2 == 0 else leafd.SNOWFLAKE
        return leafd.Loader(node, f"client-{n}", "soak", lambda: [(kind, 1)] * 5, stop, timeout=None,
                            pause=0.005, pause_after_error=0, on_error=on_error)

    loaders = [client(n) for n in range(8)]
    for loader in loaders:
        loader.start()
    started = time.time()
    samples = []
    db_restarts = zk_restarts = 0
    db_up = zk_up = True
    while time.time() - started < duration:
        second = int(time.time() - started)
        if second % DB_PERIOD == DB_DOWN and db_up:
            db.stop(); db_up = False
        elif second % DB_PERIOD == DB_UP and not db_up:
            db.start(); db_up = True; db_restarts += 1
        if second % ZK_PERIOD == ZK_DOWN and zk_up:
            zk.stop(); zk_up = False
        elif second % ZK_PERIOD == ZK_UP and not zk_up:
            zk.start(); zk_up = True; zk_restarts += 1
        if second % 5 == 0 and (not samples or samples[-1][0] != second):
            samples.append((second, rss_mb(node.process.pid)))
        time.sleep(0.2)
    if not db_up:
        db.start(); db_restarts += 1
    if not zk_up:
        zk.start(); zk_restarts += 1
    stop.set()
    for loader in loaders:
        loader.join(30)
    # A client still waiting for a reply, replies of another type, lost connections are errors too.
    errors.extend(f"{loader.name} still waiting for a reply" for loader in loaders if loader.is_alive())
    node.terminate()
    code = node.wait(30)

    for loader in loaders:
        errors.extend(loader.unexpected)
        errors.extend(f"connection lost: {reason}" for reason in loader.drops)
    ids = [i for loader in loaders for i in itertools.chain(loader.singles, loader.snowflakes)]
    events = [line.strip() for line in node.log_text().splitlines() if " WARN " in line or " ERROR " in line]
    print("\n".join(line[:220] for line in events[:10]))
    after_warmup = [mb for second, mb in samples if second >= min(20, duration // 3)]
    peak, base = max(after_warmup), after_warmup[0]
    print(f"soak {duration}s: {len(ids)} IDs checked, {unavailable[0]} UNAVAILABLE replies, "
          f"({', '.join(sorted(unavailable_kinds)) or 'none'}), {db_restarts} MariaDB restarts, {zk_restarts} ZooKeeper restarts, "
          f"RSS {base:.1f} -> peak {peak:.1f} MB, exit {code}")
    assert not errors, f"unexpected replies: {errors[:5]}"
    assert len(set(ids)) == len(ids), "duplicate IDs"
    assert peak <= base * 1.10 + 1.0, f"RSS grew from {base:.1f} to {peak:.1f} MB"
    assert code == 0, f"leafd exit status {code}"


main()
