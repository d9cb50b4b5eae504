//! leafd: a distributed unique-ID server (Meituan Leaf's segment scheme) spoken over RESP.
//!
//! Module map:
//! - [`config`]: the TOML/env/CLI configuration with defaults and validation.
//! - [`protocol`]: RESP request decoding (RESP arrays and inline commands) and reply encoding.
//! - [`cmd`]: one type per command family; a parsed command yields a [`protocol::Reply`].
//! - [`engine::segment`]: the double-buffered, database-backed segment allocator.
//! - [`storage`]: the [`storage::SegmentStore`] trait and its database implementations.
//! - [`server`]: the listener, per-connection loop and graceful shutdown.
//! - [`auth`]: users, passwords and roles shared by RESP and HTTP.
//! - [`tls`]: rustls configuration from PEM files for the RESP and HTTP listeners.
//! - [`app`]: wiring of config, storage and engines into one shared application state.

pub mod access;
pub mod app;
pub mod auth;
pub mod clock;
pub mod cmd;
pub mod config;
pub mod coord;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod protocol;
pub mod server;
pub mod storage;
pub mod tls;
