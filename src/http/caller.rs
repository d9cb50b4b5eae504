//! Who is calling: HTTP Basic (any user) or Bearer (the default user's password) checked
//! against the same users as RESP, as extractors the handlers name.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use crate::auth::{self, Role, NOAUTH, WRONGPASS};
use crate::context::Context;

use super::{forbidden, peer_of, text};

/// A caller whose credentials were checked (or anyone, when no authentication is configured):
/// `Authorization: Basic <user:password>` for any user, or `Bearer <requirepass>` for the
/// default user.
pub struct Caller;

/// A [`Caller`] with the admin role; others get 403.
pub struct AdminCaller;

pub(super) fn unauthorized(message: &str) -> Response {
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
pub(super) fn caller_role(ctx: &Context, headers: &HeaderMap) -> Result<Role, &'static str> {
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
