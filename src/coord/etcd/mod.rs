//! Worker-id leases in etcd: the database coordinator's rules ([`super::database`]) over keys of
//! etcd's v3 JSON gateway, a worker id held by a key bound to an etcd lease, its fence kept apart.
//!
//! Under `{root}/{cluster}/`: `alive/{id}` holds the owner and lives on the owner's etcd lease
//! (it vanishes when keep-alives stop for the lease's TTL: the id is free); `worker/{id}` holds
//! the owner and the fence it wrote, with no lease, so the next holder starts past it; `layout`
//! records the snowflake layout. Every change is one transaction compared on those keys.
//!
//! The gateway (HTTP/JSON, in every etcd since 3.4) is used rather than gRPC: the gRPC clients
//! generate their code with `protoc` at build time, which a fresh machine does not have.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod identity;

use super::LinkStatus;
use crate::config::EtcdConfig;
use crate::storage::{StoreError, WorkerLeaseStore, WorkerRow};

/// The etcd keys of one leafd cluster, and the etcd lease of each owner this process holds.
pub struct EtcdLeases {
    http: reqwest::Client,
    endpoints: Vec<String>,
    /// The endpoint that answered last: tried first.
    current: AtomicUsize,
    prefix: String,
    leases: Mutex<HashMap<String, i64>>,
    /// Said after a failed connection when TLS is on without a client certificate: a member
    /// with `--client-cert-auth` may close the connection before its alert is read, and the
    /// error is then only "connection was not ready".
    missing_client_cert_hint: &'static str,
    /// `snowflake.etcd.username` and `password`, and the token etcd gave for them last
    /// (asked for again when a member calls it invalid: expired, or auth was turned off and on).
    credentials: Option<(String, String)>,
    token: Mutex<Option<String>>,
    /// The `identity` value this process saw in etcd ([`identity`]).
    identity: Mutex<Option<String>>,
    /// The link as INFO and `/metrics` show it.
    pub status: std::sync::Arc<LinkStatus>,
}

/// What `worker/{id}` holds.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerValue {
    owner: String,
    fence_ms: i64,
}

/// One key-value of a range reply (etcd writes 64-bit integers as strings).
#[derive(Debug, Deserialize)]
struct Kv {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, alias = "modRevision")]
    mod_revision: Option<String>,
}

impl Kv {
    fn key_text(&self) -> String {
        String::from_utf8_lossy(&B64.decode(&self.key).unwrap_or_default()).into_owned()
    }
    fn value_text(&self) -> String {
        String::from_utf8_lossy(&B64.decode(&self.value).unwrap_or_default()).into_owned()
    }
}

fn b64(text: &str) -> String {
    B64.encode(text.as_bytes())
}

/// The key one past every key starting with `prefix` (etcd's range end of a prefix).
fn prefix_end(prefix: &str) -> String {
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

fn unavailable(why: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("etcd: {why}"))
}

impl EtcdLeases {
    pub fn new(cfg: &EtcdConfig) -> Result<EtcdLeases, StoreError> {
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
        Ok(EtcdLeases {
            http,
            endpoints: cfg
                .endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_string())
                .collect(),
            current: AtomicUsize::new(0),
            prefix: format!("{}/{}/", cfg.root, cfg.cluster),
            leases: Mutex::new(HashMap::new()),
            missing_client_cert_hint: if cfg.tls_ca_file.is_some() && client.is_none() {
                " (no client certificate is configured: a member started with \
                 --client-cert-auth also needs snowflake.etcd.tls_cert_file and tls_key_file)"
            } else {
                ""
            },
            credentials: cfg.username.clone().zip(cfg.password.clone()),
            token: Mutex::new(None),
            identity: Mutex::new(None),
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
    async fn call(&self, path: &str, body: Value) -> Result<Value, StoreError> {
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

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn alive(&self, worker_id: i64) -> String {
        self.key(&format!("alive/{worker_id}"))
    }

    fn worker(&self, worker_id: i64) -> String {
        self.key(&format!("worker/{worker_id}"))
    }

    async fn range(&self, key: &str, whole_prefix: bool) -> Result<Vec<Kv>, StoreError> {
        let mut body = json!({ "key": b64(key) });
        if whole_prefix {
            body["range_end"] = json!(prefix_end(key));
        }
        let reply = self.call("kv/range", body).await?;
        let kvs = reply.get("kvs").cloned().unwrap_or(json!([]));
        serde_json::from_value(kvs).map_err(unavailable)
    }

    /// A transaction: `compare` all true runs `success`; returns whether it did and its replies.
    async fn txn(
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

    /// The etcd lease of `owner`, granted on first use (its TTL in whole seconds).
    async fn lease_of(&self, owner: &str, lease_ms: i64) -> Result<i64, StoreError> {
        if let Some(id) = self
            .leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(owner)
        {
            return Ok(*id);
        }
        let ttl = (lease_ms / 1000).max(2);
        let reply = self.call("lease/grant", json!({ "TTL": ttl })).await?;
        let id =
            int_field(&reply, "ID").ok_or_else(|| unavailable(format!("lease/grant: {reply}")))?;
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(owner.to_string(), id);
        Ok(id)
    }

    fn forget_lease(&self, owner: &str) -> Option<i64> {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(owner)
    }
}

/// A 64-bit integer field, which etcd's gateway writes as a string.
fn int_field(value: &Value, name: &str) -> Option<i64> {
    match value.get(name)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn put(key: &str, value: &str, lease: Option<i64>) -> Value {
    let mut request = json!({ "key": b64(key), "value": b64(value) });
    if let Some(lease) = lease {
        request["lease"] = json!(lease.to_string());
    }
    json!({ "request_put": request })
}

fn absent(key: &str) -> Value {
    json!({ "target": "CREATE", "key": b64(key), "create_revision": "0" })
}

fn value_is(key: &str, value: &str) -> Value {
    json!({ "target": "VALUE", "key": b64(key), "value": b64(value) })
}

/// The fence a range reply of `worker/{id}` carries (`None`: no such key).
fn fence_in(responses: &[Value]) -> Option<i64> {
    responses
        .iter()
        .filter_map(|r| {
            r.get("response_range")?
                .get("kvs")?
                .as_array()?
                .first()
                .cloned()
        })
        .filter_map(|kv| serde_json::from_value::<Kv>(kv).ok())
        .filter_map(|kv| serde_json::from_str::<WorkerValue>(&kv.value_text()).ok())
        .map(|w| w.fence_ms)
        .max()
}

#[async_trait]
impl WorkerLeaseStore for EtcdLeases {
    /// A new, wiped or restored etcd (see [`identity`]): the claimant waits a whole lease.
    async fn instance_changed_within(&self, window_ms: i64) -> Result<bool, StoreError> {
        self.store_went_back_within(window_ms).await
    }

    async fn claim(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let lease = self.lease_of(owner, lease_ms).await?;
        let alive = self.alive(worker_id);
        let (taken, responses) = self
            .txn(
                vec![absent(&alive)],
                vec![
                    put(&alive, owner, Some(lease)),
                    json!({ "request_range": { "key": b64(&self.worker(worker_id)) } }),
                ],
            )
            .await?;
        if !taken {
            // The lease granted for this attempt holds nothing, and nothing keeps it alive: a
            // later attempt (a restarted node waiting for its old id) gets a fresh one, where
            // it once took the id on a lease about to run out and lost it at once.
            if let Some(unused) = self.forget_lease(owner) {
                let _ = self
                    .call("lease/revoke", json!({ "ID": unused.to_string() }))
                    .await;
            }
            return Ok(None);
        }
        // No `worker/{id}` at all: the id was never held here, or etcd lost the key (restored
        // from a snapshot older than the holder's claim, who may still issue until its next
        // renewal). Read as a fence a whole lease ahead: the claimant waits that long.
        Ok(Some(fence_in(&responses).unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            now + lease_ms
        })))
    }

    async fn renew(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
        fence_ms: i64,
    ) -> Result<bool, StoreError> {
        let lease = self.lease_of(owner, lease_ms).await?;
        let reply = self
            .call("lease/keepalive", json!({ "ID": lease.to_string() }))
            .await;
        // The keep-alive of a lease that ran out answers a TTL of 0 (left out): the alive key
        // is gone with it, and another node may hold the id already. Or etcd lost the lease
        // with all its data (wiped, rebuilt): its `identity` then is not the one seen.
        let ttl = reply
            .as_ref()
            .ok()
            .and_then(|reply| reply.get("result"))
            .and_then(|r| int_field(r, "TTL"))
            .unwrap_or(0);
        if ttl <= 0 && self.identity_changed().await? {
            self.forget_lease(owner);
            return Err(StoreError::WentBack(
                "etcd lost this cluster's keys (wiped, rebuilt or restored: its identity key is gone or another)".into(),
            ));
        }
        reply?;
        if ttl <= 0 {
            self.forget_lease(owner);
            return Ok(false);
        }
        let value = serde_json::to_string(&WorkerValue {
            owner: owner.to_string(),
            fence_ms,
        })
        .unwrap_or_default();
        let (held, _) = self
            .txn(
                vec![value_is(&self.alive(worker_id), owner)],
                vec![put(&self.worker(worker_id), &value, None)],
            )
            .await?;
        Ok(held)
    }

    async fn release(&self, worker_id: i64, owner: &str, fence_ms: i64) -> Result<(), StoreError> {
        let value = serde_json::to_string(&WorkerValue {
            owner: owner.to_string(),
            fence_ms,
        })
        .unwrap_or_default();
        let alive = self.alive(worker_id);
        self.txn(
            vec![value_is(&alive, owner)],
            vec![
                put(&self.worker(worker_id), &value, None),
                json!({ "request_delete_range": { "key": b64(&alive) } }),
            ],
        )
        .await?;
        if let Some(lease) = self.forget_lease(owner) {
            let _ = self
                .call("lease/revoke", json!({ "ID": lease.to_string() }))
                .await;
        }
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        let alive: HashMap<i64, String> = self
            .range(&self.key("alive/"), true)
            .await?
            .iter()
            .filter_map(|kv| {
                let id = kv.key_text().rsplit('/').next()?.parse().ok()?;
                Some((id, kv.value_text()))
            })
            .collect();
        let mut rows: HashMap<i64, WorkerRow> = HashMap::new();
        for kv in self.range(&self.key("worker/"), true).await? {
            let Some(id) = kv
                .key_text()
                .rsplit('/')
                .next()
                .and_then(|s| s.parse().ok())
            else {
                continue;
            };
            let value: Option<WorkerValue> = serde_json::from_str(&kv.value_text()).ok();
            rows.insert(
                id,
                WorkerRow {
                    worker_id: id,
                    owner: value.as_ref().map(|v| v.owner.clone()).unwrap_or_default(),
                    lease_until: 0,
                    fence_ms: value.map_or(0, |v| v.fence_ms),
                    db_now: 1,
                },
            );
        }
        // etcd has no clock to compare with: a live alive key reads as a lease not yet ended.
        for (id, owner) in alive {
            let row = rows.entry(id).or_insert(WorkerRow {
                worker_id: id,
                owner: owner.clone(),
                lease_until: 0,
                fence_ms: 0,
                db_now: 1,
            });
            row.owner = owner;
            row.lease_until = 2;
        }
        let mut rows: Vec<WorkerRow> = rows.into_values().collect();
        rows.sort_by_key(|r| r.worker_id);
        Ok(rows)
    }

    async fn record_layout(
        &self,
        expected: Option<&str>,
        layout: &str,
    ) -> Result<Option<String>, StoreError> {
        let key = self.key("layout");
        let read = self.range(&key, false).await?;
        let recorded = read.first().map(Kv::value_text);
        if expected == Some(layout) || recorded.as_deref() != expected {
            return Ok(recorded);
        }
        let unchanged = match read.first() {
            None => absent(&key),
            Some(kv) => json!({
                "target": "MOD",
                "key": b64(&key),
                "mod_revision": kv.mod_revision.clone().unwrap_or_default(),
            }),
        };
        let (moved, _) = self
            .txn(vec![unchanged], vec![put(&key, layout, None)])
            .await?;
        if moved {
            return Ok(Some(layout.to_string()));
        }
        Ok(self.range(&key, false).await?.first().map(Kv::value_text))
    }
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
