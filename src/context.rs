//! What commands, HTTP handlers and connections see of the server: the engines, the
//! configuration, the counters, and the few things they may ask of it. The app builds it.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::coord::CoordinatorStatus;
use crate::engine::segment::SegmentEngine;
use crate::engine::snowflake::{Layout, SnowflakeEngine};
use crate::metrics::Metrics;

/// Connection counters for INFO.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connected_clients: AtomicUsize,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub total_commands: AtomicU64,
}

/// The state shared by every connection and request.
pub struct Context {
    pub config: Config,
    /// The layout `[snowflake]` describes (LEAF.DECODE works even with snowflake disabled).
    pub snowflake_layout: Layout,
    pub segments: Arc<SegmentEngine>,
    pub metrics: Arc<Metrics>,
    /// Empty when `snowflake.enabled = false`, and until the worker id is held (the database
    /// coordinator waits for a database that was down at start). Set once: every SNOWFLAKE
    /// reads it, and a set-once cell is one atomic load where a swappable pointer cost ~50
    /// instructions per request (callgrind, bench/instructions.sh).
    snowflake: std::sync::OnceLock<Arc<SnowflakeEngine>>,
    /// Why there is no engine yet, once the database has answered and the worker id was
    /// still refused (a layout change, no free id); read only when there is no engine.
    snowflake_refused: std::sync::Mutex<Option<String>>,
    /// The state of the coordinator's link to its service (ZooKeeper), when it has one.
    pub coordinator: Option<Arc<dyn CoordinatorStatus>>,
    pub stats: ServerStats,
    /// What CLIENT LIST shows of every connected client.
    pub clients: ClientRegistry,
    pub started_at: Instant,
    storage_ready: AtomicBool,
    /// Set when the listeners stopped taking clients (SIGTERM, SHUTDOWN): not ready any more.
    draining: AtomicBool,
    next_client_id: AtomicU64,
    local_port: AtomicU16,
    tls_port: AtomicU16,
    /// Cancelled by the SHUTDOWN command: the listeners stop as on SIGTERM.
    shutdown: CancellationToken,
}

impl Context {
    pub fn new(
        config: Config,
        snowflake_layout: Layout,
        segments: Arc<SegmentEngine>,
        metrics: Arc<Metrics>,
        snowflake: Option<Arc<SnowflakeEngine>>,
        coordinator: Option<Arc<dyn CoordinatorStatus>>,
    ) -> Context {
        Context {
            config,
            snowflake_layout,
            segments,
            metrics,
            snowflake: snowflake.map(std::sync::OnceLock::from).unwrap_or_default(),
            snowflake_refused: std::sync::Mutex::new(None),
            coordinator,
            stats: ServerStats::default(),
            clients: ClientRegistry::default(),
            started_at: Instant::now(),
            storage_ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            next_client_id: AtomicU64::new(1),
            local_port: AtomicU16::new(0),
            tls_port: AtomicU16::new(0),
            shutdown: CancellationToken::new(),
        }
    }

    /// The Prometheus exposition: engine and connection state is copied into gauges and
    /// counters here, at scrape time, so the request path never touches the registry.
    pub fn render_metrics(&self) -> String {
        use crate::metrics::*;
        let m = &self.metrics;
        let stats = &self.stats;
        m.gauge(CONNECTIONS_OPEN, &[])
            .set(stats.connected_clients.load(Ordering::Relaxed) as f64);
        m.counter(CONNECTIONS_TOTAL, &[])
            .absolute(stats.total_connections.load(Ordering::Relaxed));
        m.counter(CONNECTIONS_REJECTED_TOTAL, &[])
            .absolute(stats.rejected_connections.load(Ordering::Relaxed));
        m.gauge(
            BUILD_INFO,
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", env!("LEAFD_COMMIT")),
            ],
        )
        .set(1.0);
        m.gauge(STORAGE_READY, &[])
            .set(self.storage_ready() as u8 as f64);
        m.counter(SEGMENT_REQUEST_WAITS_TOTAL, &[])
            .absolute(self.segments.stats().request_waits.load(Ordering::Relaxed));
        let stats = self.segments.stats();
        for (result, count) in [
            ("paid", &stats.strict_gathers_paid),
            ("missed", &stats.strict_gathers_missed),
        ] {
            m.counter(SEGMENT_STRICT_GATHERS_TOTAL, &[("result", result)])
                .absolute(count.load(Ordering::Relaxed));
        }
        if let Some(engine) = self.snowflake_now() {
            let st = engine.stats();
            m.counter(SNOWFLAKE_IDS_TOTAL, &[])
                .absolute(engine.ids_served());
            m.counter(SNOWFLAKE_SEQUENCE_WAITS_TOTAL, &[])
                .absolute(st.sequence_waits.load(Ordering::Relaxed));
            m.counter(SNOWFLAKE_CLOCK_BACKWARD_TOTAL, &[])
                .absolute(st.clock_backward_events.load(Ordering::Relaxed));
            m.gauge(SNOWFLAKE_WORKER_ID, &[])
                .set(engine.worker_id() as f64);
            let worker = engine.worker_id().to_string();
            let coordinator = match self.config.snowflake.coordinator {
                crate::config::CoordinatorKind::Database => "database",
                crate::config::CoordinatorKind::Etcd => "etcd",
                crate::config::CoordinatorKind::Zookeeper => "zookeeper",
                crate::config::CoordinatorKind::Static => "static",
            };
            m.gauge(
                SNOWFLAKE_WORKER_INFO,
                &[("worker_id", worker.as_str()), ("coordinator", coordinator)],
            )
            .set(1.0);
            let now = SystemClock.now_millis() as f64;
            let limit = engine.limit();
            m.gauge(SNOWFLAKE_FENCE_AHEAD_SECONDS, &[])
                .set((limit.fence_ms() as f64 - now) / 1000.0);
            m.counter(SNOWFLAKE_LEASE_FAILURES_TOTAL, &[])
                .absolute(limit.lease_failures());
            if limit.lease_ms() != u64::MAX {
                m.gauge(SNOWFLAKE_LEASE_REMAINING_SECONDS, &[])
                    .set(((limit.lease_ms() as f64 - now) / 1000.0).max(0.0));
            }
        }
        if let Some(status) = &self.coordinator {
            if let Some((connected, age)) = coordinator_metrics(status.kind()) {
                m.gauge(connected, &[]).set(status.connected() as u8 as f64);
                let now = SystemClock.now_millis();
                m.gauge(age, &[])
                    .set(now.saturating_sub(status.last_report_ms()) as f64 / 1000.0);
            }
        }
        let mut out = m.render();
        if m.enabled() {
            let figures = self.segments.used_snapshot().into_iter().map(|t| {
                let remaining = |s: Option<crate::engine::segment::Segment>| {
                    s.map_or(0, |s| s.remaining().max(0))
                };
                TagFigures {
                    order: t.order,
                    served: t.served,
                    loads_ok: t.loads_ok,
                    loads_failed: t.loads_failed,
                    rollbacks: t.rollbacks,
                    failover_skips: t.failover_skips,
                    step: t.step,
                    remaining_current: remaining(t.current),
                    remaining_next: remaining(t.next),
                    // The next segment is loaded once the current one has no more than this left.
                    preload_threshold: t.current.map_or(0, |s| s.step * 9 / 10),
                    period: t.period,
                    tag: t.tag,
                }
            });
            render_tag_series(figures.collect(), m.tag_series(), &mut out);
        }
        out
    }

    /// Asks the listeners to stop and drain, as SIGTERM does (the SHUTDOWN command).
    pub fn request_shutdown(&self) {
        tracing::warn!("SHUTDOWN requested by a client: stopping as on SIGTERM");
        self.shutdown.cancel();
    }

    /// Completes once SHUTDOWN was requested.
    pub fn shutdown_requested(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.shutdown.cancelled()
    }

    /// True once the database answered and the tag list was loaded.
    pub fn storage_ready(&self) -> bool {
        self.storage_ready.load(Ordering::SeqCst)
    }

    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The port the RESP listener is bound to (0 before it is).
    pub fn local_port(&self) -> u16 {
        self.local_port.load(Ordering::Relaxed)
    }

    pub(crate) fn set_local_port(&self, port: u16) {
        self.local_port.store(port, Ordering::Relaxed);
    }

    /// The port of the RESP-over-TLS listener (0 when there is none).
    pub fn tls_port(&self) -> u16 {
        self.tls_port.load(Ordering::Relaxed)
    }

    pub(crate) fn set_tls_port(&self, port: u16) {
        self.tls_port.store(port, Ordering::Relaxed);
    }

    /// The snowflake engine, once this node holds a worker id.
    pub fn snowflake(&self) -> Option<Arc<SnowflakeEngine>> {
        self.snowflake.get().cloned()
    }

    /// Why this node holds no worker id yet, for the replies that say so.
    pub fn snowflake_missing_reason(&self) -> String {
        let refused = self
            .snowflake_refused
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match refused.as_deref() {
            Some(reason) => {
                format!("the database answered but the worker id was refused: {reason}")
            }
            None => "the database the coordinator leases it from has not answered since the start"
                .to_string(),
        }
    }

    /// Records why the deferred start of the worker id failed (it keeps retrying).
    pub fn set_snowflake_refused(&self, reason: String) {
        *self
            .snowflake_refused
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(reason);
    }

    /// The engine for the request path, without touching its reference count.
    pub fn snowflake_now(&self) -> Option<&Arc<SnowflakeEngine>> {
        self.snowflake.get()
    }

    /// Installs the engine of a worker id obtained after the start; a node has one worker id
    /// for its life, so a second engine is refused (and its worker id released by the caller).
    pub fn install_snowflake(
        &self,
        engine: Arc<SnowflakeEngine>,
    ) -> Result<(), Arc<SnowflakeEngine>> {
        self.snowflake.set(engine)
    }

    /// Marks the node as draining: `/ready` answers 503 from now on.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// `Ok` when a load balancer may send clients here, else why not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if self.draining.load(Ordering::SeqCst) {
            Err("draining: shutting down, new connections are refused")
        } else if !self.storage_ready() {
            Err("segment storage not connected")
        } else if self.config.snowflake.enabled && self.snowflake_now().is_none() {
            Err("no snowflake worker id held yet")
        } else {
            Ok(())
        }
    }

    /// Marks the database as answered and the tag list as loaded.
    pub fn set_storage_ready(&self) {
        self.storage_ready.store(true, Ordering::SeqCst);
    }
}

/// One connected client as CLIENT LIST shows it.
#[derive(Debug, Clone)]
pub struct ClientLine {
    pub id: u64,
    pub addr: String,
    pub name: String,
    pub created: Instant,
    pub resp: i64,
    pub lib_name: String,
    pub lib_ver: String,
}

/// Every connected client's line, set when it connects and when it names itself (CLIENT
/// SETNAME/SETINFO, HELLO, RESET), removed when it goes: a lock taken only then, never per ID.
#[derive(Debug, Default)]
pub struct ClientRegistry {
    lines: std::sync::Mutex<std::collections::BTreeMap<u64, ClientLine>>,
}

impl ClientRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, ClientLine>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set(&self, line: ClientLine) {
        self.lock().insert(line.id, line);
    }

    pub fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Every client, by id.
    pub fn lines(&self) -> Vec<ClientLine> {
        self.lock().values().cloned().collect()
    }
}
