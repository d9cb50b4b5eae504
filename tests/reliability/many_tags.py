"""Many trend tags under faults: every (tag, ID) pair every node hands out is collected and checked.

N nodes on one database (a fresh MariaDB/PostgreSQL database, or a new SQLite file), T tags made
by `leafd migrate` and rows inserted straight into leaf_alloc (step STEP, fixed: loads come often,
and many cold tags load at once, so allocations of different tags share batched transactions).
C connections spread over the nodes send pipelined INCR segment:<random tag>. Meanwhile, per
option, faults:

  --kill-every S      SIGKILL a random node every ~S s (default 3; 0: never) and start it again
                      (same state_dir);
  --shared-state      every node the same state_dir (processes sharing the segment marks);
  --commit-kill R     every node reaches the database through a proxy that kills the connection
                      at a fraction R of the COMMITs (half before forwarding it, half after it:
                      committed, reply lost) (full_disk.py's CommitKillProxy);
  --restore           snapshot leaf_alloc's max_ids at 1/3 of the run, put them back at 2/3
                      (a database gone back, on the same instance);
  --full-disk SIZE    the state_dirs on a tmpfs of SIZE (e.g. 4m), filled to 100% at 1/4 of the
                      run, a node SIGKILLed while full, freed at 2/3, the node started again.

Checks, failing the run (exit status 1):
  * no (tag, ID) pair served twice: across all nodes and all connections; with --restore, only
    within one state_dir (a range another node loaded before a restore onto the same instance is
    the documented limit of the marks: docs/operations/failover-and-restore.md), the rest shown;
  * per connection, the IDs of each tag strictly increasing;
  * no ID above its tag's max_id in the table after the run (not with --restore);
  * every node serving in the last 2 s (after the faults).
Error replies are allowed and counted by their first word.

usage: many_tags.py LEAFD_BIN DB_URL [options]
  DB_URL: mysql://root@127.0.0.1:3306, postgres://postgres@127.0.0.1:5432 (no database name:
  one is created and dropped), or sqlite (a new file in the work directory)
Seed: MANY_TAGS_SEED (printed). Loopback only; about --seconds plus starts and checks.
"""
import argparse
import array
import bisect
import collections
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402
import full_disk  # noqa: E402  (SqlDatabase, CommitKillProxy, DiskFiller, tmpfs helpers)

ID_BITS = 44  # (tag index << ID_BITS) | id as one sortable integer
LAST_WINDOW = 2.0


class Db:
    """The database of a run: SQL statements by dialect, rows inserted in bulk."""

    def __init__(self, url, work):
        self.dialect = "sqlite" if url == "sqlite" else ("mysql" if url.startswith("mysql") else "postgres")
        if self.dialect == "sqlite":
            self.path = os.path.join(work, "db", "leafd.db")
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.sql_db = None
        else:
            self.sql_db = full_disk.SqlDatabase(self.dialect, url)
            self.sql_db.name = self.sql_db.name.replace("fulldisk", "manytags")

    def create(self):
        if self.sql_db:
            self.sql_db.create()

    def drop(self):
        if self.sql_db:
            self.sql_db.drop()

    def url(self, port=None):
        if self.dialect == "sqlite":
            return f"sqlite://{self.path}"
        return self.sql_db.url(port=port, plain=port is not None)

    def run(self, sql):
        if self.dialect == "sqlite":
            with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as c:
                rows = c.execute(sql).fetchall() if sql.lstrip().upper().startswith("SELECT") else None
                if rows is None:
                    c.executescript(sql)
                c.commit()
            return "\n".join("\t".join(str(v) for v in r) for r in rows or [])
        return self.sql_db.run(sql, database=self.sql_db.name)

    def insert_tags(self, tags, step):
        for i in range(0, len(tags), 500):
            values = ", ".join(f"('{t}', 1, {step})" for t in tags[i:i + 500])
            self.run(f"INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES {values};")

    def max_ids(self):
        both = "biz_tag || ' ' || max_id" if self.dialect == "sqlite" else "CONCAT(biz_tag, ' ', max_id)"
        out = self.run(f"SELECT {both} FROM leaf_alloc")
        return {line.split(" ")[0]: int(line.split(" ")[1]) for line in out.splitlines() if line}

    def snapshot(self):
        self.run("CREATE TABLE leaf_snap AS SELECT biz_tag, max_id, exclusive_max FROM leaf_alloc;")

    def restore(self):
        if self.dialect == "mysql":
            sql = ("UPDATE leaf_alloc a JOIN leaf_snap s ON a.biz_tag = s.biz_tag "
                   "SET a.max_id = s.max_id, a.exclusive_max = s.exclusive_max;")
        else:
            sql = ("UPDATE leaf_alloc SET max_id = (SELECT s.max_id FROM leaf_snap s WHERE s.biz_tag = leaf_alloc.biz_tag), "
                   "exclusive_max = (SELECT s.exclusive_max FROM leaf_snap s WHERE s.biz_tag = leaf_alloc.biz_tag) "
                   "WHERE biz_tag IN (SELECT biz_tag FROM leaf_snap);")
        self.run(sql)


class TagLoader(threading.Thread):
    """One client of one node: pipelined INCR segment:<random tag>, every (tag, ID) kept."""

    def __init__(self, name, node, tags, stop, batch, seed):
        super().__init__(daemon=True, name=name)
        self.node, self.tags, self.stop_event, self.batch = node, tags, stop, batch
        self.rng = random.Random(seed)
        self.keys = array.array("q")       # (tag index << ID_BITS) | id
        self.batches = []                  # (index into keys, monotonic time, connection number)
        self.errors = collections.Counter()
        self.error_examples = {}
        self.drops = collections.Counter()
        self.unexpected = []
        self.order_violations = 0
        self.order_examples = []
        self.connections = 0

    def run(self):
        while not self.stop_event.is_set():
            try:
                conn = leafd.RespConnection(self.node.port, timeout=10)
            except OSError as e:
                self.drops[f"connect: {type(e).__name__}"] += 1
                self.stop_event.wait(0.05)
                continue
            self.connections += 1
            try:
                self._serve(conn)
            except OSError as e:
                self.drops[f"{type(e).__name__}"] += 1
                self.stop_event.wait(0.02)
            finally:
                conn.close()

    def _serve(self, conn):
        last = {}  # tag index -> last ID on this connection
        n_tags = len(self.tags)
        while not self.stop_event.is_set():
            picks = [self.rng.randrange(n_tags) for _ in range(self.batch)]
            conn.send_encoded(b"".join(leafd.encode("INCR", f"segment:{self.tags[i]}") for i in picks))
            self.batches.append((len(self.keys), time.monotonic(), self.connections))
            errored = False
            for i in picks:
                reply = conn.read_reply()
                if type(reply) is int:
                    if reply >= 1 << ID_BITS or reply < 0:
                        self.unexpected.append(f"{self.tags[i]}: {reply} out of the checked range")
                        continue
                    self.keys.append((i << ID_BITS) | reply)
                    prev = last.get(i)
                    if prev is not None and reply <= prev:
                        self.order_violations += 1
                        if len(self.order_examples) < 5:
                            self.order_examples.append(f"{self.name} conn {self.connections} tag {self.tags[i]}: "
                                                       f"{reply} after {prev}")
                    last[i] = reply
                elif isinstance(reply, leafd.ErrorReply):
                    self.errors[reply.kind] += 1
                    self.error_examples.setdefault(reply.kind, str(reply)[:200])
                    errored = True
                else:
                    self.unexpected.append(f"{self.tags[i]}: {reply!r}"[:120])
            if errored:
                self.stop_event.wait(0.01)

    def when(self, position):
        """(monotonic time, connection number) of the batch that holds keys[position]."""
        t = c = None
        for start, bt, bc in self.batches:
            if start > position:
                break
            t, c = bt, bc
        return t, c


def served_between(loaders, since):
    n = 0
    for l in loaders:
        for idx, (start, t, _) in enumerate(l.batches):
            if t >= since:
                n += len(l.keys) - start
                break
    return n


def log_lines_near(node, tag, limit=6):
    lines = [line for line in node.log_text().splitlines() if tag in line]
    return lines[-limit:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("db_url")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--tags", type=int, default=2000)
    parser.add_argument("--step", type=int, default=100)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--batch", type=int, default=20, help="INCRs per pipelined batch")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--kill-every", type=float, default=3, help="0: no SIGKILLs")
    parser.add_argument("--shared-state", action="store_true")
    parser.add_argument("--commit-kill", type=float, default=0)
    parser.add_argument("--restore", action="store_true")
    parser.add_argument("--full-disk", metavar="SIZE")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    seed = int(os.environ.get("MANY_TAGS_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    print(f"many-tags: seed {seed} (MANY_TAGS_SEED), {binary}, {args}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = tempfile.mkdtemp(prefix="leafd-many-tags-")
    db = Db(args.db_url, work)
    nodes, proxy, mounted, filler = [], None, None, None
    failures, keep = [], args.keep
    try:
        db.create()
        if args.commit_kill and db.dialect == "sqlite":
            raise SystemExit("--commit-kill needs MariaDB or PostgreSQL")
        if args.commit_kill:
            proxy = full_disk.CommitKillProxy(db.dialect, db.sql_db.host, db.sql_db.port, args.commit_kill,
                                              random.Random(rng.random()))
        state_root = os.path.join(work, "state")
        if args.full_disk:
            full_disk.TMPFS_SIZE = args.full_disk
            full_disk.mount_tmpfs(state_root)
            mounted = state_root
        config = {"segment": {"adaptive_step": False}, "snowflake": {"enabled": False},
                  "storage": {"max_connections": 8}}
        url = db.url(proxy.port if proxy else None)
        for n in range(args.nodes):
            state = os.path.join(state_root, "shared" if args.shared_state else f"n{n}")
            nodes.append(leafd.Node(binary, work, f"n{n}", url, state_dir=state, config=config))
        # Schema first (a migrate run), then the rows, then the nodes.
        migrate = subprocess.run([binary, "-c", nodes[0].config_path, "--storage-url", db.url(), "migrate"],
                                 capture_output=True, text=True, timeout=60)
        if migrate.returncode != 0:
            raise RuntimeError(f"leafd migrate failed: {migrate.stderr[-500:]}")
        # Mixed case and punctuation: rows are locked in lowercase order.
        tags = [f"{'Tg' if i % 3 == 0 else 'tg'}.{i:05d}-{'X' if i % 2 else 'y'}" for i in range(args.tags)]
        db.insert_tags(tags, args.step)
        for node in nodes:
            node.start().wait_ready(60)
        if proxy:
            proxy.armed.set()

        stop = threading.Event()
        loaders = [TagLoader(f"c{i}@{nodes[i % len(nodes)].name}", nodes[i % len(nodes)], tags, stop, args.batch,
                             rng.random()) for i in range(args.clients)]
        events = []
        t0 = time.monotonic()

        def event(what):
            events.append((time.monotonic() - t0, what))
            print(f"  {time.monotonic() - t0:6.1f} s  {what}", flush=True)

        for l in loaders:
            l.start()
        end = t0 + args.seconds
        next_kill = t0 + (rng.uniform(0.5, 1.5) * args.kill_every if args.kill_every else float("inf"))
        snap_at = t0 + args.seconds / 3 if args.restore else float("inf")
        restore_at = t0 + 2 * args.seconds / 3 if args.restore else float("inf")
        fill_at = t0 + args.seconds / 4 if args.full_disk else float("inf")
        free_at = t0 + 2 * args.seconds / 3 if args.full_disk else float("inf")
        killed_full = None
        faults_until = max(t for t in (free_at, restore_at, t0) if t != float("inf"))
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= snap_at:
                db.snapshot()
                snap_at = float("inf")
                event("leaf_alloc snapshot taken")
            if now >= restore_at:
                db.restore()
                restore_at = float("inf")
                event("leaf_alloc max_ids restored from the snapshot")
            if now >= fill_at:
                filler = full_disk.DiskFiller(state_root)
                before = full_disk.free_bytes(state_root)
                filler.fill()
                fill_at = float("inf")
                event(f"tmpfs filled ({before} bytes were free, {full_disk.free_bytes(state_root)} left)")
                killed_full = rng.choice(nodes)
                time.sleep(min(2.0, (free_at - time.monotonic()) / 2))
                killed_full.kill()
                event(f"{killed_full.name} SIGKILLed while the disk is full")
            if now >= free_at:
                filler.free()
                free_at = float("inf")
                event("tmpfs freed")
                if killed_full is not None:
                    killed_full.start().wait_ready(60)
                    event(f"{killed_full.name} started again")
            if now >= next_kill and now < end - 4:
                victim = rng.choice([n for n in nodes if n.running()])
                victim.kill()
                event(f"{victim.name} SIGKILLed")
                time.sleep(rng.uniform(0.1, 0.8))
                try:
                    victim.start().wait_ready(60)
                except leafd.NodeError as e:
                    failures.append(f"{victim.name} did not start again: {e}")
                    break
                event(f"{victim.name} started again")
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * args.kill_every
            time.sleep(0.05)
        run_end = time.monotonic()
        stop.set()
        for l in loaders:
            l.join(30)
        if proxy:
            proxy.armed.clear()
        for node in nodes:
            status = node.died()
            if status is not None:
                failures.append(f"{node.name} exited by itself (status {status}): {leafd.first_error_line(node)}")
        leafd.stop_all(nodes)

        # --- checks --------------------------------------------------------------------------
        group_of = {n.name: ("shared" if args.shared_state else n.name) for n in nodes}
        owner = []  # per key position: loader index, via parallel arrays
        all_keys = array.array("q")
        for li, l in enumerate(loaders):
            all_keys.extend(l.keys)
            owner.append(len(all_keys))
        order = sorted(range(len(all_keys)), key=all_keys.__getitem__)

        def loader_at(pos):
            return bisect.bisect_right(owner, pos)

        def who(pos):
            li = loader_at(pos)
            start = owner[li - 1] if li else 0
            t, conn = loaders[li].when(pos - start)
            return loaders[li], t, conn

        repeats_same, repeats_cross, examples = 0, 0, []
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and all_keys[order[j + 1]] == all_keys[order[i]]:
                j += 1
            if j > i:
                groups = collections.Counter(group_of[loaders[loader_at(order[k])].node.name]
                                             for k in range(i, j + 1))
                same = any(c > 1 for c in groups.values())
                if same or not args.restore:
                    repeats_same += j - i
                else:
                    repeats_cross += j - i
                if len(examples) < 8:
                    holders = [who(order[k]) for k in range(i, j + 1)]
                    key = all_keys[order[i]]
                    examples.append((tags[key >> ID_BITS], key & ((1 << ID_BITS) - 1),
                                     [(h[0].name, f"conn {h[2]}", f"{h[1] - t0:.2f} s") for h in holders], same))
            i = j + 1

        errors = sum((l.errors for l in loaders), collections.Counter())
        error_examples = {}
        for l in loaders:
            for k, v in l.error_examples.items():
                error_examples.setdefault(k, v)
        order_violations = sum(l.order_violations for l in loaders)
        unexpected = [u for l in loaders for u in l.unexpected]
        above = []
        if not args.restore:
            max_ids = db.max_ids()
            highest = {}
            for key in all_keys:
                t, v = key >> ID_BITS, key & ((1 << ID_BITS) - 1)
                if v > highest.get(t, 0):
                    highest[t] = v
            above = [(tags[t], v, max_ids.get(tags[t])) for t, v in highest.items()
                     if max_ids.get(tags[t]) is None or v > max_ids[tags[t]]]
        drops = sum((l.drops for l in loaders), collections.Counter())
        tags_served = len({k >> ID_BITS for k in all_keys})
        print(f"many-tags {db.dialect}: {len(all_keys)} (tag, ID) pairs over {tags_served} tags from "
              f"{len(nodes)} nodes, {args.clients} clients; repeats {repeats_same}"
              + (f" (+ {repeats_cross} across state_dirs after the restore: the documented limit)" if args.restore else "")
              + f", order violations {order_violations}, above max_id {len(above)}, "
              f"errors {dict(sorted(errors.items()))}", flush=True)
        for kind, text in sorted(error_examples.items()):
            print(f"  error {kind}: {text}", flush=True)
        if drops:
            print(f"  lost connections: {dict(drops.most_common(4))}", flush=True)
        if proxy:
            print(f"  commit-kill proxy: {proxy.commits} COMMITs, killed before {proxy.killed['before']} "
                  f"after {proxy.killed['after']}", flush=True)
        for node in nodes:
            mine = [l for l in loaders if l.node is node]
            recent = served_between(mine, run_end - LAST_WINDOW)
            print(f"  {node.name}: {sum(len(l.keys) for l in mine)} IDs, last {LAST_WINDOW:g} s {recent}", flush=True)
            if recent == 0 and run_end - faults_until > LAST_WINDOW + 1:
                failures.append(f"{node.name} served nothing in the last {LAST_WINDOW:g} s")
        warnings = leafd.log_warnings(nodes)
        for line, count in warnings.most_common(8):
            print(f"  log x{count}: {line[:220]}", flush=True)
        for tag, v, holders, same in examples:
            print(f"  repeat{'' if same else ' (across state_dirs)'}: tag {tag} id {v} served by {holders}", flush=True)
            for node in nodes:
                for line in log_lines_near(node, tag, 4):
                    print(f"    {node.name}| {line[:300]}", flush=True)
        if repeats_same:
            failures.append(f"{repeats_same} (tag, ID) pairs served more than once")
        if order_violations:
            failures.append(f"{order_violations} order violations, e.g. {[e for l in loaders for e in l.order_examples][:3]}")
        if above:
            failures.append(f"{len(above)} tags served an ID above the table's max_id, e.g. {above[:3]}")
        if unexpected:
            failures.append(f"{len(unexpected)} unexpected replies, e.g. {unexpected[:3]}")
        if not all_keys:
            failures.append("no ID was served")
    except (leafd.NodeError, RuntimeError, OSError, subprocess.TimeoutExpired, sqlite3.Error,
            full_disk.Skip, ValueError, IndexError) as e:
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        for node in nodes:
            node.kill()
        if filler:
            filler.free()
        if proxy:
            proxy.close()
        if mounted:
            full_disk.unmount(mounted)
        try:
            db.drop()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print(f"  could not drop database: {e}", flush=True)
    if failures:
        print("FAILED many-tags:", flush=True)
        for f in failures:
            print(f"  - {f}", flush=True)
        print(f"many-tags: work directory kept: {work}", flush=True)
        sys.exit(1)
    print("ok many-tags", flush=True)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"many-tags: work directory kept: {work}", flush=True)


if __name__ == "__main__":
    main()
