//! The application state shared by every connection: configuration, the segment engine and
//! its store, connection statistics, and the background tasks they own.

use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::engine::clock::{Clock, SystemClock};
use crate::engine::segment::{SegmentEngine, SegmentError, SegmentSettings};
use crate::storage::{self, SegmentStore, StoreError};

/// Why the application could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    #[error("cannot create configured tag '{tag}': {source}")]
    Seed { tag: String, source: SegmentError },
}

/// Connection counters for INFO.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connected_clients: AtomicUsize,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub total_commands: AtomicU64,
}

pub struct App {
    pub config: Config,
    pub segments: Arc<SegmentEngine>,
    pub stats: ServerStats,
    pub started_at: Instant,
    next_client_id: AtomicU64,
    local_port: AtomicU16,
    background: CancellationToken,
}

impl App {
    /// Validates the config, opens and migrates the configured store, and starts the engine.
    pub async fn open(config: Config) -> Result<Arc<App>, AppError> {
        config.validate()?;
        let store = storage::open(&config.storage, true).await?;
        App::with_store(config, store, Arc::new(SystemClock)).await
    }

    /// Starts the application on a given store and clock (tests use wrappers and fakes here).
    pub async fn with_store(
        config: Config,
        store: Arc<dyn SegmentStore>,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<App>, AppError> {
        let segments = SegmentEngine::new(store, SegmentSettings::from(&config.segment), clock);
        for seed in &config.segment.tags {
            let created = segments
                .ensure_tag(
                    &seed.tag,
                    seed.step,
                    seed.start,
                    seed.description.as_deref(),
                )
                .await
                .map_err(|source| AppError::Seed {
                    tag: seed.tag.clone(),
                    source,
                })?;
            if created {
                tracing::info!(tag = %seed.tag, step = seed.step, start = seed.start, "created configured tag");
            }
        }
        segments.refresh_tags().await?;
        let background = CancellationToken::new();
        segments.spawn_refresher(
            Duration::from_secs(config.segment.refresh_interval_secs),
            background.clone(),
        );
        Ok(Arc::new(App {
            config,
            segments,
            stats: ServerStats::default(),
            started_at: Instant::now(),
            next_client_id: AtomicU64::new(1),
            local_port: AtomicU16::new(0),
            background,
        }))
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

    /// Stops background tasks and closes the database pool.
    pub async fn close(&self) {
        self.background.cancel();
        self.segments.store().close().await;
    }
}
