//! Commands: each family parses its arguments into a type and applies it to the shared
//! application state and the connection's [`Session`], producing one [`Reply`].

mod admin;
mod connection;
mod glob;
mod segment;
mod server;
mod snowflake;
pub mod table;
mod transaction;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::app::App;
use crate::engine::segment::SegmentError;
use crate::metrics::BatchMetrics;
use crate::protocol::{Reply, RespVersion};

/// Per-connection state that commands read and change.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    pub addr: String,
    pub protocol: RespVersion,
    pub authenticated: bool,
    /// May run admin commands: per user when authentication is configured, else as
    /// `admin_without_auth` says.
    pub admin: bool,
    /// Without a password, whether this client's host may run admin commands (loopback, or
    /// `admin.allow_unauthenticated`).
    pub admin_without_auth: bool,
    pub name: Option<Bytes>,
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    pub created: Instant,
    /// Set by QUIT: the connection closes after this reply is written.
    pub closing: bool,
    /// Commands queued since MULTI.
    pub transaction: Option<transaction::Transaction>,
    /// Close without writing this command's reply (SHUTDOWN, as Redis).
    pub silent: bool,
}

impl Session {
    /// Restricts admin commands for an unauthenticated client from another host.
    pub fn with_admin_without_auth(mut self, allowed: bool) -> Session {
        self.admin_without_auth = allowed;
        self.admin = self.admin && allowed;
        self
    }

    pub fn new(id: u64, addr: String, auth_required: bool) -> Session {
        Session {
            id,
            addr,
            protocol: RespVersion::Resp2,
            authenticated: !auth_required,
            admin: !auth_required,
            admin_without_auth: true,
            name: None,
            lib_name: None,
            lib_ver: None,
            created: Instant::now(),
            closing: false,
            transaction: None,
            silent: false,
        }
    }
}

/// Runs one command, notes its metrics in the connection's `batch` and returns its reply with
/// the time it finished. `started` is when work on this command began (for a pipelined batch,
/// when the previous command finished), so timing costs one clock read per command. Never
/// fails: every problem is an error reply.
pub async fn execute(
    app: &Arc<App>,
    session: &mut Session,
    args: Vec<Bytes>,
    started: Instant,
    batch: &mut BatchMetrics,
) -> (Reply, Instant) {
    let found = args.first().and_then(|name| table::lookup_indexed(name));
    let queued = match session.transaction {
        Some(_) => transaction::queue(app, session, &args),
        None => None,
    };
    let (index, reply) = match (queued, found) {
        (Some(reply), found) => (found.map_or(usize::MAX, |(i, _)| i), reply),
        (None, Some((index, spec))) => (index, run(spec, app, session, &args).await),
        (None, None) => (usize::MAX, unknown_command(&args)),
    };
    if !app.metrics.enabled() {
        return (reply, started);
    }
    let finished = Instant::now();
    batch.record(
        index,
        reply.is_error(),
        finished.saturating_duration_since(started),
    );
    (reply, finished)
}

async fn run(
    spec: &'static table::CommandSpec,
    app: &Arc<App>,
    session: &mut Session,
    args: &[Bytes],
) -> Reply {
    if !spec.arity_ok(args.len()) {
        return wrong_arity(spec.name);
    }
    if !session.authenticated && !spec.before_auth {
        return Reply::error(crate::auth::NOAUTH);
    }
    match spec.name {
        "incr" if args[1].eq_ignore_ascii_case(snowflake::SNOWFLAKE_KEY) => {
            snowflake::next(app).await
        }
        "incr" => match segment::Incr::parse(args) {
            Ok(cmd) => cmd.apply(app).await,
            Err(reply) => reply,
        },
        // Clients such as redis-py send INCR as INCRBY key 1.
        "incrby" if args[1].eq_ignore_ascii_case(snowflake::SNOWFLAKE_KEY) => {
            snowflake::incrby(args, app).await
        }
        "incrby" => match segment::IncrBy::parse(args, app) {
            Ok(cmd) => cmd.apply(app).await,
            Err(reply) => reply,
        },
        "snowflake" => snowflake::snowflake(args, app).await,
        "get" => snowflake::get(args, app).await,
        "leaf.decode" => snowflake::decode(args, app),
        "ping" => connection::ping(args, session),
        "echo" => Reply::Bulk(args[1].clone()),
        "hello" => connection::hello(args, app, session),
        "auth" => connection::auth(args, app, session),
        "client" => connection::client(args, session),
        "select" => connection::select(args),
        "quit" => {
            session.closing = true;
            Reply::ok()
        }
        "reset" => connection::reset(app, session),
        "command" => server::command(args),
        "info" => server::info(args, app),
        "time" => server::time(),
        "config" | "leaf.tag" | "shutdown" | "leaf.workers" if !session.admin => {
            admin_refusal(app, spec.name)
        }
        "leaf.workers" => admin::workers(app).await,
        "config" => server::config(args, app),
        "shutdown" => server::shutdown(args, app, session),
        "leaf.tags" => admin::tags(app),
        "leaf.tag" => admin::tag(args, app).await,
        "multi" => transaction::multi(session),
        "discard" => transaction::discard(session),
        "watch" => transaction::watch(session),
        "unwatch" => Reply::ok(),
        // Boxed: EXEC runs the queued commands through `run` (never another EXEC: it is not queued).
        "exec" => Box::pin(transaction::exec(app, session)).await,
        _ => unknown_command(args),
    }
}

/// Why a client may not run an admin command: its user is not an admin, or (no password
/// configured) it connects from another host.
fn admin_refusal(app: &App, name: &str) -> Reply {
    if app.config.server.auth_required() {
        Reply::error(format!(
            "NOPERM this user has no permissions to run the '{name}' command"
        ))
    } else {
        Reply::error(crate::access::ADMIN_NEEDS_PASSWORD)
    }
}

fn unknown_command(args: &[Bytes]) -> Reply {
    let name = args.first().map(|a| lossy(a)).unwrap_or_default();
    let rest: String = args
        .iter()
        .skip(1)
        .take(8)
        .map(|a| format!("'{}' ", lossy(a)))
        .collect();
    Reply::error(format!(
        "ERR unknown command '{name}', with args beginning with: {rest}"
    ))
}

pub(crate) fn wrong_arity(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

pub(crate) fn not_an_integer() -> Reply {
    Reply::error("ERR value is not an integer or out of range")
}

/// A displayable, bounded copy of a client-supplied argument for error messages.
pub(crate) fn lossy(arg: &[u8]) -> String {
    let shown = &arg[..arg.len().min(128)];
    String::from_utf8_lossy(shown).replace(['\r', '\n'], " ")
}

pub(crate) fn parse_i64(arg: &[u8]) -> Result<i64, Reply> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(not_an_integer)
}

/// The RESP error for an engine error; the first word is stable and documented.
pub(crate) fn segment_error(err: &SegmentError) -> Reply {
    match err {
        SegmentError::Unavailable { .. } | SegmentError::Storage(_) => {
            Reply::error(format!("UNAVAILABLE {err}"))
        }
        SegmentError::Rollback { .. } => Reply::error(format!("ROLLBACK {err}")),
        _ => Reply::error(format!("ERR {err}")),
    }
}
