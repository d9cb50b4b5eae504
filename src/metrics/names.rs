//! Every metric leafd exports: its name and its help text, in one place.

pub const COMMANDS_TOTAL: &str = "leafd_commands_total";
pub const COMMAND_DURATION_SECONDS: &str = "leafd_command_duration_seconds";
pub const CONNECTIONS_OPEN: &str = "leafd_connections_open";
pub const CONNECTIONS_TOTAL: &str = "leafd_connections_total";
pub const CONNECTIONS_REJECTED_TOTAL: &str = "leafd_connections_rejected_total";
pub const SEGMENT_IDS_TOTAL: &str = "leafd_segment_ids_total";
pub const SEGMENT_LOADS_TOTAL: &str = "leafd_segment_loads_total";
pub const SEGMENT_LOAD_DURATION_SECONDS: &str = "leafd_segment_load_duration_seconds";
pub const SEGMENT_REMAINING_IDS: &str = "leafd_segment_remaining_ids";
pub const SEGMENT_PRELOAD_THRESHOLD_IDS: &str = "leafd_segment_preload_threshold_ids";
pub const SEGMENT_STEP: &str = "leafd_segment_step";
pub const SEGMENT_TAG_INFO: &str = "leafd_segment_tag_info";
pub const SEGMENT_REQUEST_WAITS_TOTAL: &str = "leafd_segment_request_waits_total";
pub const SEGMENT_STRICT_GATHERS_TOTAL: &str = "leafd_segment_strict_gathers_total";
pub const SEGMENT_ROLLBACKS_TOTAL: &str = "leafd_segment_rollbacks_total";
pub const SEGMENT_FAILOVER_SKIPS_TOTAL: &str = "leafd_segment_failover_skips_total";
pub const SNOWFLAKE_FENCE_AHEAD_SECONDS: &str = "leafd_snowflake_fence_ahead_seconds";
pub const SNOWFLAKE_LEASE_REMAINING_SECONDS: &str = "leafd_snowflake_lease_remaining_seconds";
pub const SNOWFLAKE_LEASE_FAILURES_TOTAL: &str = "leafd_snowflake_lease_failures_total";
pub const STORAGE_READY: &str = "leafd_storage_ready";
pub const SNOWFLAKE_IDS_TOTAL: &str = "leafd_snowflake_ids_total";
pub const SNOWFLAKE_SEQUENCE_WAITS_TOTAL: &str = "leafd_snowflake_sequence_waits_total";
pub const SNOWFLAKE_CLOCK_BACKWARD_TOTAL: &str = "leafd_snowflake_clock_backward_total";
pub const SNOWFLAKE_WORKER_ID: &str = "leafd_snowflake_worker_id";
pub const BUILD_INFO: &str = "leafd_build_info";
pub const SNOWFLAKE_WORKER_INFO: &str = "leafd_snowflake_worker_info";
pub const ZOOKEEPER_CONNECTED: &str = "leafd_zookeeper_connected";
pub const ZOOKEEPER_LAST_REPORT_AGE_SECONDS: &str = "leafd_zookeeper_last_report_age_seconds";
pub const ETCD_CONNECTED: &str = "leafd_etcd_connected";
pub const ETCD_LAST_REPORT_AGE_SECONDS: &str = "leafd_etcd_last_report_age_seconds";

/// The two gauges of a coordinator's link (connected, seconds since the last report), by the
/// coordinator's kind.
pub fn coordinator_metrics(kind: &str) -> Option<(&'static str, &'static str)> {
    match kind {
        "zookeeper" => Some((ZOOKEEPER_CONNECTED, ZOOKEEPER_LAST_REPORT_AGE_SECONDS)),
        "etcd" => Some((ETCD_CONNECTED, ETCD_LAST_REPORT_AGE_SECONDS)),
        _ => None,
    }
}

/// The help text of every metric, shown as `# HELP` on `/metrics`.
pub(super) const DESCRIPTIONS: &[(&str, &str)] = &[
    (
        COMMANDS_TOTAL,
        "Commands executed, by command name and result (ok or error).",
    ),
    (
        COMMAND_DURATION_SECONDS,
        "Time to execute a command, from parsed request to reply, in seconds.",
    ),
    (CONNECTIONS_OPEN, "Client connections currently open."),
    (
        CONNECTIONS_TOTAL,
        "Client connections accepted since start.",
    ),
    (
        CONNECTIONS_REJECTED_TOTAL,
        "Client connections refused because max_clients was reached.",
    ),
    (
        SEGMENT_IDS_TOTAL,
        "Segment IDs handed out by this node, by tag.",
    ),
    (
        SEGMENT_LOADS_TOTAL,
        "Segment loads from the database, by tag and result.",
    ),
    (
        SEGMENT_ROLLBACKS_TOTAL,
        "Segment loads refused because the database returned IDs below this node's high-water mark (restored backup, lossy failover), by tag.",
    ),
    (
        BUILD_INFO,
        "Always 1; the labels say which leafd this is (version, commit).",
    ),
    (
        SNOWFLAKE_WORKER_INFO,
        "Always 1; the labels name the snowflake worker id this node holds and its coordinator.",
    ),
    (
        SEGMENT_FAILOVER_SKIPS_TOTAL,
        "Segment allocations that skipped segment.failover_margin IDs because the tag's previous allocation was made by another database instance (failover, restore), by tag.",
    ),
    (
        SNOWFLAKE_FENCE_AHEAD_SECONDS,
        "How far the durable snowflake time fence is ahead of the clock; at or below 0 SNOWFLAKE waits, then replies UNAVAILABLE.",
    ),
    (
        SNOWFLAKE_LEASE_FAILURES_TOTAL,
        "Failed attempts to extend the worker-id lease (database renewals, ZooKeeper reports).",
    ),
    (
        SNOWFLAKE_LEASE_REMAINING_SECONDS,
        "Time left on the coordinator's lease of the worker id (ZooKeeper: until the fence written there); 0 when it ended.",
    ),
    (
        SEGMENT_LOAD_DURATION_SECONDS,
        "Time of one segment load from the database, in seconds.",
    ),
    (
        SEGMENT_REMAINING_IDS,
        "IDs left in a tag's current or next buffer.",
    ),
    (
        SEGMENT_PRELOAD_THRESHOLD_IDS,
        "The next segment is loaded once the current buffer has this many IDs left or fewer.",
    ),
    (
        SEGMENT_STEP,
        "Step of the tag's last segment load (Leaf's adaptive step).",
    ),
    (
        SEGMENT_TAG_INFO,
        "Always 1; the labels say how the tag hands out IDs: order (trend or strict) and period (none, or e.g. daily Asia/Shanghai 6).",
    ),
    (
        SEGMENT_REQUEST_WAITS_TOTAL,
        "Requests that had to wait for a segment load because both buffers were empty.",
    ),
    (
        SEGMENT_STRICT_GATHERS_TOTAL,
        "Times a strict tag's allocation waited for its requesters to come back first: result paid (enough came back and shared one allocation) or missed (they did not, within the wait).",
    ),
    (
        STORAGE_READY,
        "1 when the segment database answered and the tag list is loaded, else 0.",
    ),
    (SNOWFLAKE_IDS_TOTAL, "Snowflake IDs issued by this node."),
    (
        SNOWFLAKE_SEQUENCE_WAITS_TOTAL,
        "Times a millisecond's sequence ran out and the engine waited for the next one.",
    ),
    (
        SNOWFLAKE_CLOCK_BACKWARD_TOTAL,
        "Times the clock was found behind the last snowflake timestamp.",
    ),
    (SNOWFLAKE_WORKER_ID, "This node's snowflake worker id."),
    (
        ZOOKEEPER_CONNECTED,
        "1 while this node's ZooKeeper time reports succeed, else 0.",
    ),
    (
        ZOOKEEPER_LAST_REPORT_AGE_SECONDS,
        "Seconds since this node last reported its time to ZooKeeper.",
    ),
    (
        ETCD_CONNECTED,
        "1 while etcd answers this node's requests, else 0.",
    ),
    (
        ETCD_LAST_REPORT_AGE_SECONDS,
        "Seconds since this node last renewed its worker-id lease in etcd.",
    ),
];
