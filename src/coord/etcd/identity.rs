//! Whether the etcd answering still holds the keys the leases were kept in: a member wiped or
//! rebuilt (even with the same cluster id: etcd derives it from the flags), or restored from a
//! snapshot older than this lineage's record, has lost them.
//!
//! `identity` holds a random value written once per lineage of the keys; `settling` lives one
//! lease on an etcd lease of its own after `identity` is (re)written. While it lives a claimant
//! waits a whole lease before issuing: a node that held its id in the lost state stops at its
//! next renewal (its etcd lease is gone and `identity` is not the one it saw), or within half a
//! lease of its last renewal when it cannot reach etcd.

use serde_json::{json, Value};

use super::gateway::{absent, b64, int_field, put, unavailable, Kv};
use super::EtcdLeases;
use crate::storage::StoreError;

impl EtcdLeases {
    /// The values of `keys`, read in one transaction (one revision).
    async fn read_keys(&self, keys: &[&str]) -> Result<Vec<Option<String>>, StoreError> {
        let success: Vec<Value> = keys
            .iter()
            .map(|key| json!({ "request_range": { "key": b64(key) } }))
            .collect();
        let reply = self
            .gateway
            .call("kv/txn", json!({ "compare": [], "success": success }))
            .await?;
        let responses = reply
            .get("responses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok((0..keys.len())
            .map(|i| {
                let kv = responses
                    .get(i)?
                    .get("response_range")?
                    .get("kvs")?
                    .get(0)?;
                let kv: Kv = serde_json::from_value(kv.clone()).ok()?;
                Some(kv.value_text())
            })
            .collect())
    }

    fn remember_identity(&self, value: Option<String>) {
        *self.identity.lock().unwrap_or_else(|p| p.into_inner()) = value;
    }

    /// True when a claimant must wait a whole lease: `identity` is missing (a new, wiped or
    /// rebuilt etcd), in which case it is written and `settling` started, or `settling` still
    /// lives. `window_ms` is the lease.
    pub(super) async fn store_went_back_within(&self, window_ms: i64) -> Result<bool, StoreError> {
        let (identity, settling) = (self.key("identity"), self.key("settling"));
        let read = self.read_keys(&[&identity, &settling]).await?;
        if let Some(recorded) = read[0].clone() {
            self.remember_identity(Some(recorded));
            return Ok(read[1].is_some());
        }
        let ttl = (window_ms / 1000).max(2) + 1;
        let grant = self
            .gateway
            .call("lease/grant", json!({ "TTL": ttl }))
            .await?;
        let lease =
            int_field(&grant, "ID").ok_or_else(|| unavailable(format!("lease/grant: {grant}")))?;
        let value = format!("{:016x}", fastrand::u64(..));
        let (written, _) = self
            .gateway
            .txn(
                vec![absent(&identity)],
                vec![
                    put(&identity, &value, None),
                    put(&settling, &value, Some(lease)),
                ],
            )
            .await?;
        if written {
            tracing::warn!(
                wait_ms = window_ms,
                "etcd holds no record of this cluster's leases (a new etcd, or one wiped or rebuilt): claimants wait a whole lease before issuing"
            );
            self.remember_identity(Some(value));
        } else {
            // Another node wrote it first: its settling period applies.
            let again = self.read_keys(&[&identity]).await?;
            self.remember_identity(again[0].clone());
        }
        Ok(true)
    }

    /// Whether `identity` is no longer the one this process saw (missing, or another
    /// lineage's): etcd lost the keys since, and with them this node's lease.
    pub(super) async fn identity_changed(&self) -> Result<bool, StoreError> {
        let seen = self
            .identity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(seen) = seen else {
            return Ok(false);
        };
        let now = self.read_keys(&[&self.key("identity")]).await?;
        Ok(now[0].as_deref() != Some(seen.as_str()))
    }
}
