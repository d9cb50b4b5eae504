//! Snowflake commands: `SNOWFLAKE [n]`, `INCR snowflake` / `GET snowflake` for clients that
//! only send INCR or GET, `LEAF.DECODE <id>` and `LEAF.FROMTIME <time>`.

use std::sync::Arc;

use super::key::Key;
use super::{arg_error, lossy};
use crate::context::Context;
use crate::engine::snowflake::{SnowflakeEngine, SnowflakeError};
use crate::protocol::{ArgCursor, Reply};

fn engine(ctx: &Context) -> Result<Arc<SnowflakeEngine>, Reply> {
    match ctx.snowflake() {
        Some(engine) => Ok(engine),
        None if ctx.config.snowflake.enabled => Err(Reply::error(format!(
            "UNAVAILABLE snowflake: no worker id held yet: {}",
            ctx.snowflake_missing_reason()
        ))),
        None => Err(Reply::error("ERR snowflake is disabled on this server")),
    }
}

/// The RESP error for an engine error; the first word is stable and documented.
fn snowflake_error(err: &SnowflakeError) -> Reply {
    match err {
        SnowflakeError::ClockBack(_) => Reply::error(format!("CLOCKBACK {err}")),
        SnowflakeError::Unavailable(_) => Reply::error(format!("UNAVAILABLE snowflake: {err}")),
        SnowflakeError::Exhausted | SnowflakeError::BeforeEpoch => {
            Reply::error(format!("ERR {err}"))
        }
    }
}

/// One ID: `SNOWFLAKE`, `INCR snowflake`, `GET snowflake`.
pub async fn next(ctx: &Arc<Context>) -> Reply {
    let engine = match engine(ctx) {
        Ok(engine) => engine,
        Err(reply) => return reply,
    };
    match engine.next_id().await {
        Ok(id) => Reply::Integer(id),
        Err(e) => snowflake_error(&e),
    }
}

/// [`next`] when the ID can be issued without waiting (nearly always); `None` otherwise.
pub fn next_at_once(ctx: &Context) -> Option<Reply> {
    let engine = ctx.snowflake_now()?;
    match engine.try_next_id() {
        Ok(id) => id.map(Reply::Integer),
        Err(e) => Some(snowflake_error(&e)),
    }
}

/// `SNOWFLAKE [n]`: one integer, or an array of n strictly increasing IDs.
pub async fn snowflake(args: &[&[u8]], ctx: &Arc<Context>) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let Some(count) = cursor.optional() else {
        return next(ctx).await;
    };
    let parsed = cursor
        .finish()
        .and_then(|()| crate::protocol::parse_i64(count));
    let n = match parsed {
        Ok(n) => n,
        Err(e) => return arg_error("snowflake", e),
    };
    let max = ctx.config.snowflake.max_batch;
    if n < 1 || n as u64 > max as u64 {
        return Reply::error(format!("ERR count must be between 1 and {max}"));
    }
    let engine = match engine(ctx) {
        Ok(engine) => engine,
        Err(reply) => return reply,
    };
    match engine.next_ids(n as usize).await {
        Ok(ids) => Reply::Array(ids.into_iter().map(Reply::Integer).collect()),
        Err(e) => snowflake_error(&e),
    }
}

/// `INCRBY snowflake 1` (what some clients send for INCR). Snowflake IDs are not contiguous,
/// so a block larger than one is refused.
pub async fn incrby(count: i64, ctx: &Arc<Context>) -> Reply {
    match count {
        1 => next(ctx).await,
        _ => Reply::error("ERR INCRBY snowflake takes only 1: use SNOWFLAKE <n> for more IDs"),
    }
}

/// `GET snowflake`: the next ID as a bulk string, as GET always answers in Redis (and so that
/// JavaScript clients, whose numbers hold 53 bits, get it exactly); any other key is not
/// something leafd stores.
pub async fn get(key: &[u8], ctx: &Arc<Context>) -> Reply {
    match Key::of(key) {
        Some(Key::Snowflake) => match next(ctx).await {
            Reply::Integer(id) => Reply::bulk(id.to_string()),
            other => other,
        },
        _ => Reply::error(format!(
            "ERR unsupported key '{}': GET only serves 'snowflake'",
            lossy(key)
        )),
    }
}

/// `LEAF.FROMTIME <unix ms | RFC 3339>`: the smallest snowflake ID of that instant in this
/// server's layout, for range queries on ID columns.
pub fn from_time(args: &[&[u8]], ctx: &Arc<Context>) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let text = match cursor
        .next_bytes()
        .and_then(|t| cursor.finish().map(|()| t))
    {
        Ok(text) => lossy(text),
        Err(e) => return arg_error("leaf.fromtime", e),
    };
    match crate::engine::snowflake::parse_instant(&text)
        .and_then(|ms| ctx.snowflake_layout.first_id_at(ms))
    {
        Ok(id) => Reply::Integer(id),
        Err(why) => Reply::error(format!("ERR {why}")),
    }
}

/// `LEAF.DECODE <id>`: timestamp, UTC time, worker id and sequence of a snowflake ID.
pub fn decode(args: &[&[u8]], ctx: &Arc<Context>) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let id = match cursor
        .next_i64()
        .and_then(|id| cursor.finish().map(|()| id))
    {
        Ok(id) => id,
        Err(e) => return arg_error("leaf.decode", e),
    };
    let layout = ctx.snowflake_layout;
    let Some(fields) = layout.decode(id) else {
        return Reply::error("ERR a snowflake ID is a positive integer");
    };
    let time = crate::engine::snowflake::format_instant(fields.timestamp_ms);
    Reply::map([
        ("id", Reply::Integer(id)),
        ("timestamp_ms", Reply::Integer(fields.timestamp_ms as i64)),
        ("time", Reply::bulk(time.to_string())),
        ("worker_id", Reply::Integer(fields.worker_id as i64)),
        ("sequence", Reply::Integer(fields.sequence as i64)),
    ])
}
