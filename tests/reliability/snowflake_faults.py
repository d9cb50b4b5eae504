"""Snowflake fault injection on the real binary: every ID from every node of every case is
collected and checked for global uniqueness. Cases:
  static-back-1s       SIGKILL under load, restart with the clock 1 s back (libfaketime)
  static-same-start    restart at the wall-clock time the previous run started
  static-back-60s      restart 60 s back: must refuse to start, naming the gap
  zk-kill-back-1s      ZooKeeper mode, 4 x SIGKILL at random moments of the report cycle,
                       each restart with the clock 1 s back
  zk-shared-identity   two nodes with one advertised identity, both loaded at once
  zk-sigstop           SIGSTOP a node past its lease, a node with its identity takes the id,
                       SIGCONT: the resumed node must issue nothing
  db-*                 the database coordinator on one SQLite file: SIGKILL + restart 1 s back,
                       two nodes from one config, SIGSTOP past the lease with one worker id
Loopback only; bounded (about 90 s); prints the IDs checked per case.

usage: snowflake_faults.py LEAFD_BIN ZOOKEEPER_CONNECT [CASE_GROUP...]
"""
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

binary, zk_connect = os.path.abspath(sys.argv[1]), sys.argv[2]
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
BATCH = b"*2\r\n$9\r\nSNOWFLAKE\r\n$3\r\n200\r\n"
all_ids = {}  # id -> case that issued it
random.seed(int(os.environ.get("FAULTS_SEED", time.time())))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timestamp_of(snowflake_id):
    return (snowflake_id >> 22) + 1288834974657


def worker_of(snowflake_id):
    return (snowflake_id >> 12) & 0x3FF


class Node:
    """One leafd process with its own config; `faketime` is a libfaketime FAKETIME value."""

    def __init__(self, workdir, name, coordinator="static", advertise=None, cluster=None,
                 faketime=None, extra="", storage=None):
        self.workdir, self.name = workdir, name
        self.port = free_port()
        os.makedirs(f"{workdir}/{name}", exist_ok=True)
        zk = ""
        if coordinator == "zookeeper":
            zk = f"""
[snowflake.zookeeper]
connect = "{zk_connect}"
cluster = "{cluster}"
session_timeout_ms = 2000
report_interval_ms = 500
lease_ms = 2000
cache_file = "{workdir}/{name}/worker.json"
{f'advertise = "{advertise}"' if advertise else ''}
"""
        with open(f"{workdir}/{name}/leafd.toml", "w") as f:
            f.write(f"""
[server]
bind = "127.0.0.1:{self.port}"
[http]
enabled = false
[storage]
url = "{storage or f'sqlite://{workdir}/{name}/leafd.db'}"
state_dir = "{workdir}/{name}"
[snowflake]
coordinator = "{coordinator}"
fence_file = "{workdir}/{name}/fence.json"
max_start_wait_ms = 10000
{extra}
{zk}""")
        env = {**os.environ, "NO_COLOR": "1", "RUST_LOG": "info"}
        if faketime:
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=faketime, FAKETIME_DONT_FAKE_MONOTONIC="1",
                       FAKETIME_NO_CACHE="1")
        self.log = open(f"{workdir}/{name}/leafd.log", "ab")
        self.process = subprocess.Popen([binary, "--config", f"{workdir}/{name}/leafd.toml"],
                                        cwd=f"{workdir}/{name}", stdout=self.log, stderr=subprocess.STDOUT,
                                        env=env)

    def wait_ready(self, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                # The listener may accept before the worker id is held: wait for a reply.
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.settimeout(max(0.1, deadline - time.time()))
                    s.sendall(b"*1\r\n$4\r\nPING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return True
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"{self.name}: did not start in {seconds} s")

    def log_text(self):
        with open(f"{self.workdir}/{self.name}/leafd.log", "rb") as f:
            return f.read().decode(errors="replace")

    def kill(self, sig=signal.SIGKILL):
        self.process.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.process.wait()


class Loader(threading.Thread):
    """Pipelined `SNOWFLAKE 200` x 5 on one connection until stopped or the server dies."""

    def __init__(self, node):
        super().__init__(daemon=True)
        self.node, self.ids, self.errors = node, [], []
        self.stop = threading.Event()
        self.after_mark = None  # index into ids when mark() was called
        self.errors_after_mark = 0
        self.start()

    def mark(self):
        self.after_mark = len(self.ids)
        self.errors_after_mark = len(self.errors)

    def run(self):
        try:
            with socket.create_connection(("127.0.0.1", self.node.port), timeout=30) as s:
                reader = s.makefile("rb")
                while not self.stop.is_set():
                    s.sendall(BATCH * 5)
                    for _ in range(5):
                        line = reader.readline()
                        if not line:
                            return
                        if line.startswith(b"*"):
                            for _ in range(int(line[1:])):
                                self.ids.append(int(reader.readline()[1:]))
                        elif line.startswith(b"-"):
                            self.errors.append(line.decode().strip())
                            time.sleep(0.01)
                        else:
                            raise SystemExit(f"unexpected reply {line!r}")
        except (OSError, ValueError):
            return

    def finish(self):
        self.stop.set()
        self.join(40)
        return self.ids


def record(case, ids):
    """Adds a case's IDs to the global set; any repeat (within or across cases) fails."""
    repeated = 0
    for i in ids:
        if i <= 0:
            raise SystemExit(f"{case}: non-positive ID {i}")
        if i in all_ids:
            repeated += 1
            if repeated <= 3:
                print(f"{case}: ID {i} repeated (first issued in {all_ids[i]})")
        all_ids[i] = case
    if repeated:
        raise SystemExit(f"{case}: {repeated} repeated IDs")
    return len(ids)


def load(node, seconds):
    loader = Loader(node)
    time.sleep(seconds)
    return loader


def static_cases(work):
    # Run 1 at the real time, killed under load.
    first_start = time.time()
    node = Node(work, "static")
    assert node.wait_ready()
    loader = load(node, 2.0)
    node.kill()
    n = record("static-run-1", loader.finish())

    # Restart 1 s back: behind the fence by about 4 s, waited out, then serves.
    node = Node(work, "static", faketime="-1")
    assert node.wait_ready(), node.log_text()
    loader = load(node, 2.0)
    node.kill()
    ids = loader.finish()
    if not ids:
        raise SystemExit("static-back-1s: no IDs after the restart\n" + node.log_text()[-2000:])
    n += record("static-back-1s", ids)
    print(f"static-back-1s: {n} IDs checked, no repeat")

    # Restart at the wall-clock time the first run started.
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(first_start))
    node = Node(work, "static", faketime=f"@{start}", extra="")
    os.environ.pop("TZ", None)
    ok = node.wait_ready()
    if ok:
        loader = load(node, 1.5)
        node.kill()
        m = record("static-same-start", loader.finish())
        print(f"static-same-start: {m} IDs checked after waiting out the fence, no repeat")
    else:
        text = node.log_text()
        if "behind" not in text:
            raise SystemExit("static-same-start: exited without naming the gap\n" + text[-2000:])
        print("static-same-start: refused to start, naming the gap")

    # 60 s back: refused with one line naming the gap.
    node = Node(work, "static", faketime="-60")
    ready = node.wait_ready(20)
    if ready:
        node.kill()
        raise SystemExit("static-back-60s: started with its clock 60 s behind its fence")
    text = node.log_text()
    if "ms behind" not in text or node.process.returncode == 0:
        raise SystemExit("static-back-60s: no clear refusal\n" + text[-2000:])
    line = [l for l in text.splitlines() if "ms behind" in l][-1]
    print("static-back-60s: refused to start: " + line[line.index("clock is"):])


def zk_kill_cases(work):
    cluster = f"faults-{os.getpid()}-{random.randrange(1 << 30)}"
    total = 0
    faketime = None
    for cycle in range(4):
        node = Node(work, "zk", coordinator="zookeeper", advertise="10.99.0.1:6380", cluster=cluster,
                    faketime=faketime)
        assert node.wait_ready(40), node.log_text()[-2000:]
        # A random moment of the 500 ms report cycle, and of the 2 s lease.
        loader = load(node, random.uniform(0.7, 2.7))
        node.kill()
        ids = loader.finish()
        if not ids:
            raise SystemExit(f"zk-kill-back-1s cycle {cycle}: no IDs\n" + node.log_text()[-2000:])
        total += record(f"zk-kill-back-1s cycle {cycle}", ids)
        faketime = "-1"  # every restart 1 s behind the real clock
    print(f"zk-kill-back-1s: {total} IDs checked over 4 SIGKILL restarts with the clock 1 s back, no repeat")


def zk_shared_identity(work):
    cluster = f"shared-{os.getpid()}-{random.randrange(1 << 30)}"
    a = Node(work, "shared-a", coordinator="zookeeper", advertise="10.99.0.2:6380", cluster=cluster)
    assert a.wait_ready(40), a.log_text()[-2000:]
    b = Node(work, "shared-b", coordinator="zookeeper", advertise="10.99.0.2:6380", cluster=cluster)
    assert b.wait_ready(40), b.log_text()[-2000:]
    la, lb = Loader(a), Loader(b)
    time.sleep(2.0)
    ia, ib = la.finish(), lb.finish()
    a.kill(signal.SIGTERM)
    b.kill(signal.SIGTERM)
    if not ia or not ib:
        raise SystemExit("zk-shared-identity: a node served nothing")
    wa, wb = {worker_of(i) for i in ia}, {worker_of(i) for i in ib}
    if wa & wb:
        raise SystemExit(f"zk-shared-identity: both nodes used worker id {wa & wb}")
    n = record("zk-shared-identity a", ia) + record("zk-shared-identity b", ib)
    print(f"zk-shared-identity: {n} IDs checked, worker ids {sorted(wa)} and {sorted(wb)}, no repeat")


def zk_sigstop(work):
    cluster = f"stop-{os.getpid()}-{random.randrange(1 << 30)}"
    a = Node(work, "stop-a", coordinator="zookeeper", advertise="10.99.0.3:6380", cluster=cluster)
    assert a.wait_ready(40), a.log_text()[-2000:]
    la = Loader(a)
    time.sleep(1.0)
    a.kill(signal.SIGSTOP)
    stopped_ms = int(time.time() * 1000)
    la.mark()
    # Past the session timeout (2 s) and the lease (2 s): the id is free for a node with
    # the same identity, which starts past a's fence.
    time.sleep(4.5)
    b = Node(work, "stop-b", coordinator="zookeeper", advertise="10.99.0.3:6380", cluster=cluster)
    assert b.wait_ready(40), b.log_text()[-2000:]
    lb = Loader(b)
    time.sleep(1.0)
    a.kill(signal.SIGCONT)
    time.sleep(2.5)
    ib = lb.finish()
    ia = la.finish()
    b.kill(signal.SIGTERM)
    a.kill(signal.SIGTERM)
    # Replies written before SIGSTOP may be read after it: judge by the IDs' own timestamps.
    resumed = [i for i in ia if timestamp_of(i) > stopped_ms + 100]
    if resumed:
        raise SystemExit(f"zk-sigstop: the resumed node issued {len(resumed)} IDs after SIGCONT")
    if not ib:
        raise SystemExit("zk-sigstop: the node that took over served nothing\n" + b.log_text()[-2000:])
    errors = la.errors[la.errors_after_mark:]
    if not errors or not all(e.startswith("-UNAVAILABLE") for e in errors):
        raise SystemExit(f"zk-sigstop: the resumed node should answer UNAVAILABLE, got {errors[:3]}")
    same = {worker_of(i) for i in ia} & {worker_of(i) for i in ib}
    n = record("zk-sigstop a", ia) + record("zk-sigstop b", ib)
    print(f"zk-sigstop: {n} IDs checked (worker id shared after takeover: {sorted(same)}), "
          f"resumed node issued 0 and answered {len(errors)} x UNAVAILABLE, no repeat")


DB_ONE_ID = "database_lease_ms = 2000\nworker_id_bits = 0\ntimestamp_bits = 51"


def db_cases(work):
    """The database coordinator on one shared SQLite file."""
    shared = f"sqlite://{work}/shared-db/leafd.db"
    os.makedirs(f"{work}/shared-db", exist_ok=True)
    # SIGKILL under load and restart 1 s back, 3 times (each restart finds its old lease live and
    # takes another id, or its old one once expired).
    total, faketime = 0, None
    for cycle in range(3):
        node = Node(work, "db", coordinator="database", storage=shared, faketime=faketime,
                    extra="database_lease_ms = 2000")
        assert node.wait_ready(40), node.log_text()[-2000:]
        loader = load(node, random.uniform(0.7, 2.0))
        node.kill()
        ids = loader.finish()
        if not ids:
            raise SystemExit(f"db-kill-back-1s cycle {cycle}: no IDs\n" + node.log_text()[-2000:])
        total += record(f"db-kill-back-1s cycle {cycle}", ids)
        faketime = "-1"
    print(f"db-kill-back-1s: {total} IDs checked over 3 SIGKILL restarts with the clock 1 s back, no repeat")

    # Two nodes from one config (same state directory, same database), loaded at once.
    a = Node(work, "db-twin", coordinator="database", storage=shared, extra="database_lease_ms = 2000")
    assert a.wait_ready(40), a.log_text()[-2000:]
    b_port = free_port()
    with open(f"{work}/db-twin/leafd.toml") as f:
        config = f.read().replace(f"127.0.0.1:{a.port}", f"127.0.0.1:{b_port}")
    with open(f"{work}/db-twin/leafd-b.toml", "w") as f:
        f.write(config)
    b = Node.__new__(Node)
    b.workdir, b.name, b.port = work, "db-twin", b_port
    b.log = open(f"{work}/db-twin/leafd-b.log", "ab")
    b.process = subprocess.Popen([binary, "--config", f"{work}/db-twin/leafd-b.toml"], cwd=f"{work}/db-twin",
                                 stdout=b.log, stderr=subprocess.STDOUT)
    assert b.wait_ready(40)
    la, lb = Loader(a), Loader(b)
    time.sleep(1.5)
    ia, ib = la.finish(), lb.finish()
    a.kill(signal.SIGTERM)
    b.kill(signal.SIGTERM)
    wa, wb = {worker_of(i) for i in ia}, {worker_of(i) for i in ib}
    if not ia or not ib or wa & wb:
        raise SystemExit(f"db-one-config: worker ids {wa} and {wb}")
    n = record("db-one-config a", ia) + record("db-one-config b", ib)
    print(f"db-one-config: {n} IDs checked, worker ids {sorted(wa)} and {sorted(wb)}, no repeat")

    # One worker id only: SIGSTOP past the lease, another node takes the id, SIGCONT.
    one = f"sqlite://{work}/one-id/leafd.db"
    os.makedirs(f"{work}/one-id", exist_ok=True)
    a = Node(work, "db-stop-a", coordinator="database", storage=one, extra=DB_ONE_ID)
    assert a.wait_ready(40), a.log_text()[-2000:]
    la = Loader(a)
    time.sleep(1.0)
    a.kill(signal.SIGSTOP)
    stopped_ms = int(time.time() * 1000)
    time.sleep(3.0)  # the 2-s lease expires in the database
    b = Node(work, "db-stop-b", coordinator="database", storage=one, extra=DB_ONE_ID)
    assert b.wait_ready(40), b.log_text()[-2000:]
    lb = Loader(b)
    time.sleep(1.0)
    a.kill(signal.SIGCONT)
    time.sleep(2.0)
    ib, ia = lb.finish(), la.finish()
    b.kill(signal.SIGTERM)
    a.kill(signal.SIGTERM)
    # Worker id bits 0: the timestamp starts at bit 12.
    resumed = [i for i in ia if (i >> 12) + 1288834974657 > stopped_ms + 100]
    if resumed or not ib:
        raise SystemExit(f"db-sigstop: resumed node issued {len(resumed)} IDs, the new holder {len(ib)}")
    n = record("db-sigstop a", ia) + record("db-sigstop b", ib)
    print(f"db-sigstop: {n} IDs checked, one worker id, the resumed node issued 0 after SIGCONT, no repeat")


def main():
    if not os.path.exists(FAKETIME_LIB):
        raise SystemExit(f"{FAKETIME_LIB} missing (Debian: faketime)")
    work = tempfile.mkdtemp()
    started = time.time()
    only = sys.argv[3:]  # optional case groups: static zk-kill zk-shared zk-sigstop
    for name, case in [("static", static_cases), ("zk-kill", zk_kill_cases),
                       ("zk-shared", zk_shared_identity), ("zk-sigstop", zk_sigstop), ("db", db_cases)]:
        if not only or name in only:
            case(work)
    print(f"snowflake faults: {len(all_ids)} IDs checked in all, none repeated, {time.time() - started:.0f} s")


main()
