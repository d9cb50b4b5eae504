//! Commands: each family parses its arguments into a type and applies it to the shared
//! application state and the connection's [`Session`], producing one [`Reply`].

mod admin;
mod connection;
pub(crate) mod glob;
mod key;
mod pipeline;
mod segment;
mod server;
mod snowflake;
pub mod table;
mod transaction;

pub use connection::client_line;
pub use pipeline::{block_at, serve_block, Pipeline};

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use table::CommandId;

use bytes::Bytes;

use crate::context::Context;
use crate::engine::segment::SegmentError;
use crate::metrics::BatchMetrics;
use crate::protocol::{ArgCursor, ArgError, Reply, RespVersion};
use key::Key;

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

/// Runs one command and notes it in the connection's `batch`. Never fails: every problem is
/// an error reply.
pub async fn execute(
    ctx: &Arc<Context>,
    session: &mut Session,
    args: &[&[u8]],
    batch: &mut BatchMetrics,
) -> Reply {
    let id = args.first().and_then(|name| CommandId::resolve(name));
    let queued = match session.transaction {
        Some(_) => transaction::queue(ctx, session, args),
        None => None,
    };
    let mut waited = false;
    let reply = match (queued, id) {
        (Some(reply), _) => reply,
        (None, Some(id)) => match admit(id.spec(), session, args.len()) {
            Err(refusal) => refusal,
            Ok(()) => match answer_at_once(id, ctx, args) {
                Some(reply) => reply,
                None => {
                    // Boxed: only commands that may wait get here, and a future held inline
                    // would be part of every connection's memory, idle or not.
                    let mut command = Box::pin(run(id, ctx, session, args));
                    // Whether it waited decides how it is timed (see BatchMetrics).
                    std::future::poll_fn(|cx| {
                        let poll = command.as_mut().poll(cx);
                        waited |= poll.is_pending();
                        poll
                    })
                    .await
                }
            },
        },
        (None, None) => unknown_command(args),
    };
    // A client that named itself shows it in everyone's CLIENT LIST.
    if matches!(
        id,
        Some(CommandId::Client | CommandId::Hello | CommandId::Reset)
    ) {
        ctx.clients.set(connection::client_line(session));
    }
    if ctx.metrics.enabled() {
        // An index past the table is the `unknown` command's.
        let index = id.map_or(usize::MAX, |id| id as usize);
        batch.record(&ctx.metrics, index, reply.is_error(), waited);
    }
    reply
}

/// Whether this client may run the command with `argc` arguments: the arity, then NOAUTH.
fn admit(spec: &table::CommandSpec, session: &Session, argc: usize) -> Result<(), Reply> {
    if !spec.arity_ok(argc) {
        return Err(wrong_arity(spec.name));
    }
    if !session.authenticated && !spec.before_auth() {
        return Err(Reply::error(crate::auth::NOAUTH));
    }
    Ok(())
}

/// The hot commands' replies when their engine has the ID at hand, as [`run`] would give
/// them, without building a command future; `None` sends the command to `run`.
fn answer_at_once(id: CommandId, ctx: &Arc<Context>, args: &[&[u8]]) -> Option<Reply> {
    match id {
        CommandId::Incr => match Key::of(sole_argument(args))? {
            Key::Snowflake => snowflake::next_at_once(ctx),
            Key::Segment(tag) => segment::incr_at_once(tag, ctx),
        },
        CommandId::Snowflake if args.len() == 1 => snowflake::next_at_once(ctx),
        _ => None,
    }
}

/// The argument of a command the table gives exactly one (INCR, GET, ECHO): [`admit`] has
/// checked the count, so the cursor's first argument is all there is.
fn sole_argument<'a>(args: &'a [&'a [u8]]) -> &'a [u8] {
    ArgCursor::new(args).optional().unwrap_or_default()
}

/// `INCRBY <key> <n>`: the key, then the count.
fn key_and_count<'a>(args: &'a [&'a [u8]]) -> Result<(Key<'a>, i64), Reply> {
    let mut cursor = ArgCursor::new(args);
    let key = Key::parse(cursor.next_bytes().map_err(|e| arg_error("incrby", e))?)?;
    let count = cursor
        .next_i64()
        .and_then(|n| cursor.finish().map(|()| n))
        .map_err(|e| arg_error("incrby", e))?;
    Ok((key, count))
}

/// Runs an admitted command (see [`admit`]).
async fn run(id: CommandId, ctx: &Arc<Context>, session: &mut Session, args: &[&[u8]]) -> Reply {
    let spec = id.spec();
    use CommandId::*;
    match id {
        Incr => match Key::parse(sole_argument(args)) {
            Ok(Key::Snowflake) => snowflake::next(ctx).await,
            Ok(Key::Segment(tag)) => segment::incr(tag, ctx).await,
            Err(reply) => reply,
        },
        // Clients such as redis-py send INCR as INCRBY key 1.
        IncrBy => match key_and_count(args) {
            Ok((Key::Snowflake, count)) => snowflake::incrby(count, ctx).await,
            Ok((Key::Segment(tag), count)) => segment::incrby(tag, count, ctx).await,
            Err(reply) => reply,
        },
        Snowflake => snowflake::snowflake(args, ctx).await,
        Get => snowflake::get(sole_argument(args), ctx).await,
        LeafDecode => snowflake::decode(args, ctx),
        LeafFromTime => snowflake::from_time(args, ctx),
        LeafCode => segment::code(sole_argument(args), ctx).await,
        Ping => connection::ping(args, session),
        Echo => Reply::Bulk(Bytes::copy_from_slice(sole_argument(args))),
        Hello => connection::hello(args, ctx, session),
        Auth => connection::auth(args, ctx, session),
        Client => connection::client(args, ctx, session),
        Select => connection::select(args),
        Quit => {
            session.closing = true;
            Reply::ok()
        }
        Reset => connection::reset(ctx, session),
        Command => server::command(args),
        Info => server::info(args, ctx),
        Time => server::time(),
        Config | LeafTag | Shutdown | LeafWorkers if !session.admin => {
            admin_refusal(ctx, spec.name)
        }
        LeafWorkers => admin::workers(ctx).await,
        Config => server::config(args, ctx),
        Shutdown => server::shutdown(args, ctx, session),
        LeafTags => admin::tags(args, ctx),
        LeafTag => admin::tag(args, ctx).await,
        Multi => transaction::multi(session),
        Discard => transaction::discard(session),
        Watch => transaction::watch(session),
        Unwatch => Reply::ok(),
        // Boxed: EXEC runs the queued commands through `run` (never another EXEC: it is not queued).
        Exec => Box::pin(transaction::exec(ctx, session)).await,
    }
}

/// Why a client may not run an admin command: its user is not an admin, or (no password
/// configured) it connects from another host.
fn admin_refusal(ctx: &Context, name: &str) -> Reply {
    if ctx.config.server.auth_required() {
        Reply::error(format!(
            "NOPERM this user has no permissions to run the '{name}' command"
        ))
    } else {
        Reply::error(crate::access::ADMIN_NEEDS_PASSWORD)
    }
}

fn unknown_command(args: &[&[u8]]) -> Reply {
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
    crate::protocol::parse_i64(arg).map_err(|_| not_an_integer())
}

/// The reply to arguments that do not fit command `name`.
pub(crate) fn arg_error(name: &str, err: ArgError) -> Reply {
    match err {
        ArgError::Missing | ArgError::Extra => wrong_arity(name),
        ArgError::NotInteger => not_an_integer(),
    }
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
