//! The rest of Leaf's monitor surface, answered as leaf-server answers it: `/db` (the rows of
//! `leaf_alloc`) and `/decodeSnowflakeId?snowflakeId=N`.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::context::Context;

use super::caller::Caller;

/// `GET /db`: an HTML table of every row (tag, max, step, update), as Leaf's page.
pub(super) async fn db(_: Caller, State(ctx): State<Arc<Context>>) -> Response {
    let rows = match ctx.segments.store().list().await {
        Ok(rows) => rows,
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("database unreachable: {e}\n"),
            )
                .into_response()
        }
    };
    let mut html = String::from(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>leafd db</title></head><body>\
         <table border=\"1\"><tr><th>tag</th><th>max</th><th>step</th><th>update</th></tr>",
    );
    for row in rows {
        html.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&row.tag),
            row.max_id,
            row.step,
            escape(row.update_time.as_deref().unwrap_or(""))
        ));
    }
    html.push_str("</table></body></html>\n");
    Html(html).into_response()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `GET /decodeSnowflakeId?snowflakeId=N`: Leaf's decoding, string values, the time in UTC
/// (Leaf uses the JVM's zone); Leaf's own `errorMsg` for a value that is not an ID.
pub(super) async fn decode_snowflake_id(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    RawQuery(query): RawQuery,
) -> Response {
    // A number needs no percent-decoding; anything else is not an ID either way.
    let value = query.as_deref().and_then(|q| {
        q.split('&')
            .find_map(|pair| pair.strip_prefix("snowflakeId="))
    });
    let Some(value) = value else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "Required parameter 'snowflakeId' is not present"})),
        )
            .into_response();
    };
    let fields = value
        .trim()
        .parse::<i64>()
        .ok()
        .and_then(|id| ctx.snowflake_layout.decode(id));
    let Some(fields) = fields else {
        return Json(json!({"errorMsg": "snowflake Id反解析发生异常!"})).into_response();
    };
    let time = crate::engine::snowflake::format_instant(fields.timestamp_ms);
    // Leaf: "ms(yyyy-MM-dd HH:mm:ss.SSS)".
    let shown = time.trim_end_matches('Z').replacen('T', " ", 1);
    Json(json!({
        "workerId": fields.worker_id.to_string(),
        "sequenceId": fields.sequence.to_string(),
        "timestamp": format!("{}({shown})", fields.timestamp_ms),
    }))
    .into_response()
}
