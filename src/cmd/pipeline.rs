//! Pipelined requests: a run of identical `INCR segment:<tag>` of a strict tag is served as one
//! block of consecutive IDs (one allocation instead of one per request); any other runs alone
//! ([`super::execute`]).

use std::sync::Arc;

use super::key::Key;
use super::table::CommandId;
use super::{segment_error, Session};
use crate::context::Context;
use crate::metrics::BatchMetrics;
use crate::protocol::Reply;

/// The longest run of pipelined INCRs served as one block: 1,024 replies of at most 20 bytes
/// each stay well under the connection's early-flush threshold (64 KiB).
const BLOCK_MAX: usize = 1024;

/// The requests a connection received right after the one being run, as far as a command
/// needs to see them.
pub trait Pipeline {
    /// How many requests directly after the current one are identical to it, up to `limit`;
    /// 0 for those already found to run alone ([`Pipeline::run_alone`]).
    fn repeats(&mut self, limit: usize) -> usize;
    /// The current request's next `n` repeats were answered with it: they are not run again.
    fn answered(&mut self, n: usize);
    /// The current request's next `n` repeats run one by one, without being looked at again.
    fn run_alone(&mut self, n: usize);
}

/// A run of identical pipelined requests that may be served as one block: `INCR
/// segment:<tag>` and how many times in a row.
pub struct Block<'a> {
    tag: &'a [u8],
    times: usize,
}

/// The block `args`, the current request of `pipeline`, begins: `INCR segment:<tag>` followed
/// by identical requests. `None` for anything else: the request runs alone ([`execute`]).
/// Checked without building a future, as every pipelined request passes here.
#[inline]
pub fn block_at<'a>(
    ctx: &Context,
    args: &[&'a [u8]],
    pipeline: &mut dyn Pipeline,
) -> Option<Block<'a>> {
    let tag = segment_incr_tag(args)?;
    let limit = usize::try_from(ctx.config.server.max_incrby)
        .unwrap_or(1)
        .clamp(1, BLOCK_MAX);
    let repeats = pipeline.repeats(limit - 1);
    (repeats > 0).then_some(Block {
        tag,
        times: repeats + 1,
    })
}

/// Serves `block` as one allocation when its tag is strict: the replies, in order, and its
/// repeats marked answered. `None` when it is not: its repeats are marked to run alone, and
/// the current request runs alone.
pub async fn serve_block(
    ctx: &Arc<Context>,
    session: &Session,
    block: Block<'_>,
    pipeline: &mut (dyn Pipeline + Send),
    batch: &mut BatchMetrics,
) -> Option<Vec<Reply>> {
    let Block { tag, times } = block;
    match strict_incr_run(ctx, session, tag, times, batch).await {
        Some(replies) => {
            pipeline.answered(times - 1);
            Some(replies)
        }
        None => {
            pipeline.run_alone(times - 1);
            None
        }
    }
}

/// The tag of `INCR segment:<tag>`, the one command a pipeline of identical copies of may be
/// served as one block; `None` for any other command.
fn segment_incr_tag<'a>(args: &[&'a [u8]]) -> Option<&'a [u8]> {
    match args {
        [name, key] if name.eq_ignore_ascii_case(b"incr") => match Key::of(key)? {
            Key::Segment(tag) => Some(tag),
            Key::Snowflake => None,
        },
        _ => None,
    }
}

/// `times` identical pipelined `INCR segment:<tag>` of a strict tag, served as one block of
/// consecutive IDs (one allocation instead of `times` in a row; all of them arrived before
/// it, so real-time order holds): the replies in order. `None` for any other tag or session
/// state (a transaction, no AUTH yet): each copy then runs on its own.
async fn strict_incr_run(
    ctx: &Arc<Context>,
    session: &Session,
    tag: &[u8],
    times: usize,
    batch: &mut BatchMetrics,
) -> Option<Vec<Reply>> {
    if session.transaction.is_some() || !session.authenticated {
        return None;
    }
    let count = i64::try_from(times).ok()?;
    let result = ctx.segments.next_strict_block(tag, count).await?;
    let replies: Vec<Reply> = match result {
        Ok(last) => (0..count)
            .map(|i| Reply::Integer(last - count + 1 + i))
            .collect(),
        Err(e) => vec![segment_error(&e); times],
    };
    if ctx.metrics.enabled() {
        for reply in &replies {
            batch.record(
                &ctx.metrics,
                CommandId::Incr as usize,
                reply.is_error(),
                true,
            );
        }
    }
    Some(replies)
}
