"""Two data centres, one tag, a changed split: no ID may be handed out by both clusters.

Two clusters, each on its OWN database (two fresh MariaDB databases with --mysql, else two SQLite
files), two nodes per cluster, the tag `dc` created in each with `LEAF.TAG CREATE dc 10`. Every
ID every node hands out (INCR, and each ID of an INCRBY block: n IDs spaced id_delta apart, the
reply the last) is kept and, at the end of each phase, checked against everything kept before,
both clusters together:

  phase 1  A 2/0, B 2/1 (segment.id_delta / id_remainder): INCR and INCRBY 7/40/60/150 from 3
           client threads per node, 3 times a node of each cluster SIGKILLed and restarted under
           load. A's IDs even, B's odd, each connection's IDs increasing, 0 repeats, no error.
  phase 2  a permitted change: A1 restarted (SIGTERM) with 4/0 under load: it narrows A's
           recorded split to 4:0 (read back from A's table). A2, still 2/0, must be refused
           from its next allocation within 3 s (it serves what it holds; segment.max_step = 200
           keeps the nodes allocating). A2 restarted with 4/2: only one
           narrower class can be recorded, so it must be refused ("IDs refused: the tag's split
           is recorded as id_delta:id_remainder 4:0 and this node's 4:2 ...") and serve
           nothing. A's IDs still even, B's odd, 0 repeats.
  phase 3  a refused change (issue 31's minimal case): every node of both clusters SIGKILLed
           and restarted with delta 3 (A remainder 1, B remainder 2). Every INCR and INCRBY is
           refused with a reply naming "IDs refused" and "LEAF.TAG SPLIT"; no ID is handed out.
           Then the operator procedure of docs/concepts/segments.md: each cluster's max_id read
           with LEAF.TAGS on every node, start = the highest + 1, `LEAF.TAG SPLIT dc 3 <r>
           <start>` in each cluster (its reply, the row's max_id after, must be >= start), the
           record read back (3:1, 3:2). Under load, 2 more SIGKILL restarts per cluster: every
           node serves again, IDs >= start, 1 mod 3 in A and 2 mod 3 in B, 0 repeats across all
           three phases.

The procedure's premise is checked too: each cluster's max_id as LEAF.TAGS shows it must be
above every ID that cluster served, or a start computed from it (as documented) can let the other
cluster repeat IDs. The start actually used is the highest of LEAF.TAGS's max_ids, each
database's max_id read directly and the highest ID collected, plus 1, so the later checks stay
meaningful when that premise fails (--stale-tags-ok reports it without failing;
--documented-start uses LEAF.TAGS's figure alone, to show what it does).

Every refusal is parsed ("recorded as <R> and this node's <M>"): M must be the node's own
split and R the split its table records (or recorded before a SPLIT, until the node's back-off
has passed); any other error reply, an ID out of its residue class, an ID at or above its
database's max_id at the end, a connection's IDs going back, or a panic in a node's log fails
the run. Each phase prints its IDs per cluster, the repeats and the refusals seen.

--previous PREV_BIN instead runs only the minimal case, on PREV_BIN (a release without the
split record: it must repeat IDs) and on LEAFD_BIN (it must refuse), and prints the figures:
A (2/0) INCRBY dc 500, B (2/1) INCR; both restarted with delta 3, A r1, B r2; 200 INCRs on
each; B's IDs that A had served are counted.

usage: split_clusters.py LEAFD_BIN [--mysql mysql://root@127.0.0.1:3306] [--previous PREV_BIN]
                         [--stale-tags-ok] [--documented-start] [--keep]
Loopback only; the databases (or SQLite files) are created fresh and dropped at the end, also on
failure. 35-45 s on 2 cores.
"""
import argparse
import array
import collections
import contextlib
import itertools
import os
import random
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

TAG = "dc"
STEP = 10
# The adaptive step doubles up to segment.max_step: capped at 200 positions, the nodes keep
# allocating (each allocation checks the split), and an INCRBY 150 (300 positions at delta 2)
# or 60 at delta 4 is reserved directly in the database (the block path checks it too).
MAX_STEP = 200
CLIENTS = 3               # per node: 2 of INCR, 1 of INCR mixed with INCRBY 7/40/60/150
BATCH = 8                 # commands per pipelined batch
BLOCKS = (7, 40, 60, 150)
PAUSE = 0.002             # between a client's batches (2 cores run 4 nodes, the database and us)
PHASE1_KILLS, PHASE1_BETWEEN = 3, 3.5
PHASE2_SETTLE = 3.0
REFUSED_WINDOW = 2.5      # phase 3: seconds of load with every node refused
SERVE_AGAIN = 12.0        # phase 3: bound for every node to serve after SPLIT (back-off <= 5 s)
PHASE3_KILLS, PHASE3_BETWEEN = 2, 3.0
BACKOFF_SLACK = 0.5       # a refusal this long after a node's first ID in phase 3 is a failure
REFUSED = "IDs refused"
EXACT_FRAGMENT = "IDs refused: the tag's split is recorded as"
REFUSAL_RE = re.compile(r"recorded as (?:id_delta:id_remainder (\d+:\d+)|the whole ID space \(no split\)) "
                        r"and this node's (\d+:\d+) is not inside it")


class Failure(Exception):
    pass


# --- databases ----------------------------------------------------------------------------------

class Database:
    """A cluster's own database: a fresh MariaDB database (--mysql) or a new SQLite file."""

    def __init__(self, label, work, mysql=None):
        self.label, self.mysql = label, mysql
        self.name = f"leafd_split_{os.getpid()}_{secrets.token_hex(2)}_{label}"
        self.created = False
        if mysql:
            parts = urllib.parse.urlsplit(mysql.rstrip("/"))
            if parts.scheme != "mysql" or parts.path not in ("", "/"):
                raise SystemExit(f"--mysql: give a server URL without a database name: {mysql}")
            self.parts = parts
            self.user = urllib.parse.unquote(parts.username or "root")
            self.password = urllib.parse.unquote(parts.password) if parts.password else None
            self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 3306
            self.url = f"mysql://{parts.netloc}/{self.name}?ssl-mode=disabled"
            self.dialect = "mysql"
        else:
            self.path = os.path.join(work, f"{self.name}.db")
            self.url = f"sqlite://{self.path}"
            self.dialect = "sqlite"

    def sql(self, statement, database=None):
        env = dict(os.environ)
        cmd = ["mysql", "-u", self.user, "-h", self.host, "-P", str(self.port), "-N", "-B", "-e", statement]
        if database:
            cmd.append(database)
        if self.password:
            env["MYSQL_PWD"] = self.password
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"mysql did not answer in 30 s: {statement!r}") from None
        if result.returncode != 0:
            raise RuntimeError(f"mysql failed on {statement!r}: {result.stderr.strip()}")
        return result.stdout.strip()

    def create(self):
        if self.mysql:
            self.sql(f"CREATE DATABASE `{self.name}`")
        self.created = True  # SQLite: leafd creates the file

    def drop(self):
        if not self.created:
            return
        self.created = False
        if self.mysql:
            self.sql(f"DROP DATABASE IF EXISTS `{self.name}`")
        else:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path + suffix)

    def row(self, tag=TAG):
        """(max_id, split) of the tag's row, read directly; None when there is no row."""
        if self.mysql:
            out = self.sql(f"SELECT max_id, COALESCE(split, '') FROM leaf_alloc WHERE biz_tag = '{tag}'",
                           database=self.name)
            if not out:
                return None
            max_id, _, split = out.partition("\t")
            return int(max_id), split or None
        with contextlib.closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)) as db:
            row = db.execute("SELECT max_id, split FROM leaf_alloc WHERE biz_tag = ?", (tag,)).fetchone()
        return (int(row[0]), row[1] or None) if row else None


# --- nodes: a slot per node, a generation per process --------------------------------------------

class Generation:
    """One process of a node: its split, its port, and what its clients got from it."""

    def __init__(self, slot, node, delta, remainder, phase, number):
        self.slot, self.node, self.delta, self.remainder = slot, node, delta, remainder
        self.phase, self.number = phase, number
        self.cluster = slot.cluster
        self.label = f"{slot.name}#{number} ({delta}/{remainder}, phase {phase})"
        self.lock = threading.Lock()
        self.ids = array.array("q")
        self.first_id_at = None          # monotonic time of its first ID
        self.refusals = []               # (monotonic time, text)
        self.other_errors = collections.Counter()
        self.served_before_split = 0     # phase 3: IDs before its cluster's SPLIT was sent
        self.unexpected = []

    @property
    def split(self):
        return f"{self.delta}:{self.remainder}"


class Slot:
    """A node of a cluster (a directory and state directory kept across restarts); `gen` is the
    process the clients connect to."""

    def __init__(self, binary, work, cluster, name, db):
        self.binary, self.work, self.cluster, self.name, self.db = binary, work, cluster, name, db
        self.gen = None
        self.gens = []

    def start(self, delta, remainder, phase):
        """A new process (new port, the same directory, so its high-water marks stay) with this
        split; waits until it answers PING."""
        config = {"segment": {"id_delta": delta, "id_remainder": remainder, "max_step": MAX_STEP}}
        node = leafd.Node(self.binary, self.work, self.name, self.db.url, config=config)
        gen = Generation(self, node, delta, remainder, phase, len(self.gens) + 1)
        self.gens.append(gen)
        node.start()
        self.gen = gen  # clients move to it (connects are retried until it listens)
        node.wait_ready(30)
        return gen

    def kill(self):
        if self.gen is not None:
            self.gen.node.kill()

    def stop_gracefully(self, bound=10):
        node = self.gen.node
        node.terminate()
        try:
            code = node.wait(bound)
        except subprocess.TimeoutExpired:
            node.kill()
            raise Failure(f"{self.name} still running {bound} s after SIGTERM\n{node.log_tail()}")
        if code != 0:
            raise Failure(f"{self.name} exited with status {code} after SIGTERM\n{node.log_tail()}")

    def call(self, *args):
        with leafd.RespConnection(self.gen.node.port, timeout=10) as c:
            return c.call(*args)


def tags_entry(reply, tag=TAG):
    """LEAF.TAGS's map (a flat array in RESP2) for `tag`, keys decoded."""
    if not isinstance(reply, list):
        raise Failure(f"LEAF.TAGS answered {reply!r}")
    for item in reply:
        entry = {k.decode() if isinstance(k, bytes) else k: v for k, v in zip(item[::2], item[1::2])}
        if entry.get("tag") in (tag, tag.encode()):
            return entry
    raise Failure(f"LEAF.TAGS has no entry for {tag}: {reply!r}")


# --- load -----------------------------------------------------------------------------------------

class Client(threading.Thread):
    """One client of a node (of whichever process its slot has): pipelined batches, every ID kept
    in the generation it came from, each connection's IDs checked to increase."""

    def __init__(self, slot, name, mixed, stop, split_sent, seed):
        super().__init__(daemon=True, name=name)
        self.slot, self.mixed, self.stop_event, self.split_sent = slot, mixed, stop, split_sent
        self.rng = random.Random(seed)
        self.order_violations = []
        self.drops = collections.Counter()
        self.connections = 0

    def batch(self):
        commands = [("INCR", f"segment:{TAG}")] * BATCH
        if self.mixed:
            commands = list(commands)
            for _ in range(self.rng.choice((1, 2))):
                commands[self.rng.randrange(BATCH)] = ("INCRBY", f"segment:{TAG}", self.rng.choice(BLOCKS))
        return commands

    def run(self):
        while not self.stop_event.is_set():
            gen = self.slot.gen
            try:
                conn = leafd.RespConnection(gen.node.port, timeout=10)
            except OSError as e:
                self.drops[f"connect: {type(e).__name__}"] += 1
                self.stop_event.wait(0.05)
                continue
            self.connections += 1
            try:
                self.serve(conn, gen)
            except OSError as e:
                self.drops[f"{type(e).__name__}"] += 1
                self.stop_event.wait(0.02)
            finally:
                conn.close()

    def serve(self, conn, gen):
        previous = None
        d = gen.delta
        while not self.stop_event.is_set() and self.slot.gen is gen:
            commands = self.batch()
            conn.send(commands)
            errored = False
            for command in commands:
                reply = conn.read_reply()
                n = command[2] if command[0] == "INCRBY" else 1
                if type(reply) is int:
                    first = reply - (n - 1) * d
                    if previous is not None and first <= previous:
                        self.order_violations.append(
                            f"{gen.label}: after {previous}, {' '.join(map(str, command))} -> {reply} "
                            f"(block from {first})")
                    previous = reply
                    now = time.monotonic()
                    with gen.lock:
                        if gen.first_id_at is None:
                            gen.first_id_at = now
                        if gen.phase == 3 and not self.split_sent[gen.cluster].is_set():
                            gen.served_before_split += n
                        if n == 1:
                            gen.ids.append(reply)
                        else:
                            gen.ids.extend(range(first, reply + 1, d))
                elif isinstance(reply, leafd.ErrorReply):
                    errored = True
                    with gen.lock:
                        if REFUSED in reply:
                            gen.refusals.append((time.monotonic(), str(reply)))
                        else:
                            gen.other_errors[str(reply)[:200]] += 1
                else:
                    gen.unexpected.append(f"{command}: {reply!r}"[:160])
            self.stop_event.wait(0.05 if errored else PAUSE)


# --- checks ---------------------------------------------------------------------------------------

def repeats_of(gens):
    """(IDs, repeats, examples with where each came from) over all the generations' IDs."""
    every = sorted(itertools.chain.from_iterable(g.ids for g in gens))
    repeats, examples = 0, []
    for a, b in zip(every, every[1:]):
        if a == b:
            repeats += 1
            if len(examples) < 5 and (not examples or examples[-1] != a):
                examples.append(a)
    described = []
    for v in examples:
        where = [f"{g.cluster}:{g.label} x{c}" for g in gens for c in [g.ids.count(v)] if c]
        described.append(f"{v} from {', '.join(where)}")
    return len(every), repeats, described


def parse_refusal(text):
    """(recorded split or None for the whole space, this node's split) of a refusal, or None."""
    m = REFUSAL_RE.search(text)
    return (m.group(1), m.group(2)) if m else None


class Scenario:
    def __init__(self, binary, work, mysql, stale_tags_ok, documented_start=False):
        self.binary, self.work, self.mysql, self.stale_tags_ok = binary, work, mysql, stale_tags_ok
        self.documented_start = documented_start
        self.dbs = {c: Database(c, work, mysql) for c in "AB"}
        self.slots = {}
        self.clients = []
        self.stop = threading.Event()
        self.split_sent = {c: threading.Event() for c in "AB"}
        self.failures = []
        self.start_id = None
        self.phase_gens = collections.defaultdict(list)  # phase -> generations started in it
        # Recorded splits a refusal may name, per generation label (set as phases go).
        self.allowed_records = {}
        self.counted = {}

    # -- helpers --
    def fail(self, text):
        print(f"  FAILURE: {text}", flush=True)
        self.failures.append(text)

    def gens(self, cluster=None):
        return [g for s in self.slots.values() for g in s.gens if cluster in (None, g.cluster)]

    def start(self, slot, delta, remainder, phase, allowed=()):
        gen = slot.start(delta, remainder, phase)
        self.allowed_records[id(gen)] = set(allowed)
        self.phase_gens[phase].append(gen)
        return gen

    def check_alive(self):
        for slot in self.slots.values():
            code = slot.gen.node.died()
            if code is not None:
                raise Failure(f"{slot.name} exited with status {code} on its own\n{slot.gen.node.log_tail()}")

    def kill_restart(self, cluster, index, phase, delta, remainder, allowed=()):
        slot = self.slots[f"{cluster}{index}"]
        slot.kill()
        self.start(slot, delta, remainder, phase, allowed)

    def phase_summary(self, phase, extra=""):
        """Prints the phase's figures (IDs kept since the previous summary, per cluster) and
        checks every ID kept so far, both clusters and all phases together."""
        total, repeats, examples = repeats_of(self.gens())
        extra = extra() if callable(extra) else extra
        now = {c: (sum(len(g.ids) for g in self.gens(c)), sum(len(g.refusals) for g in self.gens(c)),
                   sum(sum(g.other_errors.values()) for g in self.gens(c))) for c in "AB"}
        d = {c: [a - b for a, b in zip(now[c], self.counted.get(c, (0, 0, 0)))] for c in "AB"}
        self.counted = now
        print(f"phase {phase}: IDs collected A {d['A'][0]}, B {d['B'][0]}; refusals A {d['A'][1]}, "
              f"B {d['B'][1]}; other errors A {d['A'][2]}, B {d['B'][2]}; all phases so far {total} IDs, "
              f"repeats {repeats}{extra}", flush=True)
        if repeats:
            self.fail(f"after phase {phase}: {repeats} IDs handed out more than once across the clusters, "
                      f"e.g. {examples}")

    # -- the run --
    def run(self):
        for db in self.dbs.values():
            db.create()
        for c in "AB":
            for i in (1, 2):
                self.slots[f"{c}{i}"] = Slot(self.binary, self.work, c, f"{c}{i}", self.dbs[c])
        try:
            self.phase1()
            self.phase2()
            self.phase3()
        finally:
            self.stop.set()
            for client in self.clients:
                client.join(15)
        self.final_checks()

    def phase1(self):
        print(f"phase 1: A 2/0, B 2/1 on {self.dbs['A'].dialect} ({self.dbs['A'].name}, {self.dbs['B'].name})",
              flush=True)
        splits = {"A": (2, 0), "B": (2, 1)}
        for name, slot in self.slots.items():
            self.start(slot, *splits[slot.cluster], phase=1)
        for c in "AB":
            reply = self.slots[f"{c}1"].call("LEAF.TAG", "CREATE", TAG, STEP)
            if reply != "OK":
                raise Failure(f"LEAF.TAG CREATE {TAG} {STEP} in cluster {c} answered {reply!r}")
            row = self.dbs[c].row()
            print(f"  cluster {c}: LEAF.TAG CREATE {TAG} {STEP} -> OK; row max_id {row[0]}, split {row[1]}")
        seed = random.randrange(1 << 30)
        for name, slot in self.slots.items():
            for i in range(CLIENTS):
                self.clients.append(Client(slot, f"{name}/c{i}", i == CLIENTS - 1, self.stop,
                                           self.split_sent, seed + len(self.clients)))
        for client in self.clients:
            client.start()
        for k in range(PHASE1_KILLS):
            time.sleep(PHASE1_BETWEEN)
            self.check_alive()
            index = 1 + k % 2
            for c in "AB":
                self.kill_restart(c, index, 1, *splits[c])
            print(f"  SIGKILL + restart of A{index} and B{index}", flush=True)
        time.sleep(PHASE1_BETWEEN)
        self.check_alive()
        self.phase_summary(1)

    def phase2(self):
        print("phase 2: A1 -> 4/0, then A2 -> 4/2 (SIGTERM restarts under load); B stays 2/1", flush=True)
        a1, a2 = self.slots["A1"], self.slots["A2"]
        a1.stop_gracefully()
        gen_a1 = self.start(a1, 4, 0, 2)
        deadline = time.monotonic() + 10
        while gen_a1.first_id_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if gen_a1.first_id_at is None:
            raise Failure(f"A1 (4/0) served no ID in 10 s; refusals {gen_a1.refusals[:1]}, "
                          f"errors {dict(gen_a1.other_errors)}")
        row = self.dbs["A"].row()
        print(f"  A1 (4/0) serves; A's table records split {row[1]} (max_id {row[0]})", flush=True)
        if row[1] != "4:0":
            self.fail(f"after A1 served with 4/0, A's table records split {row[1]!r}, not '4:0'")
        # A2 (2/0) is now wider than the record: refused from its next allocation.
        for gen in a2.gens:
            self.allowed_records[id(gen)].add("4:0")
        time.sleep(PHASE2_SETTLE)
        wider = a2.gen
        a2.stop_gracefully()
        gen_a2 = self.start(a2, 4, 2, 2, allowed=("4:0",))
        print(f"  A2 (2/0) before its restart: {len(wider.refusals)} refusals after the narrowing"
              + (f", e.g. {wider.refusals[0][1][:200]!r}" if wider.refusals else ""), flush=True)
        if not any("4:0 and this node's 2:0" in text for _, text in wider.refusals):
            self.fail(f"A2, still 2/0, was not refused in the {PHASE2_SETTLE} s after A1 narrowed the record "
                      f"to 4:0 (the rule: refused from its next allocation)")
        deadline = time.monotonic() + 10
        while not gen_a2.refusals and time.monotonic() < deadline:
            time.sleep(0.05)
        direct = a2.call("INCR", f"segment:{TAG}")
        print(f"  A2 (4/2): INCR -> {str(direct)[:170]!r}", flush=True)
        if not (isinstance(direct, leafd.ErrorReply) and EXACT_FRAGMENT in direct
                and "4:0 and this node's 4:2" in direct):
            self.fail(f"A2 with 4/2 beside a 4:0 record: INCR answered {direct!r}, not a refusal with "
                      f"{EXACT_FRAGMENT!r} naming 4:0 and 4:2")
        if not gen_a2.refusals:
            self.fail("A2 (4/2): its clients saw no refusal in 10 s")
        time.sleep(PHASE2_SETTLE)
        self.check_alive()
        if gen_a2.ids:
            self.fail(f"A2 (4/2) handed out {len(gen_a2.ids)} IDs although A records 4:0, e.g. {list(gen_a2.ids[:5])}")
        row = self.dbs["A"].row()
        if row[1] != "4:0":
            self.fail(f"at the end of phase 2 A's table records split {row[1]!r}, not '4:0'")
        self.phase_summary(2, lambda: f"; A2 (4/2) refused {len(gen_a2.refusals)} times, served {len(gen_a2.ids)}")

    def phase3(self):
        print("phase 3: every node restarted (SIGKILL) with delta 3: A 3/1, B 3/2", flush=True)
        before = {c: self.dbs[c].row() for c in "AB"}
        splits = {"A": (3, 1), "B": (3, 2)}
        for slot in self.slots.values():
            slot.kill()
        # Until its cluster's SPLIT, a node may only be refused under the old record.
        for slot in self.slots.values():
            self.start(slot, *splits[slot.cluster], phase=3, allowed=(before[slot.cluster][1],))
        time.sleep(REFUSED_WINDOW)
        self.check_alive()
        for name, slot in self.slots.items():
            for command in (("INCR", f"segment:{TAG}"), ("INCRBY", f"segment:{TAG}", 150)):
                reply = slot.call(*command)
                if not (isinstance(reply, leafd.ErrorReply) and REFUSED in reply and "LEAF.TAG SPLIT" in reply):
                    self.fail(f"{name} ({slot.gen.split}) before SPLIT: {' '.join(map(str, command))} "
                              f"answered {reply!r}, not a refusal naming LEAF.TAG SPLIT")
        phase3 = self.phase_gens[3]
        served = sum(len(g.ids) for g in phase3)
        refusals = sum(len(g.refusals) for g in phase3)
        print(f"  before SPLIT: {refusals} refusals, {served} IDs handed out; e.g. "
              f"{phase3[0].refusals[0][1][:200] if phase3[0].refusals else None!r}", flush=True)
        if served:
            self.fail(f"{served} IDs handed out with delta 3 before any LEAF.TAG SPLIT")
        if not refusals:
            self.fail("no refusal seen with delta 3 before LEAF.TAG SPLIT")

        # The operator procedure: each cluster's max_id from LEAF.TAGS (every node).
        tags_max, db_max, served_max = {}, {}, {}
        for c in "AB":
            views = {}
            for i in (1, 2):
                entry = tags_entry(self.slots[f"{c}{i}"].call("LEAF.TAGS"))
                views[f"{c}{i}"] = entry.get("max_id")
            tags_max[c] = max(views.values())
            db_max[c] = self.dbs[c].row()[0]
            served_max[c] = max((max(g.ids) for g in self.gens(c) if g.ids), default=0)
            print(f"  cluster {c}: LEAF.TAGS max_id {views}; the database's max_id {db_max[c]}; "
                  f"highest ID the cluster served {served_max[c]}", flush=True)
            if tags_max[c] <= served_max[c]:
                text = (f"LEAF.TAGS max_id of cluster {c} (highest of its nodes: {tags_max[c]}) is not above "
                        f"the IDs it served (up to {served_max[c]}; its table's max_id {db_max[c]}): the "
                        f"documented procedure (start = every cluster's max_id + 1) would pick a start "
                        f"below IDs already handed out")
                if self.stale_tags_ok:
                    print(f"  NOTE (--stale-tags-ok): {text}", flush=True)
                else:
                    self.fail(text)
        documented = max(tags_max.values()) + 1
        self.start_id = max(max(tags_max.values()), max(db_max.values()), max(served_max.values())) + 1
        if self.documented_start:
            self.start_id = documented
        print(f"  start from LEAF.TAGS alone: {documented}; start used: {self.start_id}", flush=True)
        for c, (delta, remainder) in splits.items():
            self.split_sent[c].set()
            reply = self.slots[f"{c}1"].call("LEAF.TAG", "SPLIT", TAG, delta, remainder, self.start_id)
            row = self.dbs[c].row()
            print(f"  cluster {c}: LEAF.TAG SPLIT {TAG} {delta} {remainder} {self.start_id} -> {reply!r}; "
                  f"row max_id {row[0]}, split {row[1]}", flush=True)
            if type(reply) is not int or reply < self.start_id:
                self.fail(f"cluster {c}: LEAF.TAG SPLIT answered {reply!r}, not a max_id >= {self.start_id}")
            if row[1] != f"{delta}:{remainder}":
                self.fail(f"cluster {c}: after LEAF.TAG SPLIT the row records {row[1]!r}")
        split_at = time.monotonic()
        deadline = split_at + SERVE_AGAIN
        while any(g.first_id_at is None for g in phase3) and time.monotonic() < deadline:
            time.sleep(0.05)
        late = [g.label for g in phase3 if g.first_id_at is None]
        if late:
            raise Failure(f"not serving {SERVE_AGAIN} s after LEAF.TAG SPLIT: {late}; last refusals "
                          f"{[g.refusals[-1][1][:160] for g in phase3 if g.refusals][:2]}")
        print("  every node serves again " + ", ".join(
            f"{g.slot.name} after {g.first_id_at - split_at:.1f} s" for g in phase3), flush=True)
        for k in range(PHASE3_KILLS):
            time.sleep(PHASE3_BETWEEN)
            self.check_alive()
            index = 1 + k % 2
            for c in "AB":
                self.kill_restart(c, index, 3, *splits[c])
            print(f"  SIGKILL + restart of A{index} and B{index}", flush=True)
        time.sleep(PHASE3_BETWEEN)
        self.check_alive()
        self.stop.set()
        for client in self.clients:
            client.join(15)
        self.phase_summary(3, f"; start {self.start_id}")

    def final_checks(self):
        final = {c: self.dbs[c].row() for c in "AB"}
        for gen in self.gens():
            ids = gen.ids
            wrong = [i for i in ids if i % gen.delta != gen.remainder]
            if wrong:
                self.fail(f"{gen.cluster} {gen.label}: {len(wrong)} IDs outside {gen.remainder} mod {gen.delta}, "
                          f"e.g. {wrong[:5]}")
            cluster_class = {("A", 1): (2, 0), ("A", 2): (2, 0), ("B", 1): (2, 1), ("B", 2): (2, 1),
                             ("A", 3): (3, 1), ("B", 3): (3, 2)}[(gen.cluster, gen.phase)]
            off = [i for i in ids if i % cluster_class[0] != cluster_class[1]]
            if off:
                self.fail(f"{gen.label}: IDs not {cluster_class[1]} mod {cluster_class[0]}: {off[:5]}")
            if gen.phase == 3 and ids and min(ids) < self.start_id:
                self.fail(f"{gen.label}: IDs below the SPLIT start {self.start_id}: "
                          f"{sorted(i for i in ids if i < self.start_id)[:5]}")
            if ids and max(ids) >= final[gen.cluster][0]:
                self.fail(f"{gen.label}: ID {max(ids)} at or above its table's max_id {final[gen.cluster][0]}")
            if gen.served_before_split:
                self.fail(f"{gen.label}: {gen.served_before_split} IDs handed out before LEAF.TAG SPLIT")
            if gen.other_errors:
                self.fail(f"{gen.label}: error replies other than refusals: {dict(gen.other_errors.most_common(3))}")
            if gen.unexpected:
                self.fail(f"{gen.label}: unexpected replies: {gen.unexpected[:3]}")
            allowed = self.allowed_records.get(id(gen), set())
            bad = []
            for t, text in gen.refusals:
                parsed = parse_refusal(text)
                if parsed is None or parsed[1] != gen.split or parsed[0] not in allowed:
                    bad.append(text)
                elif gen.phase == 3 and gen.first_id_at is not None and t > gen.first_id_at + BACKOFF_SLACK:
                    bad.append(f"(after it served again) {text}")
                elif "LEAF.TAG SPLIT" not in text:
                    bad.append(text)
            if bad:
                self.fail(f"{gen.label}: {len(bad)} refusals not expected here (allowed records "
                          f"{sorted(map(str, allowed))}), e.g. {bad[0][:260]!r}")
        for client in self.clients:
            if client.order_violations:
                self.fail(f"{client.name}: {len(client.order_violations)} order violations, "
                          f"e.g. {client.order_violations[:3]}")
        for slot in self.slots.values():
            text = slot.gen.node.log_text()
            if "panicked" in text:
                line = next(l for l in text.splitlines() if "panicked" in l)
                self.fail(f"{slot.name}: a panic in its log: {line[:300]}")
        drops = sum((c.drops for c in self.clients), collections.Counter())
        total, repeats, _ = repeats_of(self.gens())
        per = {c: sum(len(g.ids) for g in self.gens(c)) for c in "AB"}
        print(f"all phases: {total} IDs checked (A {per['A']}, B {per['B']}), repeats {repeats}, "
              f"processes {len(self.gens())}, connections {sum(c.connections for c in self.clients)}, "
              f"dropped {sum(drops.values())}, tables' max_id A {final['A'][0]} ({final['A'][1]}), "
              f"B {final['B'][0]} ({final['B'][1]})", flush=True)

    def cleanup(self):
        self.stop.set()
        leafd.stop_all([s.gen.node for s in self.slots.values() if s.gen is not None])
        for db in self.dbs.values():
            try:
                db.drop()
            except Exception as e:  # noqa: BLE001 - report, and drop the other one too
                print(f"could not drop {db.name}: {e}", file=sys.stderr)


# --- the minimal case, for --previous ---------------------------------------------------------------

def minimal_case(binary, label, work, mysql):
    """A 2/0 INCRBY 500, B 2/1 INCR; both restarted with delta 3 (r1, r2); 200 INCRs each.
    Returns (B's IDs that A served before, refusals, IDs after the restart)."""
    dbs = {c: Database(f"{label}{c}", work, mysql) for c in "AB"}
    slots = {}
    try:
        for c in "AB":
            dbs[c].create()
            slots[c] = Slot(binary, os.path.join(work, label), c, f"{label}-{c}", dbs[c])
        slots["A"].start(2, 0, 1)
        slots["B"].start(2, 1, 1)
        for c in "AB":
            reply = slots[c].call("LEAF.TAG", "CREATE", TAG, STEP)
            if reply != "OK":
                raise Failure(f"{label}: LEAF.TAG CREATE in {c} answered {reply!r}")
        top = slots["A"].call("INCRBY", f"segment:{TAG}", 500)
        b_first = slots["B"].call("INCR", f"segment:{TAG}")
        if type(top) is not int or type(b_first) is not int:
            raise Failure(f"{label}: INCRBY 500 on A -> {top!r}, INCR on B -> {b_first!r}")
        a_served = set(range(top - 998, top + 1, 2))
        for c, (d, r) in (("A", (3, 1)), ("B", (3, 2))):
            slots[c].kill()
            slots[c].start(d, r, 2)
        after = {}
        refusals = collections.Counter()
        for c in "AB":
            with leafd.RespConnection(slots[c].gen.node.port) as conn:
                replies = conn.pipeline([("INCR", f"segment:{TAG}")] * 200)
            after[c] = [r for r in replies if type(r) is int]
            for r in replies:
                if isinstance(r, leafd.ErrorReply):
                    refusals[c] += 1
            example = next((r for r in replies if isinstance(r, leafd.ErrorReply)), None)
            after[c + "-example"] = example
        b_repeats = sorted(set(after["B"]) & a_served)
        all_ids = list(a_served) + [b_first] + after["A"] + after["B"]
        total_repeats = len(all_ids) - len(set(all_ids))
        print(f"{label} ({binary}, {dbs['A'].dialect}): A (2/0) INCRBY {TAG} 500 -> {top} (A served the even "
              f"IDs {top - 998}..{top}); B (2/1) INCR -> {b_first}; restarted A 3/1, B 3/2, 200 INCRs each: "
              f"A got {len(after['A'])} IDs {after['A'][:4]}..., B got {len(after['B'])} IDs {after['B'][:4]}..., "
              f"refusals A {refusals['A']}, B {refusals['B']}; B's IDs A had served: {len(b_repeats)} "
              f"(e.g. {b_repeats[:6]}); repeats over everything {total_repeats}", flush=True)
        if refusals["B"]:
            print(f"  e.g. {str(after['B-example'])[:240]!r}", flush=True)
        return total_repeats, refusals, after
    finally:
        leafd.stop_all([s.gen.node for s in slots.values() if s.gen is not None])
        for db in dbs.values():
            with contextlib.suppress(Exception):
                db.drop()


def previous_mode(args, work):
    failures = []
    repeats, _, after = minimal_case(os.path.abspath(args.previous), "previous", work, args.mysql)
    if not repeats:
        failures.append(f"the previous binary {args.previous} did not repeat an ID: the case proves nothing")
    repeats, refusals, after = minimal_case(args.binary, "current", work, args.mysql)
    if repeats or after["A"] or after["B"]:
        failures.append(f"the current binary handed out IDs after the delta-3 restart (repeats {repeats})")
    if refusals["A"] != 200 or refusals["B"] != 200:
        failures.append(f"the current binary refused {dict(refusals)} of 200 INCRs per cluster")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--mysql", help="a MariaDB/MySQL server URL without a database, "
                        "e.g. mysql://root@127.0.0.1:3306 (default: SQLite files)")
    parser.add_argument("--previous", metavar="PREV_BIN",
                        help="only the minimal case, on PREV_BIN (must repeat) and LEAFD_BIN (must refuse)")
    parser.add_argument("--stale-tags-ok", action="store_true",
                        help="report, without failing, a LEAF.TAGS max_id below IDs its cluster served")
    parser.add_argument("--documented-start", action="store_true",
                        help="use start = the highest LEAF.TAGS max_id + 1, as documented, even when it is "
                             "below IDs served (shows what that start does; expect repeats while LEAF.TAGS "
                             "is stale)")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' logs")
    args = parser.parse_args()
    args.binary = os.path.abspath(args.binary)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks still drop the databases
    work = tempfile.mkdtemp(prefix="leafd-split-")
    started = time.monotonic()
    name = "split_clusters previous" if args.previous else f"split_clusters {'mysql' if args.mysql else 'sqlite'}"
    failures = []
    scenario = None
    try:
        if args.previous:
            failures = previous_mode(args, work)
        else:
            scenario = Scenario(args.binary, work, args.mysql, args.stale_tags_ok, args.documented_start)
            try:
                scenario.run()
            finally:
                scenario.cleanup()
            failures = scenario.failures
    except (Failure, leafd.NodeError, RuntimeError) as e:
        failures.append(str(e))
    ok = leafd.print_outcome(name, failures, started)
    if ok and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"logs kept in {work}", flush=True)
    sys.exit(0 if ok else 1)


main()
