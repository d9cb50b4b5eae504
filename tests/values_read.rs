//! Values a node reads and must not believe unchecked: a period row whose position is no date
//! of its rule or a later period, a refused opaque node's marker, one fence file reached by two
//! paths. Every case checks what was served and what the row holds after the refusal. SQLite
//! always; MariaDB and PostgreSQL with LEAFD_TEST_MYSQL_URL / _POSTGRES_URL.

mod common;

use std::sync::Arc;

use common::backends::{raw, Backend};
use common::{test_config, TestServer};
use leafd::app::App;
use leafd::clock::ManualClock;
use leafd::config::{Config, CoordinatorKind, OpaqueTag, Period, TagSeed};

/// 2026-12-07T12:00:00Z.
const NOON_MS: u64 = 1_796_644_800_000;

fn daily(tag: &str, digits: u32) -> TagSeed {
    TagSeed {
        period: Some(Period::Daily),
        time_zone: "UTC".into(),
        sequence_digits: digits,
        ..TagSeed::new(tag, 10)
    }
}

async fn node(config: Config) -> TestServer {
    let clock = Arc::new(ManualClock::new(NOON_MS));
    let app = App::open_with_clock(test_config(config), clock)
        .await
        .expect("leafd starts");
    TestServer::serve_app(app).await
}

fn on(url: &str) -> Config {
    let mut config = Config::default();
    config.storage.url = url.to_string();
    config.snowflake.enabled = false;
    config
}

async fn send(
    con: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> Result<String, String> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async::<redis::Value>(con)
        .await
        .map(|v| match v {
            redis::Value::Int(n) => n.to_string(),
            redis::Value::Okay => "OK".into(),
            other => format!("{other:?}"),
        })
        .map_err(|e| e.to_string())
}

async fn row_i64(url: &str, sql: &str) -> i64 {
    raw(url, sql).await.expect("a row")
}

/// The tag's row is at `position` and records no rule and no opaque key.
async fn check_unmoved(url: &str, tag: &str, position: i64) {
    let sql = format!("SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'");
    assert_eq!(row_i64(url, &sql).await, position, "{tag}: the row moved");
    let sql = format!(
        "SELECT COUNT(*) FROM leaf_alloc WHERE biz_tag = '{tag}' AND split IS NULL AND opaque IS NULL"
    );
    assert_eq!(row_i64(url, &sql).await, 1, "{tag}: a rule was recorded");
}

/// Rows a trend use, a hand edit or other digits left where no date is: the period node refuses
/// each before anything moves (no ID, the row as it was, no rule recorded), and serves a
/// tag whose row is at a date of today.
async fn period_rows_that_are_no_date(url: &str) {
    let plain = node(on(url)).await;
    let mut admin = plain.client().await;
    for (tag, start) in [
        ("m13", "202613070000005"),
        ("nextyear", "20271207000005"),
        ("ninedigits", "202612070000002"),
        ("good", "202612070000005"),
        ("rep", "20261207000001"),
        ("yr", "2026000001"),
    ] {
        assert_eq!(
            send(&mut admin, &["LEAF.TAG", "CREATE", tag, "10", start]).await,
            Ok("OK".into())
        );
    }
    // Trend IDs that are also IDs of today's period (daily) and of this year's (yearly).
    for tag in ["rep", "yr"] {
        for _ in 0..3 {
            send(&mut admin, &["INCR", &format!("segment:{tag}")])
                .await
                .unwrap();
        }
    }
    // Stopped, so no background load of its own moves those rows while they are checked.
    plain.stop().await;
    let plain = node(on(url)).await;
    let mut config = on(url);
    config.segment.tags = vec![
        daily("m13", 6),
        daily("nextyear", 5),
        daily("ninedigits", 4),
        daily("good", 6),
        daily("rep", 6),
        TagSeed {
            period: Some(Period::Yearly),
            ..daily("yr", 6)
        },
    ];
    let period = node(config).await;
    let mut con = period.client().await;
    for (tag, position, why) in [
        (
            "m13",
            202613070000005i64,
            "reads as period 20261307, no date of a daily tag with 6 sequence digits",
        ),
        (
            "nextyear",
            20271207000005,
            "reads as period 20271207, later than this node's period 20261207",
        ),
        (
            "ninedigits",
            202612070000002,
            "reads as period 2026120700, no date of a daily tag with 4 sequence digits",
        ),
    ] {
        for _ in 0..3 {
            let refused = send(&mut con, &["INCR", &format!("segment:{tag}")])
                .await
                .unwrap_err();
            assert!(
                refused.contains(&format!(
                    "IDs refused: the row's position {position} {why}; nothing was taken"
                )),
                "{tag}: {refused}"
            );
            assert!(refused.contains("LEAF.TAG CREATE"), "{refused}");
        }
        let refused = send(&mut con, &["INCRBY", &format!("segment:{tag}"), "5"]).await;
        assert!(refused.is_err(), "{tag}: {refused:?}");
        // SKIP would move the row further into that impossible period: refused too.
        let refused = send(&mut con, &["LEAF.TAG", "SKIP", tag, "5"])
            .await
            .unwrap_err();
        assert!(
            refused.contains(&format!(
                "tag '{tag}': IDs refused: the row's position {position} {why}"
            )),
            "{tag}: {refused}"
        );
        check_unmoved(url, tag, position).await;
    }
    // SKIPALL leaves those rows as they are and moves the others.
    let moved = send(&mut con, &["LEAF.TAG", "SKIPALL", "5"]).await.unwrap();
    for tag in ["m13", "nextyear", "ninedigits", "rep", "yr"] {
        assert!(!moved.contains(&format!("\"{tag}\"")), "{tag} in {moved}");
    }
    assert!(moved.contains("good"), "{moved}");
    for (tag, position) in [
        ("m13", 202613070000005),
        ("nextyear", 20271207000005),
        ("ninedigits", 202612070000002),
    ] {
        check_unmoved(url, tag, position).await;
    }
    // Trend IDs served in today's numbers: refused, not raised over.
    for (tag, why) in [
        (
            "rep",
            "is above period 20261207's first ID 20261207000001 and the row records no period rule",
        ),
        (
            "yr",
            "is above period 2026's first ID 2026000001 and the row records no period rule",
        ),
    ] {
        let sql = format!("SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'");
        let position = row_i64(url, &sql).await;
        let refused = send(&mut con, &["INCR", &format!("segment:{tag}")])
            .await
            .unwrap_err();
        assert!(
            refused.contains(&format!("IDs refused: the row's position {position} {why}")),
            "{tag}: {refused}"
        );
        check_unmoved(url, tag, position).await;
        let refused = send(&mut con, &["LEAF.TAG", "SKIP", tag, "5"])
            .await
            .unwrap_err();
        assert!(refused.contains(why), "{tag}: {refused}");
        check_unmoved(url, tag, position).await;
    }
    // A row at a date of today serves from its position (5, skipped by 5), dated today.
    assert_eq!(
        send(&mut con, &["INCR", "segment:good"]).await,
        Ok("20261207000010".into())
    );
    assert_eq!(
        send(&mut con, &["INCR", "segment:good"]).await,
        Ok("20261207000011".into())
    );
    // A period tag is created without a start: its numbers start at 1 each period.
    let refused = send(
        &mut con,
        &["LEAF.TAG", "CREATE", "p2", "10", "5", "PERIOD", "daily"],
    )
    .await;
    assert!(refused.unwrap_err().contains("give no start"));
    let mut config = on(url);
    config.segment.tags = vec![daily("dated", 6)];
    let dated = node(config).await;
    let mut dcon = dated.client().await;
    let refused = send(
        &mut dcon,
        &["LEAF.TAG", "CREATE", "dated2", "10", "PERIOD", "daily"],
    )
    .await;
    assert_eq!(refused, Ok("OK".into()));
    assert_eq!(
        send(&mut dcon, &["INCR", "segment:dated2"]).await,
        Ok("20261207000001".into())
    );
    dated.stop().await;
    period.stop().await;
    plain.stop().await;
}

/// A node that lists a strict and a period tag as opaque is refused for both and writes nothing
/// to their rows; the nodes that serve them as their rows record go on, and so does a new one.
async fn a_refused_opaque_node_writes_nothing(url: &str) {
    let plain = node(on(url)).await;
    let mut admin = plain.client().await;
    for args in [
        ["LEAF.TAG", "CREATE", "s1", "10", "ORDER", "strict"],
        ["LEAF.TAG", "CREATE", "p1", "10", "PERIOD", "daily"],
    ] {
        assert_eq!(send(&mut admin, &args).await, Ok("OK".into()));
    }
    assert_eq!(
        send(&mut admin, &["INCR", "segment:s1"]).await,
        Ok("1".into())
    );
    let mut config = on(url);
    config.segment.opaque_key = "a key of at least sixteen characters".into();
    for tag in ["s1", "p1"] {
        config.segment.opaque.push(OpaqueTag {
            tag: tag.into(),
            digits: 10,
        });
    }
    let opaque = node(config).await;
    let mut ocon = opaque.client().await;
    for (tag, recorded) in [("s1", "order:strict"), ("p1", "period:daily:6:UTC:")] {
        let refused = send(&mut ocon, &["INCR", &format!("segment:{tag}")])
            .await
            .unwrap_err();
        assert!(
            refused.contains(&format!(
                "segment for '{tag}' exhausted and opaque IDs refused: tag '{tag}' records {recorded}, and opaque IDs are served in trend order only; nothing was written to its row: "
            )),
            "{refused}"
        );
        let sql =
            format!("SELECT COUNT(*) FROM leaf_alloc WHERE biz_tag = '{tag}' AND opaque IS NULL");
        assert_eq!(row_i64(url, &sql).await, 1, "{tag}: a marker was written");
    }
    assert_eq!(
        send(&mut admin, &["INCR", "segment:s1"]).await,
        Ok("2".into())
    );
    assert_eq!(
        send(&mut admin, &["INCR", "segment:p1"]).await,
        Ok("20261207000001".into())
    );
    let fresh = node(on(url)).await;
    let mut fcon = fresh.client().await;
    assert_eq!(
        send(&mut fcon, &["INCR", "segment:s1"]).await,
        Ok("3".into())
    );
    assert_eq!(
        send(&mut fcon, &["INCR", "segment:p1"]).await,
        Ok("20261207000002".into())
    );
    fresh.stop().await;
    opaque.stop().await;
    plain.stop().await;
}

/// A row whose step was set below 1 by hand would move back (or stay) under its allocations:
/// refused before anything moves, on a node with no marks of the tag (which would not see the
/// IDs it repeats).
async fn a_row_step_below_one_is_refused(url: &str) {
    let first = node(on(url)).await;
    let mut con = first.client().await;
    for tag in ["neg", "zero"] {
        assert_eq!(
            send(&mut con, &["LEAF.TAG", "CREATE", tag, "100"]).await,
            Ok("OK".into())
        );
        assert_eq!(
            send(&mut con, &["INCR", &format!("segment:{tag}")]).await,
            Ok("1".into())
        );
    }
    first.stop().await;
    raw(
        url,
        "UPDATE leaf_alloc SET step = -300 WHERE biz_tag = 'neg'",
    )
    .await;
    raw(url, "UPDATE leaf_alloc SET step = 0 WHERE biz_tag = 'zero'").await;
    let fresh = node(on(url)).await;
    let mut con = fresh.client().await;
    for (tag, step) in [("neg", -300), ("zero", 0)] {
        let sql = format!("SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'");
        let before = row_i64(url, &sql).await;
        for _ in 0..3 {
            let refused = send(&mut con, &["INCR", &format!("segment:{tag}")])
                .await
                .unwrap_err();
            assert!(
                refused.contains(&format!(
                    "segment for '{tag}' exhausted and IDs refused: tag '{tag}' would be allocated with step {step} (its row's step, or one derived from it), and a step below 1 moves the row back or not at all; nothing was taken: set a step of 1 or more with LEAF.TAG STEP {tag} <n>"
                )),
                "{refused}"
            );
        }
        assert_eq!(row_i64(url, &sql).await, before, "{tag}: the row moved");
        // The operator's way out: a step again, and the IDs continue above all served.
        assert_eq!(
            send(&mut con, &["LEAF.TAG", "STEP", tag, "100"]).await,
            Ok("OK".into())
        );
        let id: i64 = send(&mut con, &["INCR", &format!("segment:{tag}")])
            .await
            .unwrap()
            .parse()
            .unwrap();
        assert!(id > 100, "{tag}: {id}");
    }
    fresh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_row_step_below_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    a_row_step_below_one_is_refused(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_row_step_below_one_is_refused() {
    let test = "mysql_a_row_step_below_one_is_refused";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_row_step_below_one_is_refused(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_row_step_below_one_is_refused() {
    let test = "postgres_a_row_step_below_one_is_refused";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_row_step_below_one_is_refused(&url).await;
}

/// A period row that records no rule, or only the calendar and digits (an older release's
/// record, which any zone matched), records the whole rule of the first node that moves it, in
/// the same write: a node in another zone is then refused and writes nothing. (Were the record
/// written after the move, two nodes in different zones racing on the row could each write one
/// half, and both be refused until the later midnight.)
async fn a_period_row_records_its_rule_with_its_first_move(url: &str) {
    let plain = node(on(url)).await;
    let mut admin = plain.client().await;
    for tag in ["un", "bare"] {
        let args = ["LEAF.TAG", "CREATE", tag, "10"];
        assert_eq!(send(&mut admin, &args).await, Ok("OK".into()));
    }
    raw(
        url,
        "UPDATE leaf_alloc SET split = 'period:daily:4' WHERE biz_tag = 'bare'",
    )
    .await;
    let in_zone = |zone: &str| {
        let mut config = on(url);
        config.segment.tags = ["un", "bare"]
            .map(|tag| TagSeed {
                time_zone: zone.into(),
                ..daily(tag, 4)
            })
            .into();
        config
    };
    // Noon in UTC is 02:00 the next day on Kiritimati (UTC+14).
    let ahead = node(in_zone("Pacific/Kiritimati")).await;
    let mut acon = ahead.client().await;
    let utc = node(in_zone("UTC")).await;
    let mut ucon = utc.client().await;
    for tag in ["un", "bare"] {
        let key = format!("segment:{tag}");
        assert_eq!(
            send(&mut acon, &["INCR", &key]).await,
            Ok("202612080001".into())
        );
        let recorded = format!(
            "SELECT COUNT(*) FROM leaf_alloc WHERE biz_tag = '{tag}' AND split = 'period:daily:4:Pacific/Kiritimati:'"
        );
        assert_eq!(
            row_i64(url, &recorded).await,
            1,
            "{tag}: the rule is not recorded"
        );
        let position = format!("SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'");
        let before = row_i64(url, &position).await;
        let refused = send(&mut ucon, &["INCR", &key]).await.unwrap_err();
        assert!(
            refused.contains(&format!("tag '{tag}' records the period rule period:daily:4:Pacific/Kiritimati: and this node's is period:daily:4:UTC")),
            "{refused}"
        );
        assert_eq!(
            row_i64(url, &position).await,
            before,
            "{tag}: the refused node moved the row"
        );
        assert_eq!(
            row_i64(url, &recorded).await,
            1,
            "{tag}: the refused node wrote its rule"
        );
        assert_eq!(
            send(&mut acon, &["INCR", &key]).await,
            Ok("202612080002".into())
        );
    }
    for server in [plain, ahead, utc] {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_period_row_records_its_rule_with_its_first_move() {
    let dir = tempfile::tempdir().unwrap();
    a_period_row_records_its_rule_with_its_first_move(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_period_row_records_its_rule_with_its_first_move() {
    let test = "mysql_a_period_row_records_its_rule_with_its_first_move";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_period_row_records_its_rule_with_its_first_move(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_period_row_records_its_rule_with_its_first_move() {
    let test = "postgres_a_period_row_records_its_rule_with_its_first_move";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_period_row_records_its_rule_with_its_first_move(&url).await;
}

/// Nodes configured otherwise than a row records are refused by the allocation's (or the
/// raise's) own statement: the row does not move, whichever kind refuses.
async fn a_refused_node_moves_no_row(url: &str) {
    let plain = node(on(url)).await;
    let mut admin = plain.client().await;
    for args in [
        &["LEAF.TAG", "CREATE", "st", "10", "ORDER", "strict"][..],
        &["LEAF.TAG", "CREATE", "sp", "10"],
        &["LEAF.TAG", "SPLIT", "sp", "2", "0", "100"],
    ] {
        assert!(send(&mut admin, args).await.is_ok(), "{args:?}");
    }
    assert_eq!(
        send(&mut admin, &["INCR", "segment:st"]).await,
        Ok("1".into())
    );
    let mut opaque_config = on(url);
    opaque_config.segment.opaque_key = "a key of at least sixteen characters".into();
    opaque_config.segment.opaque.push(OpaqueTag {
        tag: "op".into(),
        digits: 10,
    });
    opaque_config.segment.tags = vec![TagSeed::new("op", 10)];
    let opaque = node(opaque_config).await;
    let mut ocon = opaque.client().await;
    let opaque_id = send(&mut ocon, &["INCR", "segment:op"]).await.unwrap();
    let strict_seed = |tag: &str| TagSeed {
        order: leafd::config::TagOrder::Strict,
        ..TagSeed::new(tag, 10)
    };
    let mut split_node = on(url);
    split_node.segment.id_delta = 3;
    split_node.segment.id_remainder = 1;
    let with_tags = |tags: Vec<TagSeed>| {
        let mut config = on(url);
        config.segment.tags = tags;
        config
    };
    for (config, tag, refusal) in [
        (
            with_tags(vec![TagSeed::new("st", 10)]),
            "st",
            "records strict order (order:strict) and this node serves it in trend order",
        ),
        (
            split_node,
            "sp",
            "the tag's split is recorded as id_delta:id_remainder 2:0 and this node's 3:1 is not inside it",
        ),
        (
            with_tags(vec![daily("st", 6)]),
            "st",
            "records the order rule order:strict and this node's is period:daily:6",
        ),
        (
            with_tags(vec![strict_seed("sp")]),
            "sp",
            "records the split 2:0 and this node's is order:strict",
        ),
        (
            with_tags(vec![daily("op", 6)]),
            "op",
            "IDs refused: tag 'op' serves opaque IDs (d10:",
        ),
        (
            on(url),
            "op",
            "plain IDs refused: the tag served opaque IDs of 10 digits",
        ),
    ] {
        let sql = format!("SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'");
        let before = row_i64(url, &sql).await;
        let refused_node = node(config).await;
        let mut con = refused_node.client().await;
        for _ in 0..2 {
            let refused = send(&mut con, &["INCR", &format!("segment:{tag}")])
                .await
                .unwrap_err();
            assert!(refused.contains(refusal), "{tag}: {refused}");
        }
        refused_node.stop().await;
        assert_eq!(row_i64(url, &sql).await, before, "{tag}: a refused node moved the row");
    }
    let refused = send(&mut admin, &["INCR", "segment:op"]).await;
    assert!(
        refused.is_err(),
        "a plain node below the opaque range: {refused:?}"
    );
    let mut period_node = on(url);
    period_node.segment.tags = vec![daily("op", 6)];
    let period_node = node(period_node).await;
    let refused = send(&mut period_node.client().await, &["INCR", "segment:op"])
        .await
        .unwrap_err();
    assert!(
        refused.contains(") and this node's rule for it is period:daily:6:UTC; its record would refuse every opaque node from then on; give this use a tag of its own"),
        "{refused}"
    );
    period_node.stop().await;
    let sql = "SELECT COUNT(*) FROM leaf_alloc WHERE split IS NULL AND biz_tag = 'op'";
    assert_eq!(
        row_i64(url, sql).await,
        1,
        "no rule recorded beside the opaque key"
    );
    // The nodes that serve the tags as their rows record go on.
    assert_eq!(
        send(&mut admin, &["INCR", "segment:st"]).await,
        Ok("2".into())
    );
    let next = send(&mut ocon, &["INCR", "segment:op"]).await.unwrap();
    assert_ne!(next, opaque_id);
    opaque.stop().await;
    plain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_refused_node_moves_no_row() {
    let dir = tempfile::tempdir().unwrap();
    a_refused_node_moves_no_row(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_refused_node_moves_no_row() {
    let test = "mysql_a_refused_node_moves_no_row";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_refused_node_moves_no_row(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_refused_node_moves_no_row() {
    let test = "postgres_a_refused_node_moves_no_row";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_refused_node_moves_no_row(&url).await;
}

/// A trend tag whose step is larger than what is left of the ID space serves the rest of it,
/// to its last ID, then says it has exhausted its ID space; never an ID twice.
async fn a_trend_tag_serves_to_the_end_of_the_space(url: &str) {
    let server = node(on(url)).await;
    let mut con = server.client().await;
    assert_eq!(
        send(&mut con, &["LEAF.TAG", "CREATE", "end", "1000000"]).await,
        Ok("OK".into())
    );
    let start = i64::MAX - 150_000;
    raw(
        url,
        &format!(
            "UPDATE leaf_alloc SET max_id = {start}, exclusive_max = {start} WHERE biz_tag = 'end'"
        ),
    )
    .await;
    // The first request loads a segment of the tag's step (1,000,000): the rest of the space.
    assert_eq!(
        send(&mut con, &["INCR", "segment:end"]).await,
        Ok(start.to_string())
    );
    let mut last = start;
    let mut served = 1i64;
    loop {
        match send(&mut con, &["INCRBY", "segment:end", "1000"]).await {
            Ok(id) => {
                let id: i64 = id.parse().unwrap();
                assert!(id - 999 > last, "{id} after {last}");
                assert!(id - 999 >= start);
                last = id;
                served += 1000;
            }
            Err(e) => {
                // The last block that does not fit the rest is refused whole.
                assert!(e.contains("tag 'end' has exhausted its ID space"), "{e}");
                break;
            }
        }
        assert!(served <= 150_001, "served past the space");
    }
    let mut singles = 0;
    loop {
        match send(&mut con, &["INCR", "segment:end"]).await {
            Ok(id) => {
                let id: i64 = id.parse().unwrap();
                assert!(id > last, "{id} after {last}");
                last = id;
                singles += 1;
                assert!(singles <= 1000, "more singles than the rest of a block");
            }
            Err(e) => {
                assert!(e.contains("tag 'end' has exhausted its ID space"), "{e}");
                break;
            }
        }
    }
    assert!(
        served >= 149_000,
        "only {served} IDs served of the last 150,000"
    );
    assert!(last >= i64::MAX - 2, "the last ID served: {last}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_trend_tag_serves_to_the_end_of_the_space() {
    let dir = tempfile::tempdir().unwrap();
    a_trend_tag_serves_to_the_end_of_the_space(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_trend_tag_serves_to_the_end_of_the_space() {
    let test = "mysql_a_trend_tag_serves_to_the_end_of_the_space";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_trend_tag_serves_to_the_end_of_the_space(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_trend_tag_serves_to_the_end_of_the_space() {
    let test = "postgres_a_trend_tag_serves_to_the_end_of_the_space";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_trend_tag_serves_to_the_end_of_the_space(&url).await;
}

/// The README's steps in one checkout: a node on SQLite, then nodes on a brand-new database
/// with the same state directory. The new database is served from 1 (its tags are new); a
/// restored copy of the first database is still refused by that database's own marks.
async fn marks_belong_to_their_database(second: &str) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("data").display().to_string();
    let first_url = format!("sqlite://{}", dir.path().join("leafd.db").display());
    let at = |url: &str| {
        let mut config = on(url);
        config.storage.state_dir = state.clone();
        config
    };
    let first = node(at(&first_url)).await;
    let mut con = first.client().await;
    assert_eq!(
        send(&mut con, &["LEAF.TAG", "CREATE", "order", "1000"]).await,
        Ok("OK".into())
    );
    assert_eq!(
        send(&mut con, &["INCR", "segment:order"]).await,
        Ok("1".into())
    );
    first.stop().await;
    let backup = dir.path().join("backup.db");
    std::fs::copy(dir.path().join("leafd.db"), &backup).unwrap();
    let first = node(at(&first_url)).await;
    let mut con = first.client().await;
    let served = send(&mut con, &["INCRBY", "segment:order", "2500"]).await;
    assert!(served.is_ok(), "{served:?}");
    first.stop().await;
    // A brand-new database beside it: served as the README shows.
    let second_node = node(at(second)).await;
    let mut con = second_node.client().await;
    assert_eq!(
        send(&mut con, &["LEAF.TAG", "CREATE", "order", "1000"]).await,
        Ok("OK".into())
    );
    assert_eq!(
        send(&mut con, &["INCR", "segment:order"]).await,
        Ok("1".into())
    );
    assert_eq!(
        send(&mut con, &["INCR", "segment:order"]).await,
        Ok("2".into())
    );
    second_node.stop().await;
    // The first database restored from its backup: still refused.
    std::fs::copy(&backup, dir.path().join("leafd.db")).unwrap();
    let _ = std::fs::remove_file(dir.path().join("leafd.db-wal"));
    let _ = std::fs::remove_file(dir.path().join("leafd.db-shm"));
    let restored = node(at(&first_url)).await;
    let mut con = restored.client().await;
    let refused = send(&mut con, &["INCR", "segment:order"])
        .await
        .unwrap_err();
    assert!(
        refused.contains("the database returned IDs from"),
        "{refused}"
    );
    restored.stop().await;
    // The same copy without its identity table (a backup from before it), on a node that does
    // not migrate: every mark of the tag applies, whichever database it was recorded for.
    raw(&first_url, "DROP TABLE leafd_identity").await;
    let mut config = at(&first_url);
    config.storage.migrate = false;
    let restored = node(config).await;
    let mut con = restored.client().await;
    let refused = send(&mut con, &["INCR", "segment:order"])
        .await
        .unwrap_err();
    assert!(
        refused.contains("the database returned IDs from"),
        "{refused}"
    );
    restored.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_marks_belong_to_their_database() {
    let dir = tempfile::tempdir().unwrap();
    marks_belong_to_their_database(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_marks_belong_to_their_database() {
    let test = "mysql_marks_belong_to_their_database";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    marks_belong_to_their_database(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_marks_belong_to_their_database() {
    let test = "postgres_marks_belong_to_their_database";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    marks_belong_to_their_database(&url).await;
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("l.db").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_period_rows_that_are_no_date() {
    let dir = tempfile::tempdir().unwrap();
    period_rows_that_are_no_date(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_period_rows_that_are_no_date() {
    let Some(url) = Backend::MySql
        .fresh_database("mysql_period_rows_that_are_no_date")
        .await
    else {
        return;
    };
    period_rows_that_are_no_date(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_period_rows_that_are_no_date() {
    let test = "postgres_period_rows_that_are_no_date";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    period_rows_that_are_no_date(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_refused_opaque_node_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    a_refused_opaque_node_writes_nothing(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_refused_opaque_node_writes_nothing() {
    let test = "mysql_a_refused_opaque_node_writes_nothing";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_refused_opaque_node_writes_nothing(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_refused_opaque_node_writes_nothing() {
    let test = "postgres_a_refused_opaque_node_writes_nothing";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_refused_opaque_node_writes_nothing(&url).await;
}

/// Why a node on `config` refuses to start (the test fails if it starts).
async fn refused_start(config: Config) -> String {
    match App::open(test_config(config)).await {
        Ok(_) => panic!("the node started"),
        Err(e) => e.to_string(),
    }
}

/// A static node with worker id 5 on `fence_file`, with its own state directory.
fn static_node(dir: &std::path::Path, state: &str, fence_file: &std::path::Path) -> Config {
    let mut config = Config::default();
    config.storage.url = format!("sqlite://{}", dir.join(format!("{state}.db")).display());
    config.storage.state_dir = dir.join(state).display().to_string();
    config.snowflake.coordinator = CoordinatorKind::Static;
    config.snowflake.worker_id = 5;
    config.snowflake.fence_file = fence_file.display().to_string();
    config
}

/// Two processes with worker id 5 and their own state directories, given one fence file by two
/// paths (a symbolic link to the file, a symbolic link to its directory, a hard link): the
/// second is refused, whichever path it was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fence_file_by_two_paths_is_one_lock() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("x");
    std::fs::create_dir_all(&real).unwrap();
    let fence = real.join("fence.json");
    let first = TestServer::start(static_node(dir.path(), "s1", &fence)).await;
    let mut con = first.client().await;
    let id: i64 = redis::cmd("SNOWFLAKE").query_async(&mut con).await.unwrap();
    assert!(id > 0);
    // The worker's fence file exists now: reach it by other paths.
    let worker_file = real.join("fence-w5.json");
    assert!(worker_file.exists());
    let other = dir.path().join("y");
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink(&worker_file, other.join("link-w5.json")).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("xlink")).unwrap();
    for (state, path) in [
        ("s2", other.join("link.json")),
        ("s3", dir.path().join("xlink").join("fence.json")),
    ] {
        let refused = refused_start(static_node(dir.path(), state, &path)).await;
        assert!(
            refused.contains("worker id 5 is in use by another process"),
            "{}: {refused}",
            path.display()
        );
    }
    first.stop().await;
    // A hard link: refused while it exists (a rename of the fence would part the two names),
    // for either name.
    std::fs::hard_link(&worker_file, other.join("hard-w5.json")).unwrap();
    for path in [other.join("hard.json"), fence.clone()] {
        let refused = refused_start(static_node(dir.path(), "s4", &path)).await;
        assert!(refused.contains("has 2 hard links"), "{refused}");
    }
    std::fs::remove_file(other.join("hard-w5.json")).unwrap();
    // Through the symbolic link alone, the fence is written to the file it names: the link
    // stays a link.
    let linked = TestServer::start(static_node(dir.path(), "s5", &other.join("link.json"))).await;
    let mut con = linked.client().await;
    let later: i64 = redis::cmd("SNOWFLAKE").query_async(&mut con).await.unwrap();
    assert!(later > id);
    linked.stop().await;
    assert!(std::fs::symlink_metadata(other.join("link-w5.json"))
        .unwrap()
        .file_type()
        .is_symlink());
}

/// Admin arguments and HTTP parameters outside what the configuration allows are refused, as
/// their RESP twins are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_outside_what_config_allows_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = node(on(&sqlite_url(&dir))).await;
    let mut con = server.client().await;
    assert_eq!(
        send(&mut con, &["LEAF.TAG", "CREATE", "t", "10"]).await,
        Ok("OK".into())
    );
    let refused = send(
        &mut con,
        &["LEAF.TAG", "SPLIT", "t", "4611686018427387904", "1", "5"],
    )
    .await;
    let expected = "ERR split needs a delta between 1 and 1000000 (as segment.id_delta) and 0 <= remainder < delta";
    assert!(refused.unwrap_err().contains(&expected[4..]), "SPLIT");
    assert_eq!(
        send(&mut con, &["LEAF.TAG", "SPLIT", "t", "1000000", "1", "5"]).await,
        Ok("5".into())
    );
    for zone in ["localtime", "Factory", "posixrules"] {
        let refused = send(
            &mut con,
            &[
                "LEAF.TAG", "CREATE", "z", "10", "PERIOD", "daily", "ZONE", zone,
            ],
        )
        .await;
        assert!(
            refused
                .unwrap_err()
                .contains(&format!("ZONE '{zone}' is not an IANA time zone")),
            "{zone}"
        );
    }
    let refused = send(&mut con, &["LEAF.TAGS", "0", "COUNT", "5", "COUNT", "6"]).await;
    let expected = "ERR COUNT is given twice";
    assert!(refused.unwrap_err().contains(&expected[4..]));
    for query in [
        "count=-1",
        "count=1000000000",
        "count=0",
        "count=x",
        "count=5&count=6",
    ] {
        let response = common::http_get(server.http_url(&format!("/cache?cursor=0&{query}")))
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{query}");
    }
    let response = common::http_get(server.http_url("/cache?cursor=0&count=10000"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    server.stop().await;
    let mut config = on(&sqlite_url(&dir));
    config.segment.tags = vec![TagSeed {
        time_zone: "localtime".into(),
        ..daily("d", 6)
    }];
    let refused = refused_start(config).await;
    assert!(
        refused.contains("time_zone 'localtime' is not an IANA time zone"),
        "{refused}"
    );
}

/// A configured fence path that is a symbolic link to another node's configured path (dangling
/// until that node's first fence, as a fence path normally is): one lock, the second refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_path_that_is_a_link_is_the_file_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    let other = dir.path().join("o1");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink(real.join("fence.json"), other.join("fence.json")).unwrap();
    let first = TestServer::start(static_node(dir.path(), "s1", &real.join("fence.json"))).await;
    let refused = refused_start(static_node(dir.path(), "s2", &other.join("fence.json"))).await;
    assert!(
        refused.contains("worker id 5 is in use by another process"),
        "{refused}"
    );
    first.stop().await;
}

/// One SQLite file by two names: a hard link is refused at start (each name would get its own
/// write-ahead log, a database of its own, and the same IDs), a symbolic link is one name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_database_with_a_second_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("seg.db");
    let node = |path: &std::path::Path, state: &str| {
        let mut config = Config::default();
        config.storage.url = format!("sqlite://{}", path.display());
        config.storage.state_dir = dir.path().join(state).display().to_string();
        config
    };
    let first = App::open(test_config(node(&db, "a")))
        .await
        .expect("starts");
    first.close().await;
    let symlink = dir.path().join("seg-symlink.db");
    std::os::unix::fs::symlink(&db, &symlink).unwrap();
    let through_symlink = App::open(test_config(node(&symlink, "b")))
        .await
        .expect("a symbolic link is one name");
    through_symlink.close().await;
    let hard = dir.path().join("seg-hard.db");
    std::fs::hard_link(&db, &hard).unwrap();
    for path in [&db, &hard] {
        let err = refused_start(node(path, "c")).await;
        assert!(
            err.contains(&format!(
                "the SQLite database {} has 2 names (hard links): SQLite keeps its write-ahead log beside each name",
                path.display()
            )),
            "{err}"
        );
    }
}
