//! `[snowflake]`: the layout, clock rules, time fence and worker-id coordinator.

use serde::{Deserialize, Serialize};

use super::StorageConfig;

/// Where the snowflake worker id comes from.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CoordinatorKind {
    /// `snowflake.worker_id` from the configuration (one node, or ids managed by hand).
    Static,
    /// Leaf-snowflake's ZooKeeper registration (`[snowflake.zookeeper]`).
    Zookeeper,
    /// Leases in `leaf_worker` of the segment database (SQLite, MySQL, PostgreSQL): the
    /// default, so nodes sharing a database need no worker id by hand.
    #[default]
    Database,
    /// Leases in etcd (`[snowflake.etcd]`): the same rules as the database's, for sites that
    /// run etcd already (Patroni, Kubernetes).
    Etcd,
}

/// The snowflake engine and its worker id.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SnowflakeConfig {
    pub enabled: bool,
    /// Milliseconds since the UNIX epoch at which timestamps start (Twitter's by default).
    pub epoch_ms: u64,
    /// The ID's fields: they sum to 63 or less (53 or less keeps IDs exact in JavaScript).
    pub timestamp_bits: u32,
    pub worker_id_bits: u32,
    pub sequence_bits: u32,
    /// Milliseconds per step of the timestamp field: 1 (Twitter, Leaf), 10 (sonyflake), up to
    /// 1000 (uid-generator); a longer unit makes a small timestamp field last longer.
    pub time_unit_ms: u64,
    /// A clock step back up to this many ms is waited out; a larger one is refused
    /// (`-CLOCKBACK`) until the clock has caught up.
    pub max_backward_ms: u64,
    /// Largest n of `SNOWFLAKE <n>`.
    pub max_batch: usize,
    pub coordinator: CoordinatorKind,
    /// The worker id when `coordinator = "static"`.
    pub worker_id: u64,
    /// The durable time fence: no ID carries a timestamp past the one in this file. Empty:
    /// `snowflake-fence.json` in `storage.state_dir`.
    pub fence_file: String,
    /// How far ahead of the clock the fence is kept (it is extended every quarter of this).
    pub fence_window_ms: u64,
    /// At start, a clock behind the fence by up to this much is waited out; more is refused.
    pub max_start_wait_ms: u64,
    /// A request that meets the fence (its extension is late) waits this long, then gets
    /// `UNAVAILABLE`.
    pub fence_wait_ms: u64,
    /// `coordinator = "database"`: a worker-id lease lasts this long in database time; a node
    /// that cannot renew for half of it stops issuing.
    pub database_lease_ms: u64,
    pub zookeeper: ZookeeperConfig,
    pub etcd: EtcdConfig,
}

/// Worker-id leases in etcd, through its v3 JSON gateway (HTTP).
#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members (`http://etcd1:2379`), tried in order.
    pub endpoints: Vec<String>,
    /// Parent of every cluster's keys.
    pub root: String,
    /// Name of this leafd cluster: nodes with the same name share one worker-id space.
    pub cluster: String,
    /// A worker id's etcd lease lasts this long (whole seconds, at least 2); a node that
    /// cannot renew for half of it stops issuing.
    pub lease_ms: u64,
    /// Longest one request to etcd may take before the next endpoint is tried.
    pub request_timeout_ms: u64,
    /// With `https://` endpoints: PEM file of the CA that signed the members' certificates
    /// (etcd's `--trusted-ca-file` side; required, as etcd clusters use their own CA).
    pub tls_ca_file: Option<String>,
    /// Client certificate and key (PEM) for members started with `--client-cert-auth`.
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    /// An etcd user (members with `auth enable`): its role needs read-write on
    /// `{root}/{cluster}/`. With `password`; over `https://` unless the network is trusted.
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("root", &self.root)
            .field("cluster", &self.cluster)
            .field("lease_ms", &self.lease_ms)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            root: "/leafd/snowflake".into(),
            cluster: "default".into(),
            lease_ms: 10_000,
            request_timeout_ms: 2_000,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            username: None,
            password: None,
        }
    }
}

impl Default for SnowflakeConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            // Twitter's epoch and bit split, as Leaf uses them.
            epoch_ms: 1_288_834_974_657,
            timestamp_bits: 41,
            worker_id_bits: 10,
            sequence_bits: 12,
            time_unit_ms: 1,
            max_backward_ms: 5,
            max_batch: 4096,
            coordinator: CoordinatorKind::Database,
            worker_id: 0,
            fence_file: String::new(),
            fence_window_ms: 3000,
            max_start_wait_ms: 5000,
            fence_wait_ms: 1000,
            database_lease_ms: 10_000,
            zookeeper: ZookeeperConfig::default(),
            etcd: EtcdConfig::default(),
        }
    }
}

impl SnowflakeConfig {
    /// The fence file: `fence_file`, else `snowflake-fence.json` in the storage's state
    /// directory.
    pub fn fence_path(&self, storage: &StorageConfig) -> std::path::PathBuf {
        if !self.fence_file.is_empty() {
            return self.fence_file.clone().into();
        }
        storage.state_dir().join("snowflake-fence.json")
    }
}

/// Leaf-snowflake's ZooKeeper worker-id registry.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZookeeperConfig {
    /// ZooKeeper connect string, e.g. `zk1:2181,zk2:2181`.
    pub connect: String,
    /// Parent of every cluster's tree.
    pub root: String,
    /// Name of this leafd cluster: nodes with the same name share one worker-id space.
    pub cluster: String,
    /// This node's identity `ip:port` in ZooKeeper; defaults to `server.bind`.
    pub advertise: Option<String>,
    pub session_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// How often this node writes its current time into its persistent node.
    pub report_interval_ms: u64,
    /// Refuse to start when this node's clock differs from the other live nodes' average by
    /// more than this (each measured against ZooKeeper's own clock).
    pub max_clock_skew_ms: u64,
    /// A worker id whose node has been dead (no liveness node, no time report) for this long
    /// may be given to a new node; 0 never reuses ids (Leaf's behaviour). A running node that
    /// cannot report for half this long stops issuing snowflake IDs, so that its id can never
    /// be in use twice.
    pub reuse_after_secs: u64,
    /// Each report writes a fence this far ahead of the clock into ZooKeeper; the node issues
    /// no ID past the last fence written, so it stops this long after losing ZooKeeper, and
    /// a node that takes the id over later waits until its clock has passed it.
    pub lease_ms: u64,
    /// Local copy of the worker id and last reported time, used when ZooKeeper is down at start.
    /// Empty: `snowflake-worker.json` in the storage's state directory.
    pub cache_file: String,
}

impl Default for ZookeeperConfig {
    fn default() -> Self {
        Self {
            connect: "127.0.0.1:2181".into(),
            root: "/leafd/snowflake".into(),
            cluster: "default".into(),
            advertise: None,
            session_timeout_ms: 10_000,
            connect_timeout_ms: 5_000,
            report_interval_ms: 3_000,
            max_clock_skew_ms: 5_000,
            reuse_after_secs: 86_400,
            lease_ms: 10_000,
            cache_file: String::new(),
        }
    }
}

impl SnowflakeConfig {
    /// The `[snowflake]` section's own rules; the message names the key.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.max_batch == 0 || self.max_batch > 100_000 {
            return Err("snowflake.max_batch must be between 1 and 100000".into());
        }
        if self.coordinator == CoordinatorKind::Database && self.database_lease_ms < 1000 {
            return Err("snowflake.database_lease_ms must be at least 1000".into());
        }
        if !(100..=600_000).contains(&self.fence_window_ms) {
            return Err("snowflake.fence_window_ms must be between 100 and 600000".into());
        }
        if !(1..=1000).contains(&self.time_unit_ms) {
            return Err("snowflake.time_unit_ms must be between 1 and 1000".into());
        }
        // An ID of a step is issued only while the fence and the lease cover the whole step.
        let unit = self.time_unit_ms;
        if self.fence_window_ms < 4 * unit
            || (self.coordinator == CoordinatorKind::Database && self.database_lease_ms < 4 * unit)
            || (self.coordinator == CoordinatorKind::Zookeeper
                && self.zookeeper.lease_ms < 4 * unit)
            || (self.coordinator == CoordinatorKind::Etcd && self.etcd.lease_ms < 4 * unit)
        {
            return Err(
                "snowflake.fence_window_ms and the coordinator's lease must be at least 4 × time_unit_ms"
                    .into(),
            );
        }
        let etcd = &self.etcd;
        if self.coordinator == CoordinatorKind::Etcd {
            if etcd.lease_ms < 2000 || !etcd.lease_ms.is_multiple_of(1000) {
                return Err(
                    "snowflake.etcd.lease_ms must be whole seconds, at least 2000 (etcd leases count seconds)"
                        .into(),
                );
            }
            let https = etcd
                .endpoints
                .iter()
                .filter(|e| e.starts_with("https://"))
                .count();
            let http = etcd
                .endpoints
                .iter()
                .filter(|e| e.starts_with("http://"))
                .count();
            if etcd.endpoints.is_empty()
                || (https > 0 && http > 0)
                || https + http < etcd.endpoints.len()
            {
                return Err(
                    "snowflake.etcd.endpoints must list etcd client URLs, all http://host:2379 or all https://host:2379"
                        .into(),
                );
            }
            let tls_files = etcd.tls_ca_file.is_some()
                || etcd.tls_cert_file.is_some()
                || etcd.tls_key_file.is_some();
            if https == 0 && tls_files {
                return Err(
                    "snowflake.etcd.tls_ca_file, tls_cert_file and tls_key_file apply to https:// endpoints only"
                        .into(),
                );
            }
            if https > 0 && etcd.tls_ca_file.is_none() {
                return Err(
                    "https:// etcd endpoints need snowflake.etcd.tls_ca_file (the CA that signed the members' certificates)"
                        .into(),
                );
            }
            if etcd.username.is_some() != etcd.password.is_some()
                || etcd.username.as_deref() == Some("")
            {
                return Err(
                    "snowflake.etcd.username and password go together (an etcd user and its password)"
                        .into(),
                );
            }
            if etcd.tls_cert_file.is_some() != etcd.tls_key_file.is_some() {
                return Err(
                    "snowflake.etcd.tls_cert_file and tls_key_file go together (a client certificate and its key)"
                        .into(),
                );
            }
            if !etcd.root.starts_with('/') || etcd.root.ends_with('/') || etcd.cluster.contains('/')
            {
                return Err(
                    "snowflake.etcd.root must start and not end with '/', cluster has no '/'"
                        .into(),
                );
            }
            if etcd.request_timeout_ms == 0 {
                return Err("snowflake.etcd.request_timeout_ms must be > 0".into());
            }
        }
        let zk = &self.zookeeper;
        if self.coordinator == CoordinatorKind::Zookeeper {
            if !zk.root.starts_with('/') || zk.root.ends_with('/') || zk.cluster.contains('/') {
                return Err(
                    "snowflake.zookeeper.root must start and not end with '/', cluster has no '/'"
                        .into(),
                );
            }
            if zk.report_interval_ms == 0 || zk.session_timeout_ms == 0 {
                return Err("snowflake.zookeeper intervals must be > 0".into());
            }
            if zk.lease_ms < 2 * zk.report_interval_ms {
                return Err(
                    "snowflake.zookeeper.lease_ms must be at least twice report_interval_ms".into(),
                );
            }
            if zk.reuse_after_secs != 0 && zk.reuse_after_secs * 1000 < 10 * zk.session_timeout_ms {
                return Err(
                    "snowflake.zookeeper.reuse_after_secs must be 0 or at least 10 session timeouts"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_unit_is_checked_before_what_depends_on_it() {
        let mut config = SnowflakeConfig {
            time_unit_ms: 1001,
            ..SnowflakeConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err(),
            "snowflake.time_unit_ms must be between 1 and 1000"
        );
        config.time_unit_ms = 1000;
        assert!(config
            .validate()
            .unwrap_err()
            .contains("at least 4 × time_unit_ms"));
        config.fence_window_ms = 4000;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn etcd_tls_files_go_with_https_endpoints() {
        let etcd = |endpoints: &[&str], ca: bool, cert: bool, key: bool| {
            let mut config = SnowflakeConfig {
                coordinator: CoordinatorKind::Etcd,
                ..SnowflakeConfig::default()
            };
            config.etcd.endpoints = endpoints.iter().map(|e| e.to_string()).collect();
            config.etcd.tls_ca_file = ca.then(|| "ca.pem".to_string());
            config.etcd.tls_cert_file = cert.then(|| "client.pem".to_string());
            config.etcd.tls_key_file = key.then(|| "client.key".to_string());
            config.validate()
        };
        assert!(etcd(&["http://e1:2379", "http://e2:2379"], false, false, false).is_ok());
        assert!(etcd(&["https://e1:2379"], true, false, false).is_ok());
        assert!(etcd(&["https://e1:2379"], true, true, true).is_ok());
        let mixed = etcd(&["https://e1:2379", "http://e2:2379"], true, false, false);
        assert!(mixed
            .unwrap_err()
            .contains("all http://host:2379 or all https://"));
        assert!(etcd(&["e1:2379"], false, false, false)
            .unwrap_err()
            .contains("must list etcd client URLs"));
        assert!(etcd(&["https://e1:2379"], false, false, false)
            .unwrap_err()
            .contains("need snowflake.etcd.tls_ca_file"));
        assert!(etcd(&["http://e1:2379"], true, false, false)
            .unwrap_err()
            .contains("apply to https:// endpoints only"));
        assert!(etcd(&["https://e1:2379"], true, true, false)
            .unwrap_err()
            .contains("go together"));
    }

    #[test]
    fn an_etcd_user_goes_with_its_password() {
        let etcd = |username: Option<&str>, password: Option<&str>| {
            let mut config = SnowflakeConfig {
                coordinator: CoordinatorKind::Etcd,
                ..SnowflakeConfig::default()
            };
            config.etcd.username = username.map(str::to_string);
            config.etcd.password = password.map(str::to_string);
            config.validate()
        };
        assert!(etcd(None, None).is_ok());
        assert!(etcd(Some("leafd"), Some("pw")).is_ok());
        let alone =
            "snowflake.etcd.username and password go together (an etcd user and its password)";
        assert_eq!(etcd(Some("leafd"), None).unwrap_err(), alone);
        assert_eq!(etcd(None, Some("pw")).unwrap_err(), alone);
        assert_eq!(etcd(Some(""), Some("pw")).unwrap_err(), alone);
        let shown = format!(
            "{:?}",
            SnowflakeConfig {
                etcd: EtcdConfig {
                    password: Some("pw-secret".into()),
                    ..EtcdConfig::default()
                },
                ..SnowflakeConfig::default()
            }
        );
        assert!(
            !shown.contains("pw-secret") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}
