#!/usr/bin/env python3
"""A strict tag under open-loop load: requests sent at random (Poisson) times, not when a reply
arrives, the way independent callers send them (bench/strict.sh's redis-benchmark clients send
their next request at once, a closed loop). Spread over CONNS connections and NODES leafd
nodes on one new MariaDB or PostgreSQL database; the first second is a warm-up. Each build given
runs in turn, ROUNDS times; prints per run the IDs, the latency percentiles (ms) and the IDs per
database allocation, and checks that no ID was handed out twice. Loopback only; removes what it
creates (processes, database, directory), also on failure.

    bench/strict_open.py [--db mysql|postgres] [--nodes 1] [--rate 4000] [--seconds 8]
                         [--conns 64] [--rounds 2] BIN [BIN ...]

Needs the mysql or psql client and the servers of scripts/services.sh.
"""
import argparse
import asyncio
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

SERVERS = {
    "mysql": ("mysql://root@127.0.0.1:3306", ["mysql", "-uroot", "-h127.0.0.1", "-P3306", "-e"]),
    "postgres": (
        "postgres://postgres@127.0.0.1:5432",
        ["psql", "-h", "127.0.0.1", "-p", "5432", "-U", "postgres", "-d", "postgres", "-qXc"],
    ),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sql(db, statement):
    subprocess.run(SERVERS[db][1] + [statement], check=True, stdout=subprocess.DEVNULL)


def allocations(http_ports):
    """The strict tag's successful database allocations, summed over the nodes."""
    total = 0.0
    for port in http_ports:
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        for line in page.decode().splitlines():
            if (line.startswith("leafd_segment_loads_total{") and 'tag="strict"' in line
                    and 'result="ok"' in line):
                total += float(line.split()[-1])
    return total


async def load(ports, rate, seconds, conns):
    """Poisson arrivals over `conns` connections; returns (latencies of the measured part, IDs)."""
    latencies, ids = [], []
    start = time.monotonic() + 0.2
    end = start + seconds

    async def connection(k):
        reader, writer = await asyncio.open_connection("127.0.0.1", ports[k % len(ports)])
        rng = random.Random(k)
        due = start + rng.expovariate(rate / conns)
        while due < end:
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            sent = time.monotonic()
            writer.write(b"*2\r\n$4\r\nINCR\r\n$14\r\nsegment:strict\r\n")
            line = await reader.readline()
            replied = time.monotonic()
            if not line.startswith(b":"):
                raise RuntimeError(f"error reply: {line!r}")
            ids.append(int(line[1:]))
            if sent >= start + 1.0:
                latencies.append(replied - sent)
            due += rng.expovariate(rate / conns)
        writer.close()

    await asyncio.gather(*(connection(k) for k in range(conns)))
    return latencies, ids


def run(binary, args, work, label):
    db = args.db
    name = f"leafd_strict_open_{os.getpid()}_" + "".join(c if c.isalnum() else "_" for c in label)
    sql(db, f"CREATE DATABASE {name}")
    procs = []
    try:
        ports, http_ports = [], []
        for i in range(args.nodes):
            d = os.path.join(work, f"{label}-n{i}")
            os.makedirs(d)
            port, http = free_port(), free_port()
            with open(os.path.join(d, "leafd.toml"), "w") as f:
                f.write(f'[storage]\nstate_dir = "{d}"\n[[segment.tags]]\ntag = "strict"\n'
                        f'step = 1000\norder = "strict"\n[snowflake]\ncoordinator = "static"\n'
                        f"worker_id = {i}\n")
            env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFD_")}
            env["RUST_LOG"] = "warn"
            with open(os.path.join(d, "leafd.log"), "w") as log:
                procs.append(subprocess.Popen(
                    [binary, "-c", "leafd.toml", "--bind", f"127.0.0.1:{port}",
                     "--http-bind", f"127.0.0.1:{http}", "--storage-url",
                     f"{SERVERS[db][0]}/{name}"], cwd=d, env=env, stdout=log,
                    stderr=subprocess.STDOUT))
            ports.append(port)
            http_ports.append(http)
        for port in ports:
            for _ in range(300):
                try:
                    socket.create_connection(("127.0.0.1", port)).close()
                    break
                except OSError:
                    time.sleep(0.05)
        before = allocations(http_ports)
        latencies, ids = asyncio.run(load(ports, args.rate, args.seconds, args.conns))
        after = allocations(http_ports)
        if len(ids) != len(set(ids)):
            raise SystemExit(f"{binary}: {len(ids) - len(set(ids))} IDs handed out twice")
        latencies.sort()

        def pct(q):
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

        print(f"| {label} | {args.nodes} | {args.rate:,.0f} | {len(ids):,} | {pct(0.5):.3f} | "
              f"{pct(0.9):.3f} | {pct(0.99):.3f} | {pct(0.999):.3f} | "
              f"{len(ids) / max(1.0, after - before):.2f} |", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        drop = f"DROP DATABASE IF EXISTS {name}" + (" WITH (FORCE)" if db == "postgres" else "")
        sql(db, drop)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=sorted(SERVERS), default="mysql")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--rate", type=float, default=4000.0, help="requests per second, in all")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--conns", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="leafd-strict-open.")
    try:
        print("| build | nodes | rate/s | IDs | p50 ms | p90 ms | p99 ms | p99.9 ms | IDs/alloc |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in range(args.rounds):
            for i, binary in enumerate(args.binaries):
                run(os.path.realpath(binary), args, work, f"{i}-{os.path.basename(binary)}-r{r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
