"""Soak: mixed segment (MariaDB) and snowflake (ZooKeeper) load at a moderate rate for
DURATION seconds while the database and ZooKeeper connections are cut and restored
periodically (through proxies on 127.0.0.1). Checks: no duplicate ID, no error other than the
documented UNAVAILABLE window, resident memory flat (within 10% after warm-up).

usage: soak.py LEAFD_BIN MYSQL_SERVER_URL ZOOKEEPER [DURATION=60]
  e.g. soak.py target/debug/leafd mysql://root@127.0.0.1:3306 127.0.0.1:2181 600
"""
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

binary = os.path.abspath(sys.argv[1])
mysql_url, zookeeper = sys.argv[2].rstrip("/"), sys.argv[3]
duration = int(sys.argv[4]) if len(sys.argv) > 4 else 60


class Proxy:
    """A TCP proxy that can be cut (all connections closed, new ones refused) and restored."""

    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.up = True
        self.conns = []
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, server]
            threading.Thread(target=self.pump, args=(client, server), daemon=True).start()

    def pump(self, a, b):
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        raise OSError
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self):
        self.up = False
        with self.lock:
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass
            self.conns = []

    def restore(self):
        self.up = True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    work = tempfile.mkdtemp()
    db = f"leafd_soak_{os.getpid()}"
    subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"CREATE DATABASE {db}"], check=True)
    host = mysql_url.split("@")[-1]
    db_proxy, zk_proxy = Proxy(host), Proxy(zookeeper)
    prefix = mysql_url[: mysql_url.rindex(host)]
    port = free_port()
    with open(f"{work}/leafd.toml", "w") as f:
        f.write(f"""
[server]
bind = "127.0.0.1:{port}"
[http]
bind = "127.0.0.1:{free_port()}"
[storage]
url = "{prefix}127.0.0.1:{db_proxy.port}/{db}"
acquire_timeout_ms = 500
[segment]
load_timeout_ms = 500
[[segment.tags]]
tag = "soak"
step = 200
[snowflake]
coordinator = "zookeeper"
[snowflake.zookeeper]
connect = "127.0.0.1:{zk_proxy.port}"
cluster = "soak-{os.getpid()}"
cache_file = "{work}/worker.json"
session_timeout_ms = 4000
""")
    leafd = subprocess.Popen([binary, "--config", f"{work}/leafd.toml"], cwd=work,
                             stdout=subprocess.DEVNULL, stderr=open(f"{work}/leafd.log", "w"))
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    stop = threading.Event()
    ids, errors, unavailable = [], [], [0]
    lock = threading.Lock()

    def client(n):
        command = b"*2\r\n$4\r\nINCR\r\n$12\r\nsegment:soak\r\n" if n % 2 == 0 else b"*1\r\n$9\r\nSNOWFLAKE\r\n"
        s = socket.create_connection(("127.0.0.1", port))
        reader = s.makefile("rb")
        got = []
        while not stop.is_set():
            s.sendall(command * 5)
            for _ in range(5):
                line = reader.readline()
                if line.startswith(b":"):
                    got.append(int(line[1:]))
                elif line.startswith(b"-UNAVAILABLE"):
                    with lock:
                        unavailable[0] += 1
                else:
                    with lock:
                        errors.append(line)
            time.sleep(0.005)
        with lock:
            ids.extend(got)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    started = time.time()
    samples = []
    db_cuts = zk_cuts = 0
    while time.time() - started < duration:
        elapsed = time.time() - started
        second = int(elapsed)
        if second % 15 == 5 and db_proxy.up:
            db_proxy.cut(); db_cuts += 1
        elif second % 15 == 8 and not db_proxy.up:
            db_proxy.restore()
        if second % 20 == 12 and zk_proxy.up:
            zk_proxy.cut(); zk_cuts += 1
        elif second % 20 == 17 and not zk_proxy.up:
            zk_proxy.restore()
        if second % 5 == 0 and (not samples or samples[-1][0] != second):
            samples.append((second, rss_mb(leafd.pid)))
        time.sleep(0.2)
    db_proxy.restore(); zk_proxy.restore()
    stop.set()
    for t in threads:
        t.join(30)
    leafd.terminate()
    code = leafd.wait(30)
    subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"DROP DATABASE {db}"], check=True)

    after_warmup = [mb for second, mb in samples if second >= min(20, duration // 3)]
    peak, base = max(after_warmup), after_warmup[0]
    print(f"soak {duration}s: {len(ids)} IDs checked, {unavailable[0]} UNAVAILABLE replies, "
          f"{db_cuts} database cuts, {zk_cuts} ZooKeeper cuts, RSS {base:.1f} -> peak {peak:.1f} MB, exit {code}")
    assert not errors, f"unexpected replies: {errors[:5]}"
    assert len(set(ids)) == len(ids), "duplicate IDs"
    assert peak <= base * 1.10 + 1.0, f"RSS grew from {base:.1f} to {peak:.1f} MB"
    assert code == 0, f"leafd exit status {code}"


main()
