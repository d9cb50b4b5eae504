//! HTTP: Prometheus `/metrics`, `/health`, `/ready` (always open), Leaf's HTTP API and the tag
//! admin endpoints, behind the same users as RESP when authentication is configured.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use std::net::SocketAddr;

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::serve::IncomingStream;
use axum::serve::Listener;
use axum::{Json, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use crate::auth::{self, Role, NOAUTH, WRONGPASS};
use crate::context::Context;
use crate::engine::segment::{Segment, SegmentError};
use crate::engine::snowflake::SnowflakeError;

/// Serves HTTP on `listener` (a `TcpListener`, or a [`crate::tls::HttpsListener`]) until
/// `shutdown` completes.
pub async fn run<L>(
    listener: L,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: Listener,
    L::Addr: std::fmt::Debug,
    for<'a> Peer: Connected<IncomingStream<'a, L>>,
{
    axum::serve(
        listener,
        router(ctx).into_make_service_with_connect_info::<Peer>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// The client's address, for protected mode and the admin rule.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, crate::tls::HttpsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, crate::tls::HttpsListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

/// The peer of a request; an unknown one is treated as remote (refused rather than trusted).
fn peer_of(parts: &Parts) -> SocketAddr {
    parts
        .extensions
        .get::<ConnectInfo<Peer>>()
        .map(|info| info.0 .0)
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
}

fn forbidden(message: &str) -> Response {
    text(StatusCode::FORBIDDEN, format!("{message}\n"))
}

pub fn router(ctx: Arc<Context>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/api/segment/get/{tag}", get(segment_id))
        .route("/api/snowflake/get/{key}", get(snowflake_id))
        .route("/decode/{id}", get(decode))
        .route("/cache", get(cache))
        .route("/api/segment/tags", post(create_tag))
        .route("/api/segment/tags/{tag}", patch(update_tag))
        .with_state(ctx)
}

/// A caller whose credentials were checked (or anyone, when no authentication is configured):
/// `Authorization: Basic <user:password>` for any user, or `Bearer <requirepass>` for the
/// default user.
pub struct Caller;

/// A [`Caller`] with the admin role; others get 403.
pub struct AdminCaller;

fn unauthorized(message: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [
            (WWW_AUTHENTICATE, "Basic realm=\"leafd\", charset=\"UTF-8\""),
            (CONTENT_TYPE, "text/plain; charset=utf-8"),
        ],
        format!("{message}\n"),
    )
        .into_response()
}

/// The role the request's `Authorization` header proves; `Err` is the 401 message.
fn caller_role(ctx: &Context, headers: &HeaderMap) -> Result<Role, &'static str> {
    let server = &ctx.config.server;
    if !server.auth_required() {
        return Ok(Role::Admin);
    }
    let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return Err(NOAUTH);
    };
    let (scheme, credentials) = value.trim().split_once(' ').unwrap_or((value, ""));
    let credentials = credentials.trim();
    let role = if scheme.eq_ignore_ascii_case("basic") {
        base64::engine::general_purpose::STANDARD
            .decode(credentials)
            .ok()
            .and_then(|pair| {
                let colon = pair.iter().position(|&b| b == b':')?;
                auth::authenticate(server, &pair[..colon], &pair[colon + 1..])
            })
    } else if scheme.eq_ignore_ascii_case("bearer") {
        auth::authenticate(server, b"default", credentials.as_bytes())
    } else {
        None
    };
    role.ok_or(WRONGPASS)
}

impl FromRequestParts<Arc<Context>> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, ctx: &Arc<Context>) -> Result<Self, Response> {
        if crate::access::protected_mode_refuses(&ctx.config, peer_of(parts)) {
            return Err(forbidden(crate::access::PROTECTED_MODE_DENIED));
        }
        caller_role(ctx, &parts.headers)
            .map(|_| Caller)
            .map_err(unauthorized)
    }
}

impl FromRequestParts<Arc<Context>> for AdminCaller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, ctx: &Arc<Context>) -> Result<Self, Response> {
        let peer = peer_of(parts);
        if crate::access::protected_mode_refuses(&ctx.config, peer) {
            return Err(forbidden(crate::access::PROTECTED_MODE_DENIED));
        }
        if !ctx.config.server.auth_required()
            && !crate::access::unauthenticated_admin(&ctx.config, peer)
        {
            return Err(forbidden(crate::access::ADMIN_NEEDS_PASSWORD));
        }
        match caller_role(ctx, &parts.headers).map_err(unauthorized)? {
            Role::Admin => Ok(AdminCaller),
            Role::User => Err(text(
                StatusCode::FORBIDDEN,
                "NOPERM this user has no permissions to manage tags\n".into(),
            )),
        }
    }
}

/// Body of `POST /api/segment/tags`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTag {
    tag: String,
    step: i64,
    /// The first ID handed out (1 when left out).
    #[serde(default = "first_id")]
    start: i64,
    #[serde(default)]
    description: Option<String>,
}

fn first_id() -> i64 {
    1
}

/// Body of `PATCH /api/segment/tags/{tag}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TagChange {
    /// The new step (LEAF.TAG STEP).
    #[serde(default)]
    step: Option<i64>,
    /// Move max_id forward by this many IDs (LEAF.TAG SKIP).
    #[serde(default)]
    skip: Option<i64>,
}

/// `POST /api/segment/tags` (admin): LEAF.TAG CREATE over HTTP; 201, or 409 when it exists.
async fn create_tag(
    _: AdminCaller,
    State(ctx): State<Arc<Context>>,
    Json(new): Json<NewTag>,
) -> Response {
    match ctx
        .segments
        .create_tag(&new.tag, new.step, new.start, new.description.as_deref())
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
async fn update_tag(
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

fn text(status: StatusCode, body: String) -> Response {
    (status, [(CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn metrics(State(ctx): State<Arc<Context>>) -> Response {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        ctx.render_metrics(),
    )
        .into_response()
}

/// 200 once the database answered and the tag list is loaded; 503 with the reason before.
async fn ready(State(ctx): State<Arc<Context>>) -> Response {
    if ctx.storage_ready() {
        text(StatusCode::OK, "ready\n".into())
    } else {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: segment storage not connected\n".into(),
        )
    }
}

fn segment_status(err: &SegmentError) -> StatusCode {
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
    }
}

/// Leaf's `GET /api/segment/get/{tag}`: the next ID as plain text.
async fn segment_id(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    Path(tag): Path<String>,
) -> Response {
    match ctx.segments.next_ids(&tag, 1).await {
        Ok(id) => text(StatusCode::OK, id.to_string()),
        Err(e) => text(segment_status(&e), format!("{e}\n")),
    }
}

/// Leaf's `GET /api/snowflake/get/{key}` (the key is ignored, as in Leaf).
async fn snowflake_id(
    _: Caller,
    State(ctx): State<Arc<Context>>,
    Path(_key): Path<String>,
) -> Response {
    let Some(engine) = &ctx.snowflake else {
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
async fn decode(_: Caller, State(ctx): State<Arc<Context>>, Path(id): Path<String>) -> Response {
    let layout = ctx.snowflake_layout;
    let Some(fields) = id.parse::<i64>().ok().and_then(|id| layout.decode(id)) else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("'{id}' is not a snowflake ID (a positive 64-bit integer)\n"),
        );
    };
    let time =
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(fields.timestamp_ms));
    Json(json!({
        "id": id.parse::<i64>().unwrap_or_default(),
        "timestamp_ms": fields.timestamp_ms,
        "time": time.to_string(),
        "worker_id": fields.worker_id,
        "sequence": fields.sequence,
    }))
    .into_response()
}

fn segment_json(segment: Option<Segment>) -> serde_json::Value {
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

fn segment_html(segment: Option<Segment>) -> String {
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

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Leaf's monitor page: every tag's buffers, as HTML or (with `Accept: application/json`) JSON.
async fn cache(_: Caller, State(ctx): State<Arc<Context>>, headers: HeaderMap) -> Response {
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
