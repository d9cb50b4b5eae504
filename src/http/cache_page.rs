//! Leaf's `/cache` monitor page: every tag's buffers, as HTML or JSON.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::ACCEPT;
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::context::Context;
use crate::engine::segment::Segment;

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

/// Leaf's monitor page: every tag's buffers, as HTML or (with `Accept: application/json`) JSON.
pub(super) async fn cache(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    headers: HeaderMap,
) -> Response {
    let tags = ctx.segments.snapshot();
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
        return Json(json!({ "tags": tags })).into_response();
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
         {rows}</table></body></html>\n"
    ))
    .into_response()
}
