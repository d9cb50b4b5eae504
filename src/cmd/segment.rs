//! Segment ID commands: `INCR segment:<tag>` and `INCRBY segment:<tag> <n>`.

use std::sync::Arc;

use super::{lossy, parse_i64, segment_error};
use crate::context::Context;
use crate::protocol::Reply;

const SEGMENT_PREFIX: &[u8] = b"segment:";

/// The tag named by a `segment:<tag>` key.
fn tag_of(key: &[u8]) -> Result<&str, Reply> {
    let tag = key.strip_prefix(SEGMENT_PREFIX).ok_or_else(|| {
        Reply::error(format!(
            "ERR unsupported key '{}': use segment:<tag> or snowflake",
            lossy(key)
        ))
    })?;
    std::str::from_utf8(tag).map_err(|_| Reply::error(format!("ERR unknown tag '{}'", lossy(tag))))
}

/// `INCR <key>` answered from the tag's buffer when it has the ID at hand (nearly always),
/// without waiting; `None` for anything else (another key, a tag to load): [`Incr`] then
/// parses the key and gives the reply or the error.
pub fn incr_at_once(key: &[u8], ctx: &Arc<Context>) -> Option<Reply> {
    let tag = key.strip_prefix(SEGMENT_PREFIX)?;
    ctx.segments.try_next_ids(tag, 1).map(Reply::Integer)
}

/// `INCR segment:<tag>`: the next ID of the tag.
pub struct Incr<'a> {
    tag: &'a str,
}

impl<'a> Incr<'a> {
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Incr<'a>, Reply> {
        Ok(Incr {
            tag: tag_of(args[1])?,
        })
    }

    pub async fn apply(self, ctx: &Arc<Context>) -> Reply {
        match ctx.segments.next_ids(self.tag, 1).await {
            Ok(id) => Reply::Integer(id),
            Err(e) => segment_error(&e),
        }
    }
}

/// `INCRBY segment:<tag> <n>`: a block of n contiguous IDs; the reply is the last one.
pub struct IncrBy<'a> {
    tag: &'a str,
    count: i64,
}

impl<'a> IncrBy<'a> {
    pub fn parse(args: &'a [&'a [u8]], ctx: &Context) -> Result<IncrBy<'a>, Reply> {
        let tag = tag_of(args[1])?;
        let count = parse_i64(args[2])?;
        if count < 1 {
            return Err(Reply::error("ERR increment must be positive"));
        }
        let max = ctx.config.server.max_incrby;
        if count > max {
            return Err(Reply::error(format!(
                "ERR increment exceeds the maximum of {max}"
            )));
        }
        Ok(IncrBy { tag, count })
    }

    pub async fn apply(self, ctx: &Arc<Context>) -> Reply {
        match ctx.segments.next_ids(self.tag, self.count).await {
            Ok(last) => Reply::Integer(last),
            Err(e) => segment_error(&e),
        }
    }
}
