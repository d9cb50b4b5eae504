//! Configuration: a TOML file with serde defaults for every key, overridden by `LEAFD_*`
//! environment variables and CLI flags in `main`, validated once before anything starts.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

/// Whole-server configuration. Every field has a default, so an empty file is valid.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub segment: SegmentConfig,
    pub snowflake: SnowflakeConfig,
    pub http: HttpConfig,
    pub tls: TlsConfig,
    pub admin: AdminConfig,
}

/// Who may run admin commands (LEAF.TAG, CONFIG, SHUTDOWN, the HTTP tag endpoints) when no
/// password or user is configured.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Without a password, admin commands are refused from other hosts unless this is true
    /// (named so that nobody sets it by accident).
    pub allow_unauthenticated: bool,
}

/// TLS (rustls) for the RESP and HTTP listeners, from PEM files. Off unless `bind` or `http`
/// asks for it.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Address of a RESP-over-TLS listener (Redis' `tls-port`), beside the plain one.
    pub bind: Option<String>,
    /// Serve the HTTP listener over TLS (HTTPS) with the same certificate.
    pub http: bool,
    /// The server's certificate chain, leaf first (PEM).
    pub cert_file: Option<String>,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<String>,
    /// When set, clients must present a certificate signed by one of these CAs (mutual TLS).
    pub client_ca_file: Option<String>,
    /// A client that has not finished its TLS handshake within this many ms is dropped.
    pub handshake_timeout_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            bind: None,
            http: false,
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            handshake_timeout_ms: 10_000,
        }
    }
}

impl TlsConfig {
    /// True when some listener serves TLS.
    pub fn enabled(&self) -> bool {
        self.bind.is_some() || self.http
    }

    pub fn handshake_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.handshake_timeout_ms)
    }
}

/// The HTTP listener: `/metrics`, `/health`, `/ready` and Leaf's HTTP API.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub enabled: bool,
    pub bind: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: "127.0.0.1:9380".into(),
        }
    }
}

/// The RESP listener and its per-client limits.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the plaintext RESP listener; empty for none (then `tls.bind` serves RESP).
    pub bind: String,
    /// Connections beyond this get `-ERR max number of clients reached` and are closed.
    pub max_clients: usize,
    /// Close a connection that sent no complete command for this many seconds (a client that
    /// trickles a partial frame counts as idle); 0 disables it.
    pub idle_timeout_secs: u64,
    /// Close a connection that has not read its replies for this many seconds (it pipelines
    /// without reading); 0 waits for ever. Memory stays bounded either way.
    pub write_timeout_secs: u64,
    /// When set, clients must AUTH (or HELLO … AUTH) before any other command; it is the
    /// password of the `default` user, who may run admin commands.
    pub requirepass: Option<String>,
    /// Further users (`[[server.users]]`); only those with `admin = true` may run LEAF.TAG.
    pub users: Vec<UserConfig>,
    /// Largest block one `INCRBY segment:<tag> <n>` may take.
    pub max_incrby: i64,
    /// At shutdown, commands in flight get this long to finish before leafd stops anyway.
    pub shutdown_timeout_secs: u64,
    /// Most commands one MULTI may queue; one more makes EXEC abort.
    pub max_multi_commands: usize,
    /// As Redis: with no password or user configured, clients from other hosts are refused
    /// (one `-DENIED` reply, then the connection closes); loopback clients are served.
    pub protected_mode: bool,
    /// Threads that serve client connections, each running its own event loop (a connection
    /// stays on one thread); 0 picks half the CPU cores, at least one.
    pub io_threads: usize,
    pub max_inline_len: usize,
    pub max_bulk_len: usize,
    pub max_array_len: usize,
    pub max_request_len: usize,
}

/// More connection threads than this is a typo, not a tuning.
const MAX_IO_THREADS: usize = 1024;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:6380".into(),
            max_clients: 10_000,
            idle_timeout_secs: 0,
            write_timeout_secs: 30,
            requirepass: None,
            users: Vec::new(),
            max_incrby: 100_000,
            shutdown_timeout_secs: 10,
            max_multi_commands: 10_000,
            protected_mode: true,
            io_threads: 0,
            max_inline_len: 64 * 1024,
            max_bulk_len: 512 * 1024,
            max_array_len: 1024,
            max_request_len: 4 * 1024 * 1024,
        }
    }
}

/// A user that can AUTH with a name and password.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    pub password: String,
    /// May run administrative commands (LEAF.TAG CREATE/STEP).
    #[serde(default)]
    pub admin: bool,
}

impl fmt::Debug for UserConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserConfig")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .field("admin", &self.admin)
            .finish()
    }
}

impl Config {
    /// The address of this node's RESP service, as other nodes would name it: the plaintext
    /// listener's, or the TLS listener's when there is no plaintext one.
    pub fn resp_bind(&self) -> &str {
        match (&self.server.bind, &self.tls.bind) {
            (plain, Some(tls)) if plain.is_empty() => tls,
            (plain, _) => plain,
        }
    }
}

impl ServerConfig {
    /// How many connection threads to run: `io_threads`, or half the CPU cores when it is 0.
    /// Half, because a thread that owns its connections serves them without cross-core
    /// wake-ups, and the kernel's network stack, the database client and the HTTP listener
    /// need the other cores.
    pub fn effective_io_threads(&self) -> usize {
        if self.io_threads > 0 {
            return self.io_threads;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).max(1)
    }

    /// True when clients must authenticate: a `requirepass` or any user is configured.
    pub fn auth_required(&self) -> bool {
        self.requirepass.is_some() || !self.users.is_empty()
    }
}

impl fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("bind", &self.bind)
            .field("max_clients", &self.max_clients)
            .field("idle_timeout_secs", &self.idle_timeout_secs)
            .field("write_timeout_secs", &self.write_timeout_secs)
            .field(
                "requirepass",
                &self.requirepass.as_ref().map(|_| "<redacted>"),
            )
            .field("users", &self.users)
            .field("max_incrby", &self.max_incrby)
            .field("io_threads", &self.io_threads)
            .field("max_inline_len", &self.max_inline_len)
            .field("max_bulk_len", &self.max_bulk_len)
            .field("max_array_len", &self.max_array_len)
            .field("max_request_len", &self.max_request_len)
            .finish()
    }
}

/// Where segments are stored: `sqlite://path`, `mysql://…` or `postgres://…`.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    pub url: String,
    pub max_connections: u32,
    /// How long a database call may wait for a pooled connection, in milliseconds.
    pub acquire_timeout_ms: u64,
    /// Create or upgrade the schema at start; turn off where schemas are managed by hand
    /// (`leafd migrate`), and leafd then refuses to start if `leaf_alloc` is missing.
    pub migrate: bool,
    /// Directory of this node's own durable state (the snowflake time fence, the segment
    /// high-water marks). Empty: the SQLite database's directory, else `data`.
    pub state_dir: String,
    /// Start even though both slots of the segment marks exist and neither can be read. The
    /// node then no longer refuses a range a restored or failed-over database hands out again
    /// that this node already served: set it only after moving every tag past what was served
    /// (`LEAF.TAG SKIPALL`), or when the marks are known to hold nothing that matters.
    pub discard_unreadable_marks: bool,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://data/leafd.db".into(),
            max_connections: 8,
            acquire_timeout_ms: 1000,
            migrate: true,
            state_dir: String::new(),
            discard_unreadable_marks: false,
        }
    }
}

impl StorageConfig {
    /// `state_dir`, else the directory of the SQLite database, else `data`.
    pub fn state_dir(&self) -> std::path::PathBuf {
        if !self.state_dir.is_empty() {
            return self.state_dir.clone().into();
        }
        self.url
            .strip_prefix("sqlite://")
            .map(|rest| rest.split('?').next().unwrap_or(rest))
            .filter(|path| !path.is_empty() && !path.starts_with(':'))
            .map(|path| {
                std::path::Path::new(path)
                    .parent()
                    .map(|p| p.to_path_buf())
                    .unwrap_or_default()
            })
            .unwrap_or_else(|| "data".into())
    }

    /// Where the segment high-water marks are kept.
    pub fn marks_path(&self) -> std::path::PathBuf {
        self.state_dir().join("segment-marks.json")
    }

    pub fn acquire_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.acquire_timeout_ms)
    }

    /// The URL with any password replaced, for logs.
    pub fn redacted_url(&self) -> String {
        redact_url_password(&self.url)
    }
}

impl fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageConfig")
            .field("url", &self.redacted_url())
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .field("migrate", &self.migrate)
            .field("state_dir", &self.state_dir)
            .field("discard_unreadable_marks", &self.discard_unreadable_marks)
            .finish()
    }
}

fn redact_url_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:<redacted>{}",
            &url[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        ),
        _ => url.to_string(),
    }
}

/// The segment engine: Leaf's double buffer and adaptive step.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SegmentConfig {
    /// How often the tag list is re-read from the database, in seconds.
    pub refresh_interval_secs: u64,
    /// Leaf's adaptive step: double when a segment lasted < 15 min, halve when > 30 min.
    pub adaptive_step: bool,
    /// Upper bound of the adaptive step and of `LEAF.TAG` steps.
    pub max_step: i64,
    /// Longest a request waits for a segment load when both buffers are empty, in ms.
    pub load_timeout_ms: u64,
    /// Most tags `LEAF.TAG CREATE` (and the HTTP endpoint) may bring the table to.
    pub max_tags: usize,
    /// Tags created at start when absent (`[[segment.tags]]`).
    pub tags: Vec<TagSeed>,
}

impl Default for SegmentConfig {
    fn default() -> Self {
        Self {
            refresh_interval_secs: 60,
            adaptive_step: true,
            max_step: 1_000_000,
            load_timeout_ms: 1000,
            max_tags: 10_000,
            tags: Vec::new(),
        }
    }
}

/// Where the snowflake worker id comes from.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
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
}

/// The snowflake engine and its worker id.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SnowflakeConfig {
    pub enabled: bool,
    /// Milliseconds since the UNIX epoch at which timestamps start (Twitter's by default).
    pub epoch_ms: u64,
    pub timestamp_bits: u32,
    pub worker_id_bits: u32,
    pub sequence_bits: u32,
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
#[derive(Clone, Debug, Deserialize)]
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
            cache_file: "data/snowflake-worker.json".into(),
        }
    }
}

/// A tag to create at start if the table does not have it yet.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagSeed {
    pub tag: String,
    pub step: i64,
    /// The first ID the tag hands out.
    #[serde(default = "default_start")]
    pub start: i64,
    #[serde(default)]
    pub description: Option<String>,
}

fn default_start() -> i64 {
    1
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: String,
        source: Box<toml::de::Error>,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads a TOML file; keys it leaves out keep their defaults.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                source,
            },
            other => other,
        })
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: "<inline>".into(),
            source: Box::new(source),
        })
    }

    /// Refuses values that would make the server misbehave rather than fail at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        if self.server.bind.is_empty() {
            if self.tls.bind.is_none() {
                return invalid(
                    "server.bind may only be empty (no plaintext listener) when tls.bind is set"
                        .into(),
                );
            }
        } else if self.server.bind.parse::<SocketAddr>().is_err() {
            return invalid(format!(
                "server.bind '{}' is not an ip:port address",
                self.server.bind
            ));
        }
        if self.http.enabled && self.http.bind.parse::<SocketAddr>().is_err() {
            return invalid(format!(
                "http.bind '{}' is not an ip:port address",
                self.http.bind
            ));
        }
        if let Some(bind) = &self.tls.bind {
            if bind.parse::<SocketAddr>().is_err() {
                return invalid(format!("tls.bind '{bind}' is not an ip:port address"));
            }
        }
        if self.tls.enabled() {
            if self.tls.cert_file.is_none() || self.tls.key_file.is_none() {
                return invalid("tls: cert_file and key_file are required for TLS".into());
            }
            if self.tls.handshake_timeout_ms == 0 {
                return invalid("tls.handshake_timeout_ms must be > 0".into());
            }
        }
        if self.tls.http && !self.http.enabled {
            return invalid("tls.http = true needs http.enabled = true".into());
        }
        if self
            .server
            .users
            .iter()
            .any(|u| u.name.is_empty() || u.name == "default")
        {
            return invalid(
                "server.users: a name must be non-empty and not 'default' (use requirepass)".into(),
            );
        }
        if self.server.max_clients == 0 {
            return invalid("server.max_clients must be at least 1".into());
        }
        if self.server.max_incrby < 1 {
            return invalid("server.max_incrby must be at least 1".into());
        }
        if self.server.io_threads > MAX_IO_THREADS {
            return invalid(format!(
                "server.io_threads must be at most {MAX_IO_THREADS} (0 picks half the CPU cores)"
            ));
        }
        if self.server.max_multi_commands < 1 {
            return invalid("server.max_multi_commands must be at least 1".into());
        }
        if self.server.max_array_len < 3 || self.server.max_bulk_len < 128 {
            return invalid("server.max_array_len must be >= 3 and max_bulk_len >= 128".into());
        }
        if self.storage.max_connections == 0 {
            return invalid("storage.max_connections must be at least 1".into());
        }
        if !(1..=i32::MAX as i64).contains(&self.segment.max_step) {
            return invalid("segment.max_step must be between 1 and 2147483647".into());
        }
        if self.segment.refresh_interval_secs == 0 || self.segment.load_timeout_ms == 0 {
            return invalid("segment.refresh_interval_secs and load_timeout_ms must be > 0".into());
        }
        let sf = &self.snowflake;
        if sf.max_batch == 0 || sf.max_batch > 100_000 {
            return invalid("snowflake.max_batch must be between 1 and 100000".into());
        }
        if sf.coordinator == CoordinatorKind::Database && sf.database_lease_ms < 1000 {
            return invalid("snowflake.database_lease_ms must be at least 1000".into());
        }
        if !(100..=600_000).contains(&sf.fence_window_ms) {
            return invalid("snowflake.fence_window_ms must be between 100 and 600000".into());
        }
        let zk = &sf.zookeeper;
        if sf.coordinator == CoordinatorKind::Zookeeper {
            if !zk.root.starts_with('/') || zk.root.ends_with('/') || zk.cluster.contains('/') {
                return invalid(
                    "snowflake.zookeeper.root must start and not end with '/', cluster has no '/'"
                        .into(),
                );
            }
            if zk.report_interval_ms == 0 || zk.session_timeout_ms == 0 {
                return invalid("snowflake.zookeeper intervals must be > 0".into());
            }
            if zk.lease_ms < 2 * zk.report_interval_ms {
                return invalid(
                    "snowflake.zookeeper.lease_ms must be at least twice report_interval_ms".into(),
                );
            }
            if zk.reuse_after_secs != 0 && zk.reuse_after_secs * 1000 < 10 * zk.session_timeout_ms {
                return invalid(
                    "snowflake.zookeeper.reuse_after_secs must be 0 or at least 10 session timeouts"
                        .into(),
                );
            }
        }
        for seed in &self.segment.tags {
            if !(1..=self.segment.max_step).contains(&seed.step) {
                return invalid(format!(
                    "segment.tags '{}': step must be between 1 and {}",
                    seed.tag, self.segment.max_step
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        let cfg = Config::from_toml("").unwrap();
        assert_eq!(cfg.server.bind, "127.0.0.1:6380");
        assert_eq!(cfg.storage.url, "sqlite://data/leafd.db");
        assert_eq!(cfg.segment.refresh_interval_secs, 60);
        cfg.validate().unwrap();
    }

    #[test]
    fn example_file_is_valid_and_shows_the_defaults() {
        let example = Config::from_toml(include_str!("../leafd.example.toml")).unwrap();
        example.validate().unwrap();
        assert_eq!(
            format!("{example:?}"),
            format!("{:?}", Config::default()),
            "leafd.example.toml must list the defaults"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(matches!(
            Config::from_toml("[server]\nbindd = \"x\""),
            Err(ConfigError::Parse { .. })
        ));
        let cfg = Config::from_toml("[[segment.tags]]\ntag = \"a\"\nstep = 0").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("step must be between 1 and"), "{err}");
    }

    #[test]
    fn io_threads_default_to_half_the_cores_and_are_bounded() {
        let mut cfg = Config::from_toml("[server]\nio_threads = 3").unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.server.effective_io_threads(), 3);
        cfg.server.io_threads = 0;
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(cfg.server.effective_io_threads(), (cores / 2).max(1));
        cfg.server.io_threads = 5000;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(
            err.contains("server.io_threads must be at most 1024"),
            "{err}"
        );
    }

    #[test]
    fn plaintext_listener_may_be_off_only_with_a_tls_listener() {
        let mut cfg = Config::from_toml("[server]\nbind = \"\"").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("only be empty"), "{err}");
        cfg.tls = TlsConfig {
            bind: Some("10.0.0.5:6390".into()),
            cert_file: Some("c.pem".into()),
            key_file: Some("k.pem".into()),
            ..TlsConfig::default()
        };
        cfg.validate().unwrap();
        assert_eq!(cfg.resp_bind(), "10.0.0.5:6390");
        cfg.server.bind = "10.0.0.5:6380".into();
        assert_eq!(cfg.resp_bind(), "10.0.0.5:6380");
    }

    #[test]
    fn debug_output_hides_secrets() {
        let cfg = Config::from_toml(
            "[server]\nrequirepass = \"hunter2\"\n[storage]\nurl = \"mysql://root:s3cret@db:3306/leaf\"",
        )
        .unwrap();
        let shown = format!("{:?} {:?}", cfg.server, cfg.storage);
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret"),
            "{shown}"
        );
        assert!(
            shown.contains("mysql://root:<redacted>@db:3306/leaf"),
            "{shown}"
        );
    }
}
