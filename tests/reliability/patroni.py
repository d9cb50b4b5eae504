"""leafd on PostgreSQL under Patroni (issue 33): a private cluster on 127.0.0.1 of one etcd
member, two Patroni members (PostgreSQL 15, synchronous mode) and HAProxy routing to the primary,
three leafd nodes under load, the primary SIGKILLed and later a planned switchover, every ID of
every node collected.

The cluster (Debian's patroni, etcd-server, haproxy and postgresql packages, installed here when
missing): etcd on a private client and peer port with its data under a temporary directory;
Patroni members pg1 and pg2, each its own REST port, PostgreSQL port and data directory, the
DCS settings of issue 33 (TTL, LOOP_WAIT, RETRY_TIMEOUT; synchronous_mode on, not strict: with
one member left the primary goes on alone, and Patroni then promotes no member that was not the
synchronous standby). pg1 is bootstrapped first, pg2 joins by pg_basebackup and becomes the
synchronous standby. As root, Patroni and PostgreSQL run as `postgres` (PostgreSQL refuses
root). HAProxy listens on a private port, TCP mode, health check `OPTIONS /primary` on each
member's Patroni REST port (200 only on the member holding the leader key), marked down after 2
failed checks of 250 ms, its client sessions then cut (on-marked-down shutdown-sessions), so no
leafd connection stays on a demoted primary; `timeout connect` 250 ms (see HAPROXY_CONNECT_MS:
with 1 s, HAProxy's retry turn-around, not leafd, set the switchover's recovery at 0.99 s).

The leafd nodes: three, each its own state directory, all on one storage URL (--via):
  haproxy     postgres://leafd@127.0.0.1:<haproxy>/leafd?sslmode=disable (the default)
  multi-host  postgres://leafd@127.0.0.1:<pg1>,127.0.0.1:<pg2>/leafd?target_session_attrs=
              read-write&sslmode=disable: leafd picks the writable host itself (no HAProxy).
              Needs a leafd with multi-host URLs (src/storage/pg_hosts.rs); an older binary
              refuses the URL and the run fails at the nodes' start.
The tag has a short fixed step (STEP, adaptive step off), so every node allocates many times a
second and runs dry within a fraction of a second of the database going away.
segment.failover_margin is 0 (--margin to change it): with synchronous replication every
allocation whose COMMIT leafd saw acknowledged is on the synchronous standby before the
acknowledgement, and Patroni promotes only that standby, so a failover loses no allocation a node
may have used and there is nothing to skip over (a COMMIT the killed primary made but never
acknowledged may be lost: leafd never used that range). With the margin at 0 a lost allocation would be
handed out again, and show here as a repeat (failover.py shows it does with asynchronous
replication): the default margin (10,000,000 IDs per tag and failover) would hide exactly what
this test is meant to see. leafd still notices the new instance (a new timeline) and logs it.

The scenario: WARM s of load (per node 2 INCR clients, 1 INCR client with INCRBY mixed in,
1 SNOWFLAKE client with the database coordinator's worker leases, all pipelined); then the
primary (pg1) is SIGKILLed, Patroni and every PostgreSQL process of the member at once (stopped
first, so nothing forks meanwhile), as a host dying; pg2 takes the leader key once it expires
(about TTL s) and promotes itself. A probe writes through pg2's own port (psql, an UPDATE) in a
loop: its first committed write is "the new primary accepted writes". Load goes on until every
node served a new ID (AFTER_MAX bound), then pg1's Patroni is started again: it rewinds or
recovers and rejoins as the synchronous standby. Then `patronictl switchover --candidate pg1
--force`, probed the same way through pg1. Load goes on, then stops; pg2 rejoins.

Which IDs are "new": a trigger on leaf_alloc (installed by the script once the first node made
the schema; leafd does not know of it) records each allocation's old and new max_id and writer
(the instance leafd recorded: system identifier and timeline) in leafd_alloc_history. The first
allocation on a new timeline starts at the old max_id it found: an ID at or above it is one of an
allocation the new primary made. Each node's recovery is the end of its first INCR batch holding
such an ID, minus the probe's first accepted write (negative: the node got there before the
probe). Goal 1 s (a failed load backs off at most 1 s); bound BACK_BOUND.

Checks (non-zero exit on any): no segment ID served twice over all nodes, none above the final
max_id, per connection increasing, no snowflake ID twice, no node exited, no client connection
dropped, no ROLLBACK reply (a node refusing a range below what it served: a lossy failover), no
error reply outside the two outage windows (from the kill or the switchover command to
WINDOW_GRACE s after the new primary's first accepted write: errors inside are printed, by
kind and node), every node served a new ID after each event within BACK_BOUND s, replication was
synchronous before each event, the new primaries are pg2 then pg1 (three writers in the
history), the members agree on max_id at the end.

usage: patroni.py LEAFD_BIN [--via haproxy|multi-host] [--margin N] [--haproxy-connect-ms MS] [--keep]
Runs as root (Patroni and PostgreSQL as `postgres`) or as any user (then as that user).
Loopback only. About 40 s on 2 cores (set-up 7 s; the failover takes TTL s of it). Everything
it started (etcd, Patroni, PostgreSQL, HAProxy, leafd) is killed by pid and its directory
removed at the end, also on failure or SIGTERM (--keep keeps the directory with the logs).
Prints one line per event, per node its IDs, errors in and out of the windows and recovery
seconds, and one summary line.
"""
import argparse
import collections
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402
import servers  # noqa: E402
from servers import wait_until  # noqa: E402

PG_BIN = servers.PG_BIN  # /usr/lib/postgresql/15/bin: Debian 12's postgresql
PG_USER = servers.PG_USER
PATRONI = "/usr/bin/patroni"
PATRONICTL = "/usr/bin/patronictl"
ETCD = "/usr/bin/etcd"
HAPROXY = "/usr/sbin/haproxy"
PYTHON3_ETCD = "/usr/lib/python3/dist-packages/etcd"  # Patroni's etcd3 client imports python-etcd

# Patroni's DCS settings. The leader key lives TTL s without a renewal; each member's HA loop
# runs every LOOP_WAIT s; RETRY_TIMEOUT bounds DCS and PostgreSQL operations (Patroni wants
# loop_wait + 2 * retry_timeout <= ttl). A SIGKILLed primary is replaced about TTL s later.
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 4
# HAProxy: a check every 250 ms, down after 2 failures, up after 1 success.
CHECK_INTER_MS = 250
# HAProxy's `timeout connect`. After a failed connect HAProxy waits min(1 s, timeout connect)
# before its retry (the turn-around). In a switchover the demoted primary counts as UP for 2 more
# checks, and a leafd connection routed to it meanwhile hangs (HAProxy has accepted it) until
# the retries are used up, past leafd's 1 s acquire timeout: with 1s every node served again
# 0.99 s after the new primary took writes, in every run; with 250 ms, 0.37 s.
HAPROXY_CONNECT_MS = 250

TAG = "patroni"
STEP = 100                   # a node allocates every hundred IDs: many times a second
LOAD_CLIENTS = 3             # per node: 2 INCR, 1 INCR with INCRBY mixed in; plus 1 SNOWFLAKE
BATCH = 10
INCRBY = 100
PAUSE = 0.002                # between a client's batches: 2 cores run all of it
WARM, AFTER, AFTER_MAX, MID = 3.0, 2.0, 15.0, 2.0
FAILOVER_BOUND = 60          # seconds from the kill to the new primary's first accepted write
SWITCHOVER_BOUND = 60
REJOIN_BOUND = 90            # seconds for the killed member to be the synchronous standby again
# From the new primary's first accepted write to a node's first ID of a new allocation: the goal
# is 1 s (a failed load backs off at most 1 s, HAProxy checks every 250 ms); the bound leaves
# room for a loaded 2-core machine.
BACK_GOAL, BACK_BOUND = 1.0, 2.0
# An outage window: from the kill (or the switchover command) to this long after the new
# primary's first accepted write. A request that waited its load_timeout_ms (1 s) for the dead
# primary is answered within it.
WINDOW_GRACE = 2.0
MARGIN = 0                   # segment.failover_margin: see the module's text

NODE_ENV = {"RUST_LOG": "info"}


class Failure(Exception):
    pass


# --- packages -----------------------------------------------------------------------------------

def ensure_packages():
    """Debian's patroni (with python3-etcd: Patroni's etcd3 client imports it), etcd-server,
    haproxy and postgresql (15 on Debian 12) when missing. Idempotent: nothing runs when all
    is there."""
    missing = []
    for path, package in ((PATRONI, "patroni"), (ETCD, "etcd-server"), (HAPROXY, "haproxy"),
                          (f"{PG_BIN}/postgres", "postgresql"), ("/usr/bin/psql", "postgresql-client")):
        if not os.path.exists(path):
            missing.append(package)
    # Patroni runs on Debian's python3, which may not be the one running this script.
    if os.path.exists(PATRONI) and not os.path.exists(PYTHON3_ETCD):
        missing.append("python3-etcd")
    if not missing:
        return
    if "patroni" in missing:
        missing.append("python3-etcd")  # the first of its alternatives, named: no surprise
    print(f"installing {' '.join(sorted(set(missing)))} (apt-get)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + sorted(set(missing)),
                   check=True, env=env, stdout=subprocess.DEVNULL)
    for path in (PATRONI, ETCD, HAPROXY, f"{PG_BIN}/postgres"):
        if not os.path.exists(path):
            raise Failure(f"packages installed but {path} is missing")


# --- processes ----------------------------------------------------------------------------------

port = leafd.unique_port


def kill_pids(pids):
    """SIGKILL to each pid, then until none of them runs (5 s at most)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(servers.running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def psql(port_, statement, database="leafd", timeout=15):
    return servers.psql(port_, statement, database=database, timeout=timeout)


def wall_to_monotonic():
    """The offset that turns a UNIX time (the database's clock_timestamp(), HAProxy's log) into
    this process's time.monotonic()."""
    return time.monotonic() - time.time()


# --- the cluster --------------------------------------------------------------------------------

class Etcd:
    """A single-member etcd on 127.0.0.1 (client and peer ports free), data in <dir>/etcd."""

    def __init__(self, work):
        self.dir = os.path.join(work, "etcd")
        os.makedirs(self.dir)
        self.port, self.peer_port = port(), port()
        self.server = None

    def start(self, seconds=30):
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        self.server = servers.Server("etcd", [
            ETCD, "--name", "e1", "--data-dir", os.path.join(self.dir, "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"e1={peer}", "--initial-cluster-state", "new",
            "--initial-cluster-token", f"leafd-patroni-{os.getpid()}"],
            os.path.join(self.dir, "etcd.log"))

        def healthy():
            with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        wait_until("etcd healthy", seconds, healthy)

    def close(self):
        if self.server is not None:
            self.server.kill()


class Member:
    """One Patroni member: <dir>/<name> (the postgres user's) holds its config, data directory,
    Unix socket and log (<name>.log: Patroni's lines and PostgreSQL's, which it starts)."""

    def __init__(self, cluster, name):
        self.cluster, self.name = cluster, name
        self.port, self.rest_port = port(), port()
        self.dir = servers.owned_dir(os.path.join(cluster.dir, name), cluster.user)
        self.data_dir = os.path.join(self.dir, "data")
        self.config_path = os.path.join(self.dir, "patroni.yml")
        self.log_path = os.path.join(self.dir, f"{name}.log")
        self.server = None
        self.starts = 0

    def config(self):
        """Patroni's configuration, as JSON (which YAML reads)."""
        hba = ["local all all trust", "host all all 127.0.0.1/32 trust",
               "host replication all 127.0.0.1/32 trust"]
        return {
            "scope": self.cluster.scope,
            "namespace": "/leafd-test/",
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{self.rest_port}",
                        "connect_address": f"127.0.0.1:{self.rest_port}"},
            "etcd3": {"host": f"127.0.0.1:{self.cluster.etcd.port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True, "synchronous_mode_strict": False,
                    "postgresql": {
                        "use_pg_rewind": True, "use_slots": True,
                        # fsync off: processes are killed here, not the machine (the kernel keeps
                        # what they wrote), on a shared disk (as servers.py does).
                        "parameters": {"max_connections": 100, "wal_keep_size": "256MB",
                                       "hot_standby": "on", "wal_log_hints": "on", "fsync": "off",
                                       "synchronous_commit": "on"},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": self.data_dir,
                "bin_dir": PG_BIN,
                "pgpass": os.path.join(self.dir, "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres-secret"},
                    "replication": {"username": "replicator", "password": "replicator-secret"},
                },
                "parameters": {"unix_socket_directories": self.dir, "shared_buffers": "16MB",
                               "dynamic_shared_memory_type": "mmap",
                               "log_line_prefix": "%m [%p] "},
                "pg_hba": hba,
                # pg_basebackup's default checkpoint is spread over minutes on an idle primary.
                "basebackup": [{"checkpoint": "fast"}],
                # A killed primary that cannot rewind is cloned again.
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "watchdog": {"mode": "off"},
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def write_config(self):
        with open(self.config_path, "w") as f:
            json.dump(self.config(), f, indent=1)
        servers.give_to(self.config_path, self.cluster.user)

    def start(self):
        if self.starts == 0:
            self.write_config()
            open(self.log_path, "a").close()
            servers.give_to(self.log_path, self.cluster.user)
        # Patroni reads PATRONI_* settings from the environment: none of the caller's.
        env_before = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("PATRONI_")}
        try:
            self.server = servers.Server(self.name, [PATRONI, self.config_path], self.log_path,
                                         user=self.cluster.user if os.geteuid() == 0 else None)
        finally:
            os.environ.update(env_before)
        self.starts += 1
        return self

    def postmaster_pid(self):
        """The postmaster's pid (postmaster.pid's first line) if that process runs and is this
        data directory's postgres; else None. Patroni starts it in a session of its own through
        a helper that exits: it is not Patroni's descendant."""
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid")) as f:
                pid = int(f.readline().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except (OSError, ValueError):
            return None
        return pid if self.data_dir in cmdline and servers.running(pid) else None

    def kill(self):
        """SIGKILL to Patroni, the postmaster and every process either started (backends, WAL
        sender, ...), as a host dying: every one is stopped (SIGSTOP) before any is killed, so
        nothing forks or restarts meanwhile and no backend sees the postmaster die and tells its
        client ("terminating connection due to unexpected postmaster exit"): the clients' TCP
        connections are just reset. Returns the pids killed. The postmaster's System V segment
        is released afterwards."""
        patroni = self.server.proc.pid if self.server is not None and self.server.proc.poll() is None else None
        postmaster = self.postmaster_pid()
        tops = [pid for pid in (patroni, postmaster) if pid is not None]
        stopped = set()
        for _ in range(3):  # again, for a child forked while its parent was being stopped
            found = [p for top in tops for p in [top] + servers.descendants(top) if p not in stopped]
            if not found:
                break
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
        pids = sorted(stopped)
        kill_pids(pids)
        if self.server is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.proc.wait(10)
        servers.release_postgres_shared_memory(self.data_dir)
        return pids

    def rest(self, path, timeout=2):
        """(HTTP status, JSON body or None) of GET <path> on the Patroni REST port; (None, None)
        when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}", timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            with contextlib.suppress(Exception):
                return e.code, json.loads(e.read() or b"null")
            return e.code, None
        except (OSError, ValueError):
            return None, None

    def is_primary(self):
        return self.rest("/primary")[0] == 200

    def is_sync_standby(self):
        return self.rest("/sync")[0] == 200

    def sql(self, statement, database="leafd", timeout=15):
        return psql(self.port, statement, database, timeout)

    def write_probe(self, timeout=10):
        """An UPDATE through this member's own port; True if it committed (a standby refuses
        it at once, a primary waiting for its synchronous standby holds it)."""
        # The standby's refusals are not logged (PGOPTIONS: the probe connects as superuser).
        env = dict(os.environ, PGOPTIONS="-c log_min_messages=fatal -c log_min_error_statement=panic",
                   PGCONNECT_TIMEOUT="2")
        try:
            return subprocess.run(
                ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "leafd", "-X", "-q",
                 "-v", "ON_ERROR_STOP=1", "-c", "UPDATE leafd_probe SET n = n + 1"],
                capture_output=True, timeout=timeout, env=env).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def log_text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_tail(self, lines=10):
        return self.server.log_tail(lines) if self.server else ""


class HAProxy:
    """TCP on a free port to the member whose Patroni answers 200 to OPTIONS /primary."""

    def __init__(self, work, members, connect_ms=HAPROXY_CONNECT_MS):
        self.connect_ms = connect_ms
        self.dir = os.path.join(work, "haproxy")
        os.makedirs(self.dir)
        self.port = port()
        self.members = members
        self.config_path = os.path.join(self.dir, "haproxy.cfg")
        self.log_path = os.path.join(self.dir, "haproxy.log")
        self.server = None

    def start(self):
        lines = [
            "global",
            "    maxconn 1000",
            "    log stdout format iso local0 info",
            "defaults",
            "    mode tcp",
            "    log global",
            "    option dontlognull",
            "    option tcplog",
            "    retries 2",
            f"    timeout connect {self.connect_ms}ms",
            "    timeout client 30m",
            "    timeout server 30m",
            "    timeout check 1s",
            "listen postgres",
            f"    bind 127.0.0.1:{self.port}",
            "    option httpchk OPTIONS /primary",
            "    http-check expect status 200",
            f"    default-server inter {CHECK_INTER_MS}ms fastinter {CHECK_INTER_MS}ms "
            f"downinter {CHECK_INTER_MS}ms fall 2 rise 1 on-marked-down shutdown-sessions",
        ] + [f"    server {m.name} 127.0.0.1:{m.port} maxconn 100 check port {m.rest_port}" for m in self.members]
        with open(self.config_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        servers.run([HAPROXY, "-c", "-q", "-f", self.config_path], timeout=20)
        self.server = servers.Server("haproxy", [HAPROXY, "-db", "-f", self.config_path], self.log_path)
        leafd.wait_for_port(self.port, 10)

    def marks(self, offset):
        """[(monotonic time, server, "UP" or "DOWN")] from the log's state changes."""
        out = []
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
        except OSError:
            return out
        line = r"^(\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:?\d\d|Z)?)\S* .*?Server postgres/(\w+) is (UP|DOWN)"
        for m in re.finditer(line, text, re.M):
            stamp = m.group(1)
            with contextlib.suppress(ValueError):
                from datetime import datetime
                t = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                out.append((t + offset, m.group(2), m.group(3)))
        return out

    def close(self):
        if self.server is not None:
            self.server.kill()


class Cluster:
    def __init__(self, work, via, connect_ms=HAPROXY_CONNECT_MS):
        self.dir = work
        self.via = via
        self.user = PG_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.scope = f"leafd-{os.getpid()}"
        self.etcd = Etcd(work)
        self.members = [Member(self, "pg1"), Member(self, "pg2")]
        self.haproxy = HAProxy(work, self.members, connect_ms) if via == "haproxy" else None

    def start(self):
        began = time.monotonic()
        self.etcd.start()
        pg1, pg2 = self.members
        pg1.start()
        wait_until("pg1 bootstrapped and primary", 90, pg1.is_primary, interval=0.2)
        bootstrapped = time.monotonic()
        # leafd's role and database, the probe's table (written by the write probes).
        pg1.sql("CREATE ROLE leafd LOGIN", database="postgres")
        pg1.sql("CREATE DATABASE leafd OWNER leafd", database="postgres")
        pg1.sql("CREATE TABLE leafd_probe (n bigint NOT NULL); INSERT INTO leafd_probe VALUES (0)")
        pg2.start()
        wait_until("pg2 the synchronous standby", 90, pg2.is_sync_standby, interval=0.2)
        self.wait_synchronous(pg1, pg2, 30)
        joined = time.monotonic()
        if self.haproxy is not None:
            self.haproxy.start()
            wait_until("HAProxy routes to pg1", 20, lambda: servers.psql(
                self.haproxy.port, "SELECT inet_server_port()", user="leafd", database="leafd",
                timeout=5) == str(pg1.port), interval=0.1)
        version = pg1.sql("SHOW server_version", database="postgres")
        members = ", ".join(f"{m.name} pg {m.port} rest {m.rest_port}" for m in self.members)
        proxy = (f", HAProxy {self.haproxy.port} (timeout connect {self.haproxy.connect_ms} ms)"
                 if self.haproxy else "")
        print(f"cluster: etcd 127.0.0.1:{self.etcd.port}, {members}{proxy}"
              + f" (PostgreSQL {version}, Patroni ttl {TTL} loop_wait {LOOP_WAIT} retry_timeout {RETRY_TIMEOUT}, "
              f"synchronous_mode): pg1 bootstrapped in {bootstrapped - began:.1f} s, pg2 synchronous "
              f"{joined - bootstrapped:.1f} s later", flush=True)

    @staticmethod
    def sync_state(primary):
        """pg_stat_replication's sync_state of each standby, as the primary reports it."""
        return primary.sql("SELECT coalesce(string_agg(application_name || '=' || sync_state, ','), '') "
                           "FROM pg_stat_replication", database="postgres", timeout=5)

    def wait_synchronous(self, primary, standby, seconds):
        wait_until(f"{standby.name} synchronous on {primary.name}", seconds,
                   lambda: self.sync_state(primary) == f"{standby.name}=sync", interval=0.2)

    def storage_url(self):
        if self.via == "haproxy":
            return f"postgres://leafd@127.0.0.1:{self.haproxy.port}/leafd?sslmode=disable"
        hosts = ",".join(f"127.0.0.1:{m.port}" for m in self.members)
        return f"postgres://leafd@{hosts}/leafd?target_session_attrs=read-write&sslmode=disable"

    def patronictl(self, *args, timeout=60):
        return servers.run([PATRONICTL, "-c", self.members[0].config_path] + list(args), timeout=timeout)

    def close(self):
        for part in ([self.haproxy] if self.haproxy else []) + self.members:
            with contextlib.suppress(Exception):
                part.kill() if isinstance(part, Member) else part.close()
        with contextlib.suppress(Exception):
            self.etcd.close()
        # Whatever a failed step left (a postmaster of a member whose Patroni was already gone).
        kill_pids(servers.leftovers(self.dir))
        for m in self.members:
            servers.release_postgres_shared_memory(m.data_dir)

    def log_tails(self, lines=10):
        parts = [m.log_tail(lines) for m in self.members if m.server]
        if self.haproxy and self.haproxy.server:
            parts.append(self.haproxy.server.log_tail(lines))
        return "\n".join(parts)


# --- load and figures ---------------------------------------------------------------------------

def first_new_id(loaders, after, threshold):
    """The end of the first batch (of the INCR-only loaders) ending after `after` that holds an
    ID >= threshold (one of an allocation the new primary made). None if none yet."""
    firsts = [t for l in loaders if l.name.rsplit("/", 1)[1].startswith("incr-")
              for t, ids in leafd.batches(l) if t >= after and ids and max(ids) >= threshold]
    return min(firsts) if firsts else None


def last_id_before(loaders, until):
    """The end of the last batch with IDs (INCR-only loaders) before `until`, or None."""
    lasts = [t for l in loaders if l.name.rsplit("/", 1)[1].startswith("incr-")
             for t, n, _ in list(l.timeline) if t < until and n]
    return max(lasts) if lasts else None


def first_snowflake_after(loader, after):
    return next((t for t, _, sf in list(loader.timeline) if t > after and sf), None)


class WriteProbe(threading.Thread):
    """Writes through one member's own port in a loop (psql, an UPDATE) until one commits: the
    new primary's first accepted write. `accepted`: the end of that write; `last_refused`: the
    start of the last write that failed (the moment is between the two)."""

    def __init__(self, member, stop, bound):
        super().__init__(daemon=True, name=f"probe-{member.name}")
        self.member, self.stop_event, self.bound = member, stop, bound
        self.accepted = None
        self.last_refused = None
        self.tries = 0

    def run(self):
        deadline = time.monotonic() + self.bound
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            t = time.monotonic()
            self.tries += 1
            if self.member.write_probe(timeout=10):
                self.accepted = time.monotonic()
                return
            self.last_refused = t
            self.stop_event.wait(0.01)

    def wait(self):
        self.join(self.bound + 15)
        return self.accepted


def alloc_history(member, offset):
    """leafd_alloc_history of the tag: [(monotonic time, old max_id, new max_id, writer)] in
    the order written."""
    out = member.sql("SELECT extract(epoch FROM at)::text, old_max, new_max, coalesce(writer, '') "
                     f"FROM leafd_alloc_history WHERE tag = '{TAG}' AND new_max <> old_max ORDER BY at, new_max",
                     timeout=30)
    rows = []
    for line in out.splitlines():
        at, old, new, writer = line.split("|", 3)
        rows.append((float(at) + offset, int(old), int(new), writer))
    return rows


HISTORY_SQL = """
CREATE TABLE leafd_alloc_history (at timestamptz NOT NULL DEFAULT clock_timestamp(), tag text,
                                  old_max bigint, new_max bigint, writer text);
GRANT INSERT ON leafd_alloc_history TO leafd;
CREATE FUNCTION leafd_alloc_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO leafd_alloc_history (tag, old_max, new_max, writer)
  VALUES (NEW.biz_tag, OLD.max_id, NEW.max_id, NEW.writer);
  RETURN NEW;
END $$;
CREATE TRIGGER leafd_alloc_history AFTER UPDATE ON leaf_alloc
  FOR EACH ROW EXECUTE FUNCTION leafd_alloc_history();
"""


def writers_in_order(history):
    """[(writer, its first allocation's time, the old max_id it found)] by first appearance."""
    seen = {}
    for t, old, new, writer in history:
        if writer not in seen:
            seen[writer] = (t, old)
    return [(w, t, old) for w, (t, old) in seen.items()]


def instance_changes(node):
    """leafd's log lines saying the database instance changed since a tag's last allocation."""
    return [l for l in node.log_text().splitlines() if "the database instance changed" in l]


# --- the scenario -------------------------------------------------------------------------------

class Event:
    """A failover or switchover: its start, the new primary, the probe's figures."""

    def __init__(self, name, new_primary, started):
        self.name, self.new_primary, self.started = name, new_primary, started
        self.accepted = None        # the new primary's first accepted write (probe)
        self.last_refused = None
        self.threshold = None       # the old max_id the new primary's first allocation found
        self.writer = None
        self.first_alloc = None     # the new primary's first leafd allocation (database clock)
        self.back = {}              # node -> seconds from `accepted` to its first new ID
        self.last_before = {}       # node -> seconds from its last ID before `started` to it
        self.haproxy_up = None

    @property
    def window(self):
        end = (self.accepted if self.accepted is not None else float("inf")) + WINDOW_GRACE
        return self.started, end


def await_event(event, probe, per_node, began):
    """Until the probe saw the new primary accept a write and every node served a new ID (IDs
    are judged new later, from the history: here any ID of an allocation after the event)."""
    accepted = probe.wait()
    event.accepted, event.last_refused = accepted, probe.last_refused
    if accepted is None:
        raise Failure(f"{event.name}: {event.new_primary.name} accepted no write within {probe.bound} s "
                      f"({probe.tries} tries)")
    print(f"  {event.name}: {event.new_primary.name} accepted a write at t={accepted - began:.2f} s, "
          f"{accepted - event.started:.2f} s after the {event.name} began (the first write that committed "
          f"began {accepted - (probe.last_refused or accepted):.2f} s after the last one refused; "
          f"{probe.tries} tries)", flush=True)
    # The threshold is not known before the history is read: wait until every node served an ID
    # above everything served before the event (enough: the history decides at the end).
    tops = {}
    for name, loaders in per_node.items():
        ids = [max(ids) for l in loaders if l.name.rsplit("/", 1)[1].startswith("incr-")
               for t, ids in leafd.batches(l) if t < event.started and ids]
        tops[name] = max(ids) if ids else -1
    highest = max(tops.values())
    deadline = accepted + AFTER_MAX
    while time.monotonic() < deadline and any(
            first_new_id(loaders, event.started, highest + 1) is None for loaders in per_node.values()):
        time.sleep(0.1)


def scenario(binary, work, cluster, margin, summaries):
    began = time.monotonic()
    offset = wall_to_monotonic()
    pg1, pg2 = cluster.members
    nodes, stop, loaders, failures = [], threading.Event(), [], []
    probe_stop = threading.Event()
    events = []
    try:
        config = {"segment": {"adaptive_step": False, "failover_margin": margin}}
        url = cluster.storage_url()
        nodes = [leafd.Node(binary, os.path.join(work, "nodes"), f"n{i}", url, config=config, env=NODE_ENV,
                            http_bind=f"127.0.0.1:{leafd.free_port()}") for i in (1, 2, 3)]
        # The first alone (it makes the schema), then the history trigger, then the others.
        nodes[0].start().wait_ready(60)
        pg1.sql(HISTORY_SQL)
        for node in nodes[1:]:
            node.start()
        for node in nodes[1:]:
            node.wait_ready(60)
        nodes[0].create_tag(TAG, STEP)
        print(f"  3 nodes up on {url} (step {STEP}, adaptive step off, failover_margin {margin}) "
              f"at t={time.monotonic() - began:.1f} s", flush=True)
        errors = leafd.ErrorLog()
        per_node = {node.name: leafd.mixed_loaders(node, TAG, stop, errors, LOAD_CLIENTS, BATCH, INCRBY, PAUSE) for node in nodes}
        loaders = [l for ls in per_node.values() for l in ls]
        load_began = time.monotonic()
        for loader in loaders:
            loader.start()
        time.sleep(WARM)

        # --- failover: pg1 SIGKILLed ---
        sync_before_kill = cluster.sync_state(pg1)
        if sync_before_kill != "pg2=sync":
            raise Failure(f"before the kill, replication is not synchronous: {sync_before_kill!r}")
        probe = WriteProbe(pg2, probe_stop, FAILOVER_BOUND)
        t_kill = time.monotonic()
        killed = pg1.kill()
        probe.start()
        failover = Event("failover", pg2, t_kill)
        events.append(failover)
        print(f"  pg1 SIGKILLed at t={t_kill - began:.1f} s ({len(killed)} processes: Patroni and "
              f"PostgreSQL), replication was {sync_before_kill}", flush=True)
        await_event(failover, probe, per_node, began)
        if not pg2.is_primary():
            failures.append("after the failover pg2 is not the primary (Patroni's /primary)")
        time.sleep(AFTER)

        # --- pg1 back, as the synchronous standby ---
        log_before = len(pg1.log_text())
        t_restart = time.monotonic()
        pg1.start()
        try:
            wait_until("pg1 the synchronous standby again", REJOIN_BOUND, pg1.is_sync_standby, interval=0.2)
            cluster.wait_synchronous(pg2, pg1, 30)
        except RuntimeError as e:
            raise Failure(f"{e}\n{pg1.log_tail(20)}") from None
        t_rejoined = time.monotonic()
        rejoin_log = pg1.log_text()[log_before:].lower()
        how = ("a new clone (data directory removed)" if "removing data directory" in rejoin_log
               else "pg_rewind" if "pg_rewind" in rejoin_log else "crash recovery, no rewind")
        print(f"  pg1 restarted at t={t_restart - began:.1f} s, the synchronous standby at "
              f"t={t_rejoined - began:.1f} s ({t_rejoined - t_restart:.1f} s, {how})", flush=True)
        time.sleep(MID)

        # --- planned switchover to pg1 ---
        sync_before_switch = cluster.sync_state(pg2)
        if sync_before_switch != "pg1=sync":
            raise Failure(f"before the switchover, replication is not synchronous: {sync_before_switch!r}")
        probe = WriteProbe(pg1, probe_stop, SWITCHOVER_BOUND)
        probe.start()  # pg1 refuses writes (a standby) until promoted
        t_switch = time.monotonic()
        switchover = Event("switchover", pg1, t_switch)
        events.append(switchover)
        out = cluster.patronictl("switchover", cluster.scope, "--leader", "pg2", "--candidate", "pg1", "--force")
        t_switched = time.monotonic()
        said = next((l.strip() for l in out.splitlines() if "switch" in l.lower()), out.strip()[:160])
        print(f"  patronictl switchover at t={t_switch - began:.1f} s, returned after "
              f"{t_switched - t_switch:.1f} s: {said[:200]}", flush=True)
        await_event(switchover, probe, per_node, began)
        if not pg1.is_primary():
            failures.append("after the switchover pg1 is not the primary (Patroni's /primary)")
        time.sleep(AFTER)

        stop.set()
        for loader in loaders:
            loader.join(20)
        ended = time.monotonic()
        hung = [l.name for l in loaders if l.is_alive()]
        if hung:
            raise Failure(f"load threads did not stop: {hung}")
        died = {n.name: n.died() for n in nodes}

        # --- figures ---
        final_max = int(pg1.sql(f"SELECT max_id FROM leaf_alloc WHERE biz_tag = '{TAG}'"))
        history = alloc_history(pg1, offset)
        writers = writers_in_order(history)
        report = leafd.IdReport(loaders, final_max)
        for event, (writer, t_first, old) in zip(events, writers[1:]):
            event.writer, event.first_alloc, event.threshold = writer, t_first, old
        if len(writers) != 3:
            failures.append(f"expected allocations by 3 instances (the first primary, then one per event), "
                            f"the history has {len(writers)}: {[w for w, _, _ in writers]}")
        marks = cluster.haproxy.marks(offset) if cluster.haproxy else []
        for event in events:
            ups = [t for t, name, state in marks if name == event.new_primary.name and state == "UP"
                   and t >= event.started]
            event.haproxy_up = min(ups) if ups else None
            if event.threshold is None:
                continue
            for node in nodes:
                first = first_new_id(per_node[node.name], event.started, event.threshold)
                event.back[node.name] = None if first is None else first - event.accepted
                last = last_id_before(per_node[node.name], event.started)
                event.last_before[node.name] = None if first is None or last is None else first - last
        # The members agree on max_id (pg2, the old primary, a standby of pg1 again).
        agree = None
        with contextlib.suppress(RuntimeError):
            wait_until("pg2 the synchronous standby after the switchover", 30, pg2.is_sync_standby, interval=0.2)
            agree = wait_until("pg2 replayed pg1's max_id", 10, lambda: pg2.sql(
                f"SELECT max_id FROM leaf_alloc WHERE biz_tag = '{TAG}'") == str(final_max))

        entries = errors.all()

        def in_window(t):
            return any(e.window[0] <= t <= e.window[1] for e in events)
        inside = [e for e in entries if in_window(e[0])]
        outside = [e for e in entries if not in_window(e[0])]
        for event in events:
            ev_errors = [e for e in entries if event.window[0] <= e[0] <= event.window[1]]
            per = collections.Counter((e[1], e[3]) for e in ev_errors)
            sf_errors = [e[0] for e in ev_errors if e[2] == "snowflake"]
            sf_back = []
            for node in nodes:
                mine = [t for t, n, l, _, _ in ev_errors if n == node.name and l == "snowflake"]
                if mine:
                    first = first_snowflake_after(per_node[node.name][-1], max(mine))
                    back = "never" if first is None else f"{first - event.accepted:+.2f} s"
                    sf_back.append(f"{node.name} {back}")
            hap = ("" if event.haproxy_up is None else
                   f", HAProxy marked {event.new_primary.name} UP "
                   f"{event.haproxy_up - event.accepted:+.2f} s from it")
            first_alloc = ("" if event.first_alloc is None else
                           f", leafd's first allocation on it {event.first_alloc - event.accepted:+.2f} s from it "
                           f"(old max_id {event.threshold}, writer {event.writer})")
            print(f"  {event.name}: window t={event.window[0] - began:.1f}..{event.window[1] - began:.1f} s, "
                  f"first accepted write {event.accepted - event.started:.2f} s after it began{hap}{first_alloc}",
                  flush=True)
            for node in nodes:
                back = event.back.get(node.name)
                gap = event.last_before.get(node.name)
                kinds = {k: v for (n, k), v in per.items() if n == node.name}
                print(f"    {node.name}: first new ID {'never' if back is None else f'{back:+.2f} s'} from the "
                      f"first accepted write (no ID for {'?' if gap is None else f'{gap:.2f}'} s), "
                      f"errors in the window {kinds or 0}", flush=True)
            if sf_errors:
                print(f"    snowflake back after its last error in the window (from the first accepted write): "
                      f"{', '.join(sf_back)}", flush=True)
            said = collections.Counter(re.sub(r"[0-9]+", "N", e[4][:160]) for e in ev_errors)
            for text, n in said.most_common(4):
                print(f"    {n} x -{text}", flush=True)
        examples = {}
        for e in entries:
            examples.setdefault(e[3], f"{e[1]}/{e[2]}: -{e[4][:200]}")
        for node in nodes:
            mine = per_node[node.name]
            drops = sum(sum(l.drops.values()) for l in mine)
            n_in = collections.Counter(e[3] for e in inside if e[1] == node.name)
            n_out = collections.Counter(e[3] for e in outside if e[1] == node.name)
            print(f"  {node.name}: {sum(l.segment_count() for l in mine)} segment IDs, "
                  f"{sum(len(l.snowflakes) for l in mine)} snowflake IDs, "
                  f"errors in the windows {dict(n_in) or 0}, "
                  f"outside {dict(n_out) or 0}, connections lost {drops}, instance changes logged "
                  f"{len(instance_changes(node))}", flush=True)
        for kind, text in examples.items():
            print(f"  e.g. {kind}: {text}", flush=True)
        warnings = leafd.log_warnings(nodes)
        for line, n in warnings.most_common(10):
            print(f"  log {n} x {line}", flush=True)
        backs = "; ".join(f"{e.name} " + ", ".join(
            f"{k} {'never' if v is None else f'{v:.2f}'}" for k, v in e.back.items()) + " s" for e in events)
        outages = ", ".join(f"{e.name} {e.accepted - e.started:.1f} s" for e in events if e.accepted)
        inside_kinds = dict(collections.Counter(e[3] for e in inside))
        agreed = "yes" if agree else "not checked (pg2 not back)" if agree is None else "NO"
        summary = (f"patroni via {cluster.via}: {report.segment_ids} segment IDs + {report.snowflake_ids} "
                   f"snowflake IDs in {ended - load_began:.0f} s, repeats {report.repeats}, snowflake repeats "
                   f"{report.snowflake_repeats}, order violations {report.order_violations}, errors in the outage "
                   f"windows {len(inside)} {inside_kinds or ''}, outside {len(outside)}, connections lost "
                   f"{report.drops}; until the new primary took a write: {outages}; first new ID per node from "
                   f"it: {backs}; members agree on max_id {agreed}")
        print(summary, flush=True)
        summaries.append(summary)

        # --- checks ---
        failures.extend(report.failures())
        for name, status in died.items():
            if status is not None:
                node = next(n for n in nodes if n.name == name)
                failures.append(f"{name} exited by itself (status {status}): {leafd.first_error_line(node)}")
        for t, name, loader, kind, text in outside[:5]:
            failures.append(f"{name}/{loader} answered -{text[:200]} at t={t - began:.2f} s, "
                            f"outside the outage windows")
        if len(outside) > 5:
            failures.append(f"... {len(outside)} error replies outside the outage windows in all")
        rollbacks = [e for e in entries if e[3] == "ROLLBACK"]
        if rollbacks:
            failures.append(f"{len(rollbacks)} ROLLBACK replies (a node met a range below one it served), "
                            f"e.g. {rollbacks[0][1]}: -{rollbacks[0][4][:200]}")
        if report.drops:
            failures.append(f"{report.drops} client connections lost: {dict(report.drop_reasons)}")
        for event in events:
            for name, back in event.back.items():
                if back is None:
                    failures.append(f"{name} served no new ID within {AFTER_MAX:g} s of the {event.name}'s new "
                                    f"primary accepting writes")
                elif back > BACK_BOUND:
                    failures.append(f"{name} served its first new ID {back:.2f} s after the {event.name}'s new "
                                    f"primary accepted writes (bound {BACK_BOUND:g} s, goal {BACK_GOAL:g} s)")
        if agree is False:
            failures.append("the members disagree on max_id at the end")
        if failures:
            for n in nodes:
                print(f"  last log lines of {n.name}:\n{n.log_tail(10)}", flush=True)
        return leafd.print_outcome(f"patroni via {cluster.via}", failures, began)
    except BaseException:
        for n in nodes:
            print(f"  last log lines of {n.name}:\n{n.log_tail(10)}", flush=True)
        raise
    finally:
        stop.set()
        probe_stop.set()
        for n in nodes:
            n.kill()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--via", choices=["haproxy", "multi-host"], default="haproxy",
                        help="leafd reaches the primary through HAProxy (Patroni's /primary check) or "
                             "by a URL naming both members (target_session_attrs=read-write)")
    parser.add_argument("--margin", type=int, default=MARGIN, help="segment.failover_margin (default 0: "
                        "synchronous replication loses no acknowledged allocation)")
    parser.add_argument("--haproxy-connect-ms", type=int, default=HAPROXY_CONNECT_MS,
                        help="HAProxy's timeout connect (its retry turn-around is the smaller of it and 1 s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    if not leafd.wait_for_file(binary, 60):
        raise SystemExit(f"no leafd binary at {binary}")
    # SIGTERM (a CI time limit) runs the finally blocks: processes killed, files removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    ensure_packages()
    work = tempfile.mkdtemp(prefix="leafd-patroni-")
    os.chmod(work, 0o711)  # the members' user (postgres) reaches its directories inside
    cluster = None
    passed, summaries = False, []
    try:
        cluster = Cluster(work, args.via, args.haproxy_connect_ms)
        try:
            cluster.start()
        except (RuntimeError, Failure, OSError, subprocess.TimeoutExpired) as e:
            print(f"patroni: the cluster did not come up: {e}\n{cluster.log_tails(15)}", flush=True)
            raise SystemExit("patroni: FAILED (cluster set-up)")
        try:
            passed = scenario(binary, work, cluster, args.margin, summaries)
        except (Failure, leafd.NodeError, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            passed = leafd.print_outcome(f"patroni via {args.via}", [f"{type(e).__name__}: {e}"], began)
            print(cluster.log_tails(12), flush=True)
    finally:
        if cluster is not None:
            cluster.close()
        if args.keep:
            print(f"patroni: kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if summaries:
        print("patroni: summary\n" + "\n".join(f"  {line}" for line in summaries), flush=True)
    if not passed:
        raise SystemExit(f"patroni: FAILED in {time.monotonic() - began:.0f} s")
    print(f"patroni: passed in {time.monotonic() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
