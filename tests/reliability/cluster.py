"""Several leafd nodes of one configuration as a cluster: started together on a new database,
and served behind HAProxy through rolling restarts, a node added and a SIGKILL.

Part 1, simultaneous starts: per dialect (MariaDB, PostgreSQL, SQLite) and round (3 each), a new
database and 5 nodes of ONE config file and one working directory (each its own ports), all
spawned at the same instant. Every node must reach /ready 200 without exiting (migrations, the
configured tag's creation and the worker-id leases all race), then serve INCR and SNOWFLAKE:
all IDs distinct, each node its own snowflake worker id, each exits 0 on SIGTERM.

Part 2, behind HAProxy: 3 nodes of one config on a new MariaDB database, HAProxy in TCP mode in
front (health check GET /ready every 100 ms, 4 servers declared: the 4th is down until it
starts). 16 client threads loop on pipelines of INCR segment:<tag> and SNOWFLAKE through it; a
command whose connection is closed, reset or silent for READ_TIMEOUT is re-sent on a new
connection. Meanwhile: rolling restart (SIGTERM node 1, wait for its exit, start it again, wait
until HAProxy has it up; then node 2, node 3), a 4th node started, node 2 SIGKILLed and restarted
at once. Checks: no ID twice (per kind), no error reply, per connection IDs increasing, every
graceful stop exits 0 within GRACEFUL_BOUND, no request (pipeline, its re-sends included) waits
longer than LATENCY_BOUND (250 ms, the issue's bound) and no gap with no ID answered longer than
that either; both net of the moments this script itself was not scheduled (measured, printed).

What keeps it that short, measured (about 40-90 ms at worst on 2 cores, debug build): a node's
drain closes idle connections and a killed process's sockets are reset by the kernel, so a lost
command is noticed at once, never by READ_TIMEOUT; a new connection HAProxy sends to a node that
is not listening (draining, starting, killed, before the 100 ms check marks it down) is refused
and, with `balance roundrobin` and `option redispatch 1`, retried on the next server at once.
HAProxy waits min(timeout connect, 1 s) before a retry on the same server (leastconn, or no
redispatch): that configuration measured 217 ms here with `timeout connect 200ms`, and would be
1 s with the default. A host that vanishes without a reset (power, network) is not covered: its
in-flight commands wait for the client's own timeout.

usage: cluster.py LEAFD_BIN [--only starts|haproxy] [--keep]
Needs MariaDB on 127.0.0.1:3306 (root, no password), PostgreSQL on 127.0.0.1:5432 (postgres,
trust), mysql, psql and /usr/sbin/haproxy (scripts/services.sh). About 30 s. Prints per dialect
the rounds, nodes up and time to all ready; for HAProxy the events, HAProxy's view of them, IDs
per kind, repeats, error replies, commands lost and re-sent, the latency percentiles, the
longest gap, the slowest requests (with what they waited on) and each graceful stop's time.
"""
import argparse
import array
import collections
import contextlib
import csv
import http.client
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

MYSQL = ("127.0.0.1", 3306, "root")
POSTGRES = ("127.0.0.1", 5432, "postgres")
HAPROXY = "/usr/sbin/haproxy"
TAG = "cluster"

START_NODES, START_ROUNDS = 5, 3
START_BOUND = 60           # seconds for all nodes of a round to be ready

CLIENTS = 16
BATCH = [leafd.INCR, leafd.SNOWFLAKE] * 4  # one pipeline: 8 commands, both kinds
PAUSE = 0.005              # between a client's pipelines: 2 cores run 4 nodes, HAProxy, MariaDB and us
READ_TIMEOUT = 1.0         # a reply (or connect) slower than this counts as lost and is re-sent
NOTABLE = 0.02             # a pipeline slower than this is kept with its details
GIVE_UP = 10.0             # a request unanswered this long, re-sends included, fails the run
# A node's drain: idle connections are closed at once, in-flight commands finish; the nodes'
# shutdown_timeout_secs is 2 (leafd.Node), so a stop past 3 s is a hang.
GRACEFUL_BOUND = 3.0
LATENCY_BOUND = 0.25       # the bound; what keeps requests under it: the docstring
WARM, BETWEEN, TAIL = 3.0, 3.0, 4.0  # seconds of load before, between and after the events


def run(cmd, timeout=30):
    """A command's stdout; RuntimeError with its stderr when it fails."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{cmd[0]} did not finish in {timeout} s: {' '.join(cmd)}") from None
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()[-800:]}")
    return result.stdout.strip()


class Failure(Exception):
    pass


# --- databases ----------------------------------------------------------------------------------

class Database:
    """A new, empty database of one dialect (a unique name: concurrent runs do not meet), its
    storage URL, dropped by drop()."""

    def __init__(self, dialect, name, work):
        self.dialect, self.name = dialect, name
        if dialect == "mysql":
            host, port, user = MYSQL
            self.sql(f"CREATE DATABASE {name}")
            self.url = f"mysql://{user}@{host}:{port}/{name}?ssl-mode=disabled"
        elif dialect == "postgres":
            host, port, user = POSTGRES
            self.sql(f"CREATE DATABASE {name}")
            self.url = f"postgres://{user}@{host}:{port}/{name}?sslmode=disable"
        else:
            # One new file for all nodes; leafd creates it (the first process to get there).
            self.url = f"sqlite://{work}/{name}.db"

    def sql(self, statement):
        if self.dialect == "mysql":
            host, port, user = MYSQL
            return run(["mysql", f"-u{user}", f"-h{host}", f"-P{port}", "-N", "-e", statement])
        host, port, user = POSTGRES
        return run(["psql", "-h", host, "-p", str(port), "-U", user, "-d", "postgres", "-X", "-q",
                    "-v", "ON_ERROR_STOP=1", "-c", statement])

    def drop(self):
        if self.dialect == "mysql":
            self.sql(f"DROP DATABASE IF EXISTS {self.name}")
        elif self.dialect == "postgres":
            # FORCE: a node killed in a failed run may still hold a session for a moment.
            self.sql(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


# --- nodes --------------------------------------------------------------------------------------

def http_get(port, path, timeout=1.0):
    """(status, body) of GET path on 127.0.0.1:port; None when nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace").strip()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


_taken = set()


def port():
    """A free port not handed out before by this script: leafd.free_port alone may give the same
    port twice while none of the nodes has bound it yet."""
    while True:
        p = leafd.free_port()
        if p not in _taken:
            _taken.add(p)
            return p


def make_nodes(binary, work, url, count, config):
    """`count` processes of ONE config file and one directory (the state directory: fences per
    worker id, segment marks), each with its own RESP port and a fixed HTTP port (HAProxy and
    the readiness polls need it before the node starts)."""
    first = leafd.Node(binary, work, "node1", url, config=config, http_bind="127.0.0.1:0")
    first.log_path = os.path.join(first.dir, "node1.log")  # twins log to <name>.log beside it
    nodes = [first] + [first.twin(f"node{i}") for i in range(2, count + 1)]
    for node in nodes:
        node.port, node.http_port = port(), port()
        node.http_bind = f"127.0.0.1:{node.http_port}"
    return nodes


def wait_ready(nodes, seconds, since):
    """Until every node answers /ready 200: {node name: seconds from `since`}. Failure at once
    when a node exits, or after `seconds` with the last /ready answer and the log's tail."""
    deadline = time.monotonic() + seconds
    ready, last = {}, {}
    while len(ready) < len(nodes):
        for node in nodes:
            if node.name in ready:
                continue
            if node.process.poll() is not None:
                raise Failure(f"{node.name} exited with status {node.process.returncode} while "
                              f"starting (last /ready: {last.get(node.name)})\n{node.log_tail()}")
            answer = http_get(node.http_port, "/ready", timeout=0.5)
            last[node.name] = answer
            if answer and answer[0] == 200:
                ready[node.name] = time.monotonic() - since
        if len(ready) < len(nodes):
            if time.monotonic() >= deadline:
                late = [n for n in nodes if n.name not in ready]
                raise Failure(f"not ready after {seconds} s: " + "; ".join(
                    f"{n.name} (last /ready: {last.get(n.name)})\n{n.log_tail()}" for n in late))
            time.sleep(0.01)
    return ready


def stop_gracefully(node, bound=GRACEFUL_BOUND):
    """SIGTERM and wait for the exit: its duration. Failure when the exit status is not 0 or
    the node needs longer than `bound` (it is SIGKILLed after 15 s, so a hang ends)."""
    started = time.monotonic()
    node.terminate()
    try:
        code = node.wait(15)
    except subprocess.TimeoutExpired:
        node.kill()
        raise Failure(f"{node.name} still running 15 s after SIGTERM (SIGKILLed)\n{node.log_tail()}")
    took = time.monotonic() - started
    if code != 0:
        raise Failure(f"{node.name} exited with status {code} after SIGTERM\n{node.log_tail()}")
    if took > bound:
        raise Failure(f"{node.name} took {took:.2f} s to exit after SIGTERM (bound {bound} s)\n"
                      f"{node.log_tail()}")
    return took


def log_warnings(nodes):
    """The WARN and ERROR lines of the nodes' logs (one log file per process name), counted by
    message (timestamps and fields after the message cut): printed, not judged."""
    seen = collections.Counter()
    for path in sorted({n.log_path for n in nodes}):
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            for line in f:
                parts = line.split(None, 3)
                if len(parts) == 4 and parts[1] in ("WARN", "ERROR"):
                    seen[f"{parts[1]} {parts[3][:150].strip()}"] += 1
    return seen


def worker_of(snowflake_id):
    return (snowflake_id >> 12) & 0x3FF


# --- part 1: simultaneous starts ----------------------------------------------------------------

def start_round(binary, dialect, round_no, work):
    """One round: a new database, 5 nodes spawned together. (seconds until all were ready,
    segment IDs, snowflake IDs)."""
    name = f"leafd_cluster_{os.getpid()}_{dialect}_{round_no}"
    db = Database(dialect, name, work)
    nodes = []
    try:
        config = {"segment.tags": [{"tag": TAG, "step": 100}]}
        nodes = make_nodes(binary, os.path.join(work, name), db.url, START_NODES, config)
        since = time.monotonic()
        for node in nodes:  # spawn all first: the starts race in migrations, tag, leases
            node.start()
        ready = wait_ready(nodes, START_BOUND, since)
        segment, snowflake, workers = [], [], {}
        for node in nodes:
            with leafd.RespConnection(node.port, timeout=5) as conn:
                replies = conn.pipeline([leafd.command_of(leafd.INCR, TAG)] * 5 + [("SNOWFLAKE",)] * 5)
            if not all(type(r) is int and r > 0 for r in replies):
                raise Failure(f"{dialect} round {round_no}: {node.name} answered {replies}")
            segment += replies[:5]
            snowflake += replies[5:]
            workers[node.name] = {worker_of(i) for i in replies[5:]}
        if len(set(segment)) != len(segment) or len(set(snowflake)) != len(snowflake):
            raise Failure(f"{dialect} round {round_no}: IDs repeat: segment {sorted(segment)}, "
                          f"snowflake {sorted(snowflake)}")
        # Five processes, five leases: two nodes sharing a worker id could repeat IDs later.
        held = [w for ids in workers.values() for w in ids]
        if len(held) != len(nodes) or len(set(held)) != len(nodes):
            raise Failure(f"{dialect} round {round_no}: worker ids per node {workers}")
        for node in nodes:
            stop_gracefully(node)
        return max(ready.values()), len(segment) + len(snowflake), sorted(held), log_warnings(nodes)
    finally:
        leafd.stop_all(nodes)
        db.drop()


def simultaneous_starts(binary, work):
    for dialect in ("mysql", "postgres", "sqlite"):
        times, ids, workers, warnings = [], 0, set(), collections.Counter()
        for round_no in range(1, START_ROUNDS + 1):
            took, served, held, logged = start_round(binary, dialect, round_no, work)
            times.append(took)
            ids += served
            workers.update(held)
            warnings += logged
        print(f"simultaneous starts {dialect:8}: {START_ROUNDS} rounds, "
              f"{START_NODES * START_ROUNDS}/{START_NODES * START_ROUNDS} nodes up, all ready in "
              f"{' / '.join(f'{t:.2f}' for t in times)} s, {ids} IDs distinct, worker ids {sorted(workers)}, "
              f"log warnings/errors {sum(warnings.values())}", flush=True)
        for line, n in warnings.most_common(5):
            print(f"  {n} x {line}")


# --- part 2: behind HAProxy ---------------------------------------------------------------------

def haproxy_config(port, socket_path, nodes):
    """TCP balancing with the nodes' /ready as health check.
      balance roundrobin + option redispatch 1: a connect refused by a node not yet marked down
        (draining, starting, killed) is retried on the next server at once; HAProxy waits
        min(timeout connect, 1 s) before a retry on the same server, and always with leastconn;
      fall 1 rise 1, inter 100ms: one failed check (503 draining/starting, refused) takes a node
        out, one passed brings it back (/ready is 200 only once it serves);
      timeout check 500ms: a busy node may answer /ready later than `inter`;
      no on-marked-down shutdown-sessions: a draining node finishes its in-flight commands and
        closes its idle connections itself (measured: the same figures with it, the drain being
        over before a check sees it); HAProxy cutting sessions could only lose replies;
      option tcplog to stdout (haproxy.log): per connection the server, Tw/Tc/Tt and retries
        (+1: redispatched)."""
    servers = "\n".join(f"    server {n.name} 127.0.0.1:{n.port} check port {n.http_port}" for n in nodes)
    return f"""global
    maxconn 4096
    stats socket {socket_path} mode 600 level admin
    log stdout format raw local0

defaults
    mode tcp
    log global
    option tcplog
    timeout connect 200ms
    timeout client 60s
    timeout server 60s
    timeout check 500ms
    retries 3
    option redispatch 1

frontend resp
    bind 127.0.0.1:{port}
    default_backend leafd

backend leafd
    balance roundrobin
    option httpchk GET /ready
    http-check expect status 200
    default-server inter 100ms fall 1 rise 1
{servers}
"""


class HAProxy:
    """haproxy in the foreground (-db) on a generated config; a thread polls its stats socket
    every 20 ms and keeps each server's status changes with their times."""

    def __init__(self, work, nodes):
        self.dir = os.path.join(work, "haproxy")
        os.makedirs(self.dir, exist_ok=True)
        self.port = port()
        self.socket_path = os.path.join(self.dir, "stats.sock")
        self.config_path = os.path.join(self.dir, "haproxy.cfg")
        self.config = haproxy_config(self.port, self.socket_path, nodes)
        with open(self.config_path, "w") as f:
            f.write(self.config)
        run([HAPROXY, "-c", "-q", "-f", self.config_path])
        self.log_path = os.path.join(self.dir, "haproxy.log")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([HAPROXY, "-db", "-f", self.config_path], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.status = {}
        self.changes = []  # (monotonic time, server, status)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        leafd.wait_for_port(self.port, 10)
        self.monitor = threading.Thread(target=self._monitor, daemon=True, name="haproxy-stats")
        self.monitor.start()

    def stats(self):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1)
            s.connect(self.socket_path)
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {r["svname"]: r["status"].split(" ")[0] for r in rows
                if r["pxname"] == "leafd" and r["svname"] not in ("FRONTEND", "BACKEND")}

    def _monitor(self):
        while not self.stopped.wait(0.02):
            try:
                now, states = time.monotonic(), self.stats()
            except OSError:
                continue
            with self.lock:
                for server, status in states.items():
                    if self.status.get(server) != status:
                        self.status[server] = status
                        self.changes.append((now, server, status))

    def wait_status(self, server, status, seconds=5):
        """Until HAProxy reports `server` as `status` (UP, DOWN); the time it was first seen."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.lock:
                if self.status.get(server) == status:
                    return max(t for t, s, st in self.changes if s == server)
            time.sleep(0.01)
        raise Failure(f"HAProxy did not report {server} {status} within {seconds} s "
                      f"(status {self.status.get(server)})")

    def first_change(self, server, status, since):
        with self.lock:
            return next((t for t, s, st in self.changes if s == server and st == status and t >= since), None)

    def stop(self):
        self.stopped.set()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


class Request:
    """One pipeline as the client lived it: when it was first sent, how long until its last
    reply, and each connection it was lost on (node, reason, seconds into the request)."""
    __slots__ = ("client", "started", "took", "losses", "node")

    def __init__(self, client, started):
        self.client, self.started, self.took, self.losses, self.node = client, started, None, [], None


class Client(threading.Thread):
    """Loops on pipelines of BATCH through HAProxy until stopped. Each new connection first asks
    INFO server (pipelined with the commands), so every loss and reply is tied to a node. A
    command not answered because its connection closed, reset or stayed silent READ_TIMEOUT is
    re-sent on a new connection: lost and re-sent."""

    def __init__(self, n, port, stop, node_of_port):
        super().__init__(daemon=True, name=f"client-{n}")
        self.port, self.stop_event, self.node_of_port = port, stop, node_of_port
        # Arrays, not lists of objects: the garbage collector's full passes over hundreds of
        # thousands of objects hold the GIL, and every client thread would wait (and measure it).
        self.segment, self.snowflake = array.array("q"), array.array("q")
        self.answered = array.array("d")   # monotonic time of each reply with an ID
        self.took = array.array("d")       # seconds per pipeline, re-sends included
        self.notable = []                  # Request: those with a loss or slower than NOTABLE
        self.errors = []            # (time, node, reply)
        self.unexpected = []
        self.order_violations = []
        self.resent = 0             # commands re-sent after their connection was lost
        self.losses = collections.Counter()  # connections lost, by node and reason
        self.connections = 0
        self.gave_up = None

    def run(self):
        conn, node = None, None
        try:
            while not self.stop_event.is_set():
                request = Request(self.name, time.monotonic())
                pending = list(BATCH)
                failures = 0
                while pending:
                    elapsed = time.monotonic() - request.started
                    if elapsed > GIVE_UP:
                        self.gave_up = f"{len(pending)} commands unanswered after {elapsed:.1f} s: {request.losses}"
                        return
                    if failures > 1:
                        time.sleep(0.005)  # every server refusing: do not spin
                    try:
                        if conn is None:
                            conn = leafd.RespConnection(self.port, timeout=READ_TIMEOUT)
                            self.connections += 1
                            conn.send([("INFO", "server")] + [leafd.command_of(k, TAG) for k in pending])
                            node = self._node(conn.read_reply())
                            prev_segment = prev_snowflake = None
                        else:
                            conn.send([leafd.command_of(k, TAG) for k in pending])
                        while pending:
                            reply = conn.read_reply()
                            now = time.monotonic()
                            kind = pending.pop(0)
                            if type(reply) is int:
                                self.answered.append(now)
                                if kind == leafd.INCR:
                                    self.segment.append(reply)
                                    if prev_segment is not None and reply <= prev_segment:
                                        self.order_violations.append(f"{node}: INCR {prev_segment} then {reply}")
                                    prev_segment = reply
                                else:
                                    self.snowflake.append(reply)
                                    if prev_snowflake is not None and reply <= prev_snowflake:
                                        self.order_violations.append(f"{node}: SNOWFLAKE {prev_snowflake} then {reply}")
                                    prev_snowflake = reply
                            elif isinstance(reply, leafd.ErrorReply):
                                self.errors.append((now, node, f"-{reply}"))
                            else:
                                self.unexpected.append(f"{node}: {kind}: {reply!r}"[:120])
                    except OSError as e:
                        reason = "timeout" if isinstance(e, socket.timeout) else type(e).__name__
                        if isinstance(e, ConnectionError) and "closed" in str(e):
                            reason = "closed"
                        request.losses.append((node, reason, round(time.monotonic() - request.started, 4)))
                        self.losses[(node, reason)] += 1
                        self.resent += len(pending)
                        failures += 1
                        conn.close() if conn else None
                        conn, node = None, None
                request.took = time.monotonic() - request.started
                request.node = node
                self.took.append(request.took)
                if request.losses or request.took > NOTABLE:
                    self.notable.append(request)
                self.stop_event.wait(PAUSE)
        finally:
            if conn is not None:
                conn.close()

    def _node(self, info):
        """The node behind this connection, from INFO server's tcp_port (process_id tells the
        processes of a restarted node apart)."""
        if isinstance(info, bytes):
            fields = dict(line.split(":", 1) for line in info.decode().splitlines() if ":" in line)
            name = self.node_of_port.get(int(fields.get("tcp_port", 0)), "?")
            return f"{name}/pid {fields.get('process_id', '?')}"
        if isinstance(info, leafd.ErrorReply):
            self.errors.append((time.monotonic(), None, f"-{info} (INFO server)"))
        else:
            self.unexpected.append(f"INFO server: {info!r}"[:120])
        return "?"


class Stalls(threading.Thread):
    """Sleeps 2 ms in a loop and keeps every wake-up later than STALL: times this script itself
    was not running (CPU taken by other processes, the GIL held). A slow request that overlaps
    one was (at least partly) waiting on the client, not on HAProxy or leafd."""

    STALL = 0.02

    def __init__(self, stop):
        super().__init__(daemon=True, name="stalls")
        self.stop_event, self.seen = stop, []  # (start, seconds)

    def run(self):
        before = time.monotonic()
        while not self.stop_event.is_set():
            time.sleep(0.002)
            now = time.monotonic()
            if now - before > self.STALL:
                self.seen.append((before, now - before - 0.002))
            before = now

    def during(self, start, end):
        """Seconds of stall within [start, end]."""
        return sum(max(0.0, min(end, t + d) - max(start, t)) for t, d in self.seen)


def behind_haproxy(binary, work):
    db = Database("mysql", f"leafd_cluster_{os.getpid()}_haproxy", work)
    nodes, proxy, clients, stop = [], None, [], threading.Event()
    record = {"events": [], "graceful": []}  # what happened, for the report
    try:
        config = {"segment.tags": [{"tag": TAG, "step": 1000}]}
        nodes = make_nodes(binary, os.path.join(work, "haproxy-nodes"), db.url, 4, config)
        for node in nodes[:3]:
            node.start()
        wait_ready(nodes[:3], 30, time.monotonic())
        proxy = HAProxy(work, nodes)
        for node in nodes[:3]:
            proxy.wait_status(node.name, "UP")
        proxy.wait_status(nodes[3].name, "DOWN")  # declared, not started: its check fails

        node_of_port = {n.port: n.name for n in nodes}
        clients = [Client(i, proxy.port, stop, node_of_port) for i in range(CLIENTS)]
        stalls = Stalls(stop)
        record["began"], record["began_wall"] = time.monotonic(), time.time()
        stalls.start()
        for c in clients:
            c.start()
        scenario(nodes, proxy, clients, record)
        stop.set()
        record["ended"] = time.monotonic()
        for c in clients:
            c.join(GIVE_UP + 5)
        if any(c.is_alive() for c in clients):
            raise Failure("a client is still waiting after the run")
        check_alive(nodes, clients)
        for node in nodes:
            record["graceful"].append((f"{node.name} (end)", stop_gracefully(node)))
        report(clients, stalls, proxy, record, log_warnings(nodes))
    finally:
        stop.set()
        for c in clients:
            c.join(GIVE_UP + 5)
        leafd.stop_all(nodes)
        if proxy is not None:
            proxy.stop()
        db.drop()


def check_alive(nodes, clients):
    for n in nodes:
        if n.died() is not None:
            raise Failure(f"{n.name} exited with status {n.died()} on its own\n{n.log_tail()}")
    gave_up = [c.gave_up for c in clients if c.gave_up]
    if gave_up:
        raise Failure(f"a client gave up: {gave_up[0]}")


def scenario(nodes, proxy, clients, record):
    """While the clients run: rolling restart of nodes 1-3, node 4 added, node 2 SIGKILLed and
    started again at once. Each start waits for /ready and for HAProxy to have the node UP, as
    a careful rolling restart would before touching the next node."""
    def event(what):
        record["events"].append((time.monotonic(), what))

    def start(node, why):
        node.start()
        since = time.monotonic()
        wait_ready([node], 30, since)
        proxy.wait_status(node.name, "UP")
        event(f"{node.name} {why}: ready after {time.monotonic() - since:.2f} s, HAProxy UP")

    time.sleep(WARM)
    for node in nodes[:3]:
        check_alive(nodes, clients)
        event(f"{node.name} SIGTERM")
        took = stop_gracefully(node)
        record["graceful"].append((node.name, took))
        event(f"{node.name} exited 0 after {took:.3f} s")
        start(node, "restarted")
        time.sleep(BETWEEN)
    check_alive(nodes, clients)
    event(f"{nodes[3].name} started (4th node)")
    start(nodes[3], "added")
    time.sleep(BETWEEN)
    check_alive(nodes, clients)
    victim = nodes[1]
    record["killed"], record["victim"] = time.monotonic(), victim.name
    event(f"{victim.name} SIGKILL")
    victim.kill()
    start(victim, "restarted after SIGKILL")
    record["back"] = time.monotonic()
    time.sleep(TAIL)
    check_alive(nodes, clients)


def report(clients, stalls, proxy, record, warnings):
    """Prints the figures; Failure with every broken check."""
    began, ended, events = record["began"], record["ended"], record["events"]
    segment = array.array("q", sorted(i for c in clients for i in c.segment))
    snowflake = array.array("q", sorted(i for c in clients for i in c.snowflake))
    seg_repeats = sum(1 for a, b in zip(segment, segment[1:]) if a == b)
    sf_repeats = sum(1 for a, b in zip(snowflake, snowflake[1:]) if a == b)
    errors = sorted(e for c in clients for e in c.errors)
    unexpected = [u for c in clients for u in c.unexpected]
    order = [o for c in clients for o in c.order_violations]
    took = sorted(t for c in clients for t in c.took)
    notable = sorted((r for c in clients for r in c.notable), key=lambda r: r.took)
    losses = sum((c.losses for c in clients), collections.Counter())
    resent = sum(c.resent for c in clients)
    answered = sorted(t for c in clients for t in c.answered)
    # The longest time with no ID answered to any client, from the first ID to the stop.
    gap, gap_at = 0.0, None
    for a, b in zip(answered, answered[1:]):
        if b - a > gap:
            gap, gap_at = b - a, a
    if answered and ended - answered[-1] > gap:
        gap, gap_at = ended - answered[-1], answered[-1]

    def at(t):
        return f"t={t - began:6.3f}s"

    def pct(values, p):
        return values[min(len(values) - 1, int(len(values) * p))] * 1000 if values else 0.0

    print(f"behind HAProxy: events (t=0 at {time.strftime('%H:%M:%S', time.gmtime(record['began_wall']))}"
          f".{int(record['began_wall'] % 1 * 1000):03d} UTC, as in the node logs):")
    for t, what in events:
        print(f"  {at(t)}  {what}")
    with proxy.lock:
        changes = [(t, s, st) for t, s, st in proxy.changes if began <= t <= ended]
    print("HAProxy status changes: " + ", ".join(f"{at(t)} {s} {st}" for t, s, st in changes))
    killed, back = record["killed"], record["back"]
    marked_down = proxy.first_change(record["victim"], "DOWN", killed)
    if marked_down is not None and marked_down <= back:
        print(f"HAProxy marked {record['victim']} DOWN {(marked_down - killed) * 1000:.0f} ms after its SIGKILL")
    else:
        # The node was serving again before a check failed (or between two stats polls):
        # connections sent to it meanwhile were refused and redispatched.
        print(f"HAProxy did not mark {record['victim']} DOWN: it was back {(back - killed) * 1000:.0f} ms "
              f"after its SIGKILL, before a check failed")
    print(f"IDs: {len(segment)} segment + {len(snowflake)} snowflake in {ended - began:.1f} s, "
          f"{len(took)} pipelines of {len(BATCH)} by {len(clients)} clients over "
          f"{sum(c.connections for c in clients)} connections")
    print(f"repeats: segment {seg_repeats}, snowflake {sf_repeats}; order violations {len(order)}; "
          f"error replies {len(errors)}; unexpected replies {len(unexpected)}")
    for t, node, reply in errors[:10]:
        print(f"  error {at(t)} from {node}: {reply[:200]}")
    print(f"lost and re-sent: {resent} commands, {sum(losses.values())} connections lost: "
          + (", ".join(f"{n} {why} x{k}" for (n, why), k in sorted(losses.items(), key=str)) or "none"))
    print(f"latency per pipeline (re-sends included): p50 {pct(took, 0.5):.1f} ms, p99 {pct(took, 0.99):.1f} ms, "
          f"p99.9 {pct(took, 0.999):.1f} ms, max {pct(took, 1):.1f} ms")
    lossy = [r for r in notable if r.losses]
    if lossy:
        r = lossy[-1]
        print(f"slowest request with a loss: {r.took * 1000:.1f} ms ({len(lossy)} requests had one), "
              f"losses {r.losses}, answered by {r.node}")
    print(f"client process stalls (a 2 ms sleep woke > {Stalls.STALL * 1000:.0f} ms late): {len(stalls.seen)}, "
          f"longest {max((d for t, d in stalls.seen), default=0) * 1000:.1f} ms; "
          f"load average {os.getloadavg()[0]:.2f}")
    # Only pipelines slower than NOTABLE were kept with their times: the others are within it.
    net_slowest = max((r.took - stalls.during(r.started, r.started + r.took) for r in notable),
                      default=took[-1] if took else 0.0)
    print(f"slowest request: {pct(took, 1):.1f} ms, {net_slowest * 1000:.1f} ms net of client stalls "
          f"(bound {LATENCY_BOUND * 1000:.0f} ms); the five slowest:")
    for r in reversed(notable[-5:]):
        near = min(events, key=lambda e: abs(e[0] - r.started))
        stalled = stalls.during(r.started, r.started + r.took)
        print(f"  {r.took * 1000:7.1f} ms  {r.client} from {at(r.started)} answered by {r.node}; "
              f"losses {r.losses or 'none'}; client stalled {stalled * 1000:.0f} ms of it; "
              f"nearest event {at(near[0])} {near[1]}")
    gap_stalled = stalls.during(gap_at, gap_at + gap) if gap_at else 0.0
    print(f"longest gap with no ID answered: {gap * 1000:.1f} ms from {at(gap_at) if gap_at else '-'} "
          f"(client stalled {gap_stalled * 1000:.0f} ms of it)")
    print("graceful stops (SIGTERM -> exit 0): " + ", ".join(f"{n} {t:.3f} s" for n, t in record["graceful"]))
    print(f"node log warnings/errors: {sum(warnings.values())}")
    for line, n in warnings.most_common(8):
        print(f"  {n} x {line}")

    failures = []
    if seg_repeats or sf_repeats:
        failures.append(f"repeated IDs: segment {seg_repeats}, snowflake {sf_repeats}")
    if errors:
        failures.append(f"{len(errors)} error replies, e.g. {errors[0][2]}")
    if unexpected:
        failures.append(f"{len(unexpected)} unexpected replies, e.g. {unexpected[:3]}")
    if order:
        failures.append(f"{len(order)} order violations, e.g. {order[:3]}")
    if not segment or not snowflake:
        failures.append("no IDs of one kind were served")
    # Judged net of the time this script itself was not running: a client that was not
    # scheduled cannot read a reply that waits for it.
    if net_slowest > LATENCY_BOUND:
        failures.append(f"a request waited {net_slowest * 1000:.0f} ms net of client stalls "
                        f"(slowest {took[-1] * 1000:.0f} ms) > {LATENCY_BOUND * 1000:.0f} ms")
    if gap - gap_stalled > LATENCY_BOUND:
        failures.append(f"longest gap with no ID {gap * 1000:.0f} ms ({gap_stalled * 1000:.0f} ms of it the "
                        f"client stalled) > {LATENCY_BOUND * 1000:.0f} ms")
    if failures:
        raise Failure("behind HAProxy: " + "; ".join(failures))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--only", choices=["starts", "haproxy"], action="append")
    parser.add_argument("--keep", action="store_true", help="keep the logs (a temporary directory)")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    only = set(args.only or ["starts", "haproxy"])
    work = tempfile.mkdtemp(prefix="leafd-cluster-")
    started = time.monotonic()
    ok = False
    try:
        if "starts" in only:
            simultaneous_starts(binary, work)
        if "haproxy" in only:
            behind_haproxy(binary, work)
        ok = True
    except (Failure, leafd.NodeError, RuntimeError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
    finally:
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs kept in {work}", file=sys.stderr if not ok else sys.stdout)
    print(f"cluster.py {'passed' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
    sys.exit(0 if ok else 1)


main()
