"""Crash safety: SIGKILL leafd at random moments while 16 clients fetch IDs, restart it, repeat.
Across all cycles no ID may be handed out twice, and every ID after a restart must be greater
than every ID before it. Loopback only, bounded by CYCLES.

usage: crash.py LEAFD_BIN STORAGE_URL MODE [CYCLES] [CLIENTS]
  MODE: segment (INCR segment:crash) or snowflake (SNOWFLAKE, static worker id)
"""
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

binary, storage_url, mode = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
cycles = int(sys.argv[4]) if len(sys.argv) > 4 else 20
clients = int(sys.argv[5]) if len(sys.argv) > 5 else 16
command = b"*2\r\n$4\r\nINCR\r\n$13\r\nsegment:crash\r\n" if mode == "segment" else b"*1\r\n$9\r\nSNOWFLAKE\r\n"
random.seed(int(os.environ.get("CRASH_SEED", time.time())))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port, workdir):
    process = subprocess.Popen(
        [binary, "--bind", f"127.0.0.1:{port}", "--http-bind", "127.0.0.1:0", "--storage-url", storage_url],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"*4\r\n$8\r\nLEAF.TAG\r\n$6\r\nCREATE\r\n$5\r\ncrash\r\n$3\r\n100\r\n")
                reply = s.recv(100)
                if reply.startswith(b"+OK") or b"already exists" in reply:
                    return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit(f"leafd did not start on port {port}")


def client(port, out, stop):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            reader = s.makefile("rb")
            while not stop.is_set():
                s.sendall(command * 10)
                for _ in range(10):
                    line = reader.readline()
                    if not line:
                        return
                    if not line.startswith(b":"):
                        raise SystemExit(f"unexpected reply {line!r}")
                    out.append(int(line[1:]))
    except (OSError, ValueError):
        return  # the server was killed mid-batch: replies received so far count


def main():
    workdir = tempfile.mkdtemp()
    all_ids = set()
    highest = 0
    total = 0
    for cycle in range(cycles):
        port = free_port()
        process = start(port, workdir)
        stop = threading.Event()
        results = [[] for _ in range(clients)]
        threads = [threading.Thread(target=client, args=(port, results[i], stop)) for i in range(clients)]
        for t in threads:
            t.start()
        time.sleep(random.uniform(0.2, 1.0))
        process.send_signal(signal.SIGKILL)
        process.wait()
        stop.set()
        for t in threads:
            t.join(10)
        cycle_ids = [i for ids in results for i in ids]
        if not cycle_ids:
            raise SystemExit(f"cycle {cycle}: no IDs were served")
        for ids in results:
            if ids != sorted(ids) or len(set(ids)) != len(ids):
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
