//! A client of etcd's v3 JSON gateway: every call to the member that answered last, then to the
//! others in turn, with TLS and an auth token replaced whenever a member refuses it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::LinkStatus;
use crate::config::EtcdConfig;
use crate::storage::StoreError;

/// The members of one etcd cluster, as leafd reaches them.
pub(super) struct Gateway {
    http: reqwest::Client,
    endpoints: Vec<String>,
    /// The endpoint that answered last: tried first.
    current: AtomicUsize,
    /// The prefix of leafd's keys, named when a user lacks a role on it.
    prefix: String,
    /// Said after a failed connection when TLS is on without a client certificate: a member
    /// with `--client-cert-auth` may close the connection before its alert is read, and the
    /// error is then only "connection was not ready".
    missing_client_cert_hint: &'static str,
    /// `snowflake.etcd.username` and `password`, and the token etcd gave for them last
    /// (asked for again when a member calls it invalid: expired, or auth was turned off and on).
    credentials: Option<(String, String)>,
    token: Mutex<Option<String>>,
    /// The link as INFO and `/metrics` show it.
    pub(super) status: std::sync::Arc<LinkStatus>,
}

/// One key-value of a range reply (etcd writes 64-bit integers as strings).
#[derive(Debug, Deserialize)]
pub(super) struct Kv {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, alias = "modRevision")]
    pub(super) mod_revision: Option<String>,
}

impl Kv {
    pub(super) fn key_text(&self) -> String {
        String::from_utf8_lossy(&B64.decode(&self.key).unwrap_or_default()).into_owned()
    }
    pub(super) fn value_text(&self) -> String {
        String::from_utf8_lossy(&B64.decode(&self.value).unwrap_or_default()).into_owned()
    }
}

pub(super) fn b64(text: &str) -> String {
    B64.encode(text.as_bytes())
}

/// The key one past every key starting with `prefix` (etcd's range end of a prefix).
pub(super) fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    B64.encode(end)
}

/// An error and what caused it, innermost last: reqwest's own text ("error sending request")
/// does not say whether a certificate, the connection or a timeout failed.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let more = inner.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = inner.source();
    }
    text
}

pub(super) fn unavailable(why: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("etcd: {why}"))
}

impl Gateway {
    pub(super) fn new(cfg: &EtcdConfig) -> Result<Gateway, StoreError> {
        // Always leafd's own rustls settings (ring, as everywhere in leafd): reqwest has no
        // crypto provider of its own here. With http:// endpoints they trust nothing.
        let client = cfg
            .tls_cert_file
            .as_deref()
            .zip(cfg.tls_key_file.as_deref());
        let tls = crate::tls::client_config(cfg.tls_ca_file.as_deref(), client)
            .map_err(|e| StoreError::FileAccess(format!("snowflake.etcd TLS: {e}")))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(cfg.request_timeout_ms))
            .connect_timeout(Duration::from_millis(cfg.request_timeout_ms))
            .tls_backend_preconfigured(tls)
            .https_only(cfg.tls_ca_file.is_some())
            .build()
            .map_err(unavailable)?;
        Ok(Gateway {
            http,
            endpoints: cfg
                .endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_string())
                .collect(),
            current: AtomicUsize::new(0),
            prefix: format!("{}/{}/", cfg.root, cfg.cluster),
            missing_client_cert_hint: if cfg.tls_ca_file.is_some() && client.is_none() {
                " (no client certificate is configured: a member started with \
                 --client-cert-auth also needs snowflake.etcd.tls_cert_file and tls_key_file)"
            } else {
                ""
            },
            credentials: cfg.username.clone().zip(cfg.password.clone()),
            token: Mutex::new(None),
            status: std::sync::Arc::new(LinkStatus::new("etcd")),
        })
    }

    /// One POST to one member, with the auth token when there is one.
    async fn send(
        &self,
        url: &str,
        body: &str,
        token: Option<&str>,
    ) -> Result<(reqwest::StatusCode, bytes::Bytes), reqwest::Error> {
        let mut request = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        let response = request.send().await?;
        let status = response.status();
        Ok((status, response.bytes().await?))
    }

    /// The token to send to `endpoint`: the last one, or a new one for the configured user.
    /// `None` without credentials.
    async fn token(&self, endpoint: &str, fresh: bool) -> Result<Option<String>, String> {
        let Some((name, password)) = &self.credentials else {
            return Ok(None);
        };
        if !fresh {
            if let Some(token) = self.token.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return Ok(Some(token));
            }
        }
        let url = format!("{endpoint}/v3/auth/authenticate");
        let body = json!({ "name": name, "password": password }).to_string();
        let (status, bytes) = self
            .send(&url, &body, None)
            .await
            .map_err(|e| format!("{url}: {}", with_causes(&e)))?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{url}: {status}, unreadable answer ({e})"))?;
        let token = value
            .get("token")
            .and_then(Value::as_str)
            .filter(|_| status.is_success());
        let Some(token) = token else {
            let error = value
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no token");
            return Err(format!(
                "{url}: {status} {error} (snowflake.etcd.username {name:?})"
            ));
        };
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.to_string());
        Ok(Some(token.to_string()))
    }

    /// What to do about an error reply: a hint for the operator when it is about
    /// authentication or permissions.
    fn auth_hint(&self, status: reqwest::StatusCode) -> String {
        match (status.as_u16(), &self.credentials) {
            (400, None) => " (the members have authentication on: set snowflake.etcd.username \
                            and password)"
                .into(),
            (403, Some((name, _))) => format!(
                " (etcd user {name:?} needs a role with readwrite on the prefix {})",
                self.prefix
            ),
            _ => String::new(),
        }
    }

    /// One gateway call, to the endpoint that answered last and then to the others in turn.
    pub(super) async fn call(&self, path: &str, body: Value) -> Result<Value, StoreError> {
        let first = self.current.load(Ordering::Relaxed);
        let body = body.to_string();
        let mut last_error = None;
        for k in 0..self.endpoints.len() {
            let i = (first + k) % self.endpoints.len();
            let url = format!("{}/v3/{path}", self.endpoints[i]);
            let answer = async {
                let token = self.token(&self.endpoints[i], false).await?;
                let sent = self.send(&url, &body, token.as_deref()).await;
                // The token was refused: it expired or was revoked (401: auth turned off and
                // on), or etcd's auth store changed since it was issued (a JWT or simple token
                // after any user or role change: 400 "revision of auth store is old"). A call
                // refused for it did nothing, so it is made again once with a new token.
                let sent = match sent {
                    Ok((status, reply)) if token.is_some() && token_refused(status, &reply) => {
                        let token = self.token(&self.endpoints[i], true).await?;
                        self.send(&url, &body, token.as_deref()).await
                    }
                    sent => sent,
                };
                sent.map_err(|e| {
                    format!(
                        "{url}: {}{}",
                        with_causes(&e),
                        self.missing_client_cert_hint
                    )
                })
            };
            match answer.await {
                Ok((status, bytes)) => {
                    let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
                        unavailable(format!("{url}: {status}, unreadable answer ({e})"))
                    })?;
                    if !status.is_success() || value.get("error").is_some() {
                        self.status.set_connected(true);
                        return Err(unavailable(format!(
                            "{url}: {status} {value}{}",
                            self.auth_hint(status)
                        )));
                    }
                    self.current.store(i, Ordering::Relaxed);
                    self.status.set_connected(true);
                    return Ok(value);
                }
                Err(e) => last_error = Some(e),
            }
        }
        self.status.set_connected(false);
        Err(unavailable(last_error.unwrap_or_default()))
    }

    pub(super) async fn range(&self, key: &str, whole_prefix: bool) -> Result<Vec<Kv>, StoreError> {
        let mut body = json!({ "key": b64(key) });
        if whole_prefix {
            body["range_end"] = json!(prefix_end(key));
        }
        let reply = self.call("kv/range", body).await?;
        let kvs = reply.get("kvs").cloned().unwrap_or(json!([]));
        serde_json::from_value(kvs).map_err(unavailable)
    }

    /// A transaction: `compare` all true runs `success`; returns whether it did and its replies.
    pub(super) async fn txn(
        &self,
        compare: Vec<Value>,
        success: Vec<Value>,
    ) -> Result<(bool, Vec<Value>), StoreError> {
        let reply = self
            .call("kv/txn", json!({ "compare": compare, "success": success }))
            .await?;
        let succeeded = reply
            .get("succeeded")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let responses = reply
            .get("responses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok((succeeded, responses))
    }
}

/// A 64-bit integer field, which etcd's gateway writes as a string.
pub(super) fn int_field(value: &Value, name: &str) -> Option<i64> {
    match value.get(name)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

pub(super) fn put(key: &str, value: &str, lease: Option<i64>) -> Value {
    let mut request = json!({ "key": b64(key), "value": b64(value) });
    if let Some(lease) = lease {
        request["lease"] = json!(lease.to_string());
    }
    json!({ "request_put": request })
}

pub(super) fn absent(key: &str) -> Value {
    json!({ "target": "CREATE", "key": b64(key), "create_revision": "0" })
}

pub(super) fn value_is(key: &str, value: &str) -> Value {
    json!({ "target": "VALUE", "key": b64(key), "value": b64(value) })
}

/// Whether a member refused a call for its token (not for what it asked): a 401, or an error
/// naming the auth store's revision or the token (etcd answers these with 400 or 500).
fn token_refused(status: reqwest::StatusCode, body: &[u8]) -> bool {
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return true;
    }
    let text = String::from_utf8_lossy(body);
    !status.is_success()
        && (text.contains("revision of auth store is old")
            || text.contains("invalid auth token")
            || text.contains("auth token"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_one_past_its_last_byte() {
        assert_eq!(prefix_end("/a/"), B64.encode("/a0"));
        assert_eq!(
            int_field(&json!({"ID": "7587862134223466500"}), "ID"),
            Some(7587862134223466500)
        );
        assert_eq!(int_field(&json!({"TTL": 10}), "TTL"), Some(10));
        assert_eq!(int_field(&json!({}), "TTL"), None);
    }

    #[test]
    fn a_token_refused_for_the_auth_store_is_replaced() {
        use reqwest::StatusCode;
        assert!(token_refused(StatusCode::UNAUTHORIZED, b""));
        assert!(token_refused(
            StatusCode::BAD_REQUEST,
            br#"{"error":"etcdserver: revision of auth store is old","code":3}"#
        ));
        assert!(token_refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            br#"{"error":"etcdserver: invalid auth token"}"#
        ));
        assert!(!token_refused(
            StatusCode::FORBIDDEN,
            br#"{"error":"etcdserver: permission denied"}"#
        ));
        assert!(!token_refused(StatusCode::OK, b"{}"));
    }
}
