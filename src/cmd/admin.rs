//! Leaf administration: `LEAF.TAGS` (Leaf's monitor page as a reply) and
//! `LEAF.TAG CREATE|STEP|SKIP|SKIPALL|REVEAL` to manage tags without SQL.

use std::sync::Arc;

use super::{arg_error, lossy, segment_error, wrong_arity};
use crate::context::Context;
use crate::engine::segment::{Segment, TagCursor, TagSnapshot, WHOLE_LIST_LIMIT};
use crate::protocol::{ArgCursor, Reply};

fn segment_reply(segment: Option<Segment>) -> Reply {
    match segment {
        None => Reply::Null,
        Some(s) => Reply::map([
            ("start", Reply::Integer(s.max - s.step + 1)),
            ("end", Reply::Integer(s.max)),
            ("next", Reply::Integer(s.next)),
            ("remaining", Reply::Integer(s.remaining().max(0))),
            ("step", Reply::Integer(s.step)),
        ]),
    }
}

/// `LEAF.TAGS`: one map per tag with its steps, max_id and both buffers, up to
/// [`WHOLE_LIST_LIMIT`] tags; `LEAF.TAGS <cursor> [COUNT n]`: `[next cursor, [maps]]`, as SCAN
/// pages keys (cursor `0` first and last), so no reply holds a million tags.
pub fn tags(args: &[&[u8]], ctx: &Arc<Context>) -> Reply {
    // `args` starts with the command's name.
    if args.len() == 1 {
        let known = ctx.segments.tag_count();
        if known > WHOLE_LIST_LIMIT {
            return Reply::error(format!(
                "ERR this node knows {known} tags, more than one reply lists ({WHOLE_LIST_LIMIT}): page through them with LEAF.TAGS <cursor> [COUNT n], from cursor 0"
            ));
        }
        return Reply::Array(ctx.segments.snapshot().into_iter().map(tag_map).collect());
    }
    let mut cursor = ArgCursor::new(args);
    let after = match cursor.next_bytes().map(TagCursor::parse) {
        Ok(Some(after)) => after,
        Ok(None) => return Reply::error("ERR invalid cursor"),
        Err(e) => return arg_error("leaf.tags", e),
    };
    let mut count = None;
    while cursor.remaining() > 0 {
        let option = cursor.next_bytes().unwrap_or_default().to_ascii_lowercase();
        if option != b"count" || cursor.remaining() == 0 {
            return Reply::error("ERR syntax error");
        }
        if count.is_some() {
            return Reply::error("ERR COUNT is given twice");
        }
        match cursor.next_i64() {
            Ok(n) if (1..=WHOLE_LIST_LIMIT as i64).contains(&n) => count = Some(n as usize),
            Ok(_) => return Reply::error(format!("ERR COUNT must be 1 to {WHOLE_LIST_LIMIT}")),
            Err(e) => return arg_error("leaf.tags", e),
        }
    }
    let (page, next) = ctx.segments.snapshot_page(&after, count.unwrap_or(100));
    Reply::Array(vec![
        Reply::bulk(next),
        Reply::Array(page.into_iter().map(tag_map).collect()),
    ])
}

/// One tag's map in `LEAF.TAGS`.
fn tag_map(t: TagSnapshot) -> Reply {
    Reply::map([
        ("tag", Reply::bulk(t.tag)),
        ("order", Reply::bulk(t.order)),
        ("split", t.split.map(Reply::bulk).unwrap_or(Reply::Null)),
        ("opaque", t.opaque.map(Reply::bulk).unwrap_or(Reply::Null)),
        ("period", t.period.map(Reply::bulk).unwrap_or(Reply::Null)),
        ("step", Reply::Integer(t.step)),
        ("table_step", Reply::Integer(t.table_step)),
        ("max_id", Reply::Integer(t.max_id)),
        ("current", segment_reply(t.current)),
        ("next", segment_reply(t.next)),
        ("loading", Reply::Integer(t.loading as i64)),
        (
            "last_error",
            t.last_error.map(Reply::bulk).unwrap_or(Reply::Null),
        ),
    ])
}

/// `LEAF.TAG CREATE <tag> <step> [<start>]`, `LEAF.TAG STEP <tag> <step>`,
/// `LEAF.TAG SKIP <tag> <n>` (reply: the new max_id) and `LEAF.TAG SKIPALL <n>` (reply: a map
/// of every tag to its new max_id), `LEAF.TAG REVEAL <tag> <id>` (reply: the sequential ID
/// behind an opaque one).
pub async fn tag(args: &[&[u8]], ctx: &Arc<Context>) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let given = match cursor.next_bytes() {
        Ok(sub) => sub,
        Err(e) => return arg_error("leaf.tag", e),
    };
    let sub = given.to_ascii_lowercase();
    // Arguments after the subcommand: how many it takes.
    let (name, counts) = match sub.as_slice() {
        b"skipall" => ("leaf.tag|skipall", 1..=1),
        // <tag> <step> [<start>] and up to five keyword-value pairs.
        b"create" => ("leaf.tag|create", 2..=13),
        b"step" => ("leaf.tag|step", 2..=2),
        b"skip" => ("leaf.tag|skip", 2..=2),
        b"reveal" => ("leaf.tag|reveal", 2..=2),
        b"split" => ("leaf.tag|split", 4..=4),
        _ => {
            return Reply::error(format!(
                "ERR unknown subcommand '{}'. Try LEAF.TAG CREATE, STEP, SKIP, SKIPALL, SPLIT or REVEAL.",
                lossy(given)
            ))
        }
    };
    if !counts.contains(&cursor.remaining()) {
        return wrong_arity(name);
    }
    if sub == b"skipall" {
        let n = match cursor.next_i64() {
            Ok(n) => n,
            Err(e) => return arg_error(name, e),
        };
        return match ctx.segments.skip_all(n).await {
            Ok(moved) => Reply::Map(
                moved
                    .into_iter()
                    .map(|(tag, max_id)| (Reply::bulk(tag), Reply::Integer(max_id)))
                    .collect(),
            ),
            Err(e) => segment_error(&e),
        };
    }
    // The count was checked: the tag and the number are there.
    let Ok(tag) = std::str::from_utf8(cursor.optional().unwrap_or_default()) else {
        return Reply::error("ERR tag may only contain printable ASCII characters without spaces");
    };
    if sub == b"create" {
        return create(tag, cursor, ctx).await;
    }
    if sub == b"split" {
        // LEAF.TAG SPLIT <tag> <delta> <remainder> <start>
        let numbers = (|| Ok((cursor.next_i64()?, cursor.next_i64()?, cursor.next_i64()?)))();
        let (delta, remainder, start) = match numbers {
            Ok(numbers) => numbers,
            Err(e) => return arg_error(name, e),
        };
        let split = crate::engine::segment::Interleave { delta, remainder };
        return match ctx.segments.resplit(tag, split, start).await {
            Ok(max_id) => Reply::Integer(max_id),
            Err(e) => segment_error(&e),
        };
    }
    let number = match cursor.next_i64() {
        Ok(number) => number,
        Err(e) => return arg_error(name, e),
    };
    let result = match sub.as_slice() {
        b"step" => ctx.segments.set_step(tag, number).await,
        b"reveal" => {
            return match ctx.segments.reveal(tag, number) {
                Ok(position) => Reply::Integer(position),
                Err(e) => segment_error(&e),
            }
        }
        _ => {
            return match ctx.segments.skip(tag, number).await {
                Ok(max_id) => Reply::Integer(max_id),
                Err(e) => segment_error(&e),
            }
        }
    };
    match result {
        Ok(()) => Reply::ok(),
        Err(e) => segment_error(&e),
    }
}

/// `LEAF.TAG CREATE <tag> <step> [<start>] [ORDER strict|trend] [PERIOD daily|monthly|yearly]
/// [ZONE <iana>] [DIGITS <n>] [PREFIX <p>]`: the rule is recorded in the tag's row, and every
/// node that does not configure the tag serves it by that record.
async fn create(tag: &str, mut cursor: ArgCursor<'_>, ctx: &Arc<Context>) -> Reply {
    const NAME: &str = "leaf.tag|create";
    let step = match cursor.next_i64() {
        Ok(step) => step,
        Err(e) => return arg_error(NAME, e),
    };
    let mut rest = cursor.rest();
    let mut start = 1;
    if let Some(first) = rest.first() {
        if let Ok(given) = crate::protocol::parse_i64(first) {
            start = given;
            rest = &rest[1..];
        }
    }
    let mut fields: [Option<String>; 5] = Default::default();
    for pair in rest.chunks(2) {
        let keyword = pair[0].to_ascii_uppercase();
        let slot = match keyword.as_slice() {
            b"ORDER" => 0,
            b"PERIOD" => 1,
            b"ZONE" => 2,
            b"DIGITS" => 3,
            b"PREFIX" => 4,
            _ => {
                return Reply::error(format!(
                    "ERR unknown option '{}' of LEAF.TAG CREATE: expected ORDER, PERIOD, ZONE, DIGITS or PREFIX",
                    lossy(pair[0])
                ))
            }
        };
        let Some(value) = pair.get(1) else {
            return Reply::error(format!("ERR {} needs a value", lossy(pair[0])));
        };
        // The value whole (lossy() shortens what an error message quotes).
        let Ok(value) = std::str::from_utf8(value) else {
            return Reply::error(format!("ERR {} must be text", lossy(pair[0])));
        };
        if fields[slot].replace(value.to_string()).is_some() {
            return Reply::error(format!("ERR {} is given twice", lossy(pair[0])));
        }
    }
    let [order, period, zone, digits, prefix] = fields;
    let digits = match digits.map(|d| d.parse::<u32>()).transpose() {
        Ok(digits) => digits,
        Err(_) => return Reply::error("ERR DIGITS must be a number of sequence digits"),
    };
    let rule = match crate::engine::segment::TagRule::named(
        order.as_deref(),
        period.as_deref(),
        zone.as_deref(),
        digits,
        prefix.as_deref(),
    ) {
        Ok(rule) => rule,
        Err(e) => return Reply::error(format!("ERR {e}")),
    };
    match ctx
        .segments
        .create_ruled_tag(tag, step, start, None, Some(rule))
        .await
    {
        Ok(()) => Reply::ok(),
        Err(e) => segment_error(&e),
    }
}

/// `LEAF.WORKERS` (admin): one map per row of `leaf_worker`: `worker_id`, `owner`,
/// `lease_ms_left` (database time; 0 when expired), `fence_ms`.
pub async fn workers(ctx: &Arc<Context>) -> Reply {
    // Every storage has the table; only a store whose database has not answered since the
    // start (`storage::DeferredStore`) cannot lend it yet.
    let Some(leases) = ctx.segments.store().clone().worker_leases() else {
        return Reply::error(
            "UNAVAILABLE worker-id lease table: the database has not answered since this node started",
        );
    };
    match leases.workers().await {
        Ok(rows) => Reply::Array(
            rows.into_iter()
                .map(|row| {
                    Reply::map([
                        ("worker_id", Reply::Integer(row.worker_id)),
                        ("owner", Reply::bulk(row.owner)),
                        (
                            "lease_ms_left",
                            Reply::Integer(row.lease.left_ms().unwrap_or(0).max(0)),
                        ),
                        ("fence_ms", Reply::Integer(row.fence_ms)),
                    ])
                })
                .collect(),
        ),
        Err(e) => Reply::error(format!("UNAVAILABLE worker-id lease table: {e}")),
    }
}
