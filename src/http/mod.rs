//! HTTP: Prometheus `/metrics`, `/health`, `/ready` (always open), Leaf's HTTP API and the tag
//! admin endpoints, behind the same users as RESP when authentication is configured.

mod admin;
mod cache_page;
mod caller;
mod leaf_api;
mod leaf_monitor;

use admin::{create_tag, update_tag};
use cache_page::cache;
pub use caller::{AdminCaller, Caller};
use leaf_api::{decode, from_time, segment_code, segment_id, snowflake_id};

use std::future::Future;
use std::sync::Arc;

use std::net::SocketAddr;

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::serve::IncomingStream;
use axum::serve::Listener;
use axum::Router;

use crate::context::Context;

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
        // HEAD would run the GET handler and consume an ID for nothing.
        .route("/api/segment/get/{tag}", get(segment_id).head(no_head))
        .route("/api/segment/code/{tag}", get(segment_code).head(no_head))
        .route("/api/snowflake/get/{key}", get(snowflake_id).head(no_head))
        .route("/decode/{id}", get(decode))
        .route("/fromtime/{t}", get(from_time))
        .route("/cache", get(cache))
        .route("/db", get(leaf_monitor::db))
        .route("/decodeSnowflakeId", get(leaf_monitor::decode_snowflake_id))
        .route("/api/segment/tags", post(create_tag))
        .route("/api/segment/tags/{tag}", patch(update_tag))
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method)
        .with_state(ctx)
}

async fn no_head() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(axum::http::header::ALLOW, "GET")],
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let shown: String = path.chars().take(128).collect();
    let cut = if shown.len() < path.len() { "…" } else { "" };
    text(
        StatusCode::NOT_FOUND,
        format!("no such path: {shown}{cut} (the paths: docs/reference/http.md)\n"),
    )
}

async fn wrong_method(method: axum::http::Method) -> Response {
    text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed on this path\n"),
    )
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

/// 200 once the database answered and the tag list is loaded, until draining starts; 503 with
/// the reason otherwise.
async fn ready(State(ctx): State<Arc<Context>>) -> Response {
    match ctx.readiness() {
        Ok(()) => text(StatusCode::OK, "ready\n".into()),
        Err(why) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

/// What HTTP answers while the server starts (database, migrations, worker id, time fence),
/// before the application exists: alive, not ready, nothing else yet.
pub async fn run_starting<L>(
    listener: L,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: Listener,
    L::Addr: std::fmt::Debug,
{
    const STARTING: &str =
        "starting: opening the database, migrating, taking a snowflake worker id\n";
    let router = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route(
            "/ready",
            get(|| async {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {STARTING}"),
                )
            }),
        )
        .fallback(|| async { text(StatusCode::SERVICE_UNAVAILABLE, STARTING.into()) });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
