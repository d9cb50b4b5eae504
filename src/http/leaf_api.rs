//! Leaf's HTTP API, so Leaf users switch without code changes: segment and snowflake IDs as
//! plain text, and the fields of a snowflake ID.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::context::Context;
use crate::engine::segment::SegmentError;
use crate::engine::snowflake::SnowflakeError;

use super::caller::Caller;
use super::text;

pub(super) fn segment_status(err: &SegmentError) -> StatusCode {
    match err {
        SegmentError::UnknownTag(_) => StatusCode::NOT_FOUND,
        SegmentError::Unavailable { .. } | SegmentError::Storage(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        SegmentError::TagExists(_) => StatusCode::CONFLICT,
        SegmentError::Invalid(_) => StatusCode::BAD_REQUEST,
        // The tag will never serve again: not a passing outage.
        SegmentError::Exhausted(_) => StatusCode::GONE,
        SegmentError::Rollback { .. } => StatusCode::CONFLICT,
        // Served again from the next period on.
        SegmentError::PeriodExhausted { .. } | SegmentError::PeriodShort { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// Leaf's `GET /api/segment/get/{tag}`: the next ID as plain text.
pub(super) async fn segment_id(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    Path(tag): Path<String>,
) -> Response {
    match ctx.segments.next_ids(&tag, 1).await {
        Ok(id) => text(StatusCode::OK, id.to_string()),
        Err(e) => text(segment_status(&e), format!("{e}\n")),
    }
}

/// `GET /api/segment/code/{tag}`: a period tag's next ID as its string form (LEAF.CODE).
pub(super) async fn segment_code(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    Path(tag): Path<String>,
) -> Response {
    match ctx.segments.next_code(&tag).await {
        Ok(code) => text(StatusCode::OK, code),
        Err(e) => text(segment_status(&e), format!("{e}\n")),
    }
}

/// Leaf's `GET /api/snowflake/get/{key}` (the key is ignored, as in Leaf).
pub(super) async fn snowflake_id(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    Path(_key): Path<String>,
) -> Response {
    let Some(engine) = ctx.snowflake() else {
        if ctx.config.snowflake.enabled {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "no snowflake worker id held yet: {}\n",
                    ctx.snowflake_missing_reason()
                ),
            );
        }
        return text(
            StatusCode::NOT_FOUND,
            "snowflake is disabled on this server\n".into(),
        );
    };
    match engine.next_id().await {
        Ok(id) => text(StatusCode::OK, id.to_string()),
        Err(e @ (SnowflakeError::ClockBack(_) | SnowflakeError::Unavailable(_))) => {
            text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n"))
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

/// `GET /decode/{id}`: the fields of a snowflake ID as JSON.
pub(super) async fn decode(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    Path(id): Path<String>,
) -> Response {
    let layout = ctx.snowflake_layout;
    let Some(fields) = id.parse::<i64>().ok().and_then(|id| layout.decode(id)) else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("'{id}' is not a snowflake ID (a positive 64-bit integer)\n"),
        );
    };
    let time = crate::engine::snowflake::format_instant(fields.timestamp_ms);
    Json(json!({
        "id": id.parse::<i64>().unwrap_or_default(),
        "timestamp_ms": fields.timestamp_ms,
        "time": time.to_string(),
        "worker_id": fields.worker_id,
        "sequence": fields.sequence,
    }))
    .into_response()
}

/// `GET /fromtime/{t}`: LEAF.FROMTIME over HTTP, the ID as plain text.
pub(super) async fn from_time(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    Path(t): Path<String>,
) -> Response {
    match crate::engine::snowflake::parse_instant(&t)
        .and_then(|ms| ctx.snowflake_layout.first_id_at(ms))
    {
        Ok(id) => text(StatusCode::OK, id.to_string()),
        Err(why) => text(StatusCode::BAD_REQUEST, format!("{why}\n")),
    }
}
