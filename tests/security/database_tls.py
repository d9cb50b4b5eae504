"""leafd reaches PostgreSQL and MariaDB over TLS with the URL options their users already know
(sqlx's, which follow libpq for PostgreSQL: sslmode, sslrootcert, sslcert, sslkey; and the mysql
client for MariaDB: ssl-mode, ssl-ca, ssl-cert, ssl-key), verifies what those options say it
verifies, and fails with a clear error when the certificate or the transport is wrong.

Setup (temporary directory, free ports, loopback only, everything removed at the end):
  * with the openssl CLI: a test CA; a server certificate it signs for DNS:localhost and
    IP:127.0.0.1 (not 127.0.0.2); a client certificate it signs (CN=leafd_cert); an unrelated
    CA ("wrong CA") and a client certificate CN=leafd_cert it signs; an impostor CA with the
    test CA's very name but another key;
  * a private PostgreSQL 15 (tests/reliability/servers.py) on 127.0.0.1 and 127.0.0.2 with
    ssl=on and that certificate; pg_hba.conf: Unix socket trusted (the test's own psql), TCP
    without TLS rejected (hostnossl ... reject), role leafd by password (scram-sha-256) over
    TLS only, role leafd_cert by client certificate only (hostssl ... cert);
  * a private MariaDB on 127.0.0.1 and 127.0.0.2 with --ssl-ca/--ssl-cert/--ssl-key and
    --require-secure-transport=ON; user leafd with a password, user leafd_cert REQUIRE X509.

Checks, per dialect: `leafd migrate --storage-url URL` for each URL of postgres_cases and
mariadb_cases (exit 0 and what migrate did: "created the schema in ...", "migrated ..." or
"schema ... is up to date", or exit 1 and one error line on stderr
holding the words that say why; the password in no output): verified modes with the right CA
(by IP and by DNS name), unverified modes, the wrong CA, the impostor CA, no CA (web roots
only), a name the certificate lacks, TLS off (refused by the server), client certificates
(right CA, none, wrong CA). Rows that pin down sqlx 0.8.6's behaviour where it differs from
libpq or the mysql client say so in the table (verify-ca checks the name too: sqlx #3793;
require never verifies; misspelled keys such as sslMode are ignored). Then one real node on
the verify-full / VERIFY_IDENTITY URL serves INCR segment:<tag> across two allocations and
SNOWFLAKE, its connections encrypted as the server sees them (pg_stat_ssl; MariaDB's
require_secure_transport), and exits 0 on SIGTERM; one node on the wrong CA stays up and
unready: /ready 503, INCR refused, the reason in its log (all printed).

usage: database_tls.py LEAFD_BIN
Needs root (PostgreSQL runs as the `postgres` user), PostgreSQL 15, psql, MariaDB 10.11+
(several --bind-address addresses, --require-secure-transport), mysql, openssl. About 10 s.
"""
import http.client
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

RELIABILITY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reliability")
sys.path.insert(0, RELIABILITY)
import leafd  # noqa: E402
import servers  # noqa: E402

TAG = "tls"
PASSWORD = "leafd-pw"
MIGRATE_TIMEOUT = 20  # s: a refusal is immediate (a TLS alert or the server's error packet)
DEADLINE = 110  # s for the whole run

OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def make_certificates(d):
    """The PEM files in `d`: ca, wrong-ca, impostor-ca (.pem, .key), server and client signed
    by ca, rogue-client signed by wrong-ca (.pem, .key). Returns {name: path of its .pem}, with
    "<name>.key" for the keys."""
    cnf = os.path.join(d, "openssl.cnf")
    with open(cnf, "w") as f:
        f.write(OPENSSL_CNF)

    def openssl(*args):
        servers.run(["openssl", *args], timeout=30)

    def ca(name, cn):
        openssl("req", "-x509", "-config", cnf, "-extensions", "ca", "-newkey", "rsa:2048", "-nodes",
                "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.pem", "-days", "2", "-subj", f"/CN={cn}")

    def signed(name, cn, extensions, signer="ca"):
        openssl("req", "-new", "-config", cnf, "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{name}.key",
                "-out", f"{d}/{name}.csr", "-subj", f"/CN={cn}")
        openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/{signer}.pem",
                "-CAkey", f"{d}/{signer}.key", "-set_serial", f"0x{secrets.token_hex(8)}", "-days", "2",
                "-extfile", cnf, "-extensions", extensions, "-out", f"{d}/{name}.pem")

    ca("ca", "leafd test CA")
    ca("wrong-ca", "unrelated test CA")
    ca("impostor-ca", "leafd test CA")  # the same name as the real CA, another key
    signed("server", "localhost", "server")
    signed("client", "leafd_cert", "client")
    signed("rogue-client", "leafd_cert", "client", signer="wrong-ca")  # the right name, the wrong CA
    files = {}
    for name in ("ca", "wrong-ca", "impostor-ca", "server", "client", "rogue-client"):
        files[name] = f"{d}/{name}.pem"
        files[f"{name}.key"] = f"{d}/{name}.key"
    return files


# --- the servers --------------------------------------------------------------------------------

LISTEN = "127.0.0.1,127.0.0.2"  # 127.0.0.2: an address the server certificate does not name

PG_HBA = """\
# database_tls.py: TLS or nothing over TCP
local     all  all                     trust
hostnossl all  all         0.0.0.0/0   reject
hostnossl all  all         ::/0        reject
hostssl   all  leafd_cert  127.0.0.0/8 cert
hostssl   all  leafd       127.0.0.0/8 scram-sha-256
"""


def setup_postgres(pg, files):
    pg.init()
    tls = {}
    for name in ("server", "server.key", "ca"):
        path = os.path.join(pg.dir, os.path.basename(files[name]))
        shutil.copyfile(files[name], path)
        servers.give_to(path, servers.PG_USER)
        os.chmod(path, 0o600 if name.endswith(".key") else 0o644)  # PostgreSQL demands 0600 keys
        tls[name] = path
    with open(os.path.join(pg.data_dir, "pg_hba.conf"), "w") as f:
        f.write(PG_HBA)
    pg.settings.update({"ssl": "on", "ssl_cert_file": tls["server"], "ssl_key_file": tls["server.key"],
                        "ssl_ca_file": tls["ca"], "log_connections": "on"})
    pg.start()
    pg.sql(f"CREATE ROLE leafd LOGIN PASSWORD '{PASSWORD}'; CREATE ROLE leafd_cert LOGIN")
    pg.sql("CREATE DATABASE leafd OWNER leafd")
    pg.sql("CREATE DATABASE leafd_cert OWNER leafd_cert")


def setup_mariadb(db, files):
    db.install()
    db.start([f"--ssl-ca={files['ca']}", f"--ssl-cert={files['server']}", f"--ssl-key={files['server.key']}",
              "--require-secure-transport=ON"])
    db.sql("CREATE DATABASE leafd; CREATE DATABASE leafd_cert; "
           f"CREATE USER 'leafd'@'%' IDENTIFIED BY '{PASSWORD}'; GRANT ALL ON leafd.* TO 'leafd'@'%'; "
           "CREATE USER 'leafd_cert'@'%' REQUIRE X509; GRANT ALL ON leafd_cert.* TO 'leafd_cert'@'%'")


def in_parallel(*jobs, seconds=150):
    """Runs the callables at once (the two servers' setups, a few seconds each); the first
    error is raised once all have finished. Interrupted (SIGTERM, the deadline), it still waits
    for them (every step they take is bounded): a server they start after the clean-up would be
    left running."""
    errors = []

    def call(job):
        try:
            job()
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(e)
    threads = [threading.Thread(target=call, args=(job,), daemon=True) for job in jobs]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:
        for t in threads:
            t.join(seconds)
    if errors:
        raise errors[0]


# --- the cases ----------------------------------------------------------------------------------

OK = "ok"
REFUSED = "refused"


class Case:
    """One storage URL and what `leafd migrate` must do with it: OK, or REFUSED with one error
    line on stderr holding every one of `words` (case-insensitive); for OK, `words` must be in
    the output (a warning). `why`: a note for the table."""

    def __init__(self, dialect, options, url, expect, words=(), why=""):
        self.dialect, self.options, self.url, self.expect = dialect, options, url, expect
        self.words, self.why = tuple(words), why
        self.result = self.error = None
        self.seconds = 0.0
        self.failure = None


UNKNOWN_ISSUER = ("invalid peer certificate: UnknownIssuer",)
BAD_SIGNATURE = ("invalid peer certificate: BadSignature",)
NOT_FOR_NAME = ('invalid peer certificate: certificate not valid for name "127.0.0.2"',)
# sqlx 0.8.6's verify-ca / VERIFY_CA verifier ignores only rustls' old NotValidForName error, and
# rustls >= 0.23.24 reports NotValidForNameContext: the name is checked too (sqlx issue #3793,
# fixed after 0.8.6 by pull request #3861). When sqlx is upgraded this row turns to ok.
VERIFY_CA_CHECKS_NAME = "sqlx 0.8.6 + rustls 0.23.24+: the name is checked anyway (sqlx #3793)"
MISSPELT = "the driver would ignore it and connect unverified: leafd refuses the URL"


def postgres_cases(pg, f):
    def url(options, host="127.0.0.1", user=f"leafd:{PASSWORD}", database="leafd"):
        return f"postgres://{user}@{host}:{pg.port}/{database}?{options}"
    ca, wrong, impostor = f["ca"], f["wrong-ca"], f["impostor-ca"]
    cert = f"sslcert={f['client']}&sslkey={f['client.key']}"
    rogue = f"sslcert={f['rogue-client']}&sslkey={f['rogue-client.key']}"
    C = lambda *a, **k: Case("postgres", *a, **k)  # noqa: E731
    return [
        C("sslmode=verify-full&sslrootcert=<ca>", url(f"sslmode=verify-full&sslrootcert={ca}"), OK),
        C("sslmode=verify-full&sslrootcert=<ca> (host localhost)",
          url(f"sslmode=verify-full&sslrootcert={ca}", host="localhost"), OK),
        C("sslmode=verify-ca&sslrootcert=<ca>", url(f"sslmode=verify-ca&sslrootcert={ca}"), OK),
        C("sslmode=require", url("sslmode=require"), OK, why="encrypted, server not verified"),
        C("(no sslmode: prefer)", url(""), OK, why="TLS since the server demands it, not verified"),
        C("sslmode=require&sslrootcert=<wrong-ca>", url(f"sslmode=require&sslrootcert={wrong}"), OK,
          why="sqlx: require never verifies (libpq verifies the CA when a root cert is given)"),
        C("sslmode=verify-full&sslrootcert=<wrong-ca>", url(f"sslmode=verify-full&sslrootcert={wrong}"),
          REFUSED, UNKNOWN_ISSUER),
        C("sslmode=verify-ca&sslrootcert=<wrong-ca>", url(f"sslmode=verify-ca&sslrootcert={wrong}"), REFUSED,
          UNKNOWN_ISSUER),
        C("sslmode=verify-full&sslrootcert=<impostor-ca>", url(f"sslmode=verify-full&sslrootcert={impostor}"),
          REFUSED, BAD_SIGNATURE),
        C("sslmode=verify-full (no sslrootcert: web roots only)", url("sslmode=verify-full"), REFUSED,
          UNKNOWN_ISSUER),
        C("sslmode=verify-full&sslrootcert=<ca> (host 127.0.0.2)",
          url(f"sslmode=verify-full&sslrootcert={ca}", host="127.0.0.2"), REFUSED, NOT_FOR_NAME),
        C("sslmode=verify-ca&sslrootcert=<ca> (host 127.0.0.2)",
          url(f"sslmode=verify-ca&sslrootcert={ca}", host="127.0.0.2"), REFUSED, NOT_FOR_NAME,
          why=VERIFY_CA_CHECKS_NAME),
        C("sslmode=disable", url("sslmode=disable"), REFUSED,
          ('pg_hba.conf rejects connection for host "127.0.0.1", user "leafd", database "leafd", no encryption',)),
        C("sslMode=verify-full&sslRootCert=<wrong-ca> (misspelled)",
          url(f"sslMode=verify-full&sslRootCert={wrong}"), REFUSED,
          ("storage.url: unknown option 'sslMode' for PostgreSQL",), why=MISSPELT),
        C("user leafd_cert, verify-full, sslcert=<client>&sslkey=<client.key>",
          url(f"sslmode=verify-full&sslrootcert={ca}&{cert}", user="leafd_cert", database="leafd_cert"), OK),
        C("user leafd_cert, verify-full, no client certificate",
          url(f"sslmode=verify-full&sslrootcert={ca}", user="leafd_cert", database="leafd_cert"), REFUSED,
          ("connection requires a valid client certificate",)),
        C("user leafd_cert, verify-full, client certificate of <wrong-ca>",
          url(f"sslmode=verify-full&sslrootcert={ca}&{rogue}", user="leafd_cert", database="leafd_cert"),
          REFUSED, ("received fatal alert",)),
    ]


def mariadb_cases(db, f):
    def url(options, host="127.0.0.1", user=f"leafd:{PASSWORD}", database="leafd"):
        return f"mysql://{user}@{host}:{db.port}/{database}?{options}"
    ca, wrong, impostor = f["ca"], f["wrong-ca"], f["impostor-ca"]
    cert = f"ssl-cert={f['client']}&ssl-key={f['client.key']}"
    rogue = f"ssl-cert={f['rogue-client']}&ssl-key={f['rogue-client.key']}"
    C = lambda *a, **k: Case("mariadb", *a, **k)  # noqa: E731
    return [
        C("ssl-mode=VERIFY_IDENTITY&ssl-ca=<ca>", url(f"ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"), OK),
        C("ssl-mode=VERIFY_IDENTITY&ssl-ca=<ca> (host localhost)",
          url(f"ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}", host="localhost"), OK),
        C("ssl-mode=VERIFY_CA&ssl-ca=<ca>", url(f"ssl-mode=VERIFY_CA&ssl-ca={ca}"), OK),
        C("ssl-mode=REQUIRED", url("ssl-mode=REQUIRED"), OK, why="encrypted, server not verified"),
        C("(no ssl-mode: PREFERRED)", url(""), OK, why="TLS since the server demands it, not verified"),
        C("ssl-mode=VERIFY_IDENTITY&ssl-ca=<wrong-ca>", url(f"ssl-mode=VERIFY_IDENTITY&ssl-ca={wrong}"), REFUSED,
          UNKNOWN_ISSUER),
        C("ssl-mode=VERIFY_CA&ssl-ca=<wrong-ca>", url(f"ssl-mode=VERIFY_CA&ssl-ca={wrong}"), REFUSED,
          UNKNOWN_ISSUER),
        C("ssl-mode=VERIFY_IDENTITY&ssl-ca=<impostor-ca>", url(f"ssl-mode=VERIFY_IDENTITY&ssl-ca={impostor}"),
          REFUSED, BAD_SIGNATURE),
        C("ssl-mode=VERIFY_IDENTITY (no ssl-ca: web roots only)", url("ssl-mode=VERIFY_IDENTITY"), REFUSED,
          UNKNOWN_ISSUER),
        C("ssl-mode=VERIFY_IDENTITY&ssl-ca=<ca> (host 127.0.0.2)",
          url(f"ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}", host="127.0.0.2"), REFUSED, NOT_FOR_NAME),
        C("ssl-mode=VERIFY_CA&ssl-ca=<ca> (host 127.0.0.2)",
          url(f"ssl-mode=VERIFY_CA&ssl-ca={ca}", host="127.0.0.2"), REFUSED, NOT_FOR_NAME,
          why=VERIFY_CA_CHECKS_NAME),
        # MariaDB answers a plain connection under require_secure_transport as a wrong password
        # (the mysql client gets the same); these credentials work over TLS (rows above).
        C("ssl-mode=DISABLED", url("ssl-mode=DISABLED"), REFUSED,
          ("1045 (28000): Access denied for user 'leafd'@'127.0.0.1' (using password: YES)",),
          why="require_secure_transport, reported as a wrong password"),
        C("sslMode=VERIFY_IDENTITY&sslCa=<wrong-ca> (misspelled)",
          url(f"sslMode=VERIFY_IDENTITY&sslCa={wrong}"), REFUSED,
          ("storage.url: unknown option 'sslMode' for MySQL/MariaDB",), why=MISSPELT),
        C("user leafd_cert, VERIFY_IDENTITY, ssl-cert=<client>&ssl-key=<client.key>",
          url(f"ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&{cert}", user="leafd_cert", database="leafd_cert"), OK),
        C("user leafd_cert, VERIFY_IDENTITY, no client certificate",
          url(f"ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}", user="leafd_cert", database="leafd_cert"), REFUSED,
          ("Access denied for user 'leafd_cert'@'127.0.0.1' (using password: NO)",)),
        C("user leafd_cert, VERIFY_IDENTITY, client certificate of <wrong-ca>",
          url(f"ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&{rogue}", user="leafd_cert", database="leafd_cert"),
          REFUSED, ("received fatal alert",)),
    ]


def leafd_env():
    """The environment `leafd migrate` runs with (as leafd.Node's): no LEAFD_* (settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFD_")}
    env.update({"NO_COLOR": "1", "RUST_LOG": "warn"})
    return env


def migrate(binary, url, cwd):
    """`leafd migrate --storage-url URL`: (exit status, stdout, stderr, seconds)."""
    started = time.monotonic()
    try:
        r = subprocess.run([binary, "migrate", "--storage-url", url], cwd=cwd, env=leafd_env(),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=MIGRATE_TIMEOUT)
    except subprocess.TimeoutExpired as e:  # its output is bytes, whatever text=True says
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
        return None, out, err, time.monotonic() - started
    return r.returncode, r.stdout.strip(), r.stderr.strip(), time.monotonic() - started


def run_case(binary, case, cwd):
    status, out, err, case.seconds = migrate(binary, case.url, cwd)
    text = "\n".join(x for x in (out, err) if x)
    if PASSWORD in text:
        case.result = "leak"
        case.failure = f"the password is in leafd's output: {text[-300:]!r}"
        return
    if status is None:
        case.result = f"no exit in {MIGRATE_TIMEOUT} s"
        case.failure = f"leafd migrate did not finish in {MIGRATE_TIMEOUT} s: {text[-300:]!r}"
        return
    # `leafd migrate` says what it did: created, migrated, or up to date.
    if status == 0 and any(said in out for said in ("up to date", "created the schema in", "migrated ")):
        case.result = OK
    else:
        case.result = REFUSED
        case.error = err or out
    if case.result != case.expect:
        case.failure = f"expected {case.expect}, got {case.result} (exit {status}): {text[-400:]!r}"
    elif case.expect == OK:
        missing = [w for w in case.words if w.lower() not in text.lower()]
        if missing:
            case.failure = f"the output does not say {missing}: {text[-400:]!r}"
    else:
        missing = [w for w in case.words if w.lower() not in case.error.lower()]
        if status != 1:
            case.failure = f"exit status {status}, not 1"
        elif len(case.error.splitlines()) != 1:
            case.failure = f"not one error line: {case.error!r}"
        elif missing:
            case.failure = f"the error does not say {missing}: {case.error!r}"


# --- serving nodes ------------------------------------------------------------------------------

def postgres_tls_connections(pg):
    """(encrypted, plain, versions and ciphers) of role leafd's connections (pg_stat_ssl)."""
    out = pg.sql("SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl), "
                 "coalesce(string_agg(DISTINCT s.version || ' ' || s.cipher, ', '), '') "
                 "FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.usename = 'leafd'")
    encrypted, plain, how = out.split("|")
    return int(encrypted), int(plain), how


def mariadb_tls_connections(db):
    """The same for user leafd on MariaDB, which has no per-connection TLS view without
    performance_schema: under require_secure_transport every TCP connection is TLS (and
    ssl-mode=DISABLED is seen refused)."""
    secure = db.sql("SELECT @@require_secure_transport") == "1"
    n = int(db.sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'leafd'"))
    return (n, 0, "require_secure_transport=ON") if secure else (0, n, "require_secure_transport is off")


def http_get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace").strip()
    finally:
        conn.close()


def serve_check(binary, work, dialect, url, encrypted_connections):
    """A node on `url` must serve: INCR segment:<tag> 15 times with step 10 (two allocations
    over TLS), SNOWFLAKE; `encrypted_connections()` -> (encrypted, plain, how) database
    connections of the node seen by the server. Returns (failures, description)."""
    node = leafd.Node(binary, work, f"{dialect}-node", url)
    failures = []
    try:
        node.start().wait_ready(30)
        node.create_tag(TAG, 10)
        with leafd.RespConnection(node.port) as c:
            ids = c.pipeline([("INCR", f"segment:{TAG}")] * 15)
            snowflake = c.call("SNOWFLAKE")
        if not all(type(i) is int for i in ids) or ids != sorted(set(ids)):
            failures.append(f"INCR replies not strictly increasing integers: {ids}")
        if type(snowflake) is not int:
            failures.append(f"SNOWFLAKE answered {snowflake!r}")
        encrypted, plain, how = encrypted_connections()
        if encrypted < 1 or plain:
            failures.append(f"the server sees {encrypted} encrypted and {plain} plain connections of the node")
        node.terminate()
        status = node.wait(10)
        if status != 0:
            failures.append(f"exit status {status} after SIGTERM")
        if PASSWORD in node.log_text():
            failures.append("the password is in the node's log")
        desc = (f"INCR x15 -> {ids[0]}..{ids[-1]}, SNOWFLAKE -> {snowflake}; server side: {encrypted} "
                f"connection(s) over TLS ({how}), {plain} plain")
        return failures, desc
    except (leafd.NodeError, OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        failures.append(f"{type(e).__name__}: {e}")
        return failures, ""
    finally:
        node.kill()
        if failures:
            print(f"  log of {node.name}:\n{node.log_tail(10)}", flush=True)


def unready_check(binary, work, dialect, url, words, seconds=10):
    """A node on a URL whose server certificate must be refused stays up and unready: /ready
    answers 503 with a reason, INCR is not served, and the log says why (every one of `words`).
    Returns (failures, /ready's text, the log line, INCR's reply)."""
    http_port = leafd.free_port()
    node = leafd.Node(binary, work, f"{dialect}-wrong-ca", url, http_bind=f"127.0.0.1:{http_port}")
    failures = []
    ready = line = incr = ""
    try:
        node.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if node.process.poll() is not None:
                break
            line = next((entry for entry in node.log_text().splitlines()
                         if all(w.lower() in entry.lower() for w in words)), "")
            try:
                status, body = http_get(http_port, "/ready")
                ready = f"{status} {body}"
            except OSError:
                status = None
            if line and status == 503:
                break
            time.sleep(0.2)
        if node.process.poll() is not None:
            failures.append(f"exited with status {node.process.returncode} (expected: up, not ready)")
        if not ready.startswith("503"):
            failures.append(f"/ready answered {ready or 'nothing'!r}, not 503")
        if not line:
            failures.append(f"no log line with {list(words)} in {seconds} s")
        if PASSWORD in node.log_text():
            failures.append("the password is in the node's log")
        try:
            with leafd.RespConnection(node.port, timeout=3) as c:
                reply = c.call("INCR", f"segment:{TAG}")
            if type(reply) is int:
                failures.append(f"INCR served {reply} without a verified database")
            incr = f"-{reply}" if isinstance(reply, leafd.ErrorReply) else repr(reply)
        except OSError as e:
            incr = f"no reply ({type(e).__name__}: {e})"
    finally:
        node.kill()
        if failures:
            print(f"  log of {node.name}:\n{node.log_tail(10)}", flush=True)
    return failures, ready, line, incr


# --- main ---------------------------------------------------------------------------------------

def shorten_paths(text, certs):
    """The certificates' directory (a temporary path) as <certs> in what is printed."""
    return text.replace(certs, "<certs>")


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[-1].strip())
    binary = os.path.abspath(sys.argv[1])
    if not os.path.exists(binary):
        raise SystemExit(f"no leafd binary at {binary}")
    # SIGTERM (a CI time limit) runs the finally blocks: servers and nodes killed, files removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # A bound on the whole run (about 10 s when all goes well), clean-up included.
    signal.signal(signal.SIGALRM, lambda *_: sys.exit(f"database_tls: not done after {DEADLINE} s"))
    signal.alarm(DEADLINE)
    # libpq's variables, which sqlx reads too (PGSSLROOTCERT would change what "no sslrootcert"
    # means), stay out of leafd's environment and psql's.
    for key in [k for k in os.environ if k.startswith("PG")]:
        del os.environ[key]
    began = time.monotonic()
    work = tempfile.mkdtemp(prefix="leafd-dbtls-")
    os.chmod(work, 0o711)  # the postgres user reaches its directory inside
    pg = db = None
    failures, failed = [], False
    try:
        certs = os.path.join(work, "certs")
        os.makedirs(certs)
        files = make_certificates(certs)
        print(f"database_tls: certificates made in {time.monotonic() - began:.1f} s "
              f"(server: DNS:localhost, IP:127.0.0.1; client CN=leafd_cert; wrong CA; impostor CA)", flush=True)
        pg = servers.PrivatePostgres(work, "pg", listen=LISTEN)
        db = servers.PrivateMariaDB(work, "mariadb", bind=LISTEN)
        in_parallel(lambda: setup_postgres(pg, files), lambda: setup_mariadb(db, files))
        print(f"database_tls: PostgreSQL on port {pg.port} and MariaDB on port {db.port} "
              f"({LISTEN}) up in {time.monotonic() - began:.1f} s", flush=True)
        cases = postgres_cases(pg, files) + mariadb_cases(db, files)
        by_options = {c.options: c for c in cases}
        tool_dir = os.path.join(work, "migrate")
        os.makedirs(tool_dir)
        for case in cases:
            run_case(binary, case, tool_dir)
        # The table: what leafd migrate printed on stderr for each refusal, <certs> for the path.
        width = max(len(c.options) for c in cases)
        print(f"\n{'dialect':8} {'URL options':{width}} {'expected':8} {'result':8} {'s':>4}  note / leafd's error")
        for case in cases:
            print(f"{case.dialect:8} {case.options:{width}} {case.expect:8} {case.result or '-':8} "
                  f"{case.seconds:4.1f}  {'(' + case.why + ') ' if case.why else ''}"
                  f"{shorten_paths(case.error or '', certs)}")
            if case.failure:
                failures.append(f"{case.dialect} {case.options}: {case.failure}")
        print(flush=True)

        # Real nodes.
        for dialect, url, seen in (
                ("postgres", by_options["sslmode=verify-full&sslrootcert=<ca>"].url,
                 lambda: postgres_tls_connections(pg)),
                ("mariadb", by_options["ssl-mode=VERIFY_IDENTITY&ssl-ca=<ca>"].url,
                 lambda: mariadb_tls_connections(db))):
            problems, desc = serve_check(binary, work, dialect, url, seen)
            label = f"{dialect} node on the {'verify-full' if dialect == 'postgres' else 'VERIFY_IDENTITY'} URL"
            print(f"{'ok' if not problems else 'FAILED'} {label}: {desc}", flush=True)
            failures.extend(f"{label}: {p}" for p in problems)

        for case in (by_options["sslmode=verify-full&sslrootcert=<wrong-ca>"],
                     by_options["ssl-mode=VERIFY_IDENTITY&ssl-ca=<wrong-ca>"]):
            dialect = case.dialect
            problems, ready, line, incr = unready_check(binary, work, dialect, case.url, UNKNOWN_ISSUER)
            label = f"{dialect} node on {case.options}"
            print(f"{'ok' if not problems else 'FAILED'} {label}: up, not ready\n"
                  f"    /ready: {ready}\n    INCR:   {shorten_paths(incr, certs)}\n"
                  f"    log:    {shorten_paths(line.strip(), certs)}", flush=True)
            failures.extend(f"{label}: {p}" for p in problems)
    except BaseException:
        failed = True
        raise
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up is bounded: let it finish
        if failed or failures:  # what the servers said, before their directories go
            for server in (pg, db):
                if server is not None:
                    print(f"  last log lines of {server.name}:\n{server.log_tail()}", flush=True)
        for server in (pg, db):
            if server is not None:
                server.close()
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("database_tls: FAILED", flush=True)
        for failure in failures:
            print(f"  - {failure}", flush=True)
        raise SystemExit(1)
    print(f"database_tls: all {len(cases)} URLs and 4 nodes as expected in {time.monotonic() - began:.0f} s",
          flush=True)


if __name__ == "__main__":
    main()
