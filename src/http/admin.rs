//! The tag admin endpoints: LEAF.TAG CREATE, STEP and SKIP over HTTP (admin role).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::context::Context;

use super::caller::AdminCaller;
use super::leaf_api::segment_status;
use super::text;

/// Body of `POST /api/segment/tags`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewTag {
    tag: String,
    step: i64,
    /// The first ID handed out (1 when left out).
    #[serde(default = "first_id")]
    start: i64,
    #[serde(default)]
    description: Option<String>,
    /// `strict` or `trend` (LEAF.TAG CREATE's ORDER), recorded in the row.
    #[serde(default)]
    order: Option<String>,
    /// `daily`, `monthly` or `yearly` (PERIOD), with `time_zone`, `sequence_digits` and
    /// `prefix` as the `[[segment.tags]]` keys of that name.
    #[serde(default)]
    period: Option<String>,
    #[serde(default)]
    time_zone: Option<String>,
    #[serde(default)]
    sequence_digits: Option<u32>,
    #[serde(default)]
    prefix: Option<String>,
}

fn first_id() -> i64 {
    1
}

/// Body of `PATCH /api/segment/tags/{tag}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TagChange {
    /// The new step (LEAF.TAG STEP).
    #[serde(default)]
    step: Option<i64>,
    /// Move max_id forward by this many IDs (LEAF.TAG SKIP).
    #[serde(default)]
    skip: Option<i64>,
}

/// `POST /api/segment/tags` (admin): LEAF.TAG CREATE over HTTP; 201, or 409 when it exists.
pub(super) async fn create_tag(
    _: AdminCaller,
    State(ctx): State<Arc<Context>>,
    Json(new): Json<NewTag>,
) -> Response {
    let rule = crate::engine::segment::TagRule::named(
        new.order.as_deref(),
        new.period.as_deref(),
        new.time_zone.as_deref(),
        new.sequence_digits,
        new.prefix.as_deref(),
    );
    let rule = match rule {
        Ok(rule) => rule,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    match ctx
        .segments
        .create_ruled_tag(
            &new.tag,
            new.step,
            new.start,
            new.description.as_deref(),
            Some(rule),
        )
        .await
    {
        Ok(()) => (
            StatusCode::CREATED,
            Json(json!({ "tag": new.tag, "step": new.step, "start": new.start })),
        )
            .into_response(),
        Err(e) => text(segment_status(&e), format!("{e}\n")),
    }
}

/// `PATCH /api/segment/tags/{tag}` (admin): LEAF.TAG STEP over HTTP; the new step applies
/// from the tag's next segment load.
pub(super) async fn update_tag(
    _: AdminCaller,
    State(ctx): State<Arc<Context>>,
    Path(tag): Path<String>,
    Json(change): Json<TagChange>,
) -> Response {
    let mut answer = json!({ "tag": tag });
    if change.step.is_none() && change.skip.is_none() {
        return text(
            StatusCode::BAD_REQUEST,
            "give \"step\" or \"skip\"\n".into(),
        );
    }
    // Every value is checked before anything changes: a bad skip must not leave a new step.
    let checked = change
        .step
        .map_or(Ok(()), |step| ctx.segments.validate_step(step))
        .and_then(|()| match change.skip {
            Some(n) if n < 1 => Err(crate::engine::segment::SegmentError::Invalid(
                "skip must be a positive number of IDs".into(),
            )),
            _ => Ok(()),
        });
    if let Err(e) = checked {
        return text(segment_status(&e), format!("{e}\n"));
    }
    if let Some(step) = change.step {
        if let Err(e) = ctx.segments.set_step(&tag, step).await {
            return text(segment_status(&e), format!("{e}\n"));
        }
        answer["step"] = json!(step);
    }
    if let Some(n) = change.skip {
        match ctx.segments.skip(&tag, n).await {
            Ok(max_id) => answer["max_id"] = json!(max_id),
            Err(e) => return text(segment_status(&e), format!("{e}\n")),
        }
    }
    Json(answer).into_response()
}
