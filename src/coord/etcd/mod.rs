//! Worker-id leases in etcd: the lease coordinator's rules ([`super::lease`]) over keys of
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
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod gateway;
mod identity;

use gateway::{absent, b64, int_field, put, unavailable, value_is, Gateway, Kv};

use super::LinkStatus;
use crate::config::EtcdConfig;
use crate::storage::{Lease, LeaseKeeper, StoreError, WorkerLeaseStore, WorkerRow};

/// The etcd keys of one leafd cluster, and the etcd lease of each owner this process holds.
pub struct EtcdLeases {
    gateway: Gateway,
    prefix: String,
    leases: Mutex<HashMap<String, i64>>,
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

impl EtcdLeases {
    pub fn new(cfg: &EtcdConfig) -> Result<EtcdLeases, StoreError> {
        let gateway = Gateway::new(cfg)?;
        Ok(EtcdLeases {
            status: gateway.status.clone(),
            gateway,
            prefix: format!("{}/{}/", cfg.root, cfg.cluster),
            leases: Mutex::new(HashMap::new()),
            identity: Mutex::new(None),
        })
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
        let reply = self
            .gateway
            .call("lease/grant", json!({ "TTL": ttl }))
            .await?;
        // Lease 0 is etcd's "no lease": a key put on it would never expire.
        let id = int_field(&reply, "ID")
            .filter(|&id| id > 0)
            .ok_or_else(|| unavailable(format!("lease/grant: {reply}")))?;
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

/// The fence a range reply of `worker/{id}` carries (`Ok(None)`: no such key), or why the
/// key's value is none leafd writes.
fn fence_in(responses: &[Value]) -> Result<Option<i64>, String> {
    let mut fence = None;
    for kv in responses.iter().filter_map(|r| {
        r.get("response_range")?
            .get("kvs")?
            .as_array()?
            .first()
            .cloned()
    }) {
        let kv =
            serde_json::from_value::<Kv>(kv).map_err(|e| format!("etcd: a range reply {e}"))?;
        let value = worker_value(&kv)?;
        fence = fence.max(Some(value.fence_ms));
    }
    Ok(fence)
}

/// The value of a `worker/{id}` key, checked: leafd writes a fence of its clock (never 0, nor
/// negative), so any other value was edited or damaged and its holder's last ID is not known.
fn worker_value(kv: &Kv) -> Result<WorkerValue, String> {
    let text = kv.value_text();
    match serde_json::from_str::<WorkerValue>(&text) {
        Ok(value) if value.fence_ms > 0 => Ok(value),
        _ => {
            let shown: String = text.chars().take(80).collect();
            Err(format!(
                "etcd key {} holds {shown:?}, not the owner and fence leafd writes: how far the worker id's last holder issued is not known; put back {{\"owner\":\"…\",\"fence_ms\":<a UNIX time in ms at or after its last ID>}}, or delete the key once that time has passed",
                kv.key_text()
            ))
        }
    }
}

#[async_trait]
impl WorkerLeaseStore for EtcdLeases {
    fn keeper(&self) -> LeaseKeeper {
        LeaseKeeper {
            kind: "etcd",
            holder: "etcd",
            place: "etcd",
        }
    }

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
            .gateway
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
                    .gateway
                    .call("lease/revoke", json!({ "ID": unused.to_string() }))
                    .await;
            }
            return Ok(None);
        }
        let fence = match fence_in(&responses) {
            Ok(fence) => fence,
            Err(why) => {
                // Given back at once: the id is not used on a fence nobody can read.
                if let Some(lease) = self.forget_lease(owner) {
                    let _ = self
                        .gateway
                        .call("lease/revoke", json!({ "ID": lease.to_string() }))
                        .await;
                }
                return Err(StoreError::Damaged(why));
            }
        };
        // No `worker/{id}` at all: the id was never held here, or etcd lost the key (restored
        // from a snapshot older than the holder's claim, who may still issue until its next
        // renewal). Read as a fence a whole lease ahead: the claimant waits that long.
        Ok(Some(fence.unwrap_or_else(|| {
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
            .gateway
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
            .gateway
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
        self.gateway
            .txn(
                vec![value_is(&alive, owner)],
                vec![
                    put(&self.worker(worker_id), &value, None),
                    json!({ "request_delete_range": { "key": b64(&alive) } }),
                ],
            )
            .await?;
        if let Some(lease) = self.forget_lease(owner) {
            let _ = self
                .gateway
                .call("lease/revoke", json!({ "ID": lease.to_string() }))
                .await;
        }
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        let alive: HashMap<i64, String> = self
            .gateway
            .range(&self.key("alive/"), true)
            .await?
            .iter()
            .filter_map(|kv| {
                let id = kv.key_text().rsplit('/').next()?.parse().ok()?;
                Some((id, kv.value_text()))
            })
            .collect();
        let mut rows: HashMap<i64, WorkerRow> = HashMap::new();
        for kv in self.gateway.range(&self.key("worker/"), true).await? {
            let Some(id) = kv
                .key_text()
                .rsplit('/')
                .next()
                .and_then(|s| s.parse().ok())
            else {
                continue;
            };
            // A fence nobody can read bounds neither a layout change nor a claim of the id.
            let value = worker_value(&kv).map_err(StoreError::Damaged)?;
            rows.insert(
                id,
                WorkerRow {
                    worker_id: id,
                    owner: value.owner,
                    lease: Lease::Ended,
                    fence_ms: value.fence_ms,
                },
            );
        }
        // etcd keeps no end time: an alive key is a lease its holder keeps alive.
        for (id, owner) in alive {
            let row = rows.entry(id).or_insert(WorkerRow {
                worker_id: id,
                owner: owner.clone(),
                lease: Lease::KeptAlive,
                fence_ms: 0,
            });
            row.owner = owner;
            row.lease = Lease::KeptAlive;
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
        let read = self.gateway.range(&key, false).await?;
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
            .gateway
            .txn(vec![unchanged], vec![put(&key, layout, None)])
            .await?;
        if moved {
            return Ok(Some(layout.to_string()));
        }
        Ok(self
            .gateway
            .range(&key, false)
            .await?
            .first()
            .map(Kv::value_text))
    }
}
