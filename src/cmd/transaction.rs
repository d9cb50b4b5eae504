//! `MULTI` / `EXEC` / `DISCARD` / `WATCH` / `UNWATCH` as Redis answers them: after MULTI,
//! commands are checked and queued, EXEC runs them in order. Many clients' default pipeline is one.

use std::sync::Arc;

use bytes::Bytes;

use super::table::{self, CommandId};
use super::{lossy, unknown_command, Session};
use crate::context::Context;
use crate::protocol::Reply;

/// The commands queued since MULTI.
#[derive(Debug, Default)]
pub struct Transaction {
    queued: Vec<Vec<Bytes>>,
    /// A queued command was refused (unknown, wrong arity, over the limit): EXEC aborts.
    aborted: bool,
}

/// Commands that act at once even inside MULTI (as in Redis).
fn acts_immediately(name: &[u8]) -> bool {
    [
        &b"exec"[..],
        b"discard",
        b"multi",
        b"watch",
        b"quit",
        b"reset",
    ]
    .iter()
    .any(|n| n.eq_ignore_ascii_case(name))
}

/// Inside MULTI, checks and queues `args` (returning `+QUEUED` or the error that will make EXEC
/// abort); `None` when the command is not for the queue.
pub(super) fn queue(ctx: &Context, session: &mut Session, args: &[&[u8]]) -> Option<Reply> {
    let name = args.first()?;
    if acts_immediately(name) {
        return None;
    }
    let queued = session.transaction.as_ref()?.queued.len();
    let limit = ctx.config.server.max_multi_commands;
    let refusal = match table::lookup(name) {
        None => Some(unknown_command(args)),
        Some(spec) => match super::admit(spec, session, args.len()) {
            Err(refusal) => Some(refusal),
            Ok(()) if queued >= limit => Some(Reply::error(format!(
                "ERR MULTI queue is full ({limit} commands, server.max_multi_commands)"
            ))),
            Ok(()) => None,
        },
    };
    let transaction = session.transaction.as_mut()?;
    Some(match refusal {
        Some(error) => {
            transaction.aborted = true;
            error
        }
        None => {
            // Copied: the arguments live in the input buffer only until this reply.
            let owned = args.iter().map(|arg| Bytes::copy_from_slice(arg)).collect();
            transaction.queued.push(owned);
            Reply::Simple("QUEUED".into())
        }
    })
}

pub(super) fn multi(session: &mut Session) -> Reply {
    if session.transaction.is_some() {
        return Reply::error("ERR MULTI calls can not be nested");
    }
    session.transaction = Some(Transaction::default());
    Reply::ok()
}

pub(super) fn discard(session: &mut Session) -> Reply {
    match session.transaction.take() {
        Some(_) => Reply::ok(),
        None => Reply::error("ERR DISCARD without MULTI"),
    }
}

/// `WATCH key […]`: accepted; no key leafd serves can be changed by a client, so a watched
/// transaction never aborts.
pub(super) fn watch(session: &Session) -> Reply {
    if session.transaction.is_some() {
        return Reply::error("ERR WATCH inside MULTI is not allowed");
    }
    Reply::ok()
}

/// `EXEC`: the replies of the queued commands in order, or `-EXECABORT` if one was refused.
pub(super) async fn exec(ctx: &Arc<Context>, session: &mut Session) -> Reply {
    let Some(transaction) = session.transaction.take() else {
        return Reply::error("ERR EXEC without MULTI");
    };
    if transaction.aborted {
        return Reply::error("EXECABORT Transaction discarded because of previous errors.");
    }
    let mut replies = Vec::with_capacity(transaction.queued.len());
    for owned in transaction.queued {
        let args: Vec<&[u8]> = owned.iter().map(|arg| &arg[..]).collect();
        // Checked when queued; resolved again only to reach the command's type.
        let reply = match CommandId::resolve(args[0]) {
            Some(id) => super::run(id, ctx, session, &args).await,
            None => Reply::error(format!("ERR unknown command '{}'", lossy(args[0]))),
        };
        replies.push(reply);
    }
    Reply::Array(replies)
}
