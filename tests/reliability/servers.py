"""Private database servers for the reliability and security scripts: PostgreSQL 15 and MariaDB
started here, in temporary directories, on free ports of the loopback interface, so a test
can kill, reconfigure or break them without touching the machine's own servers. Also the small
process helpers they need (run a command, as another user, wait for a condition, kill a server
with every process it started).

Standard library only. Import it next to leafd.py:
    sys.path.insert(0, <tests/reliability>)
    import servers
Needs PostgreSQL 15 (PG_BIN; run as the `postgres` OS user when we are root, as PostgreSQL
refuses to run as root), psql, MariaDB (mariadb-install-db, /usr/sbin/mariadbd) and mysql.
"""
import collections
import contextlib
import os
import pwd
import signal
import subprocess
import time

import leafd

PG_BIN = "/usr/lib/postgresql/15/bin"
PG_USER = "postgres"  # the OS user PostgreSQL runs as when we are root
MARIADBD = "/usr/sbin/mariadbd"


# --- processes ----------------------------------------------------------------------------------

def run(cmd, timeout=30, user=None, check=True):
    """A command's stdout (stripped); RuntimeError with its stderr when it fails."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **as_user(user))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{cmd[0]} did not finish in {timeout} s: {' '.join(cmd)}") from None
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()[-800:]}")
    return result.stdout.strip()


def as_user(user):
    """Popen arguments that run a process as `user` when we are root (PostgreSQL refuses to run
    as root), nothing otherwise."""
    if user is None or os.geteuid() != 0:
        return {}
    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def give_to(path, user):
    """chown `path` to `user` (and its group) when we are root; nothing otherwise."""
    if user is not None and os.geteuid() == 0:
        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def owned_dir(path, user):
    """Creates the directory `path`, owned by `user` when we are root."""
    os.makedirs(path)
    return give_to(path, user)


def wait_until(what, seconds, probe, interval=0.1):
    """Calls probe() until it returns a true value (returned); RuntimeError after `seconds`.
    Errors of the probe (a server still starting) count as "not yet"."""
    deadline = time.monotonic() + seconds
    last = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except (RuntimeError, OSError) as e:
            last = e
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what}: not after {seconds} s" + (f" (last error: {last})" if last else ""))
        time.sleep(interval)


def processes():
    """{pid: (state, ppid)} of every process (from /proc)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (state, int(ppid))
    return out


def leftovers(directory):
    """Pids of running processes whose command line mentions `directory` (a server's data or
    config directory) left by a failed step."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if directory in cmdline and running(int(entry)):
            out.append(int(entry))
    return out


def descendants(pid):
    children = collections.defaultdict(list)
    for child, (_, ppid) in processes().items():
        children[ppid].append(child)
    out, todo = [], [pid]
    while todo:
        for child in children[todo.pop()]:
            out.append(child)
            todo.append(child)
    return out


def running(pid):
    """Whether `pid` runs (a zombie, not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Server:
    """A database server process. kill() takes it and every process it started at once
    (PostgreSQL's backends, WAL sender and writer, each in a session of its own, so a signal to
    the postmaster's process group would miss them), as a host dying would: a postmaster
    killed alone leaves backends that finish their transactions."""

    def __init__(self, name, cmd, log_path, user=None):
        self.name = name
        # A session of its own: a Ctrl-C meant for the test does not stop it behind its back.
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         **as_user(user))
        self.log_path = log_path
        self.killed = []  # the pids kill() sent SIGKILL to

    def kill(self):
        if self.proc.poll() is None:
            # Stopped first, the server forks no new process while its children are listed.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGSTOP)
            self.killed = [self.proc.pid] + descendants(self.proc.pid)
            for pid in self.killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        # Until none of them runs (their System V segment is detached, nothing can commit).
        deadline = time.monotonic() + 5
        while any(running(pid) for pid in self.killed) and time.monotonic() < deadline:
            time.sleep(0.02)

    def log_tail(self, lines=8):
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read().splitlines()[-lines:]
        except OSError:
            return ""
        return "\n".join(f"  {self.name}| {line[:250]}" for line in text)


# --- PostgreSQL ---------------------------------------------------------------------------------

def initdb(data_dir, user=PG_USER):
    """A new PostgreSQL cluster in `data_dir` (its parent must be the user's), superuser
    `postgres`, trust authentication (pg_hba.conf can be rewritten before the start)."""
    run([f"{PG_BIN}/initdb", "-D", data_dir, "-U", "postgres", "--auth=trust", "-E", "UTF8",
         "--no-sync"], timeout=60, user=user)


def postgres_server(name, data_dir, port, socket_dir, log_path, settings=None, user=PG_USER,
                    listen="127.0.0.1"):
    """Starts postgres on `listen` (comma-separated addresses) port `port`, its Unix socket in
    `socket_dir`; returns the Server. fsync off: tests kill servers, not the machine (the kernel
    keeps what they wrote), on a shared disk. `settings`: further {name: value} (-c)."""
    values = {"listen_addresses": listen, "port": port, "unix_socket_directories": socket_dir,
              "fsync": "off", "shared_buffers": "16MB", "max_connections": 60,
              "dynamic_shared_memory_type": "mmap"}
    values.update(settings or {})
    cmd = [f"{PG_BIN}/postgres", "-D", data_dir]
    for key, value in values.items():
        cmd += ["-c", f"{key}={value}"]
    return Server(name, cmd, log_path, user=user)


def psql(port, statement, database="postgres", host="127.0.0.1", user="postgres", timeout=15):
    """One statement through psql as `user` (host: an address, or the Unix socket's directory);
    its unaligned, tuples-only output."""
    return run(["psql", "-h", host, "-p", str(port), "-U", user, "-d", database, "-X", "-At",
                "-v", "ON_ERROR_STOP=1", "-c", statement], timeout=timeout)


def release_postgres_shared_memory(data_dir):
    """A postmaster killed with SIGKILL leaves its small System V segment (key and id on line 7
    of postmaster.pid): removed, so runs leak nothing. Only that very segment (same key and id)
    and only once nothing is attached to it."""
    try:
        with open(os.path.join(data_dir, "postmaster.pid")) as f:
            key, shmid = (int(v) for v in f.read().splitlines()[6].split())
        with open("/proc/sysvipc/shm") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except (OSError, IndexError, ValueError):
        return
    for row in rows:  # key shmid perms size cpid lpid nattch ...
        if int(row[0]) == key and int(row[1]) == shmid and int(row[6]) == 0:
            subprocess.run(["ipcrm", "-m", str(shmid)], capture_output=True, timeout=10)


class PrivatePostgres:
    """One private PostgreSQL 15 server in <parent>/<name> (a directory of the `postgres` user
    when we are root): data in data/, log <name>.log, Unix socket in the directory, on
    127.0.0.1 (or `listen`) at a free port. init() makes the cluster (trust authentication);
    write files into data_dir (pg_hba.conf, keys) before start(). sql() goes through the Unix
    socket as superuser `postgres` (pg_hba.conf must keep `local all all trust`), whatever the
    rules for TCP. close() kills it (and every backend) and releases its shared memory."""

    def __init__(self, parent, name="pg", listen="127.0.0.1", settings=None):
        self.name, self.listen, self.settings = name, listen, dict(settings or {})
        self.dir = owned_dir(os.path.join(parent, name), PG_USER)
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, f"{name}.log")
        self.port = leafd.free_port()
        self.server = None

    def init(self):
        initdb(self.data_dir)
        return self

    def start(self, seconds=30):
        self.server = postgres_server(self.name, self.data_dir, self.port, self.dir, self.log_path,
                                      self.settings, listen=self.listen)
        wait_until(f"PostgreSQL {self.name} ready", seconds, lambda: self.sql("SELECT 1") == "1")
        return self

    def sql(self, statement, database="postgres"):
        return psql(self.port, statement, database=database, host=self.dir)

    def log_tail(self, lines=8):
        return self.server.log_tail(lines) if self.server else ""

    def close(self):
        if self.server is not None:
            self.server.kill()
        release_postgres_shared_memory(self.data_dir)


# --- MariaDB ------------------------------------------------------------------------------------

def install_mariadb(directory, names, seconds=120):
    """mariadb-install-db of <directory>/<name> for each name, all at once (each takes a couple
    of seconds), each with its own temporary directory <name>-tmp: two bootstraps at once in
    /tmp can collide on their temporary tables ("Unknown table 'mysql.tmp_user_sys'"). The
    grant tables are kept: root (localhost, 127.0.0.1, ::1) without a password."""
    installs = []
    for name in names:
        os.makedirs(f"{directory}/{name}-tmp")
        with open(f"{directory}/{name}-install.log", "wb") as log:
            installs.append((name, subprocess.Popen(
                ["mariadb-install-db", "--no-defaults", f"--datadir={directory}/{name}",
                 f"--tmpdir={directory}/{name}-tmp", "--user=root",
                 "--skip-test-db", "--auth-root-authentication-method=normal"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
    statuses = []
    for name, p in installs:  # all of them, before any error
        try:
            statuses.append((name, p.wait(seconds)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
            statuses.append((name, f"timeout after {seconds} s"))
    for name, status in statuses:
        if status != 0:
            with open(f"{directory}/{name}-install.log", errors="replace") as f:
                tail = f.read()[-1500:]
            raise RuntimeError(f"mariadb-install-db ({name}) failed with status {status}:\n{tail}")


def mariadb_server(directory, name, port, extra=(), bind="127.0.0.1"):
    """Starts mariadbd on data directory <directory>/<name> (see install_mariadb), `bind`
    (comma-separated addresses) port `port`, socket <name>.sock, error log <name>.err;
    returns the Server. `extra`: further options."""
    data = os.path.join(directory, name)
    return Server(f"mariadb-{name}", [
        MARIADBD, "--no-defaults", f"--datadir={data}", "--user=root", f"--port={port}",
        f"--bind-address={bind}", f"--socket={data}.sock", f"--pid-file={data}.pid",
        f"--tmpdir={data}-tmp",
        "--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=2",
        f"--log-error={directory}/{name}.err", "--skip-name-resolve"] + list(extra),
        os.path.join(directory, f"{name}.err"))


def mysql(port, statement, database=None, vertical=False, socket=None, user="root", timeout=15):
    """One statement (or several, separated by ;) through the mysql client as `user` without a
    password, over TCP to 127.0.0.1:port, or over the Unix socket `socket`; tab-separated output
    without column names, or with vertical=True "Column: value" lines."""
    cmd = ["mysql", f"-u{user}", "--connect-timeout=5", "-B"]
    cmd += [f"--socket={socket}"] if socket else ["-h127.0.0.1", f"-P{port}"]
    # Vertical output ("Column: value" lines) needs the column names.
    cmd.append("-E" if vertical else "-N")
    cmd += ["-e", statement] + ([database] if database else [])
    return run(cmd, timeout=timeout)


class PrivateMariaDB:
    """One private MariaDB server in <parent>/<name>: data in <name>/data, error log data.err,
    on 127.0.0.1 (or `bind`) at a free port. install() makes the data directory, start(extra)
    runs it with further options. sql() goes through the Unix socket as root (no password:
    allowed whatever the rules for TCP, require_secure_transport included)."""

    def __init__(self, parent, name="mariadb", bind="127.0.0.1"):
        self.name, self.bind = name, bind
        self.dir = os.path.join(parent, name)
        os.makedirs(self.dir)
        self.socket = os.path.join(self.dir, "data.sock")
        self.port = leafd.free_port()
        self.server = None

    def install(self):
        install_mariadb(self.dir, ["data"])
        return self

    def start(self, extra=(), seconds=60):
        self.server = mariadb_server(self.dir, "data", self.port, extra, bind=self.bind)
        self.server.name = self.name
        wait_until(f"MariaDB {self.name} ready", seconds, lambda: self.sql("SELECT 1") == "1")
        return self

    def sql(self, statement, database=None, vertical=False):
        return mysql(self.port, statement, database, vertical, socket=self.socket)

    def log_tail(self, lines=8):
        return self.server.log_tail(lines) if self.server else ""

    def close(self):
        if self.server is not None:
            self.server.kill()
