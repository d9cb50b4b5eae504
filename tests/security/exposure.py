"""What is open and to whom, tested from a real other host: a network namespace made here, joined
to this one by a veth pair (10.213.<n>.1 here, .2 there; only these two addresses are used).
Each case runs the real binary with one configuration and checks the exact replies a client
on loopback and a client on the other host get, over RESP and HTTP. Needs root (ip netns).

usage: exposure.py LEAFD_BIN
       exposure.py --client resp HOST PORT ARG...     (run inside the namespace)
       exposure.py --client http METHOD URL [BEARER] [BODY]
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def resp_call(host, port, commands):
    """Sends each command (a list of words) in turn; returns the first line of each reply, or
    'CLOSED' once the server closed the connection."""
    replies = []
    with socket.create_connection((host, port), timeout=5) as s:
        reader = s.makefile("rb")
        for command in commands:
            try:
                s.sendall(resp(*command))
                line = reader.readline()
            except OSError:
                line = b""
            replies.append(line.decode().rstrip("\r\n") if line else "CLOSED")
    return replies


def http_call(method, url, bearer=None, body=None):
    host_port, path = url.split("/", 1)
    host, port = host_port.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    headers = {"Content-Type": "application/json"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    conn.request(method, "/" + path, body=body, headers=headers)
    r = conn.getresponse()
    return f"{r.status} {r.read().decode().strip()}"


if len(sys.argv) > 1 and sys.argv[1] == "--client":
    kind = sys.argv[2]
    if kind == "resp":
        host, port = sys.argv[3], int(sys.argv[4])
        commands = [c.split(" ") for c in sys.argv[5:]]
        print(json.dumps(resp_call(host, port, commands)))
    else:
        method, url = sys.argv[3], sys.argv[4]
        bearer = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] else None
        body = sys.argv[6] if len(sys.argv) > 6 else None
        print(json.dumps(http_call(method, url, bearer, body)))
    sys.exit(0)

binary = os.path.abspath(sys.argv[1])
script = os.path.abspath(__file__)
n = os.getpid() % 200 + 20
ns = f"leafd-sec-{os.getpid()}"
veth_host, veth_ns = f"lsh{os.getpid() % 100000}", f"lsn{os.getpid() % 100000}"
here, there = f"10.213.{n}.1", f"10.213.{n}.2"

DENIED = ("-DENIED leafd is running in protected mode because protected mode is enabled and no "
          "password is set. In this mode connections are only accepted from the loopback interface. "
          "To accept clients from other hosts, either 1) set a password (server.requirepass, or users "
          "in [[server.users]]) and have clients AUTH, or 2) set server.protected_mode = false and make "
          "sure only trusted clients can reach leafd.")
ADMIN = ("NOPERM admin commands from other hosts need a password (server.requirepass, or an admin "
         "user in [[server.users]]), or admin.allow_unauthenticated = true")


def sh(*cmd):
    subprocess.run(cmd, check=True)


def setup():
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", veth_host, "type", "veth", "peer", "name", veth_ns)
    sh("ip", "link", "set", veth_ns, "netns", ns)
    sh("ip", "addr", "add", f"{here}/24", "dev", veth_host)
    sh("ip", "link", "set", veth_host, "up")
    sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{there}/24", "dev", veth_ns)
    sh("ip", "netns", "exec", ns, "ip", "link", "set", veth_ns, "up")
    sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")


def teardown():
    subprocess.run(["ip", "link", "del", veth_host], stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remote(*args):
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, script, "--client", *args],
                         check=True, capture_output=True, text=True, timeout=30).stdout
    return json.loads(out)


class Node:
    def __init__(self, extra_toml="", port_flag=None):
        self.dir = tempfile.mkdtemp()
        self.port, self.http = free_port(), free_port()
        configured = self.port
        extra_args = ()
        if port_flag:  # --port replaces the configured port
            configured, self.port, extra_args = 6380, port_flag, ("--port", str(port_flag))
        with open(f"{self.dir}/leafd.toml", "w") as f:
            f.write(f'[server]\nbind = "0.0.0.0:{configured}"\n{extra_toml}\n'
                    f'[http]\nbind = "0.0.0.0:{self.http}"\n[storage]\nurl = "sqlite://{self.dir}/leafd.db"\n')
        self.log = open(f"{self.dir}/leafd.log", "wb")
        self.process = subprocess.Popen([binary, "--config", f"{self.dir}/leafd.toml", *extra_args],
                                         stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                socket.create_connection(("127.0.0.1", self.http), timeout=1).close()
                return
            except OSError as e:
                self.last_error = e
                time.sleep(0.05)
        raise SystemExit(f"leafd did not start ({self.last_error}):\n" + open(f"{self.dir}/leafd.log").read())

    def local(self, *commands):
        return resp_call("127.0.0.1", self.port, [c.split(" ") for c in commands])

    def remote(self, *commands):
        return remote("resp", here, str(self.port), *commands)

    def url(self, path, host="127.0.0.1"):
        return f"{host}:{self.http}{path}"

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(20)

    def log_text(self):
        return open(f"{self.dir}/leafd.log").read()


checks = 0


def expect(what, got, want):
    global checks
    checks += 1
    if got != want:
        raise SystemExit(f"FAIL {what}:\n  got  {got!r}\n  want {want!r}")


def starts(what, got, prefix):
    global checks
    checks += 1
    if not got.startswith(prefix):
        raise SystemExit(f"FAIL {what}:\n  got  {got!r}\n  want {prefix!r}…")


def main():
    teardown()
    setup()
    try:
        # 1. Defaults, bound to every interface, no password: protected mode.
        node = Node()
        expect("protected: remote RESP", node.remote("PING", "PING"), [DENIED, "CLOSED"])
        expect("protected: loopback RESP", node.local("PING", "LEAF.TAG CREATE t 10", "INCR segment:t"),
               ["+PONG", "+OK", ":1"])
        expect("protected: remote HTTP API", remote("http", "GET", node.url("/api/segment/get/t", here)),
               "403 " + DENIED[1:])
        expect("protected: remote HTTP admin", remote("http", "POST", node.url("/api/segment/tags", here), "",
                                                     '{"tag":"x","step":10}'), "403 " + DENIED[1:])
        expect("protected: remote /health", remote("http", "GET", node.url("/health", here)), "200 ok")
        starts("protected: remote /metrics", remote("http", "GET", node.url("/metrics", here)), "200 # HELP")
        starts("protected: loopback HTTP API", http_call("GET", node.url("/api/segment/get/t")), "200 ")
        expect("CONFIG GET protected-mode", resp_call("127.0.0.1", node.port, [["CONFIG", "GET", "protected-mode"]]),
               ["*2"])
        if "protected mode: listening beyond loopback with no password" not in node.log_text():
            raise SystemExit("no start-up warning about protected mode:\n" + node.log_text())
        node.stop()

        # 2. Protected mode off, no password: IDs for everyone, admin commands loopback only.
        node = Node("protected_mode = false")
        expect("open: loopback admin", node.local("LEAF.TAG CREATE r 10"), ["+OK"])
        got = node.remote("LEAF.TAG CREATE x 10", "CONFIG GET port", "SHUTDOWN", "INCR segment:r", "SNOWFLAKE")
        expect("open: remote admin refused", got[:3], ["-" + ADMIN] * 3)
        expect("open: remote INCR", got[3], ":1")
        starts("open: remote SNOWFLAKE", got[4], ":")
        expect("open: remote HTTP admin", remote("http", "POST", node.url("/api/segment/tags", here), "",
                                                '{"tag":"x","step":10}'), "403 " + ADMIN)
        expect("open: remote HTTP API", remote("http", "GET", node.url("/api/segment/get/r", here)), "200 2")
        if "protected mode off: any host that reaches leafd can fetch IDs" not in node.log_text():
            raise SystemExit("no start-up warning about an open server:\n" + node.log_text())
        node.stop()

        # 3. ...unless admin.allow_unauthenticated = true.
        node = Node("protected_mode = false\n[admin]\nallow_unauthenticated = true")
        expect("allowed: remote admin", node.remote("LEAF.TAG CREATE a 10", "INCR segment:a"), ["+OK", ":1"])
        node.stop()

        # 4. A password: remote clients AUTH and may then do everything the default user may.
        node = Node('requirepass = "s3cret"')
        expect("password: remote", node.remote("PING", "AUTH s3cret", "LEAF.TAG CREATE p 10", "INCR segment:p"),
               ["-NOAUTH Authentication required.", "+OK", "+OK", ":1"])
        expect("password: remote HTTP without", remote("http", "GET", node.url("/api/segment/get/p", here)),
               "401 NOAUTH Authentication required.")
        expect("password: remote HTTP bearer", remote("http", "GET", node.url("/api/segment/get/p", here), "s3cret"),
               "200 2")
        node.stop()

        # 5. SHUTDOWN from loopback: no reply, the connection closes, the process exits 0.
        node = Node()
        expect("SHUTDOWN", node.local("SHUTDOWN NOSAVE"), ["CLOSED"])
        code = node.process.wait(20)
        expect("SHUTDOWN exit status", code, 0)

        # 6. --port, as redis-server: the configured host with that port.
        port = free_port()
        node = Node(port_flag=port)
        expect("--port", resp_call("127.0.0.1", port, [["PING"]]), ["+PONG"])
        starts("--port in the start-up line", node.log_text()[node.log_text().index("resp="):], f"resp=0.0.0.0:{port}")
        node.stop()
        print(f"exposure: {checks} checks passed (RESP and HTTP, loopback and another host {there})")
    finally:
        teardown()


main()
