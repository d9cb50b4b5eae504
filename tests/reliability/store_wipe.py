"""A coordinator's store loses its data under load, on the real binary: no snowflake ID and no
(millisecond, worker id) pair is issued by two nodes.

Each run: a private ZooKeeper or etcd (scripts/zookeeper.sh, scripts/etcd.sh), two nodes a and
b holding both worker ids of a 1-bit layout under pipelined SNOWFLAKE load; the store SIGKILLed,
its data directory emptied and started again on the same port (a rebuilt member, a restore from
nothing); a third node c started at once, loaded as soon as it answers. With --partition (etcd),
a and b reach etcd through a proxy that is frozen from before the wipe until after c serves.
With --restore (etcd), the member is instead restored from a snapshot taken after a claimed its
id and before b did (`etcdctl snapshot save` / `snapshot restore`): a's keys come back, b's are
gone while b still holds its id.
With --restart there is no loss: a is SIGKILLed and started again at once while both ids are
leased (its own until its lease runs out): it must wait for its id (its state file names it) and
serve again, not exit for want of a free id.
Every ID of every node is collected. Afterwards both worker ids must serve again by themselves
(a and b claimed theirs again, or c holds one of them; a start of c that finds both held is
refused, which is right); ZooKeeper's a and b may take theirs back at once, as each held its id
alone; any other claimant waits a whole lease.

With `database` (the database coordinator, on the MariaDB server LEAFD_TEST_MYSQL_URL names)
the wipe is `DELETE FROM leaf_worker` in the nodes' shared database (with --partial, of the lease
rows only: the records in rows -1 to -3 kept); --partition puts a and b behind the frozen proxy
to it.

    python3 tests/reliability/store_wipe.py LEAFD_BIN zookeeper|etcd|database [--runs N] [--partition|--restore|--restart|--partial]
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPOCH_MS = 1288834974657
SEQUENCE_BITS, WORKER_BITS = 21, 1
LEASE_MS = 6000


def pair_of(snowflake_id):
    """(millisecond, worker id) of an ID of the 1-bit layout."""
    return (snowflake_id >> (WORKER_BITS + SEQUENCE_BITS),
            (snowflake_id >> SEQUENCE_BITS) & ((1 << WORKER_BITS) - 1))


class Store:
    """A private ZooKeeper or etcd in `directory`, wiped and started again on its port."""

    def __init__(self, kind, directory):
        self.kind, self.dir = kind, directory
        self.script = os.path.join(ROOT, "scripts", f"{kind}.sh")
        self.address = self._run("start", self.dir)
        self.port = self.address.rsplit(":", 1)[1]

    def _run(self, *args):
        out = subprocess.run([self.script, *args], check=True, capture_output=True, text=True,
                             timeout=120)
        return out.stdout.strip()

    def wipe(self):
        """SIGKILL (ZooKeeper) or SIGTERM (etcd's script), empty the data, start again."""
        pid_file = os.path.join(self.dir, "pid")
        if self.kind == "zookeeper" and os.path.exists(pid_file):
            with open(pid_file) as f:
                pid = int(f.read())
            os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            os.remove(pid_file)
        else:
            self._run("stop", self.dir)
        shutil.rmtree(os.path.join(self.dir, "data"))
        self._run("start", self.dir, self.port)

    def snapshot(self):
        """etcd: a snapshot of the member now (`etcdctl snapshot save`)."""
        path = os.path.join(self.dir, "snapshot.db")
        subprocess.run(["etcdctl", "--endpoints", self.address, "snapshot", "save", path],
                       check=True, capture_output=True, timeout=60,
                       env={**os.environ, "ETCDCTL_API": "3"})
        return path

    def restore(self, snapshot):
        """etcd: stopped, its data replaced by `snapshot` (`etcdctl snapshot restore`, with the
        member's own name and peer URL as scripts/etcd.sh starts it), started again."""
        self._run("stop", self.dir)
        shutil.rmtree(os.path.join(self.dir, "data"))
        peer = f"http://127.0.0.1:{int(self.port) + 1}"
        subprocess.run(["etcdctl", "snapshot", "restore", snapshot, "--name", "leafd-test",
                        "--initial-cluster", f"leafd-test={peer}",
                        "--initial-advertise-peer-urls", peer,
                        "--data-dir", os.path.join(self.dir, "data")],
                       check=True, capture_output=True, timeout=60,
                       env={**os.environ, "ETCDCTL_API": "3"})
        self._run("start", self.dir, self.port)

    def stop(self):
        self._run("stop", self.dir)


class LeaseTable:
    """The database coordinator's store: `leaf_worker` in a database of its own on the MariaDB
    server LEAFD_TEST_MYSQL_URL names; a wipe deletes its rows (DELETE, as a wipe of the table
    or a restore of an empty one leaves it) while the server and the nodes run."""

    def __init__(self, run, partial=False):
        self.partial = partial
        server = os.environ.get("LEAFD_TEST_MYSQL_URL")
        if not server:
            sys.exit("store_wipe.py database needs LEAFD_TEST_MYSQL_URL (mysql://user@host:port)")
        rest = server.split("://", 1)[1].rstrip("/")
        self.user, hostport = rest.split("@", 1) if "@" in rest else ("root", rest)
        self.host, self.port = hostport.rsplit(":", 1) if ":" in hostport else (hostport, "3306")
        self.name = f"leafd_wipe_{os.getpid()}_{run}"
        self._sql(f"CREATE DATABASE {self.name}", database=None)
        self.address = self.url(self.host, self.port)

    def url(self, host, port):
        return f"mysql://{self.user}@{host}:{port}/{self.name}"

    def _sql(self, statement, database=""):
        database = self.name if database == "" else database
        cmd = ["mysql", "-u", self.user, "-h", self.host, "-P", str(self.port), "-e", statement]
        subprocess.run(cmd + ([database] if database else []), check=True, capture_output=True,
                       timeout=60)

    def wipe(self):
        self._sql("DELETE FROM leaf_worker" + (" WHERE worker_id >= 0" if self.partial else ""))

    def stop(self):
        self._sql(f"DROP DATABASE IF EXISTS {self.name}", database=None)


def start_node(binary, work, name, kind, address, cluster):
    snowflake = {"coordinator": kind, "worker_id_bits": WORKER_BITS, "sequence_bits": SEQUENCE_BITS,
                 "timestamp_bits": 63 - WORKER_BITS - SEQUENCE_BITS, "max_start_wait_ms": 10000}
    config = {"http": {"enabled": False}, "snowflake": snowflake}
    if kind == "zookeeper":
        config["snowflake.zookeeper"] = {"connect": address, "cluster": cluster,
                                         "session_timeout_ms": 2000, "report_interval_ms": 500,
                                         "lease_ms": LEASE_MS, "advertise": f"10.98.0.{len(name)}:{6380 + ord(name[0])}",
                                         "cache_file": f"{work}/{name}/worker.json"}
    elif kind == "etcd":
        config["snowflake.etcd"] = {"endpoints": [address], "cluster": cluster,
                                    "lease_ms": LEASE_MS, "request_timeout_ms": 500}
    else:
        snowflake["database_lease_ms"] = LEASE_MS
    storage = address if kind == "database" else f"sqlite://{work}/{name}/leafd.db"
    node = leafd.Node(binary, work, name, storage, config=config, http_bind=None)
    return node.start()


def loader(node):
    return leafd.Loader(node, f"{node.name}-load", None, lambda: [(leafd.SNOWFLAKE, 200)] * 5,
                        threading.Event(), timeout=30, pause_after_error=0.05)


def one_run(binary, kind, partition, run, restore=False, restart=False, partial=False):
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix=f"leafd-wipe-{kind}-")
    store = (LeaseTable(run, partial) if kind == "database"
             else Store(kind, os.path.join(work, "store")))
    cluster = f"wipe-{os.getpid()}-{run}"
    proxy = None
    nodes, loaders, failures = [], [], []
    try:
        address = store.address
        if partition and kind == "database":
            proxy = leafd.TcpProxy((store.host, int(store.port)), "ab-to-database")
            address = store.url("127.0.0.1", proxy.port)
        elif partition:
            host, port = address.replace("http://", "").rsplit(":", 1)
            proxy = leafd.TcpProxy((host, int(port)), "ab-to-etcd")
            address = f"http://127.0.0.1:{proxy.port}"
        a = start_node(binary, work, "a", kind, address, cluster).wait_ready(30)
        snapshot = store.snapshot() if restore else None
        b = start_node(binary, work, "b", kind, address, cluster).wait_ready(30)
        nodes += [a, b]
        loaders += [loader(a), loader(b)]
        for each in loaders:
            each.start()
        time.sleep(1.0)
        if proxy:
            proxy.pause()
        if restart:
            loaders[0].stop_event.set()  # the first run's client: its replies end with the kill
            loaders[0].join(40)
            a.kill()
            killed, killed_ms = time.monotonic(), int(time.time() * 1000)
            a.start()
            if a.wait_ready(LEASE_MS / 1000 + 10, allow_exit=True) is None:
                failures.append(f"a did not start again: {a.log_tail()}")
            print(f"  a started again {time.monotonic() - killed:.1f} s after its SIGKILL", flush=True)
            loaders.append(loader(a))
            loaders[-1].name = "a-again"
            loaders[-1].start()
            time.sleep(LEASE_MS / 1000 + 2)
        elif restore:
            store.restore(snapshot)
        else:
            store.wipe()
        wiped, wiped_ms = time.monotonic(), int(time.time() * 1000)
        if restart:
            wiped, wiped_ms = killed, killed_ms
        c = start_node(binary, work, "c", kind, store.address, cluster) if not restart else None
        if c is not None:
            nodes.append(c)
        ready = c.wait_ready(30, allow_exit=True) if c is not None else a
        ready_after = time.monotonic() - wiped
        if ready is None:
            refusal = c.log_tail()  # c exits only when both ids are held
            if "no free worker id" not in refusal:
                failures.append(f"c exited: {refusal}")
            ready_after = None
        elif c is not None:
            loaders.append(loader(c))
            loaders[-1].start()
        time.sleep(2.0)
        back = wiped
        if proxy:
            proxy.resume()
            # A holder cut off across the loss learns of it only now: its next renewal, its
            # claim again and a whole lease's wait.
            back = time.monotonic()
        # Long enough after the loss (and the partition), whatever c did (it may have been
        # refused at once), for every claimant's lease to have passed and the ids to serve.
        time.sleep(max(4.0, back + LEASE_MS / 1000 + 4.0 - time.monotonic()))
        for each in loaders:
            each.stop_event.set()
        for each in loaders:
            each.join(40)
        issuer, repeats, shared = {}, 0, 0
        pairs = {}
        for each in loaders:
            for i in each.snowflakes:
                if i in issuer:
                    repeats += 1
                # A loader per process: a restarted node's IDs count apart from its first run's.
                issuer[i] = each.name
                owner = pairs.setdefault(pair_of(i), each.name)
                if owner != each.name:
                    shared += 1
        counts = {each.name: len(each.snowflakes) for each in loaders}
        late = (wiped_ms + LEASE_MS + 1000 - EPOCH_MS)
        serving = sorted({each.node.name for each in loaders
                          if any((i >> (WORKER_BITS + SEQUENCE_BITS)) > late for i in each.snowflakes)})
        c_text = ("not started (a restart, no loss)" if restart
                  else "refused: both ids held again" if ready_after is None
                  else f"answered {ready_after:.1f} s after the wipe")
        how = " (a and b partitioned)" if partition else " (restored from a snapshot)" if restore else ""
        print(f"  {kind} run {run + 1}{how}: IDs "
              f"{counts}, c {c_text}; serving a lease after the wipe: {serving}; repeated IDs "
              f"{repeats}, (ms, worker id) pairs issued by two nodes {shared}", flush=True)
        if repeats:
            failures.append(f"{repeats} repeated IDs")
        if shared:
            failures.append(f"{shared} (ms, worker id) pairs issued by two nodes")
        if len(serving) < 2:
            failures.append(f"only {serving} issued again a lease after the wipe")
    finally:
        for each in loaders:
            each.stop_event.set()
        leafd.stop_all(nodes)
        if proxy:
            proxy.close()
        store.stop()
        shutil.rmtree(work, ignore_errors=True)
    leafd.print_outcome(f"store_wipe {kind} run {run + 1}", failures, started)
    return not failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("kind", choices=("zookeeper", "etcd", "database"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partition", action="store_true")
    parser.add_argument("--restore", action="store_true")
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--partial", action="store_true",
                        help="database: delete the lease rows only (rows -1 to -3 kept)")
    args = parser.parse_args()
    ok = all([one_run(os.path.abspath(args.binary), args.kind, args.partition, run, args.restore,
                      args.restart, args.partial)
              for run in range(args.runs)])
    sys.exit(0 if ok else 1)


main()
