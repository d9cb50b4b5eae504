//! The wiring: opens storage, starts the engines and the snowflake worker id, builds the
//! [`Context`] every connection shares, and owns the background tasks.

mod snowflake;

pub use snowflake::snowflake_layout;
use snowflake::{start_snowflake, StartedSnowflake};

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::config::{Config, ConfigError, CoordinatorKind, SegmentConfig};
use crate::context::Context;
use crate::coord::{CoordError, Worker};
use crate::engine::segment::{validate_tag_name, MAX_TAG_START};
use crate::engine::segment::{
    AutoCreate, Calendar, Interleave, OpaqueCipher, PeriodRule, SegmentEngine, SegmentError,
    SegmentSettings,
};
use crate::metrics::Metrics;
use crate::storage::{self, DeferredStore, OnRuntime, SegmentMarks, SegmentStore, StoreError};

/// Why the application could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    #[error("cannot create configured tag '{tag}': {source}")]
    Seed { tag: String, source: SegmentError },
    #[error("snowflake worker id: {0}")]
    Coord(#[from] CoordError),
}

/// The wiring around the [`Context`]: what keeps the worker id and the background tasks.
/// Reads of the shared state go through to the context.
pub struct App {
    pub context: Arc<Context>,
    worker: tokio::sync::Mutex<Option<Worker>>,
    background: CancellationToken,
    clock: Arc<dyn Clock>,
}

impl std::ops::Deref for App {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.context
    }
}

/// Everything a configuration must satisfy before leafd starts: its own checks
/// ([`Config::validate`]) and the engines' rules (the snowflake layout, tag names).
pub fn validate_config(config: &Config) -> Result<(), ConfigError> {
    config.validate()?;
    let invalid = |msg: String| Err(ConfigError::Invalid(msg));
    let sf = &config.snowflake;
    let layout = snowflake_layout(sf);
    layout.validate().or_else(invalid)?;
    if sf.coordinator == CoordinatorKind::Static && sf.worker_id > layout.max_worker_id() {
        return invalid(format!(
            "snowflake.worker_id {} does not fit in {} bits",
            sf.worker_id, sf.worker_id_bits
        ));
    }
    for seed in &config.segment.tags {
        validate_tag_name(&seed.tag)
            .or_else(|e| invalid(format!("segment.tags '{}': {e}", seed.tag)))?;
        if !(1..=MAX_TAG_START).contains(&seed.start) {
            return invalid(format!(
                "segment.tags '{}': start must be between 1 and {MAX_TAG_START}",
                seed.tag
            ));
        }
    }
    for entry in &config.segment.opaque {
        validate_tag_name(&entry.tag)
            .or_else(|e| invalid(format!("segment.opaque '{}': {e}", entry.tag)))?;
    }
    Ok(())
}

/// A `[[segment.tags]]` entry's period rule (its time zone was checked on load).
fn period_rule(seed: &crate::config::TagSeed) -> Option<PeriodRule> {
    use crate::config::Period;
    let calendar = match seed.period? {
        Period::Daily => Calendar::Day,
        Period::Monthly => Calendar::Month,
        Period::Yearly => Calendar::Year,
    };
    let zone = jiff::tz::TimeZone::get(&seed.time_zone).ok()?;
    Some(PeriodRule::new(
        calendar,
        zone,
        &seed.time_zone,
        seed.sequence_digits,
        &seed.prefix,
    ))
}

/// The segment engine's tuning from the `[segment]` section.
fn segment_settings(c: &SegmentConfig) -> SegmentSettings {
    SegmentSettings {
        adaptive_step: c.adaptive_step,
        max_step: c.max_step,
        load_timeout: Duration::from_millis(c.load_timeout_ms),
        max_tags: c.max_tags,
        failover_margin: c.failover_margin,
        interleave: Interleave {
            delta: c.id_delta,
            remainder: c.id_remainder,
        },
        tag_interleave: c
            .tags
            .iter()
            .filter(|seed| seed.delta.is_some() || seed.remainder.is_some())
            .map(|seed| {
                let interleave = Interleave {
                    delta: seed.delta.unwrap_or(c.id_delta),
                    remainder: seed.remainder.unwrap_or(0),
                };
                (seed.tag.clone(), interleave)
            })
            .collect(),
        opaque: c
            .opaque
            .iter()
            .map(|entry| {
                let cipher = OpaqueCipher::new(c.opaque_key.as_bytes(), &entry.tag, entry.digits);
                (entry.tag.clone(), Arc::new(cipher))
            })
            .collect(),
        strict: c
            .tags
            .iter()
            .filter(|seed| seed.order == crate::config::TagOrder::Strict)
            .map(|seed| seed.tag.clone())
            .collect(),
        period: c
            .tags
            .iter()
            .filter_map(|seed| Some((seed.tag.clone(), Arc::new(period_rule(seed)?))))
            .collect(),
        configured: c
            .tags
            .iter()
            .map(|seed| seed.tag.clone())
            .chain(c.opaque.iter().map(|entry| entry.tag.clone()))
            .collect(),
        auto_create: c.auto_create.then(|| {
            let pattern = crate::cmd::glob::Glob::case_sensitive(c.auto_create_pattern.as_bytes());
            AutoCreate {
                allows: Arc::new(move |tag: &str| pattern.matches(tag.as_bytes())),
                step: c.auto_create_step,
            }
        }),
    }
}

impl App {
    /// Validates the config, opens and migrates the configured store, and starts the engine.
    /// A database that is merely unreachable does not stop the start: segment commands reply
    /// `UNAVAILABLE` while a background task keeps connecting. A bad URL, wrong credentials or a
    /// failed migration are errors.
    pub async fn open(config: Config) -> Result<Arc<App>, AppError> {
        App::open_with_clock(config, Arc::new(SystemClock)).await
    }

    /// [`App::open`] with a given clock (tests shift it to exercise the clock rules).
    pub async fn open_with_clock(
        config: Config,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<App>, AppError> {
        validate_config(&config)?;
        match storage::open(&config.storage, config.storage.migrate).await {
            Ok(store) => App::with_store(config, store, clock).await,
            Err(err) if err.is_transient() => {
                tracing::error!(
                    storage = %config.storage.redacted_url(),
                    error = %err,
                    "database unreachable at start; segment commands reply UNAVAILABLE until it is reachable"
                );
                let backend = storage::backend_of(&config.storage.url).unwrap_or("unknown");
                let deferred = DeferredStore::new(backend, err.to_string());
                let marks = SegmentMarks::open(
                    config.storage.marks_path(),
                    config.storage.discard_unreadable_marks,
                )?;
                // The database coordinator leases its worker id from that database: it starts
                // once the database answers, and SNOWFLAKE replies UNAVAILABLE until then.
                let snowflake = if config.snowflake.coordinator == CoordinatorKind::Database {
                    StartedSnowflake::default()
                } else {
                    start_snowflake(&config, None, clock.clone()).await?
                };
                let app = App::build(config, deferred.clone(), marks, clock, snowflake);
                app.spawn_connector(deferred);
                Ok(app)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Starts the application on a given store and clock (tests use wrappers and fakes here).
    pub async fn with_store(
        config: Config,
        store: Arc<dyn SegmentStore>,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<App>, AppError> {
        let marks = SegmentMarks::open(
            config.storage.marks_path(),
            config.storage.discard_unreadable_marks,
        )?;
        // The marks of this database only (before any allocation).
        marks.scope_to(store.identity().await?.as_ref());
        let snowflake =
            start_snowflake(&config, store.clone().worker_leases(), clock.clone()).await?;
        let app = App::build(config, store, marks, clock, snowflake);
        app.initialise_storage().await?;
        Ok(app)
    }

    fn build(
        config: Config,
        store: Arc<dyn SegmentStore>,
        marks: Arc<SegmentMarks>,
        clock: Arc<dyn Clock>,
        started: StartedSnowflake,
    ) -> Arc<App> {
        // Without an HTTP listener nobody can scrape, so nothing is recorded.
        let metrics = Arc::new(if config.http.enabled {
            Metrics::new(&crate::cmd::table::names()).with_tag_series(config.http.metrics_tags)
        } else {
            Metrics::disabled()
        });
        // Commands run on the connection threads; their database calls run here.
        let store: Arc<dyn SegmentStore> =
            Arc::new(OnRuntime::new(store, tokio::runtime::Handle::current()));
        let segments = SegmentEngine::new(
            store,
            marks,
            segment_settings(&config.segment),
            clock.clone(),
            metrics.clone(),
        );
        let background = CancellationToken::new();
        segments.spawn_refresher(
            Duration::from_secs(config.segment.refresh_interval_secs),
            background.clone(),
        );
        let layout = snowflake_layout(&config.snowflake);
        Arc::new(App {
            context: Arc::new(Context::new(
                config,
                layout,
                segments,
                metrics,
                started.engine,
                started.coordinator,
            )),
            worker: tokio::sync::Mutex::new(started.worker),
            background,
            clock,
        })
    }

    /// Creates the configured tags that are missing and loads the tag list.
    async fn initialise_storage(&self) -> Result<(), AppError> {
        for seed in &self.config.segment.tags {
            let created = self
                .segments
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
        self.segments.refresh_tags().await?;
        self.context.set_storage_ready();
        Ok(())
    }

    /// The database coordinator's start, put off while the database was down: obtains the worker
    /// id (retrying while no id is free or the database fails again) and installs the engine.
    async fn start_deferred_snowflake(&self, store: &Arc<dyn SegmentStore>) {
        let config = &self.config;
        if !config.snowflake.enabled
            || config.snowflake.coordinator != CoordinatorKind::Database
            || self.snowflake().is_some()
        {
            return;
        }
        let mut backoff = Duration::from_millis(250);
        loop {
            match start_snowflake(config, store.clone().worker_leases(), self.clock.clone()).await {
                Ok(started) => {
                    if let Some(engine) = started.engine {
                        if self.context.install_snowflake(engine).is_err() {
                            // Another start installed one first: give this worker id back.
                            if let Some(worker) = started.worker {
                                worker.close(None).await;
                            }
                            return;
                        }
                    }
                    *self.worker.lock().await = started.worker;
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "database reachable but no snowflake worker id yet; retrying");
                    self.context.set_snowflake_refused(e.to_string());
                }
            }
            tokio::select! {
                _ = self.background.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            // Capped at a second: a node serves again within about a second of the database's
            // return, one connection attempt per second while it is down.
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Keeps trying to open the database (backing off from 250 ms up to 1 s) until it answers.
    fn spawn_connector(self: &Arc<Self>, deferred: Arc<DeferredStore>) {
        let app = self.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(250);
            loop {
                tokio::select! {
                    _ = app.background.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                let opened =
                    match storage::open(&app.config.storage, app.config.storage.migrate).await {
                        // The marks of this database only, before the first allocation can run.
                        Ok(store) => match store.identity().await {
                            Ok(identity) => {
                                app.segments.marks().scope_to(identity.as_ref());
                                Ok(store)
                            }
                            Err(e) => Err(e),
                        },
                        Err(e) => Err(e),
                    };
                match opened {
                    Ok(store) => {
                        let leases = store.clone();
                        deferred.connect(store);
                        match app.initialise_storage().await {
                            Ok(()) => tracing::info!("database reachable: segment service started"),
                            Err(e) => {
                                tracing::error!(error = %e, "database reachable but initialisation failed; the periodic refresh retries")
                            }
                        }
                        app.start_deferred_snowflake(&leases).await;
                        return;
                    }
                    Err(e) if e.is_transient() => {
                        deferred.set_error(e.to_string());
                        // Capped at a second: a node serves again within about a second of the database's
                        // return, one connection attempt per second while it is down.
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "database refused leafd; segment commands stay UNAVAILABLE until the configuration is fixed");
                        deferred.set_error(e.to_string());
                        return;
                    }
                }
            }
        });
    }

    /// Stops background tasks, releases the worker id and closes the database pool.
    pub async fn close(&self) {
        self.background.cancel();
        if let Some(worker) = self.worker.lock().await.take() {
            // Stop issuing first; then the last timestamp issued is final.
            let last_issued = self.snowflake().map(|engine| {
                engine
                    .limit()
                    .set_lease(0, Some("leafd is shutting down".into()));
                engine.last_timestamp_ms()
            });
            worker.close(last_issued).await;
        }
        self.segments.store().close().await;
        self.segments.marks().close().await;
    }
}
