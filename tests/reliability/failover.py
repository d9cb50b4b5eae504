"""Failover of the segment database to a replica that had not received the last allocations.
Every ID every node hands out is collected. With segment.failover_margin (the default,
10,000,000 IDs): no ID served twice across the nodes, none above the new primary's max_id, no
ROLLBACK reply (UNAVAILABLE while the primary is down is fine), every node serving a new ID within
10 s of the switch, at least one failover skip counted on the nodes' /metrics
(leafd_segment_failover_skips_total). Without the margin (0) the same scenario must make IDs
repeat: that proves it exercises the fault, so the test can fail.

Per dialect (PostgreSQL streaming replication, MariaDB binlog replication) and per margin, on
fresh private servers (temporary directories, free ports, loopback only):
  1. a primary and an asynchronous replica, the replication stream through a TCP proxy;
  2. leafd's storage URL points at a "virtual IP": a TCP proxy to the primary;
  3. 3 nodes (A, B, C), tag created with step 100 (adaptive step off, so a node allocates
     every hundred IDs), snowflake off;
  4. all nodes under INCR load (3 clients each) for 2 s; then the replication proxy is paused
     (the replica stops receiving, the primary keeps committing: asynchronous replication) for
     2.5 s while A and B keep loading and C is idle; then the primary is killed (SIGKILL to
     the server and every process it started), 1 s later the replica is promoted and the
     virtual IP switched to it (its open connections cut), and all nodes load 3 s more
     (longer, up to 10 s, until each served a new ID). A and B also load a strict tag
     (order = "strict", one pipelined client each): with the margin none of its IDs repeats and
     every one replied after the outage is above every one replied before the kill.
The allocations the primary made during the freeze are lost: the replica's max_id at promotion
must be below the old primary's, or the run proved nothing and fails. Without the margin the new
primary hands those ranges out again: A and B refuse them (ROLLBACK, their high-water marks are
above), C, which never loaded them, serves them again: repeats.

usage: failover.py LEAFD_BIN [--only postgres|mysql]...
Needs PostgreSQL 15 (/usr/lib/postgresql/15/bin, run as the `postgres` user when root) and
MariaDB (mariadb-install-db, /usr/sbin/mariadbd, mysql), psql. About a minute. Prints, per
run, the timings of the failover, the max_ids (replica before and after the freeze and at
promotion, old and new primary), the allocations lost, per node its IDs, failover skips and
seconds until it served again, the error replies by kind, and a summary line.
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
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402
import servers  # noqa: E402
from servers import run, wait_until  # noqa: E402

TAG = "failover"
STEP = 100
MARGIN = 10_000_000  # segment.failover_margin's default
CLIENTS = 3          # per node: a 2-core machine runs 9 clients, 3 nodes and 2 servers
BATCH = 10           # INCRs per pipelined batch
WARM, FREEZE, AFTER, AFTER_MAX = 2.0, 2.5, 3.0, 10.0
DOWN = 1.0  # from the kill to the promotion: a failover manager's detection time
# A strictly increasing tag loaded beside it on A and B (one pipelined client each): with the
# margin its IDs must not repeat either, and every one replied after the outage must be above
# every one replied before the kill (the real-time promise across a lossy failover).
STRICT_TAG = "failover_strict"
LOAD_TIMEOUT = 1.0  # segment.load_timeout_ms's default: a strict reply comes within it of its send
NODE_CONFIG = {
    # A fixed step: loads (allocations) keep coming every hundred IDs, so a 2.5 s freeze loses
    # many of them.
    "segment": {"adaptive_step": False},
    "segment.tags": [{"tag": STRICT_TAG, "step": STEP, "order": "strict"}],
    # Snowflake's database worker leases would be lost in the failover too: not this test.
    "snowflake": {"enabled": False},
}


# --- the two dialects ---------------------------------------------------------------------------

class Pair:
    """A primary and its asynchronous replica, the replication stream through `repl_proxy`
    (pause it to freeze replication). Subclasses: PostgresPair, MariaDBPair."""

    dialect = None

    def __init__(self, work):
        self.work = work
        self.primary_port, self.replica_port = leafd.free_port(), leafd.free_port()
        self.primary = self.replica = self.repl_proxy = None

    def servers(self):
        return [s for s in (self.primary, self.replica) if s is not None]

    def kill_primary(self):
        self.primary.kill()

    def close(self):
        if self.repl_proxy is not None:
            self.repl_proxy.close()
        for server in self.servers():
            server.kill()

    def max_id(self, port, tag=TAG):
        out = self.sql(port, f"SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'", database="leafd")
        return int(out) if out else None

    def writer(self, port):
        return self.sql(port, f"SELECT writer FROM leaf_alloc WHERE biz_tag = '{TAG}'", database="leafd")


class PostgresPair(Pair):
    dialect = "postgres"
    USER = "postgres"  # the OS user the servers run as when we are root

    def __init__(self, work):
        super().__init__(work)
        self.dir = servers.owned_dir(os.path.join(work, "pg"), self.USER)
        self.primary_dir = os.path.join(self.dir, "primary")
        self.replica_dir = os.path.join(self.dir, "replica")

    def url(self, port):
        return f"postgres://postgres@127.0.0.1:{port}/leafd?sslmode=disable"

    def sql(self, port, statement, database="postgres"):
        return servers.psql(port, statement, database=database)

    def _postgres(self, name, data_dir, port):
        # Asynchronous streaming replication: no synchronous_standby_names.
        return servers.postgres_server(
            f"pg-{name}", data_dir, port, self.dir, os.path.join(self.dir, f"{name}.log"),
            {"wal_level": "replica", "max_wal_senders": 4, "hot_standby": "on",
             "synchronous_standby_names": ""}, user=self.USER)

    def start(self):
        servers.initdb(self.primary_dir, user=self.USER)
        self.primary = self._postgres("primary", self.primary_dir, self.primary_port)
        wait_until("PostgreSQL primary ready", 30, lambda: self.sql(self.primary_port, "SELECT 1") == "1")
        # The base backup goes through the proxy, so -R writes the proxy into primary_conninfo.
        self.repl_proxy = leafd.TcpProxy(("127.0.0.1", self.primary_port), name="pg-replication")
        run([f"{servers.PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(self.repl_proxy.port),
             "-U", "postgres", "-D", self.replica_dir, "-R", "-X", "stream", "-c", "fast", "--no-sync"],
            timeout=90, user=self.USER)
        self.replica = self._postgres("replica", self.replica_dir, self.replica_port)
        wait_until("PostgreSQL replica streaming", 30, lambda: self.sql(
            self.replica_port, "SELECT status FROM pg_stat_wal_receiver") == "streaming")
        sync = self.sql(self.primary_port, "SELECT string_agg(sync_state, ',') FROM pg_stat_replication")
        if sync != "async":
            raise RuntimeError(f"replication is not asynchronous: pg_stat_replication.sync_state {sync!r}")
        self.sql(self.primary_port, "CREATE DATABASE leafd")
        wait_until("database leafd on the replica", 20, lambda: self.sql(
            self.replica_port, "SELECT 1 FROM pg_database WHERE datname = 'leafd'") == "1")

    def kill_primary(self):
        super().kill_primary()
        self._release_shared_memory(self.primary_dir)

    def promote(self):
        run([f"{servers.PG_BIN}/pg_ctl", "promote", "-D", self.replica_dir, "-w", "-t", "30"], timeout=40,
            user=self.USER)
        wait_until("promoted replica accepts writes", 20, lambda: self.sql(
            self.replica_port, "SELECT pg_is_in_recovery()") == "f")

    def close(self):
        super().close()
        for data_dir in (self.primary_dir, self.replica_dir):
            self._release_shared_memory(data_dir)

    @staticmethod
    def _release_shared_memory(data_dir):
        servers.release_postgres_shared_memory(data_dir)


class MariaDBPair(Pair):
    dialect = "mysql"

    def __init__(self, work):
        super().__init__(work)
        self.dir = os.path.join(work, "mariadb")
        os.makedirs(self.dir)

    def url(self, port):
        return f"mysql://root@127.0.0.1:{port}/leafd?ssl-mode=disabled"

    def sql(self, port, statement, database=None, vertical=False):
        return servers.mysql(port, statement, database, vertical)

    def _mariadbd(self, name, port, extra):
        return servers.mariadb_server(self.dir, name, port, extra)

    def start(self):
        # Both data directories at once. The grant tables are kept: root@127.0.0.1 without a
        # password, as replication user too.
        servers.install_mariadb(self.dir, ["primary", "replica"])
        self.primary = self._mariadbd("primary", self.primary_port, [
            "--server-id=1", f"--log-bin={self.dir}/primary-bin", "--binlog-format=ROW"])
        self.replica = self._mariadbd("replica", self.replica_port, [
            "--server-id=2", f"--relay-log={self.dir}/replica-relay", "--read-only=1"])
        for port in (self.primary_port, self.replica_port):
            wait_until(f"MariaDB on port {port} ready", 60, lambda p=port: self.sql(p, "SELECT 1") == "1")
        self.repl_proxy = leafd.TcpProxy(("127.0.0.1", self.primary_port), name="mariadb-replication")
        # An empty replica GTID position: the replica reads the primary's binlog from its start.
        self.sql(self.replica_port,
                 f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.repl_proxy.port}, "
                 "MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1; "
                 "START SLAVE")
        wait_until("MariaDB replica running", 30, self.replicating)
        self.sql(self.primary_port, "CREATE DATABASE leafd")
        wait_until("database leafd on the replica", 20,
                   lambda: self.sql(self.replica_port, "SHOW DATABASES LIKE 'leafd'") == "leafd")

    def replicating(self):
        st = self.slave_status()
        return st.get("Slave_IO_Running") == "Yes" and st.get("Slave_SQL_Running") == "Yes"

    def slave_status(self):
        out = self.sql(self.replica_port, "SHOW SLAVE STATUS", vertical=True)
        status = {}
        for line in out.splitlines():
            key, sep, value = line.strip().partition(":")
            if sep:
                status[key.strip()] = value.strip()
        return status

    def promote(self):
        # As a failover manager does: the SQL thread first applies everything the replica had
        # received (the relay log), then replication is removed and writes allowed.
        self.sql(self.replica_port, "STOP SLAVE IO_THREAD")

        def applied():
            st = self.slave_status()
            return (st.get("Master_Log_File") == st.get("Relay_Master_Log_File")
                    and st.get("Read_Master_Log_Pos") == st.get("Exec_Master_Log_Pos"))
        wait_until("replica applied its relay log", 20, applied)
        self.sql(self.replica_port, "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")


DIALECTS = {"postgres": PostgresPair, "mysql": MariaDBPair}


# --- load and figures ---------------------------------------------------------------------------

def loaders_for(node, stop, errors, tag=TAG, clients=CLIENTS):
    def batch():
        return [(leafd.INCR, 1)] * BATCH
    # pause_after_error: a node answering UNAVAILABLE at once is not hammered by 3 clients.
    return [leafd.Loader(node, f"{node.name}/{'incr' if tag == TAG else 'strict'}-{i}", tag, batch,
                         stop, timeout=5.0, pause_after_error=0.05, on_error=errors.callback(node))
            for i in range(clients)]


def strict_order_across(loaders, t_kill):
    """(IDs replied before the kill, IDs replied when their request was surely sent after it,
    how many of the latter are not above every one of the former)."""
    before, after = [], []
    for loader in loaders:
        for t, ids in leafd.batches(loader):
            if t < t_kill:
                before.extend(ids)
            elif t > t_kill + LOAD_TIMEOUT + 0.5:
                after.extend(ids)
    top = max(before, default=-1)
    return len(before), len(after), sum(1 for v in after if v <= top)


def back_in_service(loaders, since, above):
    """Seconds from `since` to the end of the first batch holding an ID above `above` (one of a
    new allocation), or None."""
    firsts = [t for l in loaders for t, ids in leafd.batches(l) if t >= since and ids and max(ids) > above]
    return min(firsts) - since if firsts else None


def highest_before(loaders, until):
    tops = [max(ids) for l in loaders for t, ids in leafd.batches(l) if t < until and ids]
    return max(tops) if tops else None


def failover_skips(node):
    """leafd_segment_failover_skips_total of the tag on the node's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("leafd_segment_failover_skips_total") and f'tag="{TAG}"' in line:
            total += int(float(line.rsplit(None, 1)[1]))
    return total


def scenario(dialect, margin, binary, work, summaries):
    """One run on fresh servers; returns the list of failures, appends its summary line."""
    label = f"{dialect} margin={margin}"
    pair = DIALECTS[dialect](work)
    vip = None
    nodes = []
    stops = []
    failures = []
    try:
        started = time.monotonic()
        pair.start()
        vip = leafd.TcpProxy(("127.0.0.1", pair.primary_port), name="vip")
        config = dict(NODE_CONFIG, segment=dict(NODE_CONFIG["segment"], failover_margin=margin))
        for name in ("A", "B", "C"):
            nodes.append(leafd.Node(binary, work, name, pair.url(vip.port), config=config,
                                    http_bind=f"127.0.0.1:{leafd.free_port()}"))
        # One after the other: the first migrates the fresh database.
        for node in nodes:
            node.start().wait_ready(60)
        nodes[0].create_tag(TAG, STEP)
        a, b, c = nodes
        print(f"{label}: servers and nodes up in {time.monotonic() - started:.1f} s", flush=True)

        errors = leafd.ErrorLog()
        stop_ab, stop_c1, stop_c2 = threading.Event(), threading.Event(), threading.Event()
        stops.extend([stop_ab, stop_c1, stop_c2])
        ab = loaders_for(a, stop_ab, errors) + loaders_for(b, stop_ab, errors)
        c1 = loaders_for(c, stop_c1, errors)
        c2 = loaders_for(c, stop_c2, errors)
        strict = [l for n in (a, b) for l in loaders_for(n, stop_ab, errors, STRICT_TAG, 1)]
        for loader in ab + c1 + strict:
            loader.start()
        time.sleep(WARM)
        # The tag's row must have reached the replica, or the failover loses the tag itself.
        replica_before = pair.max_id(pair.replica_port)
        if replica_before is None:
            raise RuntimeError("the tag's row has not reached the replica after the warm-up")

        # C goes idle: it keeps the ranges it loaded, and loads none of those the freeze loses.
        stop_c1.set()
        for loader in c1:
            loader.join(10)
        pair.repl_proxy.pause()
        t_freeze = time.monotonic()
        time.sleep(FREEZE)
        primary_max = pair.max_id(pair.primary_port)
        replica_frozen = pair.max_id(pair.replica_port)
        pair.kill_primary()
        t_kill = time.monotonic()
        # Whatever the proxy still held never reaches the replica.
        pair.repl_proxy.close()
        time.sleep(DOWN)
        pair.promote()
        t_promoted = time.monotonic()
        replica_max = pair.max_id(pair.replica_port)
        vip.switch(("127.0.0.1", pair.replica_port))
        t_switch = time.monotonic()
        for loader in c2:
            loader.start()

        # Served again: an ID above what the new primary can have handed out before (the
        # margin, if any, on top of the replica's max_id).
        threshold = replica_max + margin
        deadline = t_switch + AFTER_MAX
        time.sleep(AFTER)
        while time.monotonic() < deadline and any(
                back_in_service([l for l in ab + c2 if l.node is n], t_switch, threshold) is None
                for n in nodes):
            time.sleep(0.25)
        skips = {n.name: failover_skips(n) for n in nodes}
        stop_ab.set()
        stop_c2.set()
        everyone = ab + c1 + c2
        for loader in everyone + strict:
            loader.join(20)
        hung = [l.name for l in everyone + strict if l.is_alive()]
        if hung:
            raise RuntimeError(f"load threads did not stop: {hung}")
        final_max = pair.max_id(pair.replica_port)
        strict_max = pair.max_id(pair.replica_port, STRICT_TAG)
        writer = pair.writer(pair.replica_port)
        died = {n.name: n.died() for n in nodes}  # before stop_all: then they exit on purpose
        leafd.stop_all(nodes)

        # The old primary's last max_id: read just before the kill, or higher if an allocation
        # came after the read (a served ID tells).
        old_max = max(v for v in (primary_max, highest_before(everyone, t_switch)) if v is not None)
        lost = old_max - replica_max
        report = leafd.IdReport(everyone, final_max)
        strict_report = leafd.IdReport(strict, strict_max)
        strict_before, strict_after, strict_behind = strict_order_across(strict, t_kill)
        after = errors.kinds(since=t_switch)
        total = errors.kinds()
        back = {}
        for n in nodes:
            s = back_in_service([l for l in everyone if l.node is n], t_switch, threshold)
            back[n.name] = s
        timing = (f"freeze {t_kill - t_freeze:.1f} s, down {t_promoted - t_kill:.1f} s (promotion included), "
                  f"switch {t_switch - t_promoted:.2f} s")
        print(f"  {timing}; replica max_id {replica_before} before the freeze, {replica_frozen} at its "
              f"end, {replica_max} at promotion; old primary max_id {old_max} (read {primary_max}); "
              f"new primary max_id {final_max}, writer {writer}", flush=True)
        print(f"  allocations lost: {lost // STEP} ({lost} IDs)", flush=True)
        for n in nodes:
            mine = [l for l in everyone if l.node is n]
            print(f"  {n.name}: {sum(l.segment_count() for l in mine)} IDs, "
                  f"{sum(l.connections for l in mine)} connections "
                  f"({sum(sum(l.drops.values()) for l in mine)} lost), failover skips {skips[n.name]}, "
                  f"back in service {'never' if back[n.name] is None else f'{back[n.name]:.2f} s'}", flush=True)
        for kind in sorted(total):
            print(f"  error {kind}: {total[kind]} ({after.get(kind, 0)} after the switch), "
                  f"e.g. {errors.example(kind)}", flush=True)
        if report.repeats:
            print(f"  repeats e.g. {report.repeat_examples[:3]}", flush=True)
        print(f"  strict tag: {strict_report.segment_ids} IDs on A and B, repeats {strict_report.repeats}; "
              f"{strict_before} replied before the kill, {strict_after} after the outage, "
              f"{strict_behind} of those not above every earlier one", flush=True)
        backs = ", ".join(f"{k} {'never' if v is None else f'{v:.1f} s'}" for k, v in back.items())
        summary = (f"{label}: ids={report.segment_ids}, allocations lost={lost // STEP}, "
                   f"repeats={report.repeats}, strict ids={strict_report.segment_ids} "
                   f"(repeats {strict_report.repeats}, out of order {strict_behind}), "
                   f"rollbacks={total.get('ROLLBACK', 0)}, "
                   f"unavailable={total.get('UNAVAILABLE', 0)}, failover skips={sum(skips.values())}, "
                   f"back in service: {backs}")
        summaries.append(summary)
        print(summary, flush=True)

        # --- checks ---
        if lost <= 0:
            failures.append(f"the failover lost no allocation (old primary max_id {old_max}, replica "
                            f"{replica_max} at promotion): the scenario tested nothing")
        for name, status in died.items():
            if status is not None:
                failures.append(f"{name} exited by itself (status {status})")
        if margin:
            failures.extend(report.failures())
            failures.extend(f"strict tag: {f}" for f in strict_report.failures())
            if strict_behind:
                failures.append(f"strict tag: {strict_behind} IDs replied after the outage are not above "
                                f"every ID replied before the kill")
            if not strict_before or not strict_after:
                failures.append(f"strict tag: {strict_before} IDs before the kill, {strict_after} after: "
                                f"nothing to compare")
            # The margin is there so that no node meets a range below its high-water mark
            # (and none can before the failover).
            if total.get("ROLLBACK"):
                failures.append(f"{total['ROLLBACK']} ROLLBACK replies ({after.get('ROLLBACK', 0)} after the "
                                f"switch), e.g. {errors.example('ROLLBACK')}")
            for name, seconds in back.items():
                if seconds is None:
                    failures.append(f"{name} served no new ID within {AFTER_MAX:g} s of the switch")
            if sum(skips.values()) < 1:
                failures.append("no node counted a failover skip (leafd_segment_failover_skips_total)")
            if lost >= margin:
                failures.append(f"{lost} IDs lost: more than the margin, the test's freeze is too long")
            other = set(total) - {"UNAVAILABLE", "ROLLBACK"}
            if other:
                failures.append(f"unexpected error replies: {sorted(other)}")
        else:
            # Without the margin the fault must show, or the test could not fail.
            if report.repeats == 0:
                failures.append("no repeated ID without the margin: the scenario did not exercise the fault")
            if report.unexpected:
                failures.append(f"replies of an unexpected type, e.g. {report.unexpected[:3]}")
        if failures:
            for n in nodes:
                print(f"  last log lines of {n.name} ({n.log_path}):\n{n.log_tail(8)}", flush=True)
        return failures
    except BaseException:
        for n in nodes:
            print(f"  last log lines of {n.name} ({n.log_path}):\n{n.log_tail(8)}", flush=True)
        for server in pair.servers():
            print(f"  last log lines of {server.name}:\n{server.log_tail()}", flush=True)
        raise
    finally:
        for stop in stops:
            stop.set()
        for n in nodes:
            n.kill()
        if vip is not None:
            vip.close()
        pair.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--only", action="append", default=[], choices=sorted(DIALECTS),
                        help="run only this dialect; repeatable")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    if not leafd.wait_for_file(binary, 60):
        raise SystemExit(f"no leafd binary at {binary}")
    dialects = args.only or ["postgres", "mysql"]
    # SIGTERM (a CI time limit) runs the finally blocks: servers and nodes killed, files removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work_root = tempfile.mkdtemp(prefix="leafd-failover-")
    # The PostgreSQL user must reach its directories inside.
    os.chmod(work_root, 0o711)
    failed, keep, summaries = [], False, []
    began = time.monotonic()
    try:
        for dialect in dialects:
            for margin in (MARGIN, 0):
                name = f"{dialect} margin={margin}"
                work = os.path.join(work_root, f"{dialect}-{margin}")
                os.makedirs(work)
                os.chmod(work, 0o711)
                started = time.monotonic()
                try:
                    failures = scenario(dialect, margin, binary, work, summaries)
                except (leafd.NodeError, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                    failures = [f"{type(e).__name__}: {e}"]
                if leafd.print_outcome(name, failures, started):
                    # Its data directories (a quarter of a gigabyte for MariaDB) go at once.
                    shutil.rmtree(work, ignore_errors=True)
                else:
                    keep = True
                    failed.append(name)
    finally:
        if keep:
            print(f"failover: logs kept in {work_root}", flush=True)
        else:
            shutil.rmtree(work_root, ignore_errors=True)
    if summaries:
        print("failover: summary\n" + "\n".join(f"  {line}" for line in summaries), flush=True)
    if failed:
        raise SystemExit(f"failover: FAILED {', '.join(failed)}")
    print(f"failover: all {len(dialects) * 2} runs passed in {time.monotonic() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
