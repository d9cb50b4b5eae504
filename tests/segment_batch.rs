//! A batch of allocations (`SegmentStore::allocate_many`, what a node meeting many cold tags at
//! once sends) answers every request exactly as the same requests made one at a time do, and
//! leaves every row as they leave it: two databases set up alike, one given the batch, the
//! other the single allocations, compared request by request and then by one more allocation
//! of each tag. The batch holds the cases a row can be in: plain, moved by Leaf, written last
//! by another database instance, recording a period, at the end of the ID space, unknown, and
//! one tag asked twice. SQLite always; MariaDB and PostgreSQL with LEAFD_TEST_MYSQL_URL /
//! _POSTGRES_URL.

mod common;

use std::sync::Arc;

use common::backends::{raw, Backend};
use leafd::config::StorageConfig;
use leafd::storage::{Grant, NewTag, SegmentStore};

const MARGIN: i64 = 1_000;

/// The tags of the batch, each with its step and first ID.
const TAGS: [(&str, i64, i64); 6] = [
    ("plain", 10, 1),
    ("leaf", 10, 1),
    ("failover", 10, 1),
    ("period", 10, 1),
    ("end", 10, i64::MAX - 8),
    ("other", 7, 100),
];

/// Opens a store on `url` and sets its rows up: every tag allocated once, then `leaf` moved as
/// Leaf moves it and `failover` marked as written by another instance (server databases).
async fn set_up(url: &str) -> Arc<dyn SegmentStore> {
    let config = StorageConfig {
        url: url.to_string(),
        ..StorageConfig::default()
    };
    let store = leafd::storage::open(&config, true).await.unwrap();
    for (tag, step, start) in TAGS {
        store
            .create_tag(&NewTag {
                tag: tag.into(),
                step,
                start,
                description: None,
                split: (tag == "period").then(|| "period:daily:6".into()),
                max_tags: usize::MAX,
            })
            .await
            .unwrap();
        if tag != "period" {
            store
                .allocate(tag, Grant::step(Some(1), MARGIN))
                .await
                .unwrap();
        }
    }
    raw(
        url,
        "UPDATE leaf_alloc SET max_id = max_id + 5 WHERE biz_tag = 'leaf'",
    )
    .await;
    if !url.starts_with("sqlite:") {
        raw(
            url,
            "UPDATE leaf_alloc SET writer = 'the old primary' WHERE biz_tag = 'failover'",
        )
        .await;
    }
    store
}

/// What a request got, comparable across stores: the range and the skip, or the error's text.
fn outcome(result: &Result<leafd::storage::LeafAlloc, leafd::storage::StoreError>) -> String {
    match result {
        Ok(alloc) => format!(
            "{} {}..{} skipped {:?}",
            alloc.tag,
            alloc.first,
            alloc.max_id,
            alloc.failover.as_ref().map(|f| f.margin)
        ),
        Err(e) => format!("error: {e}"),
    }
}

async fn a_batch_answers_as_single_allocations(batch_url: &str, single_url: &str) {
    let batched = set_up(batch_url).await;
    let single = set_up(single_url).await;
    let requests: Vec<(String, Grant)> = [
        ("plain", None),
        ("leaf", None),
        ("failover", None),
        ("period", None),
        ("end", None),
        ("nosuchtag", None),
        ("other", Some(3)),
        ("plain", Some(4)),
    ]
    .into_iter()
    .map(|(tag, step)| (tag.to_string(), Grant::step(step, MARGIN)))
    .collect();
    let results = batched.allocate_many(&requests).await.unwrap();
    assert_eq!(results.len(), requests.len());
    let mut expected = Vec::new();
    for (tag, grant) in &requests {
        expected.push(outcome(&single.allocate(tag, grant.clone()).await));
    }
    let got: Vec<String> = results.iter().map(outcome).collect();
    assert_eq!(got, expected);
    // The cases did what they are there for (from the single allocations' own rules).
    assert!(expected[0].starts_with("plain 2..12"), "{expected:?}");
    assert!(expected[1].starts_with("leaf 8..18"), "{expected:?}");
    assert!(expected[3].contains("period"), "{expected:?}");
    assert!(expected[4].contains("end of the ID space"), "{expected:?}");
    assert!(expected[5].contains("nosuchtag"), "{expected:?}");
    assert_eq!(expected[7], "plain 12..16 skipped None", "{expected:?}");
    if !batch_url.starts_with("sqlite:") {
        assert_eq!(expected[2], "failover 1002..1012 skipped Some(1000)");
    }
    // Every row was left alike: the next allocation of each starts at the same place.
    for (tag, _, _) in TAGS {
        let grant = Grant::step(Some(2), MARGIN);
        assert_eq!(
            outcome(&batched.allocate(tag, grant.clone()).await),
            outcome(&single.allocate(tag, grant).await),
            "{tag}"
        );
    }
    batched.close().await;
    single.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_batch_answers_as_single_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let url = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    a_batch_answers_as_single_allocations(&url("batch.db"), &url("single.db")).await;
}

async fn on_two_databases(backend: Backend, test: &str) {
    let Some(batch) = backend.fresh_database(test).await else {
        return;
    };
    let Some(single) = backend.fresh_database(test).await else {
        return;
    };
    a_batch_answers_as_single_allocations(&batch, &single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_batch_answers_as_single_allocations() {
    on_two_databases(
        Backend::MySql,
        "mysql_a_batch_answers_as_single_allocations",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_batch_answers_as_single_allocations() {
    on_two_databases(
        Backend::Postgres,
        "postgres_a_batch_answers_as_single_allocations",
    )
    .await;
}
