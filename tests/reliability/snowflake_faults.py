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
  etcd-*               the same three cases with the etcd coordinator (LEAFD_TEST_ETCD, a
                       private etcd: scripts/etcd.sh)
Loopback only; bounded (about 90 s); prints the IDs checked per case. FAULTS_LAYOUT=js-safe runs
every case with the JavaScript-safe layout (41 + 4 + 8 bits in 10 ms steps): then every ID must
also be at most 2^53 - 1.

usage: [FAULTS_LAYOUT=default|js-safe] snowflake_faults.py LEAFD_BIN ZOOKEEPER_CONNECT [CASE_GROUP...]
"""
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

binary, zk_connect = os.path.abspath(sys.argv[1]), sys.argv[2]
etcd_url = os.environ.get("LEAFD_TEST_ETCD", "")
etcd_cluster = f"faults-{os.getpid()}"
all_ids = {}  # id -> case that issued it
random.seed(int(os.environ.get("FAULTS_SEED", time.time())))


LAYOUTS = {
    "default": {"timestamp_bits": 41, "worker_id_bits": 10, "sequence_bits": 12, "time_unit_ms": 1},
    "js-safe": {"timestamp_bits": 41, "worker_id_bits": 4, "sequence_bits": 8, "time_unit_ms": 10},
}
LAYOUT_NAME = os.environ.get("FAULTS_LAYOUT", "default")
LAYOUT = LAYOUTS[LAYOUT_NAME]
EPOCH_MS = 1288834974657
SEQUENCE_BITS, WORKER_BITS, UNIT_MS = LAYOUT["sequence_bits"], LAYOUT["worker_id_bits"], LAYOUT["time_unit_ms"]
MAX_ID = (1 << (LAYOUT["timestamp_bits"] + WORKER_BITS + SEQUENCE_BITS)) - 1
# One worker id only (worker_id_bits 0), the same total of bits.
DB_ONE_ID = {"database_lease_ms": 2000, "worker_id_bits": 0, "timestamp_bits": LAYOUT["timestamp_bits"] + WORKER_BITS}


def timestamp_of(snowflake_id, worker_bits=WORKER_BITS):
    """The first millisecond of the ID's time step."""
    return (snowflake_id >> (worker_bits + SEQUENCE_BITS)) * UNIT_MS + EPOCH_MS


def worker_of(snowflake_id):
    return (snowflake_id >> SEQUENCE_BITS) & ((1 << WORKER_BITS) - 1)


def start_node(workdir, name, coordinator="static", advertise=None, cluster=None, faketime=None, extra=None,
               storage=None):
    """One leafd process with its own config (HTTP off), started; `faketime` is a libfaketime
    FAKETIME value; `extra` more [snowflake] keys."""
    config = {"http": {"enabled": False},
              "snowflake": {"coordinator": coordinator, "fence_file": f"{workdir}/{name}/fence.json",
                            "max_start_wait_ms": 10000, **LAYOUT, **(extra or {})}}
    if coordinator == "zookeeper":
        config["snowflake.zookeeper"] = {"connect": zk_connect, "cluster": cluster, "session_timeout_ms": 2000,
                                         "report_interval_ms": 500, "lease_ms": 2000,
                                         "cache_file": f"{workdir}/{name}/worker.json", "advertise": advertise}
    if coordinator == "etcd":
        lease = (extra or {}).pop("database_lease_ms", 2000)
        config["snowflake"].pop("database_lease_ms", None)
        config["snowflake.etcd"] = {"endpoints": [etcd_url], "cluster": cluster or etcd_cluster,
                                    "lease_ms": lease, "request_timeout_ms": 500}
    node = leafd.Node(binary, workdir, name, storage or f"sqlite://{workdir}/{name}/leafd.db", config=config,
                      http_bind=None, env=leafd.faketime_env(faketime) if faketime else None)
    return node.start()


class Loader(leafd.Loader):
    """Pipelined `SNOWFLAKE 200` x 5 on one connection until stopped; every error reply kept."""

    def __init__(self, node):
        self.error_lines = []
        # After a batch with errors, 0.05 s: 0.01 s per error reply of a batch of 5.
        super().__init__(node, f"{node.name}-load", None, lambda: [(leafd.SNOWFLAKE, 200)] * 5,
                         threading.Event(), timeout=30, pause_after_error=0.05,
                         on_error=lambda reply: self.error_lines.append("-" + reply))
        self.errors_after_mark = 0
        self.start()

    def mark(self):
        self.errors_after_mark = len(self.error_lines)

    def finish(self):
        self.stop_event.set()
        self.join(40)
        if self.unexpected:
            raise SystemExit(f"{self.name}: unexpected reply {self.unexpected[0]}")
        return list(self.snowflakes)


def record(case, ids):
    """Adds a case's IDs to the global set; any repeat (within or across cases) fails."""
    repeated = 0
    for i in ids:
        if i <= 0 or i > MAX_ID:
            raise SystemExit(f"{case}: ID {i} outside 1 ..= {MAX_ID} ({LAYOUT_NAME} layout)")
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


def stop(*nodes):
    """SIGTERM to each in turn, waiting for it to exit."""
    for node in nodes:
        node.terminate()
        node.wait()


def static_cases(work):
    # Run 1 at the real time, killed under load.
    first_start = time.time()
    node = start_node(work, "static")
    node.wait_ready()
    loader = load(node, 2.0)
    node.kill()
    n = record("static-run-1", loader.finish())

    # Restart 1 s back: behind the fence by about 4 s, waited out, then serves.
    node = start_node(work, "static", faketime="-1")
    node.wait_ready()
    loader = load(node, 2.0)
    node.kill()
    ids = loader.finish()
    if not ids:
        raise SystemExit("static-back-1s: no IDs after the restart\n" + node.log_text()[-2000:])
    n += record("static-back-1s", ids)
    print(f"static-back-1s: {n} IDs checked, no repeat")

    # Restart at the wall-clock time the first run started.
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(first_start))
    node = start_node(work, "static", faketime=f"@{start}")
    os.environ.pop("TZ", None)
    ok = node.wait_ready(allow_exit=True)
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
    node = start_node(work, "static", faketime="-60")
    ready = node.wait_ready(20, allow_exit=True)
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
        node = start_node(work, "zk", coordinator="zookeeper", advertise="10.99.0.1:6380", cluster=cluster,
                          faketime=faketime)
        node.wait_ready(40)
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
    a = start_node(work, "shared-a", coordinator="zookeeper", advertise="10.99.0.2:6380", cluster=cluster)
    a.wait_ready(40)
    b = start_node(work, "shared-b", coordinator="zookeeper", advertise="10.99.0.2:6380", cluster=cluster)
    b.wait_ready(40)
    la, lb = Loader(a), Loader(b)
    time.sleep(2.0)
    ia, ib = la.finish(), lb.finish()
    stop(a, b)
    if not ia or not ib:
        raise SystemExit("zk-shared-identity: a node served nothing")
    wa, wb = {worker_of(i) for i in ia}, {worker_of(i) for i in ib}
    if wa & wb:
        raise SystemExit(f"zk-shared-identity: both nodes used worker id {wa & wb}")
    n = record("zk-shared-identity a", ia) + record("zk-shared-identity b", ib)
    print(f"zk-shared-identity: {n} IDs checked, worker ids {sorted(wa)} and {sorted(wb)}, no repeat")


def zk_sigstop(work):
    cluster = f"stop-{os.getpid()}-{random.randrange(1 << 30)}"
    a = start_node(work, "stop-a", coordinator="zookeeper", advertise="10.99.0.3:6380", cluster=cluster)
    a.wait_ready(40)
    la = Loader(a)
    time.sleep(1.0)
    a.pause()
    stopped_ms = int(time.time() * 1000)
    la.mark()
    # Past the session timeout (2 s) and the lease (2 s): the id is free for a node with
    # the same identity, which starts past a's fence.
    time.sleep(4.5)
    b = start_node(work, "stop-b", coordinator="zookeeper", advertise="10.99.0.3:6380", cluster=cluster)
    b.wait_ready(40)
    lb = Loader(b)
    time.sleep(1.0)
    a.resume()
    time.sleep(2.5)
    ib = lb.finish()
    ia = la.finish()
    stop(b, a)
    # Replies written before SIGSTOP may be read after it: judge by the IDs' own timestamps.
    resumed = [i for i in ia if timestamp_of(i) > stopped_ms + 100]
    if resumed:
        raise SystemExit(f"zk-sigstop: the resumed node issued {len(resumed)} IDs after SIGCONT")
    if not ib:
        raise SystemExit("zk-sigstop: the node that took over served nothing\n" + b.log_text()[-2000:])
    errors = la.error_lines[la.errors_after_mark:]
    if not errors or not all(e.startswith("-UNAVAILABLE") for e in errors):
        raise SystemExit(f"zk-sigstop: the resumed node should answer UNAVAILABLE, got {errors[:3]}")
    same = {worker_of(i) for i in ia} & {worker_of(i) for i in ib}
    n = record("zk-sigstop a", ia) + record("zk-sigstop b", ib)
    print(f"zk-sigstop: {n} IDs checked (worker id shared after takeover: {sorted(same)}), "
          f"resumed node issued 0 and answered {len(errors)} x UNAVAILABLE, no repeat")


def db_cases(work, coordinator="database"):
    """The database coordinator on one shared SQLite file (or the etcd coordinator: its nodes
    share that file too, and their worker ids live in etcd)."""
    tag = "db" if coordinator == "database" else "etcd"
    shared = f"sqlite://{work}/shared-{tag}/leafd.db"
    os.makedirs(f"{work}/shared-{tag}", exist_ok=True)
    # SIGKILL under load and restart 1 s back, 3 times (each restart finds its old lease live and
    # takes another id, or its old one once expired).
    total, faketime = 0, None
    for cycle in range(3):
        node = start_node(work, tag, coordinator=coordinator, storage=shared, faketime=faketime,
                          extra={"database_lease_ms": 2000})
        node.wait_ready(40)
        loader = load(node, random.uniform(0.7, 2.0))
        node.kill()
        ids = loader.finish()
        if not ids:
            raise SystemExit(f"{tag}-kill-back-1s cycle {cycle}: no IDs\n" + node.log_text()[-2000:])
        total += record(f"{tag}-kill-back-1s cycle {cycle}", ids)
        faketime = "-1"
    print(f"{tag}-kill-back-1s: {total} IDs checked over 3 SIGKILL restarts with the clock 1 s back, no repeat")

    # Two nodes from one config (same state directory, same database), loaded at once.
    a = start_node(work, f"{tag}-twin", coordinator=coordinator, storage=shared, extra={"database_lease_ms": 2000})
    a.wait_ready(40)
    b = a.twin("leafd-b").start()  # a's config file and directory, another port, log leafd-b.log
    b.wait_ready(40)
    la, lb = Loader(a), Loader(b)
    time.sleep(1.5)
    ia, ib = la.finish(), lb.finish()
    stop(a, b)
    wa, wb = {worker_of(i) for i in ia}, {worker_of(i) for i in ib}
    if not ia or not ib or wa & wb:
        raise SystemExit(f"{tag}-one-config: worker ids {wa} and {wb}")
    n = record(f"{tag}-one-config a", ia) + record(f"{tag}-one-config b", ib)
    print(f"{tag}-one-config: {n} IDs checked, worker ids {sorted(wa)} and {sorted(wb)}, no repeat")

    # One worker id only: SIGSTOP past the lease, another node takes the id, SIGCONT.
    one = f"sqlite://{work}/one-id-{tag}/leafd.db"
    os.makedirs(f"{work}/one-id-{tag}", exist_ok=True)
    one_cluster = f"{etcd_cluster}-one"
    a = start_node(work, f"{tag}-stop-a", coordinator=coordinator, storage=one, extra=dict(DB_ONE_ID), cluster=one_cluster)
    a.wait_ready(40)
    la = Loader(a)
    time.sleep(1.0)
    a.pause()
    stopped_ms = int(time.time() * 1000)
    time.sleep(3.0)  # the 2-s lease expires in the database
    b = start_node(work, f"{tag}-stop-b", coordinator=coordinator, storage=one, extra=dict(DB_ONE_ID), cluster=one_cluster)
    b.wait_ready(40)
    lb = Loader(b)
    time.sleep(1.0)
    a.resume()
    time.sleep(2.0)
    ib, ia = lb.finish(), la.finish()
    stop(b, a)
    # Worker id bits 0: the timestamp starts right above the sequence.
    resumed = [i for i in ia if timestamp_of(i, worker_bits=0) > stopped_ms + 100]
    if resumed or not ib:
        raise SystemExit(f"{tag}-sigstop: resumed node issued {len(resumed)} IDs, the new holder {len(ib)}")
    n = record(f"{tag}-sigstop a", ia) + record(f"{tag}-sigstop b", ib)
    print(f"{tag}-sigstop: {n} IDs checked, one worker id, the resumed node issued 0 after SIGCONT, no repeat")


def main():
    if not os.path.exists(leafd.FAKETIME_LIB):
        raise SystemExit(f"{leafd.FAKETIME_LIB} missing (Debian: faketime)")
    work = tempfile.mkdtemp()
    started = time.time()
    only = sys.argv[3:]  # optional case groups: static zk-kill zk-shared zk-sigstop
    for name, case in [("static", static_cases), ("zk-kill", zk_kill_cases),
                       ("zk-shared", zk_shared_identity), ("zk-sigstop", zk_sigstop), ("db", db_cases),
                       ("etcd", lambda work: db_cases(work, "etcd"))]:
        if name == "etcd" and not etcd_url:
            if name in only:
                raise SystemExit("the etcd cases need LEAFD_TEST_ETCD (scripts/etcd.sh start DIR)")
            print("etcd cases skipped: LEAFD_TEST_ETCD is not set")
            continue
        if not only or name in only:
            try:
                case(work)
            except leafd.NodeError as e:
                raise SystemExit(str(e))
    print(f"snowflake faults ({LAYOUT_NAME} layout): {len(all_ids)} IDs checked in all, none repeated, "
          f"{time.time() - started:.0f} s")


main()
