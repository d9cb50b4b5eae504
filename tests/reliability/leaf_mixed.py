"""Meituan Leaf and leafd side by side on one MariaDB database and one ZooKeeper tree, as a Leaf
cluster migrating to leafd node by node, and a leafd upgrade from the previous release: every ID
of every node collected; no segment ID and no snowflake ID may be handed out twice.

The Leaf nodes are a stand-in written for this test (class LeafNode), not Leaf itself: it does
what Leaf's leaf-core does, in-process, with no HTTP.
  segment    SegmentIDGenImpl + IDAllocDaoImpl: one transaction of `UPDATE leaf_alloc SET
             max_id = max_id + step WHERE biz_tag = ?` (the first two loads of a tag) or
             `... max_id = max_id + <next step> ...` (the adaptive step: twice the previous
             step while a segment lasts under 15 minutes), then `SELECT biz_tag, max_id, step
             FROM leaf_alloc WHERE biz_tag = ?`, COMMIT; the segment is [max_id - step, max_id);
             the next segment is loaded in the background once 10% of the current one is used
             (double buffer). Leaf caps the step at 1,000,000; the stand-in at LEAF_MAX_STEP, so
             that a short run crosses many range boundaries.
  snowflake  SnowflakeZookeeperHolder + SnowflakeIDGenImpl: no `{PATH}/forever`: create
             `{PATH}/forever/{ip}:{port}-` PERSISTENT_SEQUENTIAL (parents too) and take worker
             id 0; else split every child of forever on "-" ([0] the endpoint, [1] parsed as
             an int: an unparsable child fails the start as Leaf's NumberFormatException does),
             reuse this endpoint's sequence number (refusing a start when its node's timestamp
             is ahead of the clock) or create a new sequential node and parse its number; any
             failure falls back to {leaf.name}/leafconf/{port}/workerID.properties, as Leaf
             does, which the stand-in reports as a failure (a Leaf node started from its cache
             reports nothing to ZooKeeper). Node data {"ip","port","timestamp"} (Jackson: an
             unknown field fails the read), written every 3 s. IDs: 41 bits of ms since
             Twitter's epoch, 10 bits worker id, 12 bits sequence (a new ms starts at 0-99).
PATH is /snowflake/{leaf.name}; the leafd nodes use snowflake.zookeeper.root = "/snowflake" and
cluster = leaf.name, one of them with advertise = "leafd-2:<port>" (a name with Leaf's separator).

Scenarios (about 100 s in all):
  leaf-mixed  a database made as Leaf's README makes it (Leaf's DDL, the row at max_id = 1, step
              STEP); Leaf A registers, leafd nodes 1 and 2 (the new binary) start on it
              (migrating Leaf's table), Leaf B registers after them; all four under load at
              once (BOTH s), then leafd alone (Leaf stopped, ALONE s), then Leaf alone (leafd
              stopped, Leaf A and B started again, ALONE s).
  upgrade     a new database; the previous leafd binary creates the tag and serves; the new
              binary starts beside it on the same table (migrating it under load), both loaded
              (BOTH s); then the previous node stops and the new one serves alone (ALONE s).
              Then the previous binary is started once more on the migrated table (reported,
              not judged here: tests/reliability/rollback.py judges rollbacks under load).
Per scenario one summary line: IDs per node, ranges loaded per node (leafd: its /metrics), range
handovers between nodes crossed in ID order, repeated segment IDs, snowflake IDs, worker ids,
repeated snowflake IDs. Exit status 1 on any repeat or failure.

Passing release 0c1dd66 as NEW must fail with repeats in leaf-mixed: that earlier leafd
served (max_id - step, max_id], so a Leaf range allocated right after a leafd range served to
its end shares one ID.

usage: leaf_mixed.py NEW_LEAFD PREV_LEAFD --mysql mysql://root@127.0.0.1:3306
                     --zookeeper 127.0.0.1:2181 [--keep]
Needs the `mysql` client and the Python ZooKeeper client kazoo: when it cannot be imported,
the script installs kazoo==2.11.0 from PyPI into a virtualenv under ~/.cache/leafd (once;
LEAF_MIXED_VENV overrides the path) and runs itself again with that interpreter.
"""
import os
import sys

KAZOO_VERSION = "2.11.0"


def _bootstrap_kazoo():
    """Runs this script again in a virtualenv that has kazoo, created once (idempotent)."""
    try:
        import kazoo  # noqa: F401
        return
    except ImportError:
        pass
    import subprocess
    if os.environ.get("LEAF_MIXED_BOOTSTRAPPED"):
        raise SystemExit("leaf_mixed: kazoo still missing in the virtualenv")
    venv = os.environ.get("LEAF_MIXED_VENV") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "leafd", f"kazoo-{KAZOO_VERSION}")
    python = os.path.join(venv, "bin", "python")
    check = [python, "-c", f"import kazoo, sys; sys.exit(kazoo.__version__ != '{KAZOO_VERSION}')"]
    if not os.path.exists(python) or subprocess.run(check, capture_output=True).returncode != 0:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        f"kazoo=={KAZOO_VERSION}"], check=True)
    os.environ["LEAF_MIXED_BOOTSTRAPPED"] = "1"
    os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == "__main__":
    _bootstrap_kazoo()

import argparse  # noqa: E402
import array  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402

from kazoo.client import KazooClient  # noqa: E402
from kazoo.exceptions import NoNodeError  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

STEP = 50                 # the row's step: small, so ranges end every few dozen IDs
LEAF_MAX_STEP = 4 * STEP  # the stand-in's adaptive-step cap (Leaf's: 1,000,000)
LEAFD_MAX_STEP = 4 * STEP  # segment.max_step of the leafd nodes (their adaptive step's cap)
INCRBY = 3 * STEP         # leafd's INCRBY blocks: larger than the step
BOTH, ALONE = 15.0, 5.0   # seconds of load: all at once, then each alone
LEAF_RATE = 4000          # IDs per second per stand-in serving thread (about a leafd node's)
TWEPOCH = 1288834974657   # Leaf's (Twitter's) epoch
SEGMENT_DURATION_MS = 15 * 60 * 1000


class Failure(Exception):
    pass


# --- MariaDB through the mysql client ------------------------------------------------------------

class MySQL:
    """A server from a mysql:// URL, reached with the `mysql` command-line client."""

    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "mysql":
            raise SystemExit(f"--mysql wants mysql://user[:password]@host:port, not {url}")
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 3306
        self.user = urllib.parse.unquote(u.username or "root")
        self.password = urllib.parse.unquote(u.password) if u.password else None
        self.netloc = u.netloc

    def url(self, database):
        return f"mysql://{self.netloc}/{database}?ssl-mode=disabled"

    def command(self, database=None):
        cmd = ["mysql", f"-h{self.host}", f"-P{self.port}", f"-u{self.user}", "--batch",
               "--skip-column-names", "--unbuffered"]
        return cmd + ([database] if database else [])

    def env(self):
        env = dict(os.environ)
        if self.password is not None:
            env["MYSQL_PWD"] = self.password
        return env

    def sql(self, statements, database=None):
        """Runs statements, returns their output rows (lists of columns)."""
        result = subprocess.run(self.command(database), input=statements, capture_output=True,
                                text=True, timeout=60, env=self.env())
        if result.returncode != 0:
            raise RuntimeError(f"mysql failed: {result.stderr.strip()[-600:]}")
        return [line.split("\t") for line in result.stdout.splitlines()]


class Session:
    """One long-lived client session (a `mysql` process fed statements on stdin): a Leaf node's
    JDBC connection. Not thread-safe: one user at a time."""

    END = "#leaf-mixed-end"

    def __init__(self, mysql, database):
        self.process = subprocess.Popen(mysql.command(database), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        bufsize=1, env=mysql.env())

    def query(self, statements):
        """Sends `statements`; the rows they printed."""
        try:
            self.process.stdin.write(f"{statements}\nSELECT '{self.END}';\n")
            self.process.stdin.flush()
        except OSError:
            pass
        rows = []
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"mysql session ended: {self.process.stderr.read().strip()[-600:]}")
            line = line.rstrip("\n")
            if line == self.END:
                return rows
            rows.append(line.split("\t"))

    def close(self):
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def sql_string(value):
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


# --- the Leaf stand-in ---------------------------------------------------------------------------

class Served:
    """What one serving thread of a stand-in handed out, in the shape leafd.IdReport reads from
    a leafd.Loader."""

    def __init__(self, owner, name):
        self.owner, self.name = owner, name
        self.singles = array.array("q")
        self.blocks = []
        self.snowflakes = array.array("q")
        self.errors = collections.Counter()
        self.error_examples = {}
        self.drops = collections.Counter()
        self.unexpected = []
        self.order_violations = 0
        self.order_examples = []


class LeafSegments:
    """SegmentIDGenImpl for one tag: a SegmentBuffer of two segments, loaded by one transaction
    each as IDAllocDaoImpl does."""

    def __init__(self, node, tag):
        self.node, self.tag = node, tag
        self.session = Session(node.mysql, node.database)
        self.db_lock = threading.Lock()
        self.lock = threading.Condition()
        self.segments = [None, None]  # [value, max, step] (value: next ID to hand out)
        self.pos = 0
        self.next_ready = False
        self.loading = False
        self.init_ok = False
        self.buffer_step = 0
        self.min_step = 0
        self.update_timestamp = 0
        self.loads = 0
        self.load_error = None

    def _load(self):
        """updateSegmentFromDb: the segment [max_id - step, max_id) of a new allocation."""
        quoted = sql_string(self.tag)
        select = f"SELECT biz_tag, max_id, step FROM leaf_alloc WHERE biz_tag = {quoted};"
        with self.db_lock:
            if not self.init_ok or self.update_timestamp == 0:
                # updateMaxIdAndGetLeafAlloc
                rows = self.session.query(
                    "START TRANSACTION;\n"
                    f"UPDATE leaf_alloc SET max_id = max_id + step WHERE biz_tag = {quoted};\n"
                    f"{select}\nCOMMIT;")
                _, max_id, step = rows[0]
                if self.init_ok:
                    self.update_timestamp = int(time.time() * 1000)
                self.buffer_step = int(step)
                self.min_step = int(step)
            else:
                # updateMaxIdByCustomStepAndGetLeafAlloc with Leaf's next step
                duration = int(time.time() * 1000) - self.update_timestamp
                next_step = self.buffer_step
                if duration < SEGMENT_DURATION_MS:
                    if next_step * 2 <= LEAF_MAX_STEP:
                        next_step *= 2
                elif duration >= 2 * SEGMENT_DURATION_MS:
                    next_step = next_step // 2 if next_step // 2 >= self.min_step else next_step
                rows = self.session.query(
                    "START TRANSACTION;\n"
                    f"UPDATE leaf_alloc SET max_id = max_id + {next_step} WHERE biz_tag = {quoted};\n"
                    f"{select}\nCOMMIT;")
                _, max_id, step = rows[0]
                self.update_timestamp = int(time.time() * 1000)
                self.buffer_step = next_step
                self.min_step = int(step)
            self.loads += 1
            max_id = int(max_id)
            return [max_id - self.buffer_step, max_id, self.buffer_step]

    def _load_next(self):
        try:
            segment = self._load()
        except Exception as e:  # noqa: BLE001 - Leaf logs and retries on a later request
            with self.lock:
                self.loading = False
                self.load_error = f"{type(e).__name__}: {e}"
                self.lock.notify_all()
            return
        with self.lock:
            self.segments[1 - self.pos] = segment
            self.next_ready = True
            self.loading = False
            self.lock.notify_all()

    def get(self):
        """getIdFromSegmentBuffer: the next ID, or None (Leaf's exception codes)."""
        with self.lock:
            if not self.init_ok:
                self.segments[self.pos] = self._load()
                self.init_ok = True
            while True:
                current = self.segments[self.pos]
                value, top, step = current
                if not self.next_ready and top - value < 0.9 * step and not self.loading:
                    self.loading = True
                    threading.Thread(target=self._load_next, daemon=True).start()
                if value < top:
                    current[0] = value + 1
                    return value
                if self.next_ready:
                    self.pos = 1 - self.pos
                    self.next_ready = False
                    continue
                if not self.loading:
                    return None  # "Both two segments ... are not ready!"
                self.lock.wait(1.0)

    def close(self):
        with self.db_lock:
            self.session.close()


def java_parse_int(text):
    """Integer.parseInt: an optional sign and decimal digits, within 32 bits."""
    if not re.fullmatch(r"[+-]?[0-9]+", text or ""):
        raise ValueError(f'NumberFormatException: For input string: "{text}"')
    value = int(text)
    if not -2**31 <= value < 2**31:
        raise ValueError(f'NumberFormatException: For input string: "{text}"')
    return value


def java_split_dash(text):
    """String.split("-"): trailing empty strings removed."""
    parts = text.split("-")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


class LeafSnowflake:
    """SnowflakeZookeeperHolder + SnowflakeIDGenImpl."""

    def __init__(self, node):
        self.node = node
        self.path = f"/snowflake/{node.leaf_name}"
        self.forever = f"{self.path}/forever"
        self.listen = f"{node.ip}:{node.port}"
        self.cache_file = os.path.join(node.workdir, node.leaf_name, "leafconf", str(node.port),
                                       "workerID.properties")
        self.worker_id = None
        self.problem = None  # why Leaf would not have started, or started from its cache
        self.zk = None
        self.stop = threading.Event()
        self.last_timestamp = -1
        self.sequence = 0
        self.lock = threading.Lock()

    def _data(self):
        return json.dumps({"ip": self.node.ip, "port": str(self.node.port),
                           "timestamp": int(time.time() * 1000)}, separators=(",", ":")).encode()

    def init(self):
        """Leaf's init(): True with a worker id, False when Leaf would not start."""
        try:
            self.zk = KazooClient(hosts=self.node.zk_hosts, timeout=6.0)
            self.zk.start(timeout=10)
            if self.zk.exists(self.forever) is None:
                node = self.zk.create(f"{self.forever}/{self.listen}-", self._data(), sequence=True,
                                      makepath=True)
                self.worker_id = 0  # Leaf keeps its field's default here
            else:
                node_map, real_node = {}, {}
                for key in self.zk.get_children(self.forever):
                    parts = java_split_dash(key)
                    if len(parts) < 2:
                        raise ValueError(f"ArrayIndexOutOfBoundsException: 1 (child {key!r})")
                    real_node[parts[0]] = key
                    node_map[parts[0]] = java_parse_int(parts[1])
                if self.listen in node_map:
                    node = f"{self.forever}/{real_node[self.listen]}"
                    self.worker_id = node_map[self.listen]
                    data, _ = self.zk.get(node)
                    endpoint = json.loads(data)
                    unknown = set(endpoint) - {"ip", "port", "timestamp"}
                    if unknown:  # Jackson's FAIL_ON_UNKNOWN_PROPERTIES
                        raise ValueError(f"UnrecognizedPropertyException: {sorted(unknown)} in {node}")
                    if endpoint["timestamp"] > time.time() * 1000:
                        raise ValueError("CheckLastTimeException: init timestamp check error,forever "
                                         "node timestamp gt this node time")
                else:
                    node = self.zk.create(f"{self.forever}/{self.listen}-", self._data(), sequence=True,
                                          makepath=True)
                    self.worker_id = java_parse_int(java_split_dash(node)[1])
            self._write_cache()
            threading.Thread(target=self._report, args=(node,), daemon=True,
                             name=f"{self.node.name}-report").start()
        except Exception as e:  # noqa: BLE001 - Leaf catches everything here
            self.problem = f"{type(e).__name__}: {e}"
            try:
                with open(self.cache_file) as f:
                    self.worker_id = java_parse_int(f.read().strip().split("=", 1)[1])
                self.problem += " (Leaf starts from its cache file, reporting nothing to ZooKeeper)"
            except (OSError, IndexError, ValueError):
                self.problem += " (no cache file: 'Snowflake Id Gen is not init ok', Leaf does not start)"
                return False
        if not 0 <= self.worker_id <= 1023:
            self.problem = f"workerID must gte 0 and lte 1023 (got {self.worker_id})"
            return False
        return True

    def _write_cache(self):
        os.makedirs(os.path.dirname(self.cache_file), exist_ok=True)
        with open(self.cache_file, "w") as f:
            f.write(f"workerID={self.worker_id}")

    def _report(self, node):
        """ScheduledUploadData: every 3 s after 1 s."""
        if self.stop.wait(1.0):
            return
        while True:
            try:
                self.zk.set(node, self._data())
            except Exception:  # noqa: BLE001 - Leaf logs and goes on
                pass
            if self.stop.wait(3.0):
                return

    def get(self):
        with self.lock:
            timestamp = int(time.time() * 1000)
            if timestamp < self.last_timestamp:
                offset = self.last_timestamp - timestamp
                if offset > 5:
                    return None
                time.sleep((offset << 1) / 1000)
                timestamp = int(time.time() * 1000)
                if timestamp < self.last_timestamp:
                    return None
            if self.last_timestamp == timestamp:
                self.sequence = (self.sequence + 1) & 0xFFF
                if self.sequence == 0:
                    self.sequence = random.randrange(100)
                    while timestamp <= self.last_timestamp:
                        timestamp = int(time.time() * 1000)
            else:
                self.sequence = random.randrange(100)
            self.last_timestamp = timestamp
            return ((timestamp - TWEPOCH) << 22) | (self.worker_id << 12) | self.sequence

    def close(self):
        self.stop.set()
        if self.zk is not None:
            try:
                self.zk.stop()
                self.zk.close()
            except Exception:  # noqa: BLE001
                pass


class LeafNode:
    """A Leaf server stand-in: segment IDs of one tag and snowflake IDs, each served by threads
    in a loop (at most LEAF_RATE IDs per second each) until stop()."""

    def __init__(self, name, mysql, database, tag, zk_hosts, leaf_name, workdir, port):
        self.name, self.mysql, self.database, self.tag = name, mysql, database, tag
        self.zk_hosts, self.leaf_name, self.workdir = zk_hosts, leaf_name, workdir
        self.ip, self.port = "127.0.0.1", port
        self.runs = 0
        self.served = []   # Served, over every start
        self.segment_loads = 0
        self.worker_ids = set()
        self.problems = []
        self._running = None

    def start(self, segment_threads=2, snowflake_threads=1):
        """Leaf's start: the snowflake service (ZooKeeper), then the segment service."""
        self.runs += 1
        snowflake = LeafSnowflake(self)
        if not snowflake.init():
            self.problems.append(f"{self.name} start {self.runs}: {snowflake.problem}")
            snowflake.close()
            return False
        if snowflake.problem:
            self.problems.append(f"{self.name} start {self.runs}: {snowflake.problem}")
        self.worker_ids.add(snowflake.worker_id)
        segments = LeafSegments(self, self.tag)
        stop = threading.Event()
        threads = []
        for i in range(segment_threads):
            served = Served(self.name, f"{self.name}/segment-{self.runs}.{i}")
            threads.append(threading.Thread(target=self._serve, args=(segments.get, served, stop, False),
                                            daemon=True, name=served.name))
            self.served.append(served)
        for i in range(snowflake_threads):
            served = Served(self.name, f"{self.name}/snowflake-{self.runs}.{i}")
            threads.append(threading.Thread(target=self._serve, args=(snowflake.get, served, stop, True),
                                            daemon=True, name=served.name))
            self.served.append(served)
        for t in threads:
            t.start()
        self._running = (snowflake, segments, stop, threads)
        return True

    @staticmethod
    def _serve(get, served, stop, is_snowflake):
        out = served.snowflakes if is_snowflake else served.singles
        previous, batch, started, handed = None, 50, time.monotonic(), 0
        while not stop.is_set():
            for _ in range(batch):
                try:
                    value = get()
                except Exception as e:  # noqa: BLE001 - Leaf answers an error, the client retries
                    served.errors[type(e).__name__] += 1
                    served.error_examples.setdefault(type(e).__name__, str(e)[:200])
                    stop.wait(0.05)
                    break
                if value is None:
                    served.errors["EXCEPTION"] += 1
                    stop.wait(0.01)
                    break
                if previous is not None and value <= previous:
                    served.order_violations += 1
                    if len(served.order_examples) < 5:
                        served.order_examples.append(f"{served.name}: {value} after {previous}")
                previous = value
                out.append(value)
            handed += batch
            ahead = handed / LEAF_RATE - (time.monotonic() - started)
            if ahead > 0:
                stop.wait(ahead)

    def stop(self):
        if self._running is None:
            return
        snowflake, segments, stop, threads = self._running
        stop.set()
        for t in threads:
            t.join(10)
        self.segment_loads += segments.loads
        if segments.load_error:
            self.problems.append(f"{self.name}: a segment load failed: {segments.load_error}")
        segments.close()
        snowflake.close()
        self._running = None


# --- leafd nodes ---------------------------------------------------------------------------------

def leafd_node(binary, work, name, url, zk_hosts, leaf_name, advertise_host=None, tags=None):
    """A leafd node on `url` with its snowflake worker id in Leaf's ZooKeeper tree; its identity
    there is `{advertise_host}:{port}` when given, else its RESP address."""
    port, http_port = leafd.free_port(), leafd.free_port()
    advertise = f"{advertise_host}:{port}" if advertise_host else None
    node = leafd.Node(binary, work, name, url, port_flag=port, http_bind=f"127.0.0.1:{http_port}", config={
        "segment": {"adaptive_step": True, "max_step": LEAFD_MAX_STEP},
        "snowflake": {"coordinator": "zookeeper", "fence_file": os.path.join(work, name, "fence.json")},
        "snowflake.zookeeper": {"connect": zk_hosts, "root": "/snowflake", "cluster": leaf_name,
                                "session_timeout_ms": 4000, "advertise": advertise,
                                "cache_file": os.path.join(work, name, "worker.json")},
        **({"segment.tags": tags} if tags else {}),
    })
    node.http_port = http_port
    return node


def leafd_load(node, tag, stop):
    """Three clients: pipelined INCRs, INCRs with an INCRBY (larger than the step) now and then,
    SNOWFLAKE arrays."""
    rng = random.Random()

    def incr():
        return [(leafd.INCR, 1)] * 10

    def mixed():
        batch = [(leafd.INCR, 1)] * 10
        if rng.randrange(4) == 0:
            batch[rng.randrange(10)] = (leafd.INCRBY, INCRBY)
        return batch

    def snowflakes():
        return [(leafd.SNOWFLAKE, 20)] * 5

    loaders = [leafd.Loader(node, f"{node.name}/incr", tag, incr, stop, pause=0.002),
               leafd.Loader(node, f"{node.name}/incrby", tag, mixed, stop, pause=0.002),
               leafd.Loader(node, f"{node.name}/snowflake", tag, snowflakes, stop, pause=0.01)]
    for loader in loaders:
        loader.owner = node.name
        loader.start()
    return loaders


def metric_sum(node, name, **labels):
    """The sum of a metric's samples on the node's /metrics whose labels include `labels`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return int(total)


def stop_loaders(loaders):
    for loader in loaders:
        loader.stop_event.set()
    for loader in loaders:
        loader.join(30)


# --- the checks ----------------------------------------------------------------------------------

def runs_of(ids, blocks):
    """Contiguous runs [first, last] of a set of IDs given as singles and (first, last) blocks."""
    spans = sorted([(v, v) for v in set(ids)] + list(blocks))
    runs = []
    for first, last in spans:
        if runs and first <= runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], last)
        else:
            runs.append([first, last])
    return runs


def handovers(sources):
    """`sources`: {owner: loaders}. The runs of each owner's segment IDs; then, in ID order, how
    often the next run belongs to another owner (a range boundary between two nodes), by kind
    of owner (kind_of). Returns ({owner: runs}, Counter)."""
    runs = {}
    for owner, loaders in sources.items():
        singles = [v for l in loaders for v in l.singles]
        blocks = [b for l in loaders for b in l.blocks]
        runs[owner] = runs_of(singles, blocks)
    ordered = sorted((first, last, owner) for owner, rs in runs.items() for first, last in rs)
    kinds = collections.Counter()
    for (_, _, a), (_, _, b) in zip(ordered, ordered[1:]):
        if a != b:
            kinds[f"{kind_of(a)}->{kind_of(b)}"] += 1
    return runs, kinds


def kind_of(owner):
    """Leaf (a stand-in), leafd-prev (the previous release) or leafd (the binary under test)."""
    if owner.startswith("leaf-"):
        return "Leaf"
    return "leafd-prev" if owner.startswith("leafd-prev") else "leafd"


def worker_of(snowflake_id):
    return (snowflake_id >> 12) & 0x3FF


class Tally:
    """Every snowflake ID of the whole run, across scenarios."""

    def __init__(self):
        self.snowflakes = set()
        self.repeats = 0

    def add(self, loaders):
        repeats = 0
        for l in loaders:
            for v in l.snowflakes:
                if v in self.snowflakes:
                    repeats += 1
                self.snowflakes.add(v)
        self.repeats += repeats
        return repeats


def judge(label, loaders, owners, max_id, loads, tally, extra_failures):
    """The checks and the summary line of one scenario; its failures."""
    report = leafd.IdReport(loaders, max_id)
    sources = collections.defaultdict(list)
    for l in loaders:
        sources[l.owner].append(l)
    runs, kinds = handovers(sources)
    cross = tally.add(loaders)  # snowflake repeats against the earlier scenarios too
    per_node = []
    for owner in owners:
        ls = sources.get(owner, [])
        seg = sum(len(l.singles) + sum(b - a + 1 for a, b in l.blocks) for l in ls)
        sf = [v for l in ls for v in l.snowflakes]
        workers = sorted({worker_of(v) for v in sf})
        per_node.append(f"{owner} {seg} seg ({loads.get(owner, '?')} loads, {len(runs.get(owner, []))} runs)"
                        f" + {len(sf)} sf (worker {','.join(map(str, workers)) or '-'})")
    crossed = sum(kinds.values())
    print(f"{label}: segment IDs {report.segment_ids}, snowflake IDs {report.snowflake_ids}; "
          f"{'; '.join(per_node)}; boundaries crossed {crossed} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or 'none'}); "
          f"repeated segment IDs {report.repeats}, repeated snowflake IDs {cross}, "
          f"errors {dict(sorted(report.errors.items()))}", flush=True)
    failures = list(extra_failures) + report.failures()
    if cross > report.snowflake_repeats:
        failures.append(f"{cross - report.snowflake_repeats} snowflake IDs repeat IDs of an earlier scenario")
    if report.segment_ids == 0 or report.snowflake_ids == 0:
        failures.append("no IDs served")
    # Two nodes serving at once must never share a worker id: compare per owner.
    workers = {}
    for owner, ls in sources.items():
        for w in {worker_of(v) for l in ls for v in l.snowflakes}:
            workers.setdefault(w, set()).add(owner)
    shared = {w: sorted(o) for w, o in workers.items() if len(o) > 1}
    if shared:
        failures.append(f"worker ids used by more than one node: {shared}")
    return failures


# --- scenarios -----------------------------------------------------------------------------------

def leaf_mixed(args, mysql, database, leaf_name, work, tally):
    """Leaf stand-ins and new leafd nodes on Leaf's own table and ZooKeeper tree."""
    tag = "leafmix"
    mysql.sql(f"CREATE DATABASE {database}")
    # Leaf's README: its DDL and its first row (max_id 1).
    mysql.sql("""
        CREATE TABLE `leaf_alloc` (
          `biz_tag` varchar(128) NOT NULL DEFAULT '',
          `max_id` bigint(20) NOT NULL DEFAULT '1',
          `step` int(11) NOT NULL,
          `description` varchar(256) DEFAULT NULL,
          `update_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
          PRIMARY KEY (`biz_tag`)
        ) ENGINE=InnoDB;
        INSERT INTO leaf_alloc (biz_tag, max_id, step, description)
          VALUES ('%s', 1, %d, 'leaf_mixed.py');""" % (tag, STEP), database)
    url = mysql.url(database)
    leaf_a = LeafNode("leaf-A", mysql, database, tag, args.zookeeper, leaf_name, work, leafd.free_port())
    leaf_b = LeafNode("leaf-B", mysql, database, tag, args.zookeeper, leaf_name, work, leafd.free_port())
    n1 = leafd_node(args.new, work, "leafd-1", url, args.zookeeper, leaf_name)
    # A host name with Leaf's separator in it, as the compose demo's "leafd-1:6380".
    n2 = leafd_node(args.new, work, "leafd-2", url, args.zookeeper, leaf_name, advertise_host="leafd-2")
    nodes, loaders, failures, loads = [n1, n2], [], [], {}
    stop = threading.Event()
    try:
        if not leaf_a.start():
            failures.extend(leaf_a.problems)
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_ready(60)
        for node in nodes:
            loaders += leafd_load(node, tag, stop)
        # Leaf B starts with leafd's nodes in the tree: it must parse their names.
        if not leaf_b.start():
            print(f"  leaf-B did not start: {leaf_b.problems[-1]}", flush=True)
        time.sleep(BOTH)
        leaf_a.stop()
        leaf_b.stop()
        time.sleep(ALONE)  # leafd alone
        stop.set()
        stop_loaders(loaders)
        for node in nodes:
            loads[node.name] = metric_sum(node, "leafd_segment_loads_total", tag=tag, result="ok")
            node.terminate()
        for node in nodes:
            code = node.wait(15)
            if code != 0:
                failures.append(f"{node.name} exited with status {code} after SIGTERM")
        for leaf in (leaf_a, leaf_b):  # Leaf alone: both restart, finding their own nodes
            if not leaf.start():
                print(f"  {leaf.name} did not start again: {leaf.problems[-1]}", flush=True)
        time.sleep(ALONE)
    finally:
        stop.set()
        stop_loaders(loaders)
        leaf_a.stop()
        leaf_b.stop()
        leafd.stop_all(nodes)
    for leaf in (leaf_a, leaf_b):
        loads[leaf.name] = leaf.segment_loads
        failures.extend(leaf.problems)
    max_id = int(mysql.sql(f"SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'", database)[0][0])
    print(f"  leaf_alloc after leaf-mixed: max_id {max_id}; "
          f"ZooKeeper forever children: {args.zk_children()}", flush=True)
    everyone = loaders + leaf_a.served + leaf_b.served
    if failures:
        for node in nodes:
            print(f"  last log lines of {node.name}:\n{node.log_tail(6)}", flush=True)
    return judge("leaf-mixed", everyone, ["leafd-1", "leafd-2", "leaf-A", "leaf-B"], max_id, loads,
                 tally, failures)


def upgrade(args, mysql, database, leaf_name, work, tally):
    """The previous leafd release and the new one on one table, then the new one alone."""
    tag = "upgrade"
    mysql.sql(f"CREATE DATABASE {database}")
    url = mysql.url(database)
    tags = [{"tag": tag, "step": STEP}]
    old = leafd_node(args.prev, work, "leafd-prev", url, args.zookeeper, leaf_name, tags=tags)
    new = leafd_node(args.new, work, "leafd-new", url, args.zookeeper, leaf_name, tags=tags)
    loaders, failures, loads = [], [], {}
    stop_old, stop_new = threading.Event(), threading.Event()
    nodes = [old, new]
    try:
        old.start().wait_ready(60)
        old_loaders = leafd_load(old, tag, stop_old)
        time.sleep(1.0)
        new.start().wait_ready(60)  # migrates the table under the previous node's load
        new_loaders = leafd_load(new, tag, stop_new)
        loaders = old_loaders + new_loaders
        time.sleep(BOTH - 5)
        stop_loaders(old_loaders)
        loads[old.name] = metric_sum(old, "leafd_segment_loads_total", tag=tag, result="ok")
        old.terminate()
        if old.wait(15) != 0:
            failures.append(f"{old.name} exited with status {old.process.returncode} after SIGTERM")
        time.sleep(ALONE)
        stop_loaders(new_loaders)
        loads[new.name] = metric_sum(new, "leafd_segment_loads_total", tag=tag, result="ok")
        # A rollback: the previous binary once more, on the table the new one migrated.
        again = old.twin("leafd-prev-again")
        again.start()
        answered = again.wait_ready(20, allow_exit=True)
        if answered is None:
            lines = [l for l in again.log_text().splitlines() if l.strip()]
            print(f"  the previous binary restarted after the upgrade: exited "
                  f"{again.process.returncode}: {(lines or ['?'])[-1][:240]}", flush=True)
        else:
            print("  the previous binary restarted after the upgrade: it starts", flush=True)
        again.stop()
    finally:
        stop_old.set()
        stop_new.set()
        stop_loaders(loaders)
        leafd.stop_all(nodes)
    max_id = int(mysql.sql(f"SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'", database)[0][0])
    if failures:
        for node in nodes:
            print(f"  last log lines of {node.name}:\n{node.log_tail(6)}", flush=True)
    return judge("upgrade", loaders, [old.name, new.name], max_id, loads, tally, failures)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("new", help="the leafd binary under test")
    parser.add_argument("prev", help="the previous leafd release's binary")
    parser.add_argument("--mysql", required=True, help="mysql://user[:password]@host:port (a database is made and dropped)")
    parser.add_argument("--zookeeper", required=True, help="host:port")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    args.new, args.prev = os.path.abspath(args.new), os.path.abspath(args.prev)
    for binary in (args.new, args.prev):
        if not leafd.wait_for_file(binary, 120):
            raise SystemExit(f"no leafd binary at {binary}")
    logging.basicConfig(level=logging.CRITICAL)  # kazoo's reconnect chatter
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    mysql = MySQL(args.mysql)
    suffix = f"{os.getpid()}_{random.randrange(1 << 20)}"
    databases = [f"leafd_leafmix_{suffix}", f"leafd_leafup_{suffix}"]
    leaf_name = f"leafmix{suffix}"  # Leaf's own rule: leaf.name without "-"
    work = tempfile.mkdtemp(prefix="leafd-leaf-mixed-")
    admin = KazooClient(hosts=args.zookeeper, timeout=6.0)
    admin.start(timeout=15)

    def zk_children():
        try:
            return sorted(admin.get_children(f"/snowflake/{leaf_name}/forever"))
        except NoNodeError:
            return []
    args.zk_children = zk_children
    tally = Tally()
    began = time.monotonic()
    failed = []
    try:
        for name, scenario, database in (("leaf-mixed", leaf_mixed, databases[0]),
                                         ("upgrade", upgrade, databases[1])):
            started = time.monotonic()
            try:
                failures = scenario(args, mysql, database, leaf_name, work, tally)
            except (leafd.NodeError, RuntimeError, OSError, subprocess.TimeoutExpired, Failure) as e:
                failures = [f"{type(e).__name__}: {e}"]
            if not leafd.print_outcome(name, failures, started):
                failed.append(name)
    finally:
        for database in databases:
            try:
                mysql.sql(f"DROP DATABASE IF EXISTS {database}")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"leaf_mixed: could not drop {database}: {e}", flush=True)
        try:
            admin.delete(f"/snowflake/{leaf_name}", recursive=True)
        except Exception as e:  # noqa: BLE001
            print(f"leaf_mixed: could not remove /snowflake/{leaf_name}: {e}", flush=True)
        admin.stop()
        admin.close()
        if args.keep or failed:
            print(f"leaf_mixed: logs in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        raise SystemExit(f"leaf_mixed: FAILED {', '.join(failed)}")
    print(f"leaf_mixed: both scenarios passed in {time.monotonic() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
