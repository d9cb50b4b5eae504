//! `[server]`: the RESP listener, its per-client limits, users and passwords.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The RESP listener and its per-client limits.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the plaintext RESP listener; empty for none (then `tls.bind` serves RESP).
    pub bind: String,
    /// Connections beyond this get `-ERR max number of clients reached` and are closed.
    pub max_clients: usize,
    /// Close a connection that sent no complete command for this many seconds (a client that
    /// trickles a partial frame counts as idle); 0 disables it.
    pub idle_timeout_secs: u64,
    /// Close a connection that has not read its replies for this many seconds (it pipelines
    /// without reading); 0 waits for ever. Memory stays bounded either way.
    pub write_timeout_secs: u64,
    /// When set, clients must AUTH (or HELLO … AUTH) before any other command; it is the
    /// password of the `default` user, who may run admin commands.
    pub requirepass: Option<String>,
    /// Further users (`[[server.users]]`); only those with `admin = true` may run LEAF.TAG.
    pub users: Vec<UserConfig>,
    /// Largest block one `INCRBY segment:<tag> <n>` may take.
    pub max_incrby: i64,
    /// At shutdown, commands in flight get this long to finish before leafd stops anyway.
    pub shutdown_timeout_secs: u64,
    /// Most commands one MULTI may queue; one more makes EXEC abort.
    pub max_multi_commands: usize,
    /// As Redis: with no password or user configured, clients from other hosts are refused
    /// (one `-DENIED` reply, then the connection closes); loopback clients are served.
    pub protected_mode: bool,
    /// Threads that serve client connections, each running its own event loop (a connection
    /// stays on one thread); 0 picks half the CPU cores, at least one.
    pub io_threads: usize,
    pub max_inline_len: usize,
    pub max_bulk_len: usize,
    pub max_array_len: usize,
    pub max_request_len: usize,
}

/// More connection threads than this is a typo, not a tuning.
const MAX_IO_THREADS: usize = 1024;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:6380".into(),
            max_clients: 10_000,
            idle_timeout_secs: 0,
            write_timeout_secs: 30,
            requirepass: None,
            users: Vec::new(),
            max_incrby: 100_000,
            shutdown_timeout_secs: 10,
            max_multi_commands: 10_000,
            protected_mode: true,
            io_threads: 0,
            max_inline_len: 64 * 1024,
            max_bulk_len: 512 * 1024,
            max_array_len: 1024,
            max_request_len: 4 * 1024 * 1024,
        }
    }
}

/// A user that can AUTH with a name and password.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    pub password: String,
    /// May run administrative commands (LEAF.TAG CREATE/STEP).
    #[serde(default)]
    pub admin: bool,
}

impl fmt::Debug for UserConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserConfig")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .field("admin", &self.admin)
            .finish()
    }
}

impl ServerConfig {
    /// How many connection threads to run: `io_threads`, or half the CPU cores when it is 0.
    /// Half, because a thread that owns its connections serves them without cross-core
    /// wake-ups, and the kernel's network stack, the database client and the HTTP listener
    /// need the other cores.
    pub fn effective_io_threads(&self) -> usize {
        if self.io_threads > 0 {
            return self.io_threads;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).max(1)
    }

    /// True when clients must authenticate: a `requirepass` or any user is configured.
    pub fn auth_required(&self) -> bool {
        self.requirepass.is_some() || !self.users.is_empty()
    }
}

impl fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("bind", &self.bind)
            .field("max_clients", &self.max_clients)
            .field("idle_timeout_secs", &self.idle_timeout_secs)
            .field("write_timeout_secs", &self.write_timeout_secs)
            .field(
                "requirepass",
                &self.requirepass.as_ref().map(|_| "<redacted>"),
            )
            .field("users", &self.users)
            .field("max_incrby", &self.max_incrby)
            .field("io_threads", &self.io_threads)
            .field("max_inline_len", &self.max_inline_len)
            .field("max_bulk_len", &self.max_bulk_len)
            .field("max_array_len", &self.max_array_len)
            .field("max_request_len", &self.max_request_len)
            .finish()
    }
}

impl ServerConfig {
    /// The `[server]` section's own rules; the message names the key.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self
            .users
            .iter()
            .any(|u| u.name.is_empty() || u.name == "default")
        {
            return Err(
                "server.users: a name must be non-empty and not 'default' (use requirepass)".into(),
            );
        }
        if self.max_clients == 0 {
            return Err("server.max_clients must be at least 1".into());
        }
        if self.max_incrby < 1 {
            return Err("server.max_incrby must be at least 1".into());
        }
        if self.io_threads > MAX_IO_THREADS {
            return Err(format!(
                "server.io_threads must be at most {MAX_IO_THREADS} (0 picks half the CPU cores)"
            ));
        }
        if self.max_multi_commands < 1 {
            return Err("server.max_multi_commands must be at least 1".into());
        }
        if self.max_array_len < 3 || self.max_bulk_len < 128 {
            return Err("server.max_array_len must be >= 3 and max_bulk_len >= 128".into());
        }
        Ok(())
    }
}
