//! The command table: every command leafd knows, its arity and flags, in one place; used for
//! dispatch, arity checks, NOAUTH gating and the COMMAND family's answers.

/// What leafd tells clients about one command (the shape of Redis's COMMAND INFO).
#[derive(Debug)]
pub struct CommandSpec {
    /// Lower-case name as clients send it.
    pub name: &'static str,
    /// Redis arity: `n` means exactly n arguments (name included), `-n` at least n.
    pub arity: i32,
    pub flags: &'static [&'static str],
    pub first_key: i64,
    pub last_key: i64,
    pub key_step: i64,
    pub group: &'static str,
    pub summary: &'static str,
    /// May run before the client authenticated.
    pub before_auth: bool,
}

impl CommandSpec {
    pub fn arity_ok(&self, argc: usize) -> bool {
        if self.arity >= 0 {
            argc == self.arity as usize
        } else {
            argc >= self.arity.unsigned_abs() as usize
        }
    }
}

const fn spec(
    name: &'static str,
    arity: i32,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
    group: &'static str,
    summary: &'static str,
    before_auth: bool,
) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        first_key: keys.0,
        last_key: keys.1,
        key_step: keys.2,
        group,
        summary,
        before_auth,
    }
}

const NO_KEYS: (i64, i64, i64) = (0, 0, 0);
const ONE_KEY: (i64, i64, i64) = (1, 1, 1);
const WRITE: &[&str] = &["write", "denyoom", "fast"];
const CONN: &[&str] = &["noscript", "loading", "stale", "fast"];
const ADMIN: &[&str] = &["admin", "noscript"];
const NO_AUTH: &[&str] = &["noscript", "loading", "stale", "fast", "no-auth"];

/// Every command, the hot ones first (the table is scanned linearly).
#[rustfmt::skip]
pub const COMMANDS: &[CommandSpec] = &[
    spec("incr", 2, WRITE, ONE_KEY, "string", "Returns the next ID of segment:<tag> (or of snowflake).", false),
    spec("incrby", 3, WRITE, ONE_KEY, "string", "Reserves a block of n contiguous IDs of segment:<tag>; returns the last.", false),
    spec("snowflake", -1, WRITE, NO_KEYS, "leaf", "Returns the next snowflake ID, or an array of n.", false),
    spec("get", 2, &["readonly", "fast"], ONE_KEY, "string", "GET snowflake: the next snowflake ID.", false),
    spec("ping", -1, CONN, NO_KEYS, "connection", "Returns PONG, or the argument.", false),
    spec("echo", 2, CONN, NO_KEYS, "connection", "Returns the argument.", false),
    spec("hello", -1, NO_AUTH, NO_KEYS, "connection", "Handshake: protocol version, authentication, client name.", true),
    spec("auth", -2, NO_AUTH, NO_KEYS, "connection", "Authenticates the connection.", true),
    spec("client", -2, CONN, NO_KEYS, "connection", "Connection introspection: ID, SETNAME, GETNAME, SETINFO, INFO, LIST.", false),
    spec("select", 2, CONN, NO_KEYS, "connection", "Selects database 0 (the only one).", false),
    spec("quit", -1, NO_AUTH, NO_KEYS, "connection", "Closes the connection.", true),
    spec("reset", 1, NO_AUTH, NO_KEYS, "connection", "Resets the connection state.", true),
    spec("command", -1, &["loading", "stale"], NO_KEYS, "server", "Describes commands: COUNT, INFO, DOCS, LIST.", false),
    spec("info", -1, &["loading", "stale"], NO_KEYS, "server", "Server information and statistics.", false),
    spec("time", 1, &["loading", "stale", "fast"], NO_KEYS, "server", "Returns the server time.", false),
    spec("config", -2, &["admin", "noscript", "loading", "stale"], NO_KEYS, "server", "CONFIG GET of a harmless subset of parameters.", false),
    spec("shutdown", -1, &["admin", "noscript", "loading", "stale"], NO_KEYS, "server", "Stops leafd gracefully, like SIGTERM (NOSAVE/SAVE/NOW/FORCE accepted and ignored).", false),
    spec("leaf.workers", 1, ADMIN, NO_KEYS, "leaf", "The worker-id lease table (database coordinator): id, owner, lease left, fence.", false),
    spec("leaf.tags", 1, &["readonly"], NO_KEYS, "leaf", "Every segment tag with its step, max_id and both buffers.", false),
    spec("leaf.decode", 2, &["readonly", "fast"], NO_KEYS, "leaf", "Timestamp, UTC time, worker id and sequence of a snowflake ID.", false),
    spec("multi", 1, &["noscript", "loading", "stale", "fast", "allow-busy"], NO_KEYS, "transactions", "Starts a transaction: later commands are queued until EXEC.", false),
    spec("exec", 1, &["noscript", "loading", "stale", "skip-slowlog"], NO_KEYS, "transactions", "Runs the queued commands in order and replies with their replies.", false),
    spec("discard", 1, &["noscript", "loading", "stale", "fast", "allow-busy"], NO_KEYS, "transactions", "Drops the queued commands.", false),
    spec("watch", -2, &["noscript", "loading", "stale", "fast", "allow-busy"], (1, -1, 1), "transactions", "Accepted; no key leafd serves can be changed by a client, so EXEC never aborts for it.", false),
    spec("unwatch", 1, &["noscript", "loading", "stale", "fast", "allow-busy"], NO_KEYS, "transactions", "Forgets watched keys (none matter).", false),
    spec("leaf.tag", -3, ADMIN, NO_KEYS, "leaf", "LEAF.TAG CREATE <tag> <step> [<start>] | STEP <tag> <step> | SKIP <tag> <n> | SKIPALL <n>.", false),
];

/// Finds a command by name, ignoring ASCII case.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    lookup_indexed(name).map(|(_, spec)| spec)
}

/// Finds a command and its position in [`COMMANDS`] (the index of its metrics).
pub fn lookup_indexed(name: &[u8]) -> Option<(usize, &'static CommandSpec)> {
    COMMANDS
        .iter()
        .enumerate()
        .find(|(_, spec)| spec.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Every command name, in table order.
pub fn names() -> Vec<&'static str> {
    COMMANDS.iter().map(|spec| spec.name).collect()
}
