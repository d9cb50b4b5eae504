//! Leaf's `/cache` monitor page: every tag's buffers (or a page of them), as HTML or JSON.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::header::ACCEPT;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::context::Context;
use crate::engine::segment::{Segment, TagCursor, WHOLE_LIST_LIMIT};

use super::caller::Caller;

pub(super) fn segment_json(segment: Option<Segment>) -> serde_json::Value {
    match segment {
        None => serde_json::Value::Null,
        Some(s) => json!({
            "start": s.max - s.step + 1,
            "end": s.max,
            "next": s.next,
            "remaining": s.remaining().max(0),
            "step": s.step,
        }),
    }
}

pub(super) fn segment_html(segment: Option<Segment>) -> String {
    match segment {
        None => "—".into(),
        Some(s) => format!(
            "{}…{} (next {}, {} left)",
            s.max - s.step + 1,
            s.max,
            s.next,
            s.remaining().max(0)
        ),
    }
}

pub(super) fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `/cache?cursor=…&count=…`: a page of the tags, as `LEAF.TAGS <cursor> COUNT <n>` gives it.
/// A cursor is `0` or `t` and hex digits, so the query needs no decoding.
#[derive(Default)]
struct Page {
    cursor: Option<String>,
    count: Option<usize>,
}

impl Page {
    /// The query's cursor and count, bounded as `LEAF.TAGS` bounds COUNT (1 to
    /// [`WHOLE_LIST_LIMIT`]); a count out of range, not a number, or given twice is refused.
    fn parse(query: Option<&str>) -> Result<Page, String> {
        let mut page = Page::default();
        for pair in query.unwrap_or("").split('&') {
            match pair.split_once('=') {
                Some(("cursor", _)) if page.cursor.is_some() => {
                    return Err("cursor is given twice".into());
                }
                Some(("cursor", v)) => page.cursor = Some(v.to_string()),
                Some(("count", v)) => {
                    let count = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=WHOLE_LIST_LIMIT).contains(n))
                        .ok_or_else(|| format!("count must be 1 to {WHOLE_LIST_LIMIT}"))?;
                    if page.count.replace(count).is_some() {
                        return Err("count is given twice".into());
                    }
                }
                _ => {}
            }
        }
        Ok(page)
    }
}

/// Leaf's monitor page: every tag's buffers, as HTML or (with `Accept: application/json`) JSON.
/// With more than [`WHOLE_LIST_LIMIT`] tags (or a `cursor`), one page of them and the cursor
/// of the next (`"0"`: none), so no page walks a million tags.
pub(super) async fn cache(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let page = match Page::parse(query.as_deref()) {
        Ok(page) => page,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let paged = page.cursor.is_some() || ctx.segments.tag_count() > WHOLE_LIST_LIMIT;
    let (tags, next) = if paged {
        let Some(after) = TagCursor::parse(page.cursor.as_deref().unwrap_or("0").as_bytes()) else {
            return (StatusCode::BAD_REQUEST, "invalid cursor\n").into_response();
        };
        let count = page.count.unwrap_or(1000);
        let (tags, next) = ctx.segments.snapshot_page(&after, count);
        (tags, Some(next))
    } else {
        (ctx.segments.snapshot(), None)
    };
    let wants_json = headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    if wants_json {
        let tags: Vec<_> = tags
            .iter()
            .map(|t| {
                json!({
                    "tag": t.tag,
                    "order": t.order,
                    "split": t.split,
                    "opaque": t.opaque,
                    "period": t.period,
                    "step": t.step,
                    "table_step": t.table_step,
                    "max_id": t.max_id,
                    "current": segment_json(t.current),
                    "next": segment_json(t.next),
                    "loading": t.loading,
                    "served": t.served,
                    "last_error": t.last_error,
                })
            })
            .collect();
        return match next {
            Some(cursor) => Json(json!({ "tags": tags, "cursor": cursor })),
            None => Json(json!({ "tags": tags })),
        }
        .into_response();
    }
    let rows: String = tags
        .iter()
        .map(|t| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                escape_html(&t.tag),
                t.step,
                t.table_step,
                t.max_id,
                segment_html(t.current),
                segment_html(t.next),
                t.served,
                escape_html(t.last_error.as_deref().unwrap_or("")),
            )
        })
        .collect();
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>leafd cache</title></head><body>\n\
         <h1>leafd segment buffers</h1>\n<table border=\"1\" cellpadding=\"4\">\n\
         <tr><th>tag</th><th>step</th><th>table step</th><th>max_id</th><th>current</th><th>next</th><th>served</th><th>last error</th></tr>\n\
         {rows}</table>{more}</body></html>\n",
        more = match next.as_deref() {
            None | Some("0") => String::new(),
            Some(cursor) => format!("\n<p><a href=\"/cache?cursor={cursor}\">next page</a></p>"),
        }
    ))
    .into_response()
}
