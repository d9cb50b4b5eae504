//! The command table: every command leafd knows, its arity and flags, in one place; used for
//! dispatch, arity checks, NOAUTH gating and the COMMAND family's answers.

/// What leafd tells clients about one command (the shape of Redis's COMMAND INFO).
#[derive(Debug)]
pub struct CommandSpec {
    pub id: CommandId,
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
}

impl CommandSpec {
    /// May run before the client authenticated (Redis's `no-auth` flag).
    pub fn before_auth(&self) -> bool {
        self.flags.contains(&"no-auth")
    }

    pub fn arity_ok(&self, argc: usize) -> bool {
        if self.arity >= 0 {
            argc == self.arity as usize
        } else {
            argc >= self.arity.unsigned_abs() as usize
        }
    }
}

const fn spec(
    id: CommandId,
    name: &'static str,
    arity: i32,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
    group: &'static str,
    summary: &'static str,
) -> CommandSpec {
    CommandSpec {
        id,
        name,
        arity,
        flags,
        first_key: keys.0,
        last_key: keys.1,
        key_step: keys.2,
        group,
        summary,
    }
}

const NO_KEYS: (i64, i64, i64) = (0, 0, 0);
const ONE_KEY: (i64, i64, i64) = (1, 1, 1);
const WRITE: &[&str] = &["write", "denyoom", "fast"];
const CONN: &[&str] = &["noscript", "loading", "stale", "fast"];
const ADMIN: &[&str] = &["admin", "noscript"];
const NO_AUTH: &[&str] = &["noscript", "loading", "stale", "fast", "no-auth"];

/// Every command leafd knows, in the order of [`COMMANDS`]: its index there is the index of
/// its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandId {
    Incr,
    IncrBy,
    Snowflake,
    Get,
    Ping,
    Echo,
    Hello,
    Auth,
    Client,
    Select,
    Quit,
    Reset,
    Command,
    Info,
    Time,
    Config,
    Shutdown,
    LeafWorkers,
    LeafTags,
    LeafDecode,
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
    LeafTag,
    LeafFromTime,
    LeafCode,
}

/// `name` is `lower` in any ASCII case; `lower` is a lower-case command name of the same length.
fn same_name(name: &[u8], lower: &[u8]) -> bool {
    name.iter()
        .zip(lower)
        .all(|(&b, &c)| b == c || (c.is_ascii_lowercase() && b | 0x20 == c))
}

impl CommandId {
    /// The command `name` names, ignoring ASCII case: compared only with the commands of its
    /// length, the hot ones first in the table and so first here.
    pub fn resolve(name: &[u8]) -> Option<CommandId> {
        use CommandId::*;
        let candidates: &[CommandId] = match name.len() {
            3 => &[Get],
            4 => &[Incr, Ping, Echo, Auth, Quit, Info, Time, Exec],
            5 => &[Hello, Reset, Multi, Watch],
            6 => &[IncrBy, Client, Select, Config],
            7 => &[Command, Discard, Unwatch],
            8 => &[Shutdown, LeafTag],
            9 => &[Snowflake, LeafTags, LeafCode],
            11 => &[LeafDecode],
            12 => &[LeafWorkers],
            13 => &[LeafFromTime],
            _ => return None,
        };
        candidates
            .iter()
            .copied()
            .find(|id| same_name(name, id.spec().name.as_bytes()))
    }

    pub fn spec(self) -> &'static CommandSpec {
        &COMMANDS[self as usize]
    }
}

/// Every command: name, arity, flags and help, as COMMAND reports them.
#[rustfmt::skip]
#[allow(clippy::enum_glob_use)]
pub const COMMANDS: &[CommandSpec] = {
    use CommandId::*;
    &[
    spec(Incr, "incr", 2, WRITE, ONE_KEY, "string", "Returns the next ID of segment:<tag> (or of snowflake)."),
    spec(IncrBy, "incrby", 3, WRITE, ONE_KEY, "string", "Reserves a block of n contiguous IDs of segment:<tag>; returns the last."),
    spec(Snowflake, "snowflake", -1, WRITE, NO_KEYS, "leaf", "Returns the next snowflake ID, or an array of n."),
    spec(Get, "get", 2, &["readonly", "fast"], ONE_KEY, "string", "GET snowflake: the next snowflake ID."),
    spec(Ping, "ping", -1, CONN, NO_KEYS, "connection", "Returns PONG, or the argument."),
    spec(Echo, "echo", 2, CONN, NO_KEYS, "connection", "Returns the argument."),
    spec(Hello, "hello", -1, NO_AUTH, NO_KEYS, "connection", "Handshake: protocol version, authentication, client name."),
    spec(Auth, "auth", -2, NO_AUTH, NO_KEYS, "connection", "Authenticates the connection."),
    spec(Client, "client", -2, CONN, NO_KEYS, "connection", "Connection introspection: ID, SETNAME, GETNAME, SETINFO, INFO, LIST."),
    spec(Select, "select", 2, CONN, NO_KEYS, "connection", "Selects database 0 (the only one)."),
    spec(Quit, "quit", -1, NO_AUTH, NO_KEYS, "connection", "Closes the connection."),
    spec(Reset, "reset", 1, NO_AUTH, NO_KEYS, "connection", "Resets the connection state."),
    spec(Command, "command", -1, &["loading", "stale"], NO_KEYS, "server", "Describes commands: COUNT, INFO, DOCS, LIST."),
    spec(Info, "info", -1, &["loading", "stale"], NO_KEYS, "server", "Server information and statistics."),
    spec(Time, "time", 1, &["loading", "stale", "fast"], NO_KEYS, "server", "Returns the server time."),
    spec(Config, "config", -2, &["admin", "noscript", "loading", "stale"], NO_KEYS, "server", "CONFIG GET of a harmless subset of parameters."),
    spec(Shutdown, "shutdown", -1, &["admin", "noscript", "loading", "stale"], NO_KEYS, "server", "Stops leafd gracefully, like SIGTERM (NOSAVE/SAVE/NOW/FORCE accepted and ignored)."),
    spec(LeafWorkers, "leaf.workers", 1, ADMIN, NO_KEYS, "leaf", "The worker-id lease table (database coordinator): id, owner, lease left, fence."),
    spec(LeafTags, "leaf.tags", -1, &["readonly"], NO_KEYS, "leaf", "Every segment tag with its step, max_id and both buffers, or a page of them after a cursor."),
    spec(LeafDecode, "leaf.decode", 2, &["readonly", "fast"], NO_KEYS, "leaf", "Timestamp, UTC time, worker id and sequence of a snowflake ID."),
    spec(Multi, "multi", 1, &["noscript", "loading", "stale", "fast", "allow-busy"], NO_KEYS, "transactions", "Starts a transaction: later commands are queued until EXEC."),
    spec(Exec, "exec", 1, &["noscript", "loading", "stale", "skip-slowlog"], NO_KEYS, "transactions", "Runs the queued commands in order and replies with their replies."),
    spec(Discard, "discard", 1, &["noscript", "loading", "stale", "fast", "allow-busy"], NO_KEYS, "transactions", "Drops the queued commands."),
    spec(Watch, "watch", -2, &["noscript", "loading", "stale", "fast", "allow-busy"], (1, -1, 1), "transactions", "Accepted; no key leafd serves can be changed by a client, so EXEC never aborts for it."),
    spec(Unwatch, "unwatch", 1, &["noscript", "loading", "stale", "fast", "allow-busy"], NO_KEYS, "transactions", "Forgets watched keys (none matter)."),
    spec(LeafTag, "leaf.tag", -3, ADMIN, NO_KEYS, "leaf", "LEAF.TAG CREATE <tag> <step> [<start>] | STEP <tag> <step> | SKIP <tag> <n> | SKIPALL <n> | REVEAL <tag> <id>."),
    spec(LeafFromTime, "leaf.fromtime", 2, &["readonly", "fast"], NO_KEYS, "leaf", "The smallest snowflake ID of an instant (UNIX ms or RFC 3339 with an offset): IDs of [t1, t2) are >= FROMTIME(t1) and < FROMTIME(t2)."),
    spec(LeafCode, "leaf.code", 2, WRITE, NO_KEYS, "leaf", "The next ID of a period tag as a string: its prefix, the period's date and the zero-padded sequence (ORD20261204000123)."),
    ]
};

/// Finds a command by name, ignoring ASCII case.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    CommandId::resolve(name).map(CommandId::spec)
}

/// Every command name, in table order.
pub fn names() -> Vec<&'static str> {
    COMMANDS.iter().map(|spec| spec.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_resolves_to_its_own_row() {
        for (index, spec) in COMMANDS.iter().enumerate() {
            assert_eq!(spec.id as usize, index, "{} is out of order", spec.name);
            assert_eq!(CommandId::resolve(spec.name.as_bytes()), Some(spec.id));
            let upper = spec.name.to_ascii_uppercase();
            assert_eq!(lookup(upper.as_bytes()).map(|s| s.name), Some(spec.name));
        }
        assert_eq!(CommandId::resolve(b"iNcR"), Some(CommandId::Incr));
        assert_eq!(CommandId::resolve(b"LEAF.TAG"), Some(CommandId::LeafTag));
        for unknown in [
            &b""[..],
            b"inc",
            b"inc\x12",
            b"leaf\x0etag",
            b"incrr",
            b"leaf.decodes",
            b"a-much-longer-name",
        ] {
            assert!(CommandId::resolve(unknown).is_none());
        }
    }
}
