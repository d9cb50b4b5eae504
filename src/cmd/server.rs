//! Server commands: COMMAND (from the command table), INFO, TIME and a read-only CONFIG GET.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::connection::REDIS_COMPAT_VERSION;
use super::glob::Glob;
use super::table::{self, CommandSpec, COMMANDS};
use super::{lossy, wrong_arity};
use crate::context::Context;
use crate::protocol::{ArgCursor, Reply};

fn command_info(spec: &CommandSpec) -> Reply {
    Reply::Array(vec![
        Reply::bulk(spec.name),
        Reply::Integer(spec.arity as i64),
        Reply::Array(
            spec.flags
                .iter()
                .map(|f| Reply::Simple((*f).into()))
                .collect(),
        ),
        Reply::Integer(spec.first_key),
        Reply::Integer(spec.last_key),
        Reply::Integer(spec.key_step),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
    ])
}

fn command_docs(spec: &CommandSpec) -> Reply {
    Reply::map([
        ("summary", Reply::bulk(spec.summary)),
        ("since", Reply::bulk("1.0.0")),
        ("group", Reply::bulk(spec.group)),
    ])
}

/// `COMMAND`, `COMMAND COUNT`, `COMMAND INFO [name…]`, `COMMAND DOCS [name…]`, `COMMAND LIST`.
pub fn command(args: &[&[u8]]) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let Some(sub) = cursor.optional() else {
        return Reply::Array(COMMANDS.iter().map(command_info).collect());
    };
    let names = cursor.rest();
    let selected = || -> Vec<&'static CommandSpec> {
        if names.is_empty() {
            COMMANDS.iter().collect()
        } else {
            names.iter().filter_map(|n| table::lookup(n)).collect()
        }
    };
    match sub.to_ascii_lowercase().as_slice() {
        b"count" if names.is_empty() => Reply::Integer(COMMANDS.len() as i64),
        b"list" if names.is_empty() => {
            Reply::Array(COMMANDS.iter().map(|c| Reply::bulk(c.name)).collect())
        }
        b"info" => {
            if names.is_empty() {
                return Reply::Array(COMMANDS.iter().map(command_info).collect());
            }
            Reply::Array(
                names
                    .iter()
                    .map(|n| table::lookup(n).map(command_info).unwrap_or(Reply::Null))
                    .collect(),
            )
        }
        b"docs" => Reply::Map(
            selected()
                .into_iter()
                .map(|c| (Reply::bulk(c.name), command_docs(c)))
                .collect(),
        ),
        b"help" if names.is_empty() => Reply::Array(
            [
                "COMMAND <subcommand> [<arg> ...]. Subcommands are:",
                "(no subcommand): every command's details, COUNT, LIST,",
                "INFO [<command-name> ...], DOCS [<command-name> ...], HELP",
            ]
            .into_iter()
            .map(|l| Reply::Simple(l.into()))
            .collect(),
        ),
        b"count" | b"list" | b"help" => wrong_arity("command"),
        _ => Reply::error(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            lossy(sub)
        )),
    }
}

/// `INFO [section …]`: server, clients, stats, persistence, replication, leafd, keyspace.
pub fn info(args: &[&[u8]], ctx: &Arc<Context>) -> Reply {
    let wanted: Vec<String> = ArgCursor::new(args)
        .rest()
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| w == "all" || w == "default" || w == "everything");
    let show = |section: &str| all || wanted.iter().any(|w| w == section);
    let mut out = String::new();
    let uptime = ctx.started_at.elapsed().as_secs();
    if show("server") {
        let _ = write!(
            out,
            "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nleafd_version:{}\r\n\
             redis_mode:standalone\r\nos:{} {}\r\narch_bits:64\r\nprocess_id:{}\r\n\
             tcp_port:{}\r\ntls_port:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH,
            std::process::id(),
            ctx.local_port(),
            ctx.tls_port(),
            uptime / 86_400,
        );
    }
    if show("clients") {
        let _ = write!(
            out,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\r\n",
            ctx.stats.connected_clients.load(Ordering::Relaxed),
            ctx.config.server.max_clients,
        );
    }
    if show("stats") {
        let _ = write!(
            out,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\
             rejected_connections:{}\r\n\r\n",
            ctx.stats.total_connections.load(Ordering::Relaxed),
            ctx.stats.total_commands.load(Ordering::Relaxed),
            ctx.stats.rejected_connections.load(Ordering::Relaxed),
        );
    }
    if show("memory") {
        let rss = resident_bytes();
        let _ = write!(
            out,
            "# Memory\r\nused_memory:{rss}\r\nused_memory_human:{:.2}M\r\nused_memory_rss:{rss}\r\n\
             maxmemory:0\r\nmaxmemory_policy:noeviction\r\n\r\n",
            rss as f64 / (1024.0 * 1024.0)
        );
    }
    if show("persistence") {
        out.push_str("# Persistence\r\nloading:0\r\n\r\n");
    }
    if show("replication") {
        out.push_str("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n");
    }
    if show("leafd") {
        let seg = ctx.segments.stats();
        let _ = write!(
            out,
            "# Leafd\r\nsegment_storage:{}\r\nsegment_storage_ready:{}\r\nsegment_tags:{}\r\nsegment_ids_served:{}\r\n\
             segment_loads_ok:{}\r\nsegment_loads_failed:{}\r\nsegment_request_waits:{}\r\n",
            ctx.segments.store().backend(),
            ctx.storage_ready() as u8,
            ctx.segments.tag_count(),
            ctx.segments.used_snapshot().iter().map(|t| t.served).sum::<u64>(),
            seg.loads_ok.load(Ordering::Relaxed),
            seg.loads_failed.load(Ordering::Relaxed),
            seg.request_waits.load(Ordering::Relaxed),
        );
    }
    if show("leafd") {
        if let Some(engine) = ctx.snowflake_now() {
            let st = engine.stats();
            let _ = write!(
                out,
                "snowflake_worker_id:{}\r\nsnowflake_ids_served:{}\r\nsnowflake_sequence_waits:{}\r\n\
                 snowflake_clock_backward_events:{}\r\n",
                engine.worker_id(),
                engine.ids_served(),
                st.sequence_waits.load(Ordering::Relaxed),
                st.clock_backward_events.load(Ordering::Relaxed),
            );
        }
        if let Some(status) = &ctx.coordinator {
            let age = crate::clock::Clock::now_millis(&crate::clock::SystemClock)
                .saturating_sub(status.last_report_ms());
            let kind = status.kind();
            let _ = write!(
                out,
                "{kind}_connected:{}\r\n{kind}_last_report_age_ms:{age}\r\n",
                status.connected() as u8
            );
        }
        out.push_str("\r\n");
    }
    // Only on request, as redis-server does (not part of INFO or INFO all's default set).
    if wanted
        .iter()
        .any(|w| w == "commandstats" || w == "everything")
    {
        out.push_str("# Commandstats\r\n");
        for (name, calls, usec, failed) in ctx.metrics.command_stats() {
            let per_call = usec as f64 / calls as f64;
            let _ = write!(
                out,
                "cmdstat_{name}:calls={calls},usec={usec},usec_per_call={per_call:.2},rejected_calls=0,failed_calls={failed}\r\n"
            );
        }
        out.push_str("\r\n");
    }
    if show("keyspace") {
        out.push_str("# Keyspace\r\n\r\n");
    }
    Reply::Verbatim(out)
}

/// `TIME`: unix seconds and microseconds, as bulk strings.
pub fn time() -> Reply {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Reply::Array(vec![
        Reply::bulk(now.as_secs().to_string()),
        Reply::bulk(now.subsec_micros().to_string()),
    ])
}

/// `CONFIG GET <pattern> […]` over a harmless subset; `CONFIG SET` and friends are refused.
pub fn config(args: &[&[u8]], ctx: &Arc<Context>) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let Ok(sub) = cursor.next_bytes() else {
        return wrong_arity("config");
    };
    if !sub.eq_ignore_ascii_case(b"get") {
        return Reply::error(format!(
            "ERR CONFIG {} is not supported by leafd; edit leafd.toml instead",
            lossy(sub).to_ascii_uppercase()
        ));
    }
    let names = cursor.rest();
    if names.is_empty() {
        return wrong_arity("config|get");
    }
    let server = &ctx.config.server;
    let params: [(&str, String); 10] = [
        ("maxclients", server.max_clients.to_string()),
        ("timeout", server.idle_timeout_secs.to_string()),
        ("databases", "1".into()),
        ("port", ctx.local_port().to_string()),
        ("tls-port", ctx.tls_port().to_string()),
        ("save", String::new()),
        ("appendonly", "no".into()),
        ("proto-max-bulk-len", server.max_bulk_len.to_string()),
        ("bind", server.bind.clone()),
        (
            "protected-mode",
            if server.protected_mode { "yes" } else { "no" }.into(),
        ),
    ];
    let patterns: Vec<Glob> = names.iter().map(|p| Glob::new(p)).collect();
    Reply::Map(
        params
            .iter()
            .filter(|(name, _)| patterns.iter().any(|p| p.matches(name.as_bytes())))
            .map(|(name, value)| (Reply::bulk(*name), Reply::bulk(value.clone())))
            .collect(),
    )
}

/// `SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE]` (admin): stops leafd gracefully, as SIGTERM does; the
/// options are accepted and ignored (leafd has no dataset to save). As Redis, the client gets
/// no reply: its connection closes.
pub fn shutdown(args: &[&[u8]], ctx: &Arc<Context>, session: &mut crate::cmd::Session) -> Reply {
    for arg in ArgCursor::new(args).rest() {
        let known = [&b"nosave"[..], b"save", b"now", b"force"]
            .iter()
            .any(|o| o.eq_ignore_ascii_case(arg));
        if arg.eq_ignore_ascii_case(b"abort") {
            return Reply::error("ERR No shutdown in progress.");
        }
        if !known {
            return Reply::error("ERR syntax error");
        }
    }
    ctx.request_shutdown();
    session.silent = true;
    session.closing = true;
    Reply::ok()
}

/// The resident memory of this process in bytes (0 where /proc is not there): leafd's dataset
/// is its buffers and connections, so what it uses is what it holds.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}
