"""Crash safety: SIGKILL leafd at random moments while 16 clients fetch IDs, restart it, repeat.
Across all cycles no ID may be handed out twice, and every ID after a restart must be greater
than every ID before it. Loopback only, bounded by CYCLES.

usage: crash.py LEAFD_BIN STORAGE_URL MODE [CYCLES] [CLIENTS]
  MODE: segment (INCR segment:crash) or snowflake (SNOWFLAKE, the default database coordinator)
"""
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leafd  # noqa: E402

binary, storage_url, mode = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
cycles = int(sys.argv[4]) if len(sys.argv) > 4 else 20
clients = int(sys.argv[5]) if len(sys.argv) > 5 else 16
kind = leafd.INCR if mode == "segment" else leafd.SNOWFLAKE
random.seed(int(os.environ.get("CRASH_SEED", time.time())))
# No [storage] state_dir: leafd's default, next to the SQLite file (else ./data).
CONFIG = {"storage": {"state_dir": None}}


def batch():
    return [(kind, 1)] * 10


def start(workdir):
    """A new port each cycle, the same directory; ready once the tag exists."""
    node = leafd.Node(binary, workdir, "leafd", storage_url, config=CONFIG)
    try:
        node.start().wait_ready(30)
        node.create_tag("crash", 100)
    except leafd.NodeError as e:
        node.kill()
        raise SystemExit(f"leafd did not start on port {node.port}\n{e}")
    return node


def main():
    workdir = tempfile.mkdtemp()
    all_ids = set()
    highest = 0
    total = 0
    for cycle in range(cycles):
        node = start(workdir)
        stop = threading.Event()
        # 10 commands pipelined per batch; the replies read before the kill count.
        loaders = [leafd.Loader(node, f"client-{i}", "crash", batch, stop, timeout=5) for i in range(clients)]
        for loader in loaders:
            loader.start()
        time.sleep(random.uniform(0.2, 1.0))
        node.kill()
        stop.set()
        for loader in loaders:
            loader.join(10)
        results = [list(l.singles if kind == leafd.INCR else l.snowflakes) for l in loaders]
        cycle_ids = [i for ids in results for i in ids]
        if not cycle_ids:
            raise SystemExit(f"cycle {cycle}: no IDs were served")
        for loader in loaders:
            if loader.errors or loader.unexpected:
                got = list(loader.error_examples.values()) + loader.unexpected
                raise SystemExit(f"cycle {cycle}: unexpected reply {got[0]!r}")
        for ids in results:
            if any(a >= b for a, b in zip(ids, ids[1:])):
                raise SystemExit(f"cycle {cycle}: a client's IDs do not strictly increase")
        duplicates = all_ids.intersection(cycle_ids)
        if duplicates or len(set(cycle_ids)) != len(cycle_ids):
            raise SystemExit(f"cycle {cycle}: duplicate IDs {sorted(duplicates)[:5]}")
        if min(cycle_ids) <= highest:
            raise SystemExit(f"cycle {cycle}: ID {min(cycle_ids)} after restart is not above {highest}")
        all_ids.update(cycle_ids)
        highest = max(cycle_ids)
        total += len(cycle_ids)
    print(f"crash {mode} on {storage_url.split(':')[0]}: {total} IDs checked, {cycles} SIGKILL restarts, "
          f"{clients} clients, no duplicate, increasing across restarts")


main()
