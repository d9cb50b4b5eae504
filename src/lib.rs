//! leafd: a distributed unique-ID server (Meituan Leaf's segment scheme) spoken over RESP.
//!
//! The whole server is [`run::run`] (or [`run::Server`], which also reports the addresses it
//! bound); `main` only parses the command line and calls it.
//!
//! Module map, from the top (arrows point down; `tests/dependency_rule.rs` checks them):
//! - [`run`]: binds the listeners, opens the application, serves, drains, closes.
//! - [`server`]: the RESP listeners and the per-connection loop on I/O threads.
//! - [`http`]: `/metrics`, Leaf's HTTP API, `/cache`, admin, `/health` and `/ready`.
//! - [`app`]: wiring of config, storage, coordinators and engines into one application state.
//! - [`cmd`]: one file per command family; a parsed command yields a [`protocol::Reply`].
//! - [`context`]: what commands, HTTP handlers and connections see (the engines, the config, the
//!   counters), built by the app; it copies engine state into the metrics at each scrape.
//! - [`metrics`]: metric names, histograms, per-batch counters and the Prometheus registry.
//! - [`access`], [`auth`], [`tls`]: who may connect and run what; rustls from PEM files.
//! - [`engine::segment`], [`engine::snowflake`]: the two ID engines.
//! - [`coord`]: snowflake worker ids (static, database, ZooKeeper), the time fence, [`coord::IssueLimit`].
//! - [`storage`]: the [`storage::SegmentStore`] trait, one implementation per database dialect.
//! - [`clock`], [`protocol`], [`config`]: import nothing from the crate.

pub mod access;
pub mod app;
pub mod auth;
pub mod clock;
pub mod cmd;
pub mod config;
pub mod context;
pub mod coord;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod protocol;
pub mod run;
pub mod server;
pub mod storage;
pub mod tls;
