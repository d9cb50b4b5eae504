"""leafd on a MariaDB Galera Cluster: a private 3-member cluster on 127.0.0.1 (Debian's galera-4,
installed here when missing), one leafd node per member, every ID of every node collected.

The cluster: three mariadbd processes, data directories under a temporary directory, each its
own SQL port, group communication (gmcast) port, IST port and SST port (all picked free on
127.0.0.1). Member 1 is bootstrapped (--wsrep-new-cluster), members 2 and 3 join it by a state
snapshot transfer with rsync (SST_METHOD). Every member lists all three in wsrep_cluster_address.
As root the members run as `mysql` (--user=mysql, their directories its own): run as root,
wsrep_sst_rsync's rsync daemon writes as `nobody` and the SST fails ("cannot stat destination").
Eviction of a dead member is made quick with PROVIDER_TIMEOUTS: Galera's defaults (suspect PT5S,
inactive PT15S) stall every write of the cluster for about 6 s when a member dies; with suspect
PT1S the stall measured 2.0 s. evs.install_timeout stays at PT5S: at PT3S, a member rejoining on
this loaded 2-core machine once failed to install the new view in time, and every member went
non-primary for about 7 s (1180 "Not connected to Primary Component" on every node). At PT5S it
happened once more in about ten runs (a rejoin by IST 9.9 s after the restart, against 3.6-5.5 s
usually): the survivors' nodes then pass on Galera's refusal (1047 or 1180), which the scenario
reports and does not count as their failure; any other error reply of theirs fails it.

Scenario 1, simultaneous starts (issue 33: before the fix 2 of 3 starts exited in every round
with "migration ... Deadlock / Duplicate entry / partially applied"): ROUNDS rounds, each on a
new database created through member 1 (Galera replicates it; the script waits until every member
has it). Three nodes, node i on member i, each with the tag in [[segment.tags]] (so the three
race to create it too), are spawned at the same instant (with --busy N, beside N processes
spinning on the CPU): the migration lock is a row of leafd_migration_lock that Galera replicates
(GET_LOCK, held only on the member that granted it, let the three migrate together). Every start must come up (answer PING)
without exiting; each then serves INCR and SNOWFLAKE: all IDs distinct, per connection
increasing, three different snowflake worker ids; the schema's migration rows are the same on
every member, all successful, and the tag is one row.

Scenario 2, a member SIGKILLed under load: a new database, three nodes on the three members,
LOAD_CLIENTS client threads per node (INCR, and INCR with INCRBY mixed in) plus one SNOWFLAKE
client, pipelined. The tag's step is sized from the rate measured during the warm-up (fixed step,
adaptive step off) so that a node's two buffers carry it through the cluster-wide write stall
while a dead member is evicted, but not through the killed member's whole absence: the node on
that member runs dry and must load again once its member is back. After WARM s, member 3's
mariadbd is SIGKILLed; load goes on KILLED s; member 3 is started again: its last committed
position is read first with `mariadbd --wsrep-recover` and passed as --wsrep-start-position (as
Debian's systemd unit does with galera_recovery), so it rejoins by IST (--rejoin sst: without the
position, a full rsync SST); its first successful write (an UPDATE through its SQL port, polled
with the mysql client) is "accepting writes again"; load goes on AFTER s (longer, up to
AFTER_MAX s, until node 3 served a new ID). Checks: no ID served twice over all nodes, per
connection IDs increasing, no node exited, no error reply and no dropped connection on the nodes
whose member survived, the members agree on max_id; node 3 (on the killed member) may answer
UNAVAILABLE while its member is away (counted, printed). The
figure: seconds from member 3's first accepted write to node 3's first ID of a new allocation
(an ID above the tag's max_id read while member 3 was down: node 3 reaches no other member),
bound BACK_BOUND; negative when node 3 got there before the polling client. Also printed: the
write stall seen through member 1 (the eviction), the join (IST or SST) and its duration, and
when node 3 served snowflake IDs again (its worker-id lease could not be renewed meanwhile).

Found on the way (not judged here): LEAF.TAG STEP (and SKIP, SPLIT) under load can lose Galera
certification to an allocation on another member and answer `-UNAVAILABLE storage error:
database write failed: ... 1213 (40001): Deadlock found ...`: the script retries it and prints
a note.

usage: galera.py LEAFD_BIN [--only starts|kill]... [--rounds N] [--busy N] [--rejoin ist|sst] [--keep]
Runs as root (the members as `mysql`) or as any user (the members as that user). Needs MariaDB
(mariadb-install-db, /usr/sbin/mariadbd, mysql: scripts/services.sh); installs galera-4 and rsync
from Debian when missing (apt-get, idempotent). Loopback only. About 40 s. Everything it
created (processes, data directories) is removed at the end, also on failure or SIGTERM (--keep
keeps the directory with the logs). Prints one line per round or event, one summary line per
scenario, and in scenario 1 how many starts lost the migration race and ran it again (leafd's
debug lines, by error: 1062, 1213, "partially applied"): proof that the race happened.
"""
import argparse
import collections
import contextlib
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402
import servers  # noqa: E402
from servers import wait_until  # noqa: E402

GALERA_LIBRARY = "/usr/lib/galera/libgalera_smm.so"  # Debian's galera-4 (bookworm: 26.4)
DB_USER = "mysql"  # the members' OS user when we are root (Debian's mariadb-server makes it)
SST_METHOD = "rsync"  # wsrep_sst_rsync: needs rsync (and ss or lsof); mariabackup needs mariadb-backup
# A dead member is suspected after 1 s without a message and evicted once every survivor suspects
# it (inactive_timeout: the hard limit); keepalives and checks often enough for those to hold.
PROVIDER_TIMEOUTS = ("evs.keepalive_period=PT0.3S;evs.inactive_check_period=PT0.2S;"
                     "evs.suspect_timeout=PT1S;evs.inactive_timeout=PT5S;evs.install_timeout=PT5S")
# What a member answers while the cluster is non-primary (no write can commit anywhere).
GALERA_NON_PRIMARY = ("WSREP has not yet prepared node for application use",
                      "Not connected to Primary Component")
GCACHE = "gcache.size=64M"  # enough for the writes of a member's absence: it rejoins by IST

TAG = "galera"
ROUNDS = 3
START_STEP = 1000
START_BOUND = 60             # seconds for a start to come up (the migration waits up to 60 s)

LOAD_CLIENTS = 3             # per node: 2 INCR, 1 INCR with INCRBY mixed in; plus 1 SNOWFLAKE
BATCH = 10
INCRBY = 100
PAUSE = 0.002                # between a client's batches: 2 cores run 3 members, 3 nodes and us
WARM, KILLED, AFTER, AFTER_MAX = 3.0, 5.0, 5.0, 15.0
# The step, in seconds of a node's load: a node holds 1 to 2 steps, so it rides out a stall of
# up to COVER seconds (the eviction takes about 1-3 s) but runs dry during a member's absence of
# KILLED s plus the restart.
COVER = 3.0
# From the killed member's first accepted write to its node's first ID of a new allocation: the
# goal is 1 s (a failed load backs off at most 1 s); the rest is the probe's resolution.
BACK_BOUND = 1.5
REJOIN_BOUND = 90            # seconds for the killed member to accept writes again


class Failure(Exception):
    pass


# --- packages -----------------------------------------------------------------------------------

def ensure_packages():
    """galera-4 and rsync from Debian's packages when missing (MariaDB itself comes from
    scripts/services.sh; installed here too if absent). Idempotent: nothing runs when all is
    there."""
    missing = []
    if not os.path.exists(GALERA_LIBRARY):
        missing.append("galera-4")
    if shutil.which("rsync") is None:
        missing.append("rsync")
    if shutil.which("ss") is None and shutil.which("lsof") is None:
        missing.append("iproute2")  # wsrep_sst_rsync checks its port with ss (or lsof)
    if not os.path.exists(servers.MARIADBD) or shutil.which("mariadb-install-db") is None:
        missing.append("mariadb-server")
    if shutil.which("mysql") is None:
        missing.append("mariadb-client")
    if not missing:
        return
    print(f"installing {' '.join(missing)} (apt-get)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing,
                   check=True, env=env, stdout=subprocess.DEVNULL)
    if not os.path.exists(GALERA_LIBRARY):
        raise Failure(f"galera-4 installed but {GALERA_LIBRARY} is missing")


# --- the Galera cluster -------------------------------------------------------------------------

port = leafd.unique_port


class Member:
    """One mariadbd of the cluster: data directory <dir>/<name>, error log <dir>/<name>.err."""

    def __init__(self, cluster, index):
        self.cluster, self.index = cluster, index
        self.name = f"m{index}"
        self.port, self.gcomm_port, self.ist_port, self.sst_port = port(), port(), port(), port()
        self.server = None
        self.starts = 0

    @property
    def log_path(self):
        return os.path.join(self.cluster.dir, f"{self.name}.err")

    def url(self, database):
        return f"mysql://root@127.0.0.1:{self.port}/{database}?ssl-mode=disabled"

    def command(self, log_path):
        d = os.path.join(self.cluster.dir, self.name)
        options = ";".join([f"gmcast.listen_addr=tcp://127.0.0.1:{self.gcomm_port}",
                            f"ist.recv_addr=127.0.0.1:{self.ist_port}", PROVIDER_TIMEOUTS, GCACHE])
        # --user: mariadbd (and the SST script and rsync daemon it starts) runs as the owner of
        # the data directories. As root, rsync's daemon would otherwise write as `nobody`.
        return [
            servers.MARIADBD, "--no-defaults", f"--datadir={d}", f"--user={self.cluster.user}",
            f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={d}.sock",
            f"--pid-file={d}.pid", f"--tmpdir={d}-tmp", "--innodb-buffer-pool-size=32M",
            "--innodb-flush-log-at-trx-commit=2", f"--log-error={log_path}", "--skip-name-resolve",
            "--wsrep-on=ON", f"--wsrep-provider={GALERA_LIBRARY}",
            f"--wsrep-cluster-name={self.cluster.name}",
            "--wsrep-cluster-address=gcomm://" + ",".join(f"127.0.0.1:{m.gcomm_port}" for m in self.cluster.members),
            f"--wsrep-node-name={self.name}", f"--wsrep-node-address=127.0.0.1:{self.gcomm_port}",
            f"--wsrep-node-incoming-address=127.0.0.1:{self.port}",
            f"--wsrep-provider-options={options}",
            f"--wsrep-sst-method={SST_METHOD}", f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}",
            "--binlog-format=ROW", "--default-storage-engine=InnoDB", "--innodb-autoinc-lock-mode=2",
            "--wsrep-slave-threads=2",
        ]

    def _log_file(self, path):
        open(path, "a").close()  # written by the server as its user
        return servers.give_to(path, self.cluster.user)

    def start(self, bootstrap=False, position=None):
        """bootstrap: --wsrep-new-cluster (a new cluster of this member alone); position: the
        member's last committed GTID (see recover) as --wsrep-start-position, so a member that
        crashed asks for the missing write sets (IST) instead of a full snapshot (SST)."""
        extra = (["--wsrep-new-cluster"] if bootstrap else []) + (
            [f"--wsrep-start-position={position}"] if position else [])
        self.server = servers.Server(self.name, self.command(self._log_file(self.log_path)) + extra,
                                     self.log_path)
        self.starts += 1
        return self

    def recover(self, seconds=60):
        """After a crash: `mariadbd --wsrep-recover` reads the last committed GTID from InnoDB
        (what Debian's systemd unit does with galera_recovery before each start). Returns it, or
        None (then the start takes a full SST)."""
        log = self._log_file(os.path.join(self.cluster.dir, f"{self.name}-recover.err"))
        servers.run(self.command(log) + ["--wsrep-recover"], timeout=seconds)
        with open(log, errors="replace") as f:
            found = re.findall(r"WSREP: Recovered position: ([0-9a-f-]{36}:-?[0-9]+)", f.read())
        return found[-1] if found and not found[-1].endswith(":-1") else None

    def sql(self, statement, database=None, timeout=15):
        """Through the SQL port (TCP), as root."""
        return servers.mysql(self.port, statement, database, timeout=timeout)

    def status(self):
        """{variable: value} of SHOW GLOBAL STATUS LIKE 'wsrep%'."""
        out = self.sql("SHOW GLOBAL STATUS LIKE 'wsrep%'", timeout=5)
        return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)

    def synced(self, size=None):
        st = self.status()
        return (st.get("wsrep_ready") == "ON" and st.get("wsrep_local_state_comment") == "Synced"
                and (size is None or st.get("wsrep_cluster_size") == str(size)))

    def kill(self):
        if self.server is not None:
            self.server.kill()

    def log_tail(self, lines=8):
        return self.server.log_tail(lines) if self.server else ""

    def log_text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


class Cluster:
    """Three members on 127.0.0.1 in <work>/galera. start() installs the data directories,
    bootstraps member 1 and joins 2 and 3 (SST); close() kills every process it started."""

    def __init__(self, work):
        # As root, the members run as `mysql` (see Member.start): their directory is its own and
        # `work` must let it through (0711).
        self.user = DB_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.dir = servers.owned_dir(os.path.join(work, "galera"), self.user)
        self.name = f"leafd-galera-{os.getpid()}"
        self.members = []
        self.members = [Member(self, i) for i in (1, 2, 3)]

    def start(self):
        began = time.monotonic()
        self.install()
        installed = time.monotonic()
        first, others = self.members[0], self.members[1:]
        first.start(bootstrap=True)
        wait_until("member 1 bootstrapped", 60, first.synced, interval=0.2)
        bootstrapped = time.monotonic()
        # One joiner at a time: each takes a full snapshot (rsync) from a donor.
        for m in others:
            m.start()
            wait_until(f"member {m.index} joined", 120, lambda m=m: m.synced(), interval=0.2)
        wait_until("cluster of 3", 30, lambda: all(m.synced(3) for m in self.members), interval=0.2)
        joined = time.monotonic()
        first.sql("CREATE DATABASE leafd_probe; CREATE TABLE leafd_probe.beat "
                  "(id INT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB; "
                  "INSERT INTO leafd_probe.beat VALUES (1, 0), (2, 0), (3, 0)")
        self.wait_replicated("SELECT COUNT(*) FROM leafd_probe.beat", "3")
        version = first.sql("SELECT @@version")
        provider = first.status().get("wsrep_provider_version", "?")
        print(f"galera: 3 members on 127.0.0.1 (SQL ports {', '.join(str(m.port) for m in self.members)}; "
              f"MariaDB {version}, Galera {provider}, SST {SST_METHOD}, {PROVIDER_TIMEOUTS}): "
              f"installed in {installed - began:.1f} s, bootstrapped in {bootstrapped - installed:.1f} s, "
              f"2 joined in {joined - bootstrapped:.1f} s", flush=True)

    def install(self, seconds=120):
        """mariadb-install-db of the three data directories at once, each with its own temporary
        directory (two bootstraps in one /tmp can collide on their temporary tables); root
        (localhost, 127.0.0.1, ::1) without a password."""
        installs = []
        for m in self.members:
            d = os.path.join(self.dir, m.name)
            servers.owned_dir(f"{d}-tmp", self.user)
            log = open(f"{d}-install.log", "wb")
            installs.append((m.name, log, subprocess.Popen(
                ["mariadb-install-db", "--no-defaults", f"--datadir={d}", f"--tmpdir={d}-tmp",
                 f"--user={self.user}", "--skip-test-db", "--auth-root-authentication-method=normal"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
        for name, log, p in installs:
            try:
                status = p.wait(seconds)
            except subprocess.TimeoutExpired:
                p.kill()
                status = f"timeout after {seconds} s"
            log.close()
            if status != 0:
                with open(os.path.join(self.dir, f"{name}-install.log"), errors="replace") as f:
                    raise RuntimeError(f"mariadb-install-db ({name}) failed with status {status}:\n{f.read()[-1500:]}")

    def wait_replicated(self, query, expected, seconds=20):
        for m in self.members:
            wait_until(f"{m.name}: {query} = {expected}", seconds, lambda m=m: m.sql(query) == expected)

    def write_probe(self, member, timeout=10):
        """An UPDATE through member's SQL port; True if it committed."""
        try:
            member.sql(f"UPDATE leafd_probe.beat SET n = n + 1 WHERE id = {member.index}", timeout=timeout)
            return True
        except RuntimeError:
            return False

    def close(self):
        for m in self.members:
            with contextlib.suppress(Exception):
                m.kill()
        # An SST helper (wsrep_sst_rsync, its rsync daemon) of a killed member, if one was left
        # behind in a session of its own: only processes whose command line names our directory.
        for pid in servers.leftovers(self.dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def log_tails(self, lines=10):
        return "\n".join(m.log_tail(lines) for m in self.members if m.server)


# --- leafd nodes --------------------------------------------------------------------------------

# The migration's "lost the race, checking again" lines are debug: counted in scenario 1.
NODE_ENV = {"RUST_LOG": "info,leafd::storage::migrate=debug"}
RACE_LINE = "another node migrates at the same time"


def make_nodes(binary, work, cluster, database, prefix, config):
    """Node i on member i, each its own directory (state, log)."""
    return [leafd.Node(binary, work, f"{prefix}-n{m.index}", m.url(database), config=config, env=NODE_ENV)
            for m in cluster.members]


def race_errors(node):
    """The errors of the migration runs a node lost to another node (debug lines), by code."""
    out = collections.Counter()
    for line in node.log_text().splitlines():
        if RACE_LINE in line and "partially applied" in line:
            out["partially applied"] += 1  # the other node's version row, still in progress
        elif RACE_LINE in line:
            m = re.search(r"error=.*?(\d{4}) \(\w+\)|error=(.{0,60})", line)
            out[(m.group(1) or m.group(2)).strip() if m else "?"] += 1
    return out


def create_database(cluster, name):
    cluster.members[0].sql(f"CREATE DATABASE {name}")
    cluster.wait_replicated(f"SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = '{name}'", "1")


def drop_database(cluster, name):
    with contextlib.suppress(RuntimeError):
        cluster.members[0].sql(f"DROP DATABASE IF EXISTS {name}")


def worker_of(snowflake_id):
    return (snowflake_id >> 12) & 0x3FF


# --- scenario 1: simultaneous starts ------------------------------------------------------------

def start_round(binary, work, cluster, round_no):
    """One round: (starts that came up, seconds until the last came up, IDs served, worker ids,
    exits: [(node, status, error line)], problems: [str], log warnings, (starts that lost the
    migration race at least once, their lost runs by error))."""
    database = f"leafd_galera_{os.getpid()}_r{round_no}"
    create_database(cluster, database)
    nodes, problems, exits = [], [], []
    try:
        config = {"segment.tags": [{"tag": TAG, "step": START_STEP}]}
        nodes = make_nodes(binary, os.path.join(work, f"round{round_no}"), cluster, database,
                           f"r{round_no}", config)
        since = time.monotonic()
        for node in nodes:  # all spawned first: migrations, the tag's creation and leases race
            node.start()
        up, last_up = [], 0.0
        for node in nodes:
            if node.wait_ready(START_BOUND, allow_exit=True) is None:
                exits.append((node.name, node.process.returncode, leafd.first_error_line(node)))
            else:
                up.append(node)
                last_up = time.monotonic() - since
        ids, workers = 0, {}
        segment, snowflake = [], []
        for node in up:
            with leafd.RespConnection(node.port, timeout=10) as conn:
                replies = conn.pipeline([leafd.command_of(leafd.INCR, TAG)] * 5 + [("SNOWFLAKE",)] * 5)
            if not all(type(r) is int and r > 0 for r in replies):
                problems.append(f"round {round_no}: {node.name} answered {replies}")
                continue
            if replies[:5] != sorted(set(replies[:5])):
                problems.append(f"round {round_no}: {node.name}: INCR replies not increasing {replies[:5]}")
            segment += replies[:5]
            snowflake += replies[5:]
            workers[node.name] = sorted({worker_of(i) for i in replies[5:]})
            ids += len(replies)
        if len(set(segment)) != len(segment) or len(set(snowflake)) != len(snowflake):
            problems.append(f"round {round_no}: IDs repeat: segment {sorted(segment)}, snowflake {sorted(snowflake)}")
        held = [w for ws in workers.values() for w in ws]
        if len(held) != len(set(held)) or any(len(ws) != 1 for ws in workers.values()):
            problems.append(f"round {round_no}: worker ids per node {workers}")
        # The schema as every member has it: the same migration rows, all successful; one tag row.
        rows = {}
        for m in cluster.members:
            rows[m.name] = m.sql("SELECT GROUP_CONCAT(CONCAT(version, ':', success) ORDER BY version) "
                                 "FROM _sqlx_migrations", database)
        if len(set(rows.values())) != 1 or ":0" in next(iter(rows.values())):
            problems.append(f"round {round_no}: migration rows per member {rows}")
        tags = cluster.members[2].sql(f"SELECT COUNT(*) FROM leaf_alloc WHERE biz_tag = '{TAG}'", database)
        if tags != "1":
            problems.append(f"round {round_no}: {tags} rows for tag {TAG}")
        for node in up:
            node.terminate()
        for node in up:
            try:
                code = node.wait(10)
            except subprocess.TimeoutExpired:
                problems.append(f"round {round_no}: {node.name} still running 10 s after SIGTERM")
                continue
            if code != 0:
                problems.append(f"round {round_no}: {node.name} exited with {code} after SIGTERM")
        races = [race_errors(n) for n in nodes]
        lost = (sum(1 for r in races if r), sum(races, collections.Counter()))
        return len(up), last_up, ids, sorted(held), exits, problems, leafd.log_warnings(nodes), lost
    finally:
        leafd.stop_all(nodes)
        drop_database(cluster, database)


def busy_loops(count):
    """`count` processes spinning on the CPU (a busy machine), to stop with stop_busy_loops."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop_busy_loops(loops):
    for loop in loops:
        loop.kill()
        loop.wait()


def simultaneous_starts(binary, work, cluster, summaries, rounds=ROUNDS, busy=0):
    started = time.monotonic()
    loops = busy_loops(busy)
    try:
        return starts_rounds(binary, work, cluster, summaries, rounds, busy, started)
    finally:
        stop_busy_loops(loops)


def starts_rounds(binary, work, cluster, summaries, rounds, busy, started):
    came_up, ids, times, workers = 0, 0, [], []
    exits, problems, warnings = [], [], collections.Counter()
    racers, reruns = 0, collections.Counter()
    for round_no in range(1, rounds + 1):
        up, took, served, held, round_exits, round_problems, logged, (lost, why) = start_round(
            binary, work, cluster, round_no)
        racers += lost
        reruns += why
        came_up += up
        ids += served
        times.append(took)
        workers.append(held)
        exits += round_exits
        problems += round_problems
        warnings += logged
        print(f"  round {round_no}: {up} of 3 came up (last after {took:.2f} s), {served} IDs, worker ids {held}, "
              f"starts that lost the migration race and ran it again {lost} ({dict(why) or 'none'})"
              + "".join(f"\n    {name} exited with status {code}: {line}" for name, code, line in round_exits),
              flush=True)
    summary = (f"galera simultaneous starts{f' beside {busy} busy loops' if busy else ''}: "
               f"starts that came up {came_up} of {3 * rounds}, "
               f"all up in {' / '.join(f'{t:.2f}' for t in times)} s, {ids} IDs distinct "
               f"{'yes' if not problems else 'see failures'}, starts that lost the migration race and ran it "
               f"again {racers} (runs lost by error {dict(reruns) or 'none'}), "
               f"log warnings/errors {sum(warnings.values())}")
    print(summary, flush=True)
    summaries.append(summary)
    for line, n in warnings.most_common(6):
        print(f"  {n} x {line}", flush=True)
    failures = list(problems)
    for name, code, line in exits:
        failures.append(f"{name} exited with status {code} at start: {line}")
    return leafd.print_outcome("galera simultaneous starts", failures, started)


# --- scenario 2: a member SIGKILLed under load --------------------------------------------------

def first_new_id(loaders, after, above):
    """The end of the first batch (of the INCR-only loaders) after `after` holding an ID above
    `above`: one of an allocation made after `above` was read. None if none yet."""
    firsts = [t for l in loaders if l.name.rsplit("/", 1)[1].startswith("incr-")
              for t, ids in leafd.batches(l) if t >= after and ids and max(ids) > above]
    return min(firsts) if firsts else None


def first_snowflake_after(loader, after):
    """The end of the loader's first batch after `after` with snowflake IDs, or None."""
    return next((t for t, _, sf in list(loader.timeline) if t > after and sf), None)


def segment_rate(loaders, since, until):
    return sum(l.served_between(since, until)[0] for l in loaders) / max(0.1, until - since)


class StallProbe(threading.Thread):
    """Writes through member 1 in a loop (an UPDATE by the mysql client): the longest write,
    and when, tell how long the cluster stalled while the dead member was evicted."""

    def __init__(self, cluster, member, stop):
        super().__init__(daemon=True, name="stall-probe")
        self.cluster, self.member, self.stop_event = cluster, member, stop
        self.writes = []  # (start, seconds, committed)

    def run(self):
        while not self.stop_event.is_set():
            t = time.monotonic()
            ok = self.cluster.write_probe(self.member, timeout=20)
            self.writes.append((t, time.monotonic() - t, ok))
            self.stop_event.wait(0.05)

    def longest(self, since, until):
        window = [(d, t) for t, d, ok in self.writes if since - 1 <= t <= until]
        return max(window, default=(0.0, since))


def member_kill(binary, work, cluster, summaries, rejoin="ist"):
    started = time.monotonic()
    database = f"leafd_galera_{os.getpid()}_kill"
    create_database(cluster, database)
    victim = cluster.members[2]

    def max_id(member):
        return member.sql(f"SELECT max_id FROM leaf_alloc WHERE biz_tag = '{TAG}'", database)
    nodes, stop, loaders, failures = [], threading.Event(), [], []
    probe_stop = threading.Event()
    probe = None
    try:
        config = {"segment": {"adaptive_step": False}}
        nodes = make_nodes(binary, os.path.join(work, "kill"), cluster, database, "load", config)
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_ready(START_BOUND)
        nodes[0].create_tag(TAG, START_STEP)
        errors = leafd.ErrorLog()
        per_node = {node.name: leafd.mixed_loaders(node, TAG, stop, errors, LOAD_CLIENTS, BATCH, INCRBY, PAUSE) for node in nodes}
        loaders = [l for ls in per_node.values() for l in ls]
        began = time.monotonic()
        for loader in loaders:
            loader.start()
        time.sleep(WARM / 2)
        # The step from the measured rate: COVER seconds of the busiest node's segment IDs.
        t = time.monotonic()
        rate = max(segment_rate(ls, began + 0.5, t) for ls in per_node.values())
        step = max(START_STEP, int(rate * COVER))
        # Under load on Galera this UPDATE can lose certification to an allocation on another
        # member (1213): leafd retries allocations and LEAF.TAG CREATE, not LEAF.TAG STEP (nor
        # SKIP, SPLIT): the reply is an error and the operator retries. So do we, and say so.
        refused = []
        with leafd.RespConnection(nodes[0].port) as conn:
            for _ in range(10):
                reply = conn.call("LEAF.TAG", "STEP", TAG, step)
                if reply == "OK":
                    break
                refused.append(reply)
                time.sleep(0.05)
        if reply != "OK":
            raise Failure(f"LEAF.TAG STEP {TAG} {step} answered {reply!r} ({len(refused)} tries)")
        if refused:
            print(f"  note: LEAF.TAG STEP answered -{refused[0]} {len(refused)} time(s) before OK", flush=True)
        time.sleep(WARM / 2)  # the old step's segments used up: every node loads the new one
        probe = StallProbe(cluster, cluster.members[0], probe_stop)
        probe.start()
        time.sleep(0.5)

        t_kill = time.monotonic()
        victim.kill()
        print(f"  {victim.name} SIGKILLed at t={t_kill - began:.1f} s (step {step}: {COVER:g} s of "
              f"{rate:.0f} segment IDs/s, the busiest node's warm-up rate)", flush=True)
        time.sleep(KILLED)
        # Node 3 talks to its member only, which is down: an ID it serves above this max_id is
        # one of an allocation made after the member's restart.
        threshold = int(max_id(cluster.members[0]))
        log_before = len(victim.log_text())  # the restart's own lines: IST or SST?
        t_restart = time.monotonic()
        position = victim.recover() if rejoin == "ist" else None
        t_recovered = time.monotonic()
        victim.start(position=position)
        # Polled as fast as the mysql client goes: the member began accepting writes between the
        # start of the last failed write and the end of the first that committed (t_writable).
        t_writable, t_tried = None, t_restart
        deadline = t_restart + REJOIN_BOUND
        while time.monotonic() < deadline:
            if victim.server.proc.poll() is not None:
                raise Failure(f"{victim.name} exited with {victim.server.proc.returncode} while rejoining\n"
                              f"{victim.log_tail(15)}")
            t_try = time.monotonic()
            if cluster.write_probe(victim, timeout=5):
                t_writable = time.monotonic()
                break
            t_tried = t_try
            time.sleep(0.01)
        if t_writable is None:
            raise Failure(f"{victim.name} did not accept a write within {REJOIN_BOUND} s of its restart\n"
                          f"{victim.log_tail(15)}")
        join_log = victim.log_text()[log_before:]
        # MariaDB runs an IST through the SST script too ("rsync IST completed on joiner").
        join = ("SST" if "SST completed on joiner" in join_log else
                "IST" if re.search(r"IST completed on joiner|IST received", join_log) else "?")
        print(f"  {victim.name} restarted at t={t_restart - began:.1f} s (wsrep-recover "
              f"{t_recovered - t_restart:.1f} s: position {position}), accepted a write at "
              f"t={t_writable - began:.2f} s ({t_writable - t_restart:.1f} s, rejoined by {join}; the first "
              f"write that committed began {t_writable - t_tried:.2f} s after the last one that failed)",
              flush=True)
        time.sleep(AFTER)
        victim_node = nodes[2]
        deadline = t_writable + AFTER_MAX
        while (first_new_id(per_node[victim_node.name], t_restart, threshold) is None
               and time.monotonic() < deadline):
            time.sleep(0.25)
        stop.set()
        probe_stop.set()
        for loader in loaders:
            loader.join(20)
        ended = time.monotonic()
        hung = [l.name for l in loaders if l.is_alive()]
        if hung:
            raise Failure(f"load threads did not stop: {hung}")
        died = {n.name: n.died() for n in nodes}
        probe.join(30)

        # --- figures ---
        final_max = int(max_id(cluster.members[0]))
        maxes = {m.name: max_id(m) for m in cluster.members}
        report = leafd.IdReport(loaders, final_max)
        stall, stall_at = probe.longest(t_kill, t_restart)
        first = first_new_id(per_node[victim_node.name], t_restart, threshold)
        back = None if first is None else first - t_writable
        dry = [e for e in errors.of(victim_node.name) if t_kill <= e[0] <= t_writable and e[2] != "snowflake"]
        # Snowflake on node 3: its lease could not be renewed while the member was away; after
        # the last error, the first batch of IDs.
        sf_errors = [e[0] for e in errors.of(victim_node.name, "snowflake") if e[0] <= t_writable + AFTER_MAX]
        sf_loader = per_node[victim_node.name][-1]
        sf_first = first_snowflake_after(sf_loader, max(sf_errors)) if sf_errors else None
        sf_back = (f"{sf_first - t_writable:.2f} s after" if sf_first is not None
                   else "never" if sf_errors else "no snowflake error, served throughout")
        print(f"  writes through m1 stalled {stall:.2f} s (a write begun at t={stall_at - began:.1f} s) "
              f"while {victim.name} was evicted", flush=True)
        survivors_errors, survivors_drops = 0, 0
        for node in nodes:
            mine = per_node[node.name]
            kinds = collections.Counter(e[3] for e in errors.of(node.name))
            drops = sum(sum(l.drops.values()) for l in mine)
            if node is not victim_node:
                survivors_errors += sum(kinds.values())
                survivors_drops += drops
            example = next((e[4] for e in errors.of(node.name)), None)
            print(f"  {node.name} (on {cluster.members[nodes.index(node)].name}): "
                  f"{sum(l.segment_count() for l in mine)} segment IDs, "
                  f"{sum(len(l.snowflakes) for l in mine)} snowflake IDs, errors {dict(kinds) or 0}"
                  + (f" e.g. -{example}" if example else "") + f", connections lost {drops}", flush=True)
        print(f"  max_id per member at the end: {maxes}", flush=True)
        warnings = leafd.log_warnings(nodes)
        for line, n in warnings.most_common(8):
            print(f"  {n} x {line}", flush=True)
        back_text = "never" if back is None else f"{back:.2f} s"
        summary = (f"galera member SIGKILL under load: {report.segment_ids} segment IDs + "
                   f"{report.snowflake_ids} snowflake IDs in {ended - began:.0f} s, repeats {report.repeats}, "
                   f"snowflake repeats {report.snowflake_repeats}, order violations {report.order_violations}, "
                   f"errors on the nodes of surviving members {survivors_errors} (connections lost "
                   f"{survivors_drops}), node on the killed member: {len(errors.of(victim_node.name))} error "
                   f"replies (segment {'ran dry' if dry else 'never ran dry'}), first ID of a new allocation "
                   f"{back_text} after its member accepted writes again ({join}, {t_writable - t_restart:.1f} s "
                   f"after restart), snowflake {sf_back}; write stall {stall:.2f} s")
        print(summary, flush=True)
        summaries.append(summary)

        # --- checks ---
        failures.extend(report.failures())
        for name, status in died.items():
            if status is not None:
                node = next(n for n in nodes if n.name == name)
                failures.append(f"{name} exited by itself (status {status}): {leafd.first_error_line(node)}")
        # While the cluster itself is non-primary (see the module's doc), every write is refused
        # by Galera: those replies are the database's refusal, passed on, not the node's failure.
        non_primary = 0
        for node in nodes[:2]:
            own = []
            for error in errors.of(node.name):
                if any(refusal in error[4] for refusal in GALERA_NON_PRIMARY):
                    non_primary += 1
                else:
                    own.append(error)
            for t, name, _, kind, text in own[:3]:
                failures.append(f"{name} (its member survived) answered -{text} at t={t - began:.2f} s")
        if non_primary:
            print(f"  the cluster went non-primary while {victim.name} rejoined: {non_primary} replies on the "
                  f"nodes of surviving members passed on Galera's own refusal (not counted as failures)",
                  flush=True)
        if survivors_drops:
            failures.append(f"{survivors_drops} connections lost on the nodes of surviving members")
        if back is None:
            failures.append(f"{victim_node.name} served no new ID within {AFTER_MAX:g} s of its member "
                            f"accepting writes again")
        elif back > BACK_BOUND:
            failures.append(f"{victim_node.name} served its first ID of a new allocation {back:.2f} s after its "
                            f"member accepted writes again (bound {BACK_BOUND:g} s)")
        if len(set(maxes.values())) != 1:
            failures.append(f"the members disagree on max_id: {maxes}")
        if not dry:
            print(f"  note: {victim_node.name} never ran dry: the figure is when it next needed a segment",
                  flush=True)
        if failures:
            for n in nodes:
                print(f"  last log lines of {n.name}:\n{n.log_tail(8)}", flush=True)
        return leafd.print_outcome("galera member SIGKILL under load", failures, started)
    except BaseException:
        for n in nodes:
            print(f"  last log lines of {n.name}:\n{n.log_tail(8)}", flush=True)
        raise
    finally:
        stop.set()
        probe_stop.set()
        for n in nodes:
            n.kill()
        drop_database(cluster, database)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--only", action="append", choices=["starts", "kill"])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of simultaneous starts")
    parser.add_argument("--busy", type=int, default=0,
                        help="processes spinning on the CPU beside the simultaneous starts")
    parser.add_argument("--rejoin", choices=["ist", "sst"], default="ist",
                        help="the killed member rejoins by IST (its position recovered first, as "
                             "Debian's systemd unit does) or by a full SST (position not recovered)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    if not leafd.wait_for_file(binary, 60):
        raise SystemExit(f"no leafd binary at {binary}")
    only = args.only or ["starts", "kill"]
    # SIGTERM (a CI time limit) runs the finally blocks: processes killed, files removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    ensure_packages()
    work = tempfile.mkdtemp(prefix="leafd-galera-")
    os.chmod(work, 0o711)  # the members' user (mysql) reaches its directory inside
    cluster = None
    passed, summaries = [], []
    try:
        cluster = Cluster(work)
        try:
            cluster.start()
        except (RuntimeError, Failure) as e:
            print(f"galera: the cluster did not come up: {e}\n{cluster.log_tails(15)}", flush=True)
            raise SystemExit("galera: FAILED (cluster set-up)")
        for name in only:
            try:
                if name == "starts":
                    passed.append(simultaneous_starts(binary, work, cluster, summaries, args.rounds,
                                                      args.busy))
                else:
                    passed.append(member_kill(binary, work, cluster, summaries, args.rejoin))
            except (Failure, leafd.NodeError, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                passed.append(leafd.print_outcome(f"galera {name}", [f"{type(e).__name__}: {e}"], began))
                print(cluster.log_tails(10), flush=True)
    finally:
        if cluster is not None:
            cluster.close()
        if args.keep:
            print(f"galera: kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("galera: summary\n" + "\n".join(f"  {line}" for line in summaries), flush=True)
    if not all(passed):
        raise SystemExit(f"galera: FAILED in {time.monotonic() - began:.0f} s")
    print(f"galera: passed in {time.monotonic() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
