"""Shared helpers of the reliability and security scripts: free ports, a leafd node (config
file, log file, flags and environment, start / readiness / signals / stop), a minimal RESP
client with pipelining, a TCP proxy for faults between leafd and its database (a stalled
link, connections cut, a virtual IP moved), and load threads that collect every ID they are
given, with the checks made on them afterwards (no ID twice, none above the database's max_id,
IDs of one connection strictly increasing), and the line a script prints as each scenario ends.

Standard library only. Import it from a script in this directory with
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import leafd
and from another directory of tests/ (tests/security) with
    sys.path.insert(0, os.path.join(<the repository>, "tests", "reliability"))
"""
import array
import atexit
import bisect
import collections
import contextlib
import copy
import itertools
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time


def free_port(host="127.0.0.1"):
    """A TCP port free on `host` right now (nothing reserves it afterwards)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(port, seconds, host="127.0.0.1"):
    """Until something accepts TCP connections on host:port; RuntimeError after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"nothing listens on {host}:{port} after {seconds}s") from None
            time.sleep(0.1)


def wait_for_file(path, seconds):
    """Waits until `path` exists (a binary being rebuilt); False if it did not appear in time."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


# --- RESP ---------------------------------------------------------------------------------------

class ErrorReply(str):
    """An error reply (`-KIND message`) as a value: pipelined replies keep coming after one."""

    @property
    def kind(self):
        return self.split(" ", 1)[0] if self else "(empty)"


class ProtocolError(ConnectionError):
    """The server sent something that is not RESP: the connection is unusable."""


def encode(*args):
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if not isinstance(arg, bytes):
            arg = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class RespConnection:
    """One client connection. `send` writes any number of commands at once (pipelining);
    `read_reply` reads the next reply. Errors are returned as ErrorReply values; a closed or
    broken connection, a timeout or a malformed reply raise an OSError (ConnectionError)."""

    def __init__(self, port, host="127.0.0.1", timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def send(self, commands):
        """`commands`: a list of argument tuples, sent in one write."""
        self.sock.sendall(b"".join(encode(*c) for c in commands))

    def send_encoded(self, data):
        """Commands already encoded (see encode), sent in one write."""
        self.sock.sendall(data)

    def read_reply(self):
        line = self.reader.readline()
        if line[:1] == b":" and line[-2:] == b"\r\n":  # the common reply, first
            try:
                return int(line[1:-2])
            except ValueError:
                pass  # malformed: _parse says so
        return self._parse(line)

    def _parse(self, line):
        """The reply that starts with `line` (read further for bulk strings and arrays)."""
        if not line:
            raise ConnectionError("connection closed by the server")
        if not line.endswith(b"\r\n"):
            raise ConnectionError(f"connection closed in the middle of a reply ({line[:60]!r})")
        kind, rest = line[:1], line[1:-2]
        try:
            if kind == b":":
                return int(rest)
            if kind == b"+":
                return rest.decode(errors="replace")
            if kind == b"-":
                return ErrorReply(rest.decode(errors="replace"))
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                data = self.reader.read(n + 2)
                if len(data) < n + 2:
                    raise ConnectionError("connection closed in the middle of a bulk string")
                return data[:-2]
            if kind == b"*":
                n = int(rest)
                if n < 0:
                    return None
                items, readline = [], self.reader.readline
                for _ in range(n):  # SNOWFLAKE <n>: n integers
                    item = readline()
                    if item[:1] == b":" and item[-2:] == b"\r\n":
                        try:
                            items.append(int(item[1:-2]))
                            continue
                        except ValueError:
                            pass
                    items.append(self._parse(item))
                return items
        except ValueError as e:
            raise ProtocolError(f"malformed reply {line[:60]!r}: {e}") from None
        raise ProtocolError(f"unexpected reply type {line[:60]!r}")

    def pipeline(self, commands):
        """Sends all commands, returns their replies in order."""
        self.send(commands)
        return [self.read_reply() for _ in commands]

    def call(self, *args):
        return self.pipeline([args])[0]

    def close(self):
        for closer in (self.reader.close, self.sock.close):
            try:
                closer()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- a leafd node -------------------------------------------------------------------------------

def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string for paths and URLs


def render_toml(sections):
    """{"storage": {"state_dir": "/x"}, "snowflake.zookeeper": {...}, ...} -> TOML text. Sections
    hold flat keys; a key whose value is None is left out (leafd's default); a section whose value
    is a list of dicts is an array of tables ({"segment.tags": [{"tag": "t", "step": 10}]} gives
    [[segment.tags]])."""
    lines = []
    for section, keys in sections.items():
        for table in keys if isinstance(keys, list) else [keys]:
            lines.append(f"[[{section}]]" if isinstance(keys, list) else f"[{section}]")
            lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items() if value is not None)
            lines.append("")
    return "\n".join(lines)


FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


# Processes started under libfaketime: each makes /dev/shm/faketime_shm_<pid> and
# sem.faketime_sem_<pid>, which it removes only when it exits by itself, not when SIGKILLed.
_faketime_processes = []


@atexit.register
def _remove_faketime_shm():
    for process in _faketime_processes:
        if process.poll() is None:
            continue
        for name in (f"faketime_shm_{process.pid}", f"sem.faketime_sem_{process.pid}"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join("/dev/shm", name))


def faketime_env(faketime):
    """Environment for Node(env=...) that runs leafd under libfaketime (Debian: faketime) with
    the FAKETIME value `faketime` ("-1": a second behind; "@2024-01-02 03:04:05": from that
    moment on). The monotonic clock is not faked; the offset is read on every call."""
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": faketime, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_NO_CACHE": "1"}


class NodeError(Exception):
    pass


class Node:
    """One leafd process: its own directory (config file, log file, working directory), a free
    RESP port, HTTP on an ephemeral loopback port.

    `config` is {section: {key: value}} merged over the defaults ([server] shutdown_timeout_secs
    = 2, [storage] state_dir) and written to leafd.toml (passed with -c); see render_toml (None
    leaves a key out). `state_dir` goes to [storage] state_dir (default: the node's directory).
    The addresses are flags, which win over the config file:
      --bind HOST:PORT      `host` (default 127.0.0.1; "0.0.0.0" for every interface) with a free
                            port, or, with `port_flag=N`, --port N instead: server.bind's host
                            from the config file with port N (as redis-server --port);
      --http-bind ADDR      `http_bind` (default 127.0.0.1:0); None: no flag, the config decides.
                            With a fixed port, readiness waits for HTTP too (`http_port`);
      --storage-url URL     `storage_url`; None: no flag, the config decides.
    `env`: further environment variables (e.g. faketime_env(...)); leafd gets the caller's
    environment without LEAFD_* (leafd reads settings from those), with NO_COLOR=1 and
    RUST_LOG=info unless set, and then `env`."""

    def __init__(self, binary, workdir, name, storage_url=None, state_dir=None, config=None, *,
                 host="127.0.0.1", port_flag=None, http_bind="127.0.0.1:0", env=None):
        self.binary, self.name, self.storage_url = os.path.abspath(binary), name, storage_url
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.host, self.port_flag = host, port_flag is not None
        self.port = port_flag if port_flag is not None else free_port()
        self.http_bind = http_bind
        http_port = int(http_bind.rsplit(":", 1)[1]) if http_bind else 0
        self.http_port = http_port or None
        self.env = dict(env or {})
        sections = {"server": {"shutdown_timeout_secs": 2},
                    "storage": {"state_dir": self.dir if state_dir is None else state_dir}}
        for section, keys in (config or {}).items():
            if isinstance(keys, list):
                sections[section] = keys
            else:
                sections.setdefault(section, {}).update(keys)
        self.config_path = os.path.join(self.dir, "leafd.toml")
        with open(self.config_path, "w") as f:
            f.write(render_toml(sections))
        self.log_path = os.path.join(self.dir, "leafd.log")
        self.process = None
        self.stopped_on_purpose = False

    @property
    def client_host(self):
        """Where a client on this machine reaches the RESP and HTTP listeners."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    def twin(self, name):
        """A second, not yet started process from this node's config file, directory (state,
        working directory) and environment, with its own port and log file (<dir>/<name>.log):
        two nodes started from one configuration."""
        other = copy.copy(self)
        other.name = name
        other.port = free_port()
        other.env = dict(self.env)
        other.log_path = os.path.join(self.dir, f"{name}.log")
        other.process = None
        other.stopped_on_purpose = False
        return other

    def command(self):
        cmd = [self.binary, "-c", self.config_path]
        cmd += ["--port", str(self.port)] if self.port_flag else ["--bind", f"{self.host}:{self.port}"]
        if self.http_bind is not None:
            cmd += ["--http-bind", self.http_bind]
        if self.storage_url is not None:
            cmd += ["--storage-url", self.storage_url]
        return cmd

    def start(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFD_")}
        env.setdefault("RUST_LOG", "info")
        env["NO_COLOR"] = "1"
        env.update(self.env)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=self.dir, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env)
        if env.get("LD_PRELOAD") == FAKETIME_LIB:
            _faketime_processes.append(self.process)
        self.stopped_on_purpose = False
        return self

    def wait_ready(self, seconds=30, allow_exit=False):
        """Until the node answers PING (+PONG, or -NOAUTH when a password is set) and, with a
        fixed HTTP port, accepts HTTP connections; returns the node. The listener may accept
        before the node serves (a snowflake worker id still being taken): a PING waits for its
        reply up to the deadline. NodeError (with its last log lines) when it does not answer in
        time, or when it exits; with allow_exit=True an exit returns None instead (a start that
        must be refused: see process.returncode and log_text())."""
        deadline = time.monotonic() + seconds
        while True:
            if self.process.poll() is not None:
                if allow_exit:
                    return None
                raise NodeError(f"{self.name}: leafd exited with status {self.process.returncode} "
                                f"at start\n{self.log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NodeError(f"{self.name}: no reply to PING on port {self.port} in {seconds} s\n"
                                f"{self.log_tail()}")
            try:
                with RespConnection(self.port, self.client_host, timeout=max(0.1, remaining)) as c:
                    reply = c.call("PING")
                if reply == "PONG" or (isinstance(reply, ErrorReply) and reply.kind == "NOAUTH"):
                    if self.http_port is None:
                        return self
                    socket.create_connection((self.client_host, self.http_port), timeout=1).close()
                    return self
            except OSError:
                pass
            time.sleep(0.05)

    def create_tag(self, tag, step):
        """LEAF.TAG CREATE; a tag that already exists (made by another node) is fine."""
        with RespConnection(self.port, self.client_host) as c:
            reply = c.call("LEAF.TAG", "CREATE", tag, step)
        if reply != "OK" and not (isinstance(reply, ErrorReply) and "already exists" in reply):
            raise NodeError(f"{self.name}: LEAF.TAG CREATE {tag} {step} answered {reply!r}")

    def running(self):
        return self.process is not None and self.process.poll() is None

    def died(self):
        """The exit status if the node exited without being stopped by us, else None."""
        if self.process is None or self.stopped_on_purpose:
            return None
        return self.process.poll()

    def terminate(self):
        """SIGTERM to this node's own process, if it still runs (no wait: see wait, stop)."""
        if self.process is not None and self.process.poll() is None:
            self.stopped_on_purpose = True
            self.process.send_signal(signal.SIGTERM)

    def wait(self, seconds=None):
        """Until the process exits (for ever with None); its exit status.
        subprocess.TimeoutExpired when it still runs after `seconds`."""
        return self.process.wait(seconds)

    def stop(self, seconds=5):
        """SIGTERM, then SIGKILL after `seconds` (a clean-up: use terminate + wait to require a
        graceful exit)."""
        stop_all([self], seconds)

    def kill(self):
        """SIGKILL, and waits for the process to be gone."""
        if self.process is not None and self.process.poll() is None:
            self.stopped_on_purpose = True
            self.process.kill()
            self.process.wait(10)

    def pause(self):
        """SIGSTOP: the process is frozen (its connections stay open) until resume()."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self):
        """SIGCONT after pause()."""
        self.process.send_signal(signal.SIGCONT)

    def log_text(self):
        """The whole log file ("" when there is none yet)."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines=15, width=300):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError as e:
            return f"  ({self.name}: no log: {e})"
        return "\n".join(f"  {self.name}| {line[:width]}" for line in text)


def stop_all(nodes, seconds=5):
    """SIGTERM to all the nodes at once, SIGKILL to those still running after `seconds`."""
    for node in nodes:
        node.terminate()
    deadline = time.monotonic() + seconds
    for node in nodes:
        if node.process is None:
            continue
        try:
            node.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait(10)


# --- a TCP proxy --------------------------------------------------------------------------------

class ProxiedConnection:
    """One client connection of a TcpProxy and its own connection to the target, each direction
    forwarded by a thread of its own. A subclass (TcpProxy.connection_class) may keep state."""

    def __init__(self, proxy, client, server):
        self.proxy, self.client, self.server = proxy, client, server
        self.lock = threading.Lock()
        self.dead = False

    def start(self):
        threading.Thread(target=self._pump, args=(self.client, self.proxy.from_client),
                         daemon=True, name=f"{self.proxy.name}-c2s").start()
        threading.Thread(target=self._pump, args=(self.server, self.proxy.from_server),
                         daemon=True, name=f"{self.proxy.name}-s2c").start()

    def to_server(self, data):
        self.server.sendall(data)

    def to_client(self, data):
        self.client.sendall(data)

    def kill(self):
        """Closes both sides with a reset (as a dead link or host: no orderly FIN)."""
        with self.lock:
            if self.dead:
                return
            self.dead = True
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes the other thread's recv or sendall
            with contextlib.suppress(OSError):
                s.close()
        self.proxy._forget(self)

    def _pump(self, source, handler):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    return
                # Paused: the bytes wait here (and, once this thread stops reading, in the
                # kernel's buffers), on an open connection, until resume() or a kill.
                while not self.proxy.flowing.wait(0.05):
                    if self.dead:
                        return
                if self.dead or not handler(self, data):
                    return
        except OSError:
            return
        finally:
            self.kill()


class TcpProxy:
    """A TCP proxy on 127.0.0.1 (a free port: `port`) to `target` (host, port), for faults
    between leafd and its database, or between two database servers.

      pause()             no byte is forwarded any more, either way, but every connection stays
                          open (a stalled link: what was sent waits) until resume();
      drop_connections()  closes every open connection with a reset, discarding what waits;
      switch(target)      new connections go to `target`, the open ones are dropped (a virtual
                          IP moved to another server).
    A connection whose target refuses it is closed at once (counted in `refused`).

    A subclass sees the bytes: from_client(conn, data) and from_server(conn, data) run in the
    connection's two threads, forward with conn.to_server / conn.to_client, and return False
    to end the connection (both sides reset). `connection_class` may add per-connection state."""

    connection_class = ProxiedConnection

    def __init__(self, target, name="proxy"):
        self.target, self.name = tuple(target), name
        self.lock = threading.Lock()
        self.generation = 0  # switch() count: a connect that raced a switch is dropped
        self.connections = 0  # accepted and connected to the target
        self.refused = 0
        self.open = set()
        self.flowing = threading.Event()
        self.flowing.set()
        self.closed = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name=f"{name}-accept").start()

    def _accept(self):
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            with self.lock:
                target, generation = self.target, self.generation
            try:
                server = socket.create_connection(target, timeout=5)
                server.settimeout(None)
            except OSError:
                with self.lock:
                    self.refused += 1
                with contextlib.suppress(OSError):
                    client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                if self.closed.is_set() or generation != self.generation:
                    client.close()
                    server.close()
                    continue
                self.connections += 1
                conn = self.connection_class(self, client, server)
                self.open.add(conn)
            conn.start()

    def from_client(self, conn, data):
        conn.to_server(data)
        return True

    def from_server(self, conn, data):
        conn.to_client(data)
        return True

    def _forget(self, conn):
        with self.lock:
            self.open.discard(conn)

    def pause(self):
        self.flowing.clear()

    def resume(self):
        self.flowing.set()

    def drop_connections(self):
        with self.lock:
            conns = list(self.open)
        for conn in conns:
            conn.kill()

    def switch(self, target):
        with self.lock:
            self.target = tuple(target)
            self.generation += 1
        self.drop_connections()

    def close(self):
        self.closed.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        self.drop_connections()


# --- load and ID collection ---------------------------------------------------------------------

INCR, INCRBY, SNOWFLAKE = "incr", "incrby", "snowflake"


def command_of(kind, tag, n=1):
    """INCR segment:<tag>, INCRBY segment:<tag> <n>, SNOWFLAKE (n = 1) or SNOWFLAKE <n> (an
    array of n IDs)."""
    if kind == INCR:
        return ("INCR", f"segment:{tag}")
    if kind == INCRBY:
        return ("INCRBY", f"segment:{tag}", n)
    return ("SNOWFLAKE",) if n == 1 else ("SNOWFLAKE", n)


class Loader(threading.Thread):
    """One client of one node: sends the batches `make_batch()` returns (a list of (kind, n)
    with kind INCR, INCRBY or SNOWFLAKE; SNOWFLAKE with n > 1 asks for an array of n IDs),
    pipelined, reads every reply and keeps every ID it was given, until `stop` is set. A dropped
    connection is counted and replaced by a new one; the replies read before the drop count.
    Per connection, segment replies must strictly increase: each reply's first ID (last - n + 1
    for INCRBY) above the previous reply's last ID.

    `timeout`: seconds a connect or a reply may take (None: no limit) before the connection
    counts as dropped. After each batch the loader waits `pause` seconds, or
    `pause_after_error` if the batch had an error reply, whichever is longer. `on_error`, if
    given, is called (in the loader's thread) with every ErrorReply, as it is read."""

    def __init__(self, node, name, tag, make_batch, stop, timeout=10.0, pause_after_error=0.01,
                 pause=0.0, on_error=None):
        super().__init__(daemon=True, name=name)
        self.node, self.tag, self.make_batch, self.stop_event = node, tag, make_batch, stop
        self.timeout, self.pause_after_error, self.pause = timeout, pause_after_error, pause
        self.on_error = on_error
        self._wire = {}  # batch -> its commands in RESP
        self.singles = array.array("q")    # INCR replies (one ID each)
        self.blocks = []                   # INCRBY replies: (first, last)
        self.snowflakes = array.array("q")
        self.timeline = []                 # (monotonic time a batch ended, segment IDs, snowflake IDs)
        self.errors = collections.Counter()  # error replies by first word
        self.error_examples = {}
        self.drops = collections.Counter()   # connections lost, by reason
        self.unexpected = []                 # replies of the wrong type
        self.order_violations = 0
        self.order_examples = []
        self.connections = 0

    def run(self):
        while not self.stop_event.is_set():
            try:
                conn = RespConnection(self.node.port, self.node.client_host, timeout=self.timeout)
            except OSError as e:
                self.drops[f"connect: {type(e).__name__}"] += 1
                self.stop_event.wait(0.05)
                continue
            self.connections += 1
            try:
                self._serve(conn)
            except OSError as e:  # ConnectionError, timeouts, ProtocolError
                self.drops[f"{type(e).__name__}: {e}"[:80]] += 1
                self.stop_event.wait(0.02)
            finally:
                conn.close()

    def _serve(self, conn):
        previous = None  # last ID of this connection's previous segment reply
        read_reply, stop = conn.read_reply, self.stop_event  # locals: this loop is the client's CPU
        singles, blocks, snowflakes = self.singles, self.blocks, self.snowflakes
        while not stop.is_set():
            batch = self.make_batch()
            conn.send_encoded(self._encoded(batch))
            segment_ids = snowflake_ids = 0
            errored = False
            try:
                for kind, n in batch:
                    reply = read_reply()
                    if type(reply) is int and kind != SNOWFLAKE:
                        first = reply - n + 1
                        if kind == INCR:
                            singles.append(reply)
                        else:
                            blocks.append((first, reply))
                        segment_ids += n
                        if previous is not None and first <= previous:
                            self.order_violations += 1
                            if len(self.order_examples) < 5:
                                what = (f"INCRBY {n} -> {first}..{reply}" if kind == INCRBY
                                        else f"INCR -> {reply}")
                                self.order_examples.append(f"{self.name} connection {self.connections}: "
                                                           f"after {previous}, {what}")
                        previous = reply
                    elif type(reply) is int and n == 1:  # SNOWFLAKE
                        snowflakes.append(reply)
                        snowflake_ids += 1
                    elif isinstance(reply, ErrorReply):
                        self.errors[reply.kind] += 1
                        self.error_examples.setdefault(reply.kind, str(reply)[:200])
                        errored = True
                        if self.on_error is not None:
                            self.on_error(reply)
                    elif kind == SNOWFLAKE and n > 1 and type(reply) is list and self._add_snowflakes(reply):
                        snowflake_ids += len(reply)
                    else:
                        self.unexpected.append(f"{kind}{f' {n}' if kind == SNOWFLAKE and n > 1 else ''}: "
                                               f"{reply!r}"[:120])
            finally:
                # A batch cut short by a dropped connection counts the replies read before the
                # drop: the timeline's counts add up to the IDs kept.
                self.timeline.append((time.monotonic(), segment_ids, snowflake_ids))
            pause = max(self.pause, self.pause_after_error) if errored else self.pause
            if pause > 0:
                stop.wait(pause)

    def _add_snowflakes(self, ids):
        """Keeps an array reply's IDs; False (nothing kept) if one of them is not an integer."""
        before = len(self.snowflakes)
        try:
            self.snowflakes.extend(ids)
            return True
        except (TypeError, OverflowError):
            del self.snowflakes[before:]
            return False

    def _encoded(self, batch):
        """A batch as RESP, encoded once per distinct batch (up to 64 kept)."""
        key = tuple(batch)
        data = self._wire.get(key)
        if data is None:
            data = b"".join(encode(*command_of(kind, self.tag, n)) for kind, n in batch)
            if len(self._wire) < 64:
                self._wire[key] = data
        return data

    def served_between(self, since, until=float("inf")):
        """(segment IDs, snowflake IDs) of the batches that ended in [since, until)."""
        seg = sf = 0
        for t, s, f in self.timeline:
            if since <= t < until:
                seg += s
                sf += f
        return seg, sf

    def segment_count(self):
        return len(self.singles) + sum(last - first + 1 for first, last in self.blocks)


class ErrorLog:
    """Every error reply of a run's loaders: (the moment it was read, node name, loader name or
    None, kind, text)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entries = []

    def callback(self, node, loader=None):
        """A Loader's on_error for `node` (and the loader's name)."""
        def on_error(reply):
            with self.lock:
                self.entries.append((time.monotonic(), node.name, loader, reply.kind, str(reply)[:300]))
        return on_error

    def all(self):
        with self.lock:
            return list(self.entries)

    def of(self, node_name, loader=None):
        with self.lock:
            return [e for e in self.entries if e[1] == node_name and loader in (None, e[2])]

    def kinds(self, since=float("-inf")):
        with self.lock:
            return collections.Counter(e[3] for e in self.entries if e[0] >= since)

    def example(self, kind):
        with self.lock:
            return next((f"{e[1]}: -{e[4]}" for e in self.entries if e[3] == kind), None)


def batches(loader):
    """(end time, IDs) of each batch of an INCR-only loader: its timeline counts the IDs of each
    batch, in the order they were appended to `singles`."""
    out, i = [], 0
    singles = loader.singles
    for t, n, _ in list(loader.timeline):
        out.append((t, singles[i:i + n]))
        i += n
    return out


def mixed_loaders(node, tag, stop, errors, clients=3, batch=10, incrby=100, pause=0.002):
    """`clients - 1` INCR-only clients (their batches map onto their IDs: see batches), one INCR
    client with an INCRBY in every other batch, one SNOWFLAKE client; errors into `errors`."""
    counter = iter(range(1 << 62))
    lock = threading.Lock()

    def incr():
        return [(INCR, 1)] * batch

    def mixed():
        with lock:
            n = next(counter)
        commands = [(INCR, 1)] * batch
        if n % 2 == 0:
            commands[n % batch] = (INCRBY, incrby)
        return commands

    def snowflake():
        return [(SNOWFLAKE, 1)] * batch

    def loader(name, make_batch):
        return Loader(node, f"{node.name}/{name}", tag, make_batch, stop, timeout=10.0, pause=pause,
                      pause_after_error=0.05, on_error=errors.callback(node, name))

    return ([loader(f"incr-{i}", incr) for i in range(clients - 1)]
            + [loader("incrby", mixed), loader("snowflake", snowflake)])


def first_error_line(node):
    """The line of a node's log that says why it exited (the last ERROR, or the last line)."""
    lines = node.log_text().strip().splitlines()
    errors = [l for l in lines if " ERROR " in l or "error" in l.lower()]
    return (errors or lines or ["(empty log)"])[-1].strip()[:400]


def log_warnings(nodes):
    """WARN and ERROR lines of the nodes' logs, counted by message (numbers cut)."""
    seen = collections.Counter()
    for node in nodes:
        for line in node.log_text().splitlines():
            parts = line.split(None, 3)
            if len(parts) == 4 and parts[1] in ("WARN", "ERROR"):
                seen[f"{parts[1]} {re.sub(r'[0-9]+', 'N', parts[3][:200].strip())}"] += 1
    return seen


_taken_ports = set()


def unique_port():
    """A free port not handed out before by this process (a script picks several before it
    binds any)."""
    while True:
        p = free_port()
        if p not in _taken_ports:
            _taken_ports.add(p)
            return p


def standard_load(node, tag, stop, clients=8, batch=10, incrby=2500, incrby_every=5, rng=None):
    """The usual mix on one node: clients - 2 connections of INCR, one of INCR with an
    INCRBY <incrby> in about one batch of `incrby_every`, one of SNOWFLAKE; `batch` commands per
    pipelined batch. Returns the (not yet started) loaders."""
    import random
    rng = rng or random.Random()
    rng_lock = threading.Lock()

    def incr_batch():
        return [(INCR, 1)] * batch

    def mixed_batch():
        commands = [(INCR, 1)] * batch
        with rng_lock:
            if rng.randrange(incrby_every) == 0:
                commands[rng.randrange(batch)] = (INCRBY, incrby)
        return commands

    def snowflake_batch():
        return [(SNOWFLAKE, 1)] * batch

    loaders = [Loader(node, f"{node.name}/incr-{i}", tag, incr_batch, stop) for i in range(clients - 2)]
    loaders.append(Loader(node, f"{node.name}/incrby", tag, mixed_batch, stop))
    loaders.append(Loader(node, f"{node.name}/snowflake", tag, snowflake_batch, stop))
    return loaders


class IdReport:
    """The checks over all loaders of a run (all nodes, all connections)."""

    def __init__(self, loaders, max_id):
        self.max_id = max_id
        singles = sorted(itertools.chain.from_iterable(l.singles for l in loaders))
        blocks = sorted(b for l in loaders for b in l.blocks)
        self.segment_ids = len(singles) + sum(last - first + 1 for first, last in blocks)
        # Distinct IDs: the union of the blocks, plus the distinct singles outside it.
        merged = []
        examples = []
        for first, last in blocks:
            if merged and first <= merged[-1][1]:
                if len(examples) < 5:
                    examples.append(first)
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        distinct = sum(last - first + 1 for first, last in merged)
        j, previous = 0, None
        for v in singles:
            if v == previous:
                if len(examples) < 5 and v not in examples:
                    examples.append(v)
                continue
            previous = v
            while j < len(merged) and merged[j][1] < v:
                j += 1
            if j < len(merged) and merged[j][0] <= v:
                if len(examples) < 5 and v not in examples:
                    examples.append(v)
                continue
            distinct += 1
        self.repeats = self.segment_ids - distinct
        self.repeat_examples = [f"{v} from {', '.join(self._sources(loaders, v))}" for v in examples]
        # Served above the database's max_id (each time served).
        tops = ([singles[-1]] if singles else []) + [last for first, last in blocks]
        self.highest = max(tops) if tops else None
        if max_id is None:
            self.above_max = self.segment_ids  # no row: nothing may have been served
            above = singles[:1] + [b[0] for b in blocks[:1]]
        else:
            cut = bisect.bisect_right(singles, max_id)
            self.above_max = len(singles) - cut + sum(
                max(0, last - max(first, max_id + 1) + 1) for first, last in blocks)
            above = singles[cut:cut + 1] + [max(first, max_id + 1) for first, last in blocks if last > max_id][:1]
        self.above_examples = [f"{v} from {', '.join(self._sources(loaders, v))}" for v in sorted(above)[:3]]
        snowflakes = list(itertools.chain.from_iterable(l.snowflakes for l in loaders))
        self.snowflake_ids = len(snowflakes)
        self.snowflake_repeats = len(snowflakes) - len(set(snowflakes))
        self.order_violations = sum(l.order_violations for l in loaders)
        self.order_examples = [e for l in loaders for e in l.order_examples][:5]
        self.errors = sum((l.errors for l in loaders), collections.Counter())
        self.error_examples = {}
        for l in loaders:
            for kind, text in l.error_examples.items():
                self.error_examples.setdefault(kind, text)
        self.drops = sum(sum(l.drops.values()) for l in loaders)
        self.drop_reasons = sum((l.drops for l in loaders), collections.Counter())
        self.unexpected = [u for l in loaders for u in l.unexpected]

    @staticmethod
    def _sources(loaders, v):
        names = []
        for l in loaders:
            times = l.singles.count(v) + sum(1 for first, last in l.blocks if first <= v <= last)
            if times:
                names.append(l.name if times == 1 else f"{l.name} x{times}")
        return names

    def failures(self):
        out = []
        if self.repeats:
            out.append(f"{self.repeats} segment IDs served more than once, e.g. {self.repeat_examples}")
        if self.above_max:
            out.append(f"{self.above_max} segment IDs above the database's max_id {self.max_id}, "
                       f"e.g. {self.above_examples}")
        if self.order_violations:
            out.append(f"{self.order_violations} order violations (a connection's segment IDs went "
                       f"back), e.g. {self.order_examples}")
        if self.snowflake_repeats:
            out.append(f"{self.snowflake_repeats} snowflake IDs served more than once")
        if self.unexpected:
            out.append(f"{len(self.unexpected)} replies of an unexpected type, e.g. {self.unexpected[:3]}")
        return out

    def summary(self, label, extra=""):
        errors = dict(sorted(self.errors.items()))
        return (f"{label}: {self.segment_ids} segment IDs + {self.snowflake_ids} snowflake IDs checked, "
                f"repeats {self.repeats}, above database max_id {self.above_max}, "
                f"order violations {self.order_violations}, snowflake repeats {self.snowflake_repeats}, "
                f"errors {errors}{extra}")


def print_outcome(name, failures, started):
    """Prints how a scenario ended: `ok NAME (N s)`, or `FAILED NAME (N s):` and then each
    failure on a line of its own (`  - ...`). started: its time.monotonic() at the start.
    Returns True when it passed (no failures)."""
    elapsed = time.monotonic() - started
    if failures:
        print(f"FAILED {name} ({elapsed:.0f} s):", flush=True)
        for failure in failures:
            print(f"  - {failure}", flush=True)
        return False
    print(f"ok {name} ({elapsed:.0f} s)", flush=True)
    return True
