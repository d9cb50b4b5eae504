"""Upgrade, rollback and upgrade again under load, on the real binaries: the previous release and
this one take turns on one database (MariaDB or PostgreSQL) and no segment or snowflake ID is
served twice.

Two hosts, A and B, each with its own state directory that every binary run on the host uses
(as a binary swapped in place would), on a new database the previous release creates:
  1. A and B run the previous release;
  2. upgrade, one host at a time: A, then B, stopped (SIGTERM) and started with this release (the
     first start migrates the schema under B's load);
  3. rollback, one host at a time: B is SIGKILLed (a crash, then the rollback) and A stopped, each
     started with the previous release on the migrated schema and this release's state files;
  4. upgrade again: A, then B, with this release.
Each step lasts PHASE s under load on both hosts (leafd.standard_load: INCR, INCRBY, SNOWFLAKE,
pipelined), every ID of every run collected: no segment ID twice, none above the row's max_id, no
connection going back, no snowflake ID twice; every start must come up, no node may exit by
itself.

    python3 tests/reliability/rollback.py NEW_LEAFD PREV_LEAFD --url mysql://root@127.0.0.1:3306
    python3 tests/reliability/rollback.py NEW_LEAFD PREV_LEAFD --url postgres://postgres@127.0.0.1:5432
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

PHASE = 3.0  # seconds each step lasts
TAG = "rollback"


class Server:
    """The MariaDB or PostgreSQL server a URL names, through its command-line client."""

    def __init__(self, url):
        self.url = url.rstrip("/")
        parsed = urllib.parse.urlparse(self.url)
        self.kind = "mysql" if parsed.scheme in ("mysql", "mariadb") else "postgres"
        self.user = parsed.username or ("root" if self.kind == "mysql" else "postgres")
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port

    def sql(self, statement, database=None):
        if self.kind == "mysql":
            cmd = ["mysql", "-u", self.user, "-h", self.host, "-P", str(self.port or 3306), "-N",
                   "-B", "-e", statement] + ([database] if database else [])
        else:
            cmd = ["psql", "-U", self.user, "-h", self.host, "-p", str(self.port or 5432), "-tA",
                   "-d", database or "postgres", "-c", statement]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60)
        return out.stdout.strip()

    def database_url(self, name):
        return f"{self.url}/{name}"


def one_run(new_binary, prev_binary, server):
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix=f"leafd-rollback-{server.kind}-")
    database = f"leafd_rollback_{os.getpid()}"
    server.sql(f"CREATE DATABASE {database}")
    url = server.database_url(database)
    config = {"segment.tags": [{"tag": TAG, "step": 1000}],
              "snowflake": {"database_lease_ms": 2000}}
    stop_events, loaders, nodes, failures = {}, [], [], []
    hosts = {"a": None, "b": None}  # the node running on each host
    runs = {"a": 0, "b": 0}

    def start(host, binary):
        runs[host] += 1
        release = "new" if binary == new_binary else "prev"
        name = f"{host}{runs[host]}-{release}"
        node = leafd.Node(binary, work, name, url, state_dir=os.path.join(work, f"host-{host}"),
                          config=config)
        nodes.append(node)
        hosts[host] = node
        if node.start().wait_ready(60, allow_exit=True) is None:
            failures.append(f"{name} did not start: {node.log_tail(4)}")
            return
        stop_events[name] = threading.Event()
        for each in leafd.standard_load(node, TAG, stop_events[name]):
            loaders.append(each)
            each.start()

    def stop(host, kill=False):
        node = hosts[host]
        stop_events.get(node.name, threading.Event()).set()
        if kill:
            node.kill()
            return
        node.terminate()
        if node.wait(15) != 0:
            failures.append(f"{node.name} exited with status {node.process.returncode} after SIGTERM")

    def swap(host, binary, kill=False):
        stop(host, kill)
        start(host, binary)
        print(f"  host {host}: {hosts[host].name} serves"
              + (" (after a SIGKILL)" if kill else ""), flush=True)
        time.sleep(PHASE)

    try:
        start("a", prev_binary)
        start("b", prev_binary)
        time.sleep(PHASE)
        swap("a", new_binary)   # the upgrade, one host at a time
        swap("b", new_binary)
        swap("b", prev_binary, kill=True)  # the rollback
        swap("a", prev_binary)
        swap("a", new_binary)   # the upgrade again
        swap("b", new_binary)
        stop("a")
        stop("b")
        for node in nodes:
            if node.died() is not None:
                failures.append(f"{node.name} exited by itself: {node.log_tail(4)}")
    finally:
        for event in stop_events.values():
            event.set()
        for each in loaders:
            each.join(30)
        leafd.stop_all(nodes)
        try:
            max_id = int(server.sql(f"SELECT max_id FROM leaf_alloc WHERE biz_tag = '{TAG}'",
                                    database) or 0)
            versions = server.sql("SELECT MAX(version) FROM _sqlx_migrations", database)
        finally:
            server.sql(f"DROP DATABASE IF EXISTS {database}")
            shutil.rmtree(work, ignore_errors=True)
    report = leafd.IdReport(loaders, max_id)
    served = {n.name: sum(l.segment_count() + len(l.snowflakes) for l in loaders
                          if l.node is n) for n in nodes}
    print("  " + report.summary(f"rollback {server.kind}", f", IDs per node {served}, "
                                f"schema at migration {versions}"), flush=True)
    failures += report.failures()
    for name, count in served.items():
        if count == 0:
            failures.append(f"{name} served no ID")
    return leafd.print_outcome(f"rollback {server.kind}", failures, started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("new")
    parser.add_argument("prev")
    parser.add_argument("--url", required=True, help="mysql://user@host:port or postgres://user@host:port")
    args = parser.parse_args()
    ok = one_run(os.path.abspath(args.new), os.path.abspath(args.prev), Server(args.url))
    sys.exit(0 if ok else 1)


main()
