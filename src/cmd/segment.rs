//! Segment ID commands: `INCR segment:<tag>`, `INCRBY segment:<tag> <n>` and `LEAF.CODE <tag>`
//! (a period tag's ID as a string).

use std::sync::Arc;

use super::{lossy, segment_error};
use crate::context::Context;
use crate::protocol::Reply;

/// The tag as text (tags are printable ASCII; anything else cannot name one).
fn tag_text(tag: &[u8]) -> Result<&str, Reply> {
    std::str::from_utf8(tag).map_err(|_| Reply::error(format!("ERR unknown tag '{}'", lossy(tag))))
}

/// `INCR segment:<tag>` answered from the tag's buffer when it has the ID at hand (nearly
/// always), without waiting; `None` when the tag must be loaded first: [`incr`] then gives
/// the reply or the error.
pub fn incr_at_once(tag: &[u8], ctx: &Context) -> Option<Reply> {
    ctx.segments.try_next_ids(tag, 1).map(Reply::Integer)
}

/// `INCR segment:<tag>`: the next ID of the tag.
pub async fn incr(tag: &[u8], ctx: &Arc<Context>) -> Reply {
    next_ids(tag, 1, ctx).await
}

/// `INCRBY segment:<tag> <n>`: a block of n contiguous IDs; the reply is the last one.
pub async fn incrby(tag: &[u8], count: i64, ctx: &Arc<Context>) -> Reply {
    if count < 1 {
        return Reply::error("ERR increment must be positive");
    }
    let max = ctx.config.server.max_incrby;
    if count > max {
        return Reply::error(format!("ERR increment exceeds the maximum of {max}"));
    }
    next_ids(tag, count, ctx).await
}

async fn next_ids(tag: &[u8], count: i64, ctx: &Arc<Context>) -> Reply {
    let tag = match tag_text(tag) {
        Ok(tag) => tag,
        Err(reply) => return reply,
    };
    match ctx.segments.next_ids(tag, count).await {
        Ok(last) => Reply::Integer(last),
        Err(e) => segment_error(&e),
    }
}

/// `LEAF.CODE <tag>`: the next ID of a period tag as its string form.
pub async fn code(tag: &[u8], ctx: &Arc<Context>) -> Reply {
    let tag = match tag_text(tag) {
        Ok(tag) => tag,
        Err(reply) => return reply,
    };
    match ctx.segments.next_code(tag).await {
        Ok(code) => Reply::bulk(code),
        Err(e) => segment_error(&e),
    }
}
