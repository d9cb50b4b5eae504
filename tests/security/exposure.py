"""What is open and to whom, tested from a real other host: a network namespace made here, joined
to this one by a veth pair (10.213.<n>.1 here, .2 there; only these two addresses are used).
Each case runs the real binary with one configuration and checks the exact replies a client
on loopback and a client on the other host get, over RESP and HTTP. Needs root (ip netns).

usage: exposure.py LEAFD_BIN
       exposure.py --client resp HOST PORT ARG...     (run inside the namespace)
       exposure.py --client http METHOD URL [BEARER] [BODY]
"""
import http.client
import itertools
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reliability"))
import leafd  # noqa: E402


def first_line(reply):
    """A reply as the first line the server sent for it, without CRLF: "+PONG", "-DENIED …",
    ":1", "*2" (an array of two), "$5" (a bulk string of 5 bytes)."""
    if isinstance(reply, leafd.ErrorReply):
        return "-" + reply
    if isinstance(reply, str):
        return "+" + reply
    if isinstance(reply, int):
        return f":{reply}"
    if isinstance(reply, bytes):
        return f"${len(reply)}"
    if isinstance(reply, list):
        return f"*{len(reply)}"
    return "$-1"  # a null bulk string (or null array)


def resp_call(host, port, commands):
    """Sends each command (a list of words) in turn; returns the first line of each reply, or
    'CLOSED' once the server closed the connection."""
    replies = []
    with leafd.RespConnection(port, host, timeout=5) as conn:
        for command in commands:
            try:
                conn.send([command])
                replies.append(first_line(conn.read_reply()))
            except OSError:
                replies.append("CLOSED")
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
work = tempfile.mkdtemp()  # a directory per node in it
node_numbers = itertools.count(1)
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


def remote(*args):
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, script, "--client", *args],
                         check=True, capture_output=True, text=True, timeout=30).stdout
    return json.loads(out)


class Node(leafd.Node):
    """leafd bound to every interface, RESP and HTTP, SQLite in its own directory; `config` is
    merged into its leafd.toml. With port_flag, server.bind is 0.0.0.0:6380 in the file and
    leafd runs with --port port_flag (which replaces the configured port)."""

    def __init__(self, config=None, port_flag=None):
        name = f"node-{next(node_numbers)}"
        config = dict(config or {})
        if port_flag:
            config["server"] = {"bind": "0.0.0.0:6380", **config.get("server", {})}
        super().__init__(binary, work, name, f"sqlite://{work}/{name}/leafd.db", config=config, host="0.0.0.0",
                         port_flag=port_flag, http_bind=f"0.0.0.0:{leafd.free_port()}")
        self.start().wait_ready(10)

    def local(self, *commands):
        return resp_call("127.0.0.1", self.port, [c.split(" ") for c in commands])

    def remote(self, *commands):
        return remote("resp", here, str(self.port), *commands)

    def url(self, path, host="127.0.0.1"):
        return f"{host}:{self.http_port}{path}"

    def stop(self):
        """SIGTERM; the process must exit within 20 s (subprocess.TimeoutExpired otherwise)."""
        self.terminate()
        self.wait(20)


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
        node = Node({"server": {"protected_mode": False}})
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
        node = Node({"server": {"protected_mode": False}, "admin": {"allow_unauthenticated": True}})
        expect("allowed: remote admin", node.remote("LEAF.TAG CREATE a 10", "INCR segment:a"), ["+OK", ":1"])
        node.stop()

        # 4. A password: remote clients AUTH and may then do everything the default user may.
        node = Node({"server": {"requirepass": "s3cret"}})
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
        code = node.wait(20)
        expect("SHUTDOWN exit status", code, 0)

        # 6. --port, as redis-server: the configured host with that port.
        port = leafd.free_port()
        node = Node(port_flag=port)
        expect("--port", resp_call("127.0.0.1", port, [["PING"]]), ["+PONG"])
        starts("--port in the start-up line", node.log_text()[node.log_text().index("resp="):], f"resp=0.0.0.0:{port}")
        node.stop()
        print(f"exposure: {checks} checks passed (RESP and HTTP, loopback and another host {there})")
    except leafd.NodeError as e:
        raise SystemExit(f"leafd did not start: {e}")
    finally:
        teardown()


main()
