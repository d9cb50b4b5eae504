use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::storage::{LeafAlloc, MemoryStore};

const MINUTE: u64 = 60 * 1000;

fn engine(max_step: i64, clock: Arc<ManualClock>) -> Arc<SegmentEngine> {
    let settings = SegmentSettings {
        adaptive_step: true,
        max_step,
        load_timeout: Duration::from_secs(1),
        max_tags: 1000,
        failover_margin: 0,
        ..SegmentSettings::default()
    };
    SegmentEngine::new(
        Arc::new(MemoryStore::new()),
        crate::storage::SegmentMarks::in_memory(),
        settings,
        clock,
        Arc::new(()),
    )
}

/// Takes IDs until the tag's current step changed from `before`, and returns the new step.
async fn drain_until_step_changes(engine: &Arc<SegmentEngine>, before: i64) -> i64 {
    for _ in 0..10_000 {
        engine.next_ids("t", 1).await.unwrap();
        tokio::task::yield_now().await;
        let step = engine.snapshot()[0].step;
        if step != before {
            return step;
        }
    }
    panic!("step stayed at {before}");
}

#[tokio::test(flavor = "current_thread")]
async fn adaptive_step_follows_the_clock() {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let engine = engine(400, clock.clone());
    engine.create_tag("t", 100, 1, None).await.unwrap();
    assert_eq!(engine.next_ids("t", 1).await.unwrap(), 1);
    assert_eq!(
        engine.snapshot()[0].step,
        100,
        "first load uses the table step"
    );

    // Segments used up within 15 minutes: the step doubles, up to the cap of 400.
    clock.advance(MINUTE);
    assert_eq!(drain_until_step_changes(&engine, 100).await, 200);
    clock.advance(MINUTE);
    assert_eq!(drain_until_step_changes(&engine, 200).await, 400);

    // A segment that lasted over 30 minutes: the step halves, never below the table's 100.
    clock.advance(31 * MINUTE);
    assert_eq!(drain_until_step_changes(&engine, 400).await, 200);
    clock.advance(31 * MINUTE);
    assert_eq!(drain_until_step_changes(&engine, 200).await, 100);

    // Between 15 and 30 minutes the step stays; drain two whole segments to see two loads.
    clock.advance(20 * MINUTE);
    let loads_before = engine.stats().loads_ok.load(Ordering::SeqCst);
    while engine.stats().loads_ok.load(Ordering::SeqCst) < loads_before + 1 {
        engine.next_ids("t", 1).await.unwrap();
        tokio::task::yield_now().await;
    }
    assert_eq!(engine.snapshot()[0].step, 100);
}

#[tokio::test(flavor = "current_thread")]
async fn segments_never_overlap_under_adaptive_steps() {
    let clock = Arc::new(ManualClock::new(0));
    let engine = engine(1_000_000, clock);
    engine.create_tag("t", 10, 1, None).await.unwrap();
    let mut last = 0;
    for i in 0..20_000 {
        let id = engine.next_ids("t", 1 + (i % 3)).await.unwrap();
        assert!(id > last, "{id} after {last}");
        last = id;
    }
}

/// A memory store whose allocations wait while `gate` is closed (a database holding them), and
/// with `late_table_steps` answer allocations of the table step late, after committing (a
/// background load that finishes after an INCRBY block sent later).
struct SlowStore {
    inner: MemoryStore,
    late_table_steps: bool,
    gate: tokio::sync::watch::Receiver<bool>,
    /// Pages of the tag list ignore their cursor (a store whose order the cursor does not
    /// follow): every page is the first.
    stuck_pages: bool,
}

impl SlowStore {
    fn late() -> SlowStore {
        SlowStore {
            inner: MemoryStore::new(),
            late_table_steps: true,
            gate: tokio::sync::watch::channel(true).1,
            stuck_pages: false,
        }
    }
}

#[async_trait::async_trait]
impl SegmentStore for SlowStore {
    async fn allocate(
        &self,
        tag: &str,
        grant: crate::storage::Grant,
    ) -> Result<LeafAlloc, StoreError> {
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        let by_table_step = grant.step.is_none();
        let alloc = self.inner.allocate(tag, grant).await;
        if self.late_table_steps && by_table_step {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        alloc
    }
    async fn allocate_many(
        &self,
        requests: &[(String, crate::storage::Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        let mut out = Vec::with_capacity(requests.len());
        for (tag, grant) in requests {
            out.push(self.allocate(tag, grant.clone()).await);
        }
        Ok(out)
    }
    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        self.inner.list().await
    }
    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.inner.rules().await
    }
    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let after = if self.stuck_pages { None } else { after };
        self.inner.rules_after(after, limit).await
    }
    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        self.inner.row(tag).await
    }
    async fn create_tag(&self, new: &crate::storage::NewTag) -> Result<(), StoreError> {
        self.inner.create_tag(new).await
    }
    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.inner.claim_split(tag, expected, split).await
    }
    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError> {
        self.inner.resplit(tag, split, start).await
    }
    async fn raise(&self, tag: &str, floor: i64, record: &str) -> Result<i64, StoreError> {
        self.inner.raise(tag, floor, record).await
    }
    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        self.inner.claim_opaque(tag, marker, below).await
    }
    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        self.inner.set_step(tag, step).await
    }
    fn backend(&self) -> &'static str {
        "slow"
    }
    async fn close(&self) {}
    async fn schema_version(&self) -> Option<i64> {
        None
    }
    async fn identity(&self) -> Result<Option<crate::storage::DbIdentity>, StoreError> {
        Ok(None)
    }
    fn worker_leases(
        self: std::sync::Arc<Self>,
    ) -> Option<std::sync::Arc<dyn crate::storage::WorkerLeaseStore>> {
        None
    }
}

/// Out-of-order answers of one node's own allocations are not a rollback: allocations of
/// a tag go one at a time, each checked before the next is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_reserved_during_a_slow_load_is_not_taken_for_a_rollback() {
    let settings = SegmentSettings {
        adaptive_step: false,
        max_step: 1000,
        load_timeout: Duration::from_secs(2),
        max_tags: 10,
        failover_margin: 0,
        ..SegmentSettings::default()
    };
    let engine = SegmentEngine::new(
        Arc::new(SlowStore::late()),
        crate::storage::SegmentMarks::in_memory(),
        settings,
        Arc::new(ManualClock::new(0)),
        Arc::new(()),
    );
    engine.create_tag("t", 10, 1, None).await.unwrap();
    assert_eq!(engine.next_ids("t", 1).await.unwrap(), 1);
    // The second ID starts the preload of (10, 20], which answers 50 ms late...
    assert_eq!(engine.next_ids("t", 1).await.unwrap(), 2);
    tokio::time::sleep(Duration::from_millis(5)).await;
    // ...while a block larger than the step is reserved directly.
    let block_end = engine.next_ids("t", 500).await.unwrap();
    assert_eq!(block_end, 520, "the block follows the preloaded segment");
    // IDs keep increasing: the rest of 1..=20 is skipped, the next segment is (520, 530].
    assert_eq!(engine.next_ids("t", 1).await.unwrap(), 521);
    assert_eq!(engine.next_ids("t", 1).await.unwrap(), 522);
}

/// The newcomer's case: INCR, an INCRBY larger than the step, INCR again, on one node.
#[tokio::test(flavor = "current_thread")]
async fn ids_increase_across_a_block_larger_than_the_step() {
    // The step stays 500 (the cap), so every INCRBY 600 is a block from the database.
    let engine = engine(500, Arc::new(ManualClock::new(0)));
    engine.create_tag("t", 500, 1, None).await.unwrap();
    let mut last = 0;
    for i in 0..3000 {
        let n = match i % 100 {
            7 => 600,
            50 => 50,
            _ => 1,
        };
        let id = engine.next_ids("t", n).await.unwrap();
        assert!(
            id - n + 1 > last,
            "block {}..={id} after {last}",
            id - n + 1
        );
        last = id;
    }
    assert_eq!(engine.next_ids("t", 1).await.unwrap(), last + 1);
}

/// An engine on `store` whose tag `tag` hands out opaque IDs of 4 digits (the key
/// [`OPAQUE_TEST_KEY`]) under `interleave`; fixed steps.
fn opaque_engine(store: Arc<MemoryStore>, tag: &str, interleave: Interleave) -> Arc<SegmentEngine> {
    let settings = SegmentSettings {
        adaptive_step: false,
        max_step: 1000,
        load_timeout: Duration::from_secs(1),
        max_tags: 10,
        failover_margin: 0,
        tag_interleave: [(tag.to_string(), interleave)].into_iter().collect(),
        opaque: [(
            tag.to_string(),
            Arc::new(OpaqueCipher::new(OPAQUE_TEST_KEY, tag, 4)),
        )]
        .into_iter()
        .collect(),
        ..SegmentSettings::default()
    };
    SegmentEngine::new(
        store,
        crate::storage::SegmentMarks::in_memory(),
        settings,
        Arc::new(crate::clock::SystemClock),
        Arc::new(()),
    )
}

const OPAQUE_TEST_KEY: &[u8] = b"a key of sixteen+ bytes";

/// An opaque tag past the last position with an opaque ID answers "exhausted" without
/// reserving more ranges in the database, however often it is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_opaque_tag_stops_allocating() {
    let store = Arc::new(MemoryStore::new());
    let engine = opaque_engine(store.clone(), "small", Interleave::default());
    engine.create_tag("small", 1000, 1, None).await.unwrap();
    let mut served = std::collections::HashSet::new();
    let first_error = loop {
        match engine.next_ids("small", 1).await {
            Ok(id) => assert!((1000..=9999).contains(&id) && served.insert(id), "{id}"),
            Err(e) => break e,
        }
    };
    assert_eq!(served.len(), 8999);
    assert_eq!(first_error, SegmentError::Exhausted("small".into()));
    for _ in 0..200 {
        assert!(engine.next_ids("small", 1).await.is_err());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let max_id = store.list().await.unwrap()[0].max_id;
    // The range past the end is refused; the next try waits the longest back-off (5 s).
    assert!(max_id <= 11_000, "kept allocating: max_id {max_id}");
}

/// An opaque tag whose delta exceeds its step takes single IDs straight from the table (a
/// block, not a buffered segment): they are opaque too. Before, those went out as sequential
/// positions (`4, 7, 10, …` with delta 3) and repeated opaque IDs already handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opaque_tag_with_a_delta_above_its_step_hands_out_only_opaque_ids() {
    let interleave = Interleave {
        delta: 3,
        remainder: 0,
    };
    let engine = opaque_engine(Arc::new(MemoryStore::new()), "o", interleave);
    let cipher = OpaqueCipher::new(OPAQUE_TEST_KEY, "o", 4);
    // Step 3 holds one ID of the split; step 2 may hold none, so every ID is a block.
    engine.create_tag("o", 3, 1, None).await.unwrap();
    let mut served = std::collections::HashSet::new();
    for round in 0..600 {
        if round == 300 {
            engine.set_step("o", 2).await.unwrap();
        }
        let id = engine.next_ids("o", 1).await.unwrap();
        assert!(
            (1000..=9999).contains(&id),
            "round {round}: {id} is not 4 digits"
        );
        assert!(served.insert(id), "round {round}: {id} handed out twice");
        let position = cipher.decode(id).unwrap();
        assert_eq!(
            position % 3,
            0,
            "round {round}: position {position} of {id}"
        );
    }
}

/// Two engines ("nodes") on one store with tag `s` strict: requests alternating between them,
/// each sent after the previous reply, get strictly increasing consecutive IDs; INCRBY n gets
/// the n IDs right above; 64 concurrent requests on both get distinct IDs above all of them,
/// never more allocations than requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_tag_orders_requests_across_nodes() {
    let store = Arc::new(MemoryStore::new());
    let timed = Arc::new(CountingObserver::default());
    let node = || {
        let settings = SegmentSettings {
            adaptive_step: true,
            max_step: 1000,
            load_timeout: Duration::from_secs(5),
            max_tags: 10,
            failover_margin: 0,
            strict: ["s".to_string()].into_iter().collect(),
            ..SegmentSettings::default()
        };
        SegmentEngine::new(
            store.clone(),
            crate::storage::SegmentMarks::in_memory(),
            settings,
            Arc::new(crate::clock::SystemClock),
            timed.clone(),
        )
    };
    let (a, b) = (node(), node());
    a.create_tag("s", 1000, 1, None).await.unwrap();
    b.refresh_tags().await.unwrap();
    let mut last = 0;
    for i in 0..20 {
        let engine = if i % 2 == 0 { &a } else { &b };
        let id = engine.next_ids("s", 1).await.unwrap();
        assert_eq!(
            id,
            last + 1,
            "strict and without a gap on one table of leafd nodes"
        );
        last = id;
    }
    assert_eq!(a.try_next_ids(b"s", 1), None, "never served from a buffer");
    assert_eq!(b.next_ids("s", 5).await.unwrap(), last + 5);
    let mut tasks = Vec::new();
    for i in 0..64 {
        let engine = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            engine.next_ids("s", 1).await.unwrap()
        }));
    }
    let mut ids = std::collections::HashSet::new();
    for task in tasks {
        assert!(ids.insert(task.await.unwrap()));
    }
    assert!(ids.iter().all(|&id| id > last + 5));
    // Batching shows under a real database's round trip (tests/reliability/strict_order.py);
    // here every allocation is instant, so only the count's bound is certain.
    let allocations = a.snapshot()[0].loads_ok + b.snapshot()[0].loads_ok;
    assert!(allocations <= 20 + 1 + 64, "{allocations} allocations");
    // Each allocation counts in INFO and in the load-duration metric like a trend tag's load.
    let counted =
        a.stats().loads_ok.load(Ordering::SeqCst) + b.stats().loads_ok.load(Ordering::SeqCst);
    assert_eq!(counted, allocations);
    assert_eq!(timed.0.load(Ordering::SeqCst), allocations);
}

/// Counts the loads it is told of.
#[derive(Default)]
struct CountingObserver(std::sync::atomic::AtomicU64);

impl super::LoadObserver for CountingObserver {
    fn load_finished(&self, _: &str, _: Duration) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A request whose batch was taken by a holder that then gave up (its caller timed out) answers
/// UNAVAILABLE at once: it does not go on to serve requests queued later and then wait on an
/// answer that can never come (that awaited a spent receiver, and the panic reset the
/// client's connection).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_whose_batch_was_abandoned_answers_unavailable() {
    let (open, gate) = tokio::sync::watch::channel(false);
    let settings = SegmentSettings {
        load_timeout: Duration::from_millis(1000),
        max_tags: 10,
        strict: ["s".to_string()].into_iter().collect(),
        ..SegmentSettings::default()
    };
    let engine = SegmentEngine::new(
        Arc::new(SlowStore {
            inner: MemoryStore::new(),
            late_table_steps: false,
            gate,
            stuck_pages: false,
        }),
        crate::storage::SegmentMarks::in_memory(),
        settings,
        Arc::new(ManualClock::new(0)),
        Arc::new(()),
    );
    engine.create_tag("s", 10, 1, None).await.unwrap();
    let request = || {
        let engine = engine.clone();
        tokio::spawn(async move { engine.next_ids("s", 1).await })
    };
    let ms = |n| tokio::time::sleep(Duration::from_millis(n));
    // A holds the allocation (the database holds it); B and C queue behind it.
    let a = request();
    ms(200).await;
    let b = request();
    ms(200).await;
    let c = request();
    // t = 1100: A gave up at 1000 and B took the batch [B, C]; D queues after it.
    ms(700).await;
    let d = request();
    // t = 1300: B gave up at 1200, dropping [B, C]; the database answers again.
    ms(200).await;
    open.send(true).unwrap();
    let [a, b, c, d] = [a, b, c, d].map(|task| async { task.await.expect("no task panicked") });
    let (a, b, c, d) = (a.await, b.await, c.await, d.await);
    for (name, result) in [("A", &a), ("B", &b)] {
        let error = result.as_ref().expect_err(name).to_string();
        assert!(
            error.contains("no allocation within 1000 ms"),
            "{name}: {error}"
        );
    }
    let lost = c.expect_err("C's batch was abandoned").to_string();
    assert!(lost.contains("was abandoned"), "{lost}");
    assert_eq!(
        d.unwrap(),
        1,
        "D is served by its own allocation, the first that ran"
    );
}

/// Two processes sharing one state directory (one marks file), the database gone back: the
/// second refuses a range the first loaded, though it never loaded the tag itself (its marks
/// learn the first's only by reading the files).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_sharing_the_state_directory_refuses_what_the_other_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("segment-marks.json");
    let settings = || SegmentSettings {
        adaptive_step: false,
        load_timeout: Duration::from_secs(1),
        max_tags: 1000,
        ..SegmentSettings::default()
    };
    let start = |store: Arc<MemoryStore>| {
        SegmentEngine::new(
            store,
            crate::storage::SegmentMarks::open(&path, false).unwrap(),
            settings(),
            Arc::new(ManualClock::new(1_000_000_000)),
            Arc::new(()),
        )
    };
    let first = start(Arc::new(MemoryStore::new()));
    first.create_tag("t", 100, 1, None).await.unwrap();
    for _ in 0..250 {
        first.next_ids("t", 1).await.unwrap();
    }
    // The second process's database is the first's before any of those loads.
    let second = start(Arc::new(MemoryStore::new()));
    second.create_tag("t", 100, 1, None).await.unwrap();
    match second.next_ids("t", 1).await {
        Err(SegmentError::Rollback { .. }) => {}
        other => panic!("served {other:?} from a range the other process loaded"),
    }
}

/// A node on `store` with room for more tags than a few sweep pages.
fn sweep_node(store: Arc<dyn SegmentStore>) -> Arc<SegmentEngine> {
    SegmentEngine::new(
        store,
        crate::storage::SegmentMarks::in_memory(),
        SegmentSettings {
            max_tags: 100_000,
            ..SegmentSettings::default()
        },
        Arc::new(crate::clock::SystemClock),
        Arc::new(()),
    )
}

/// The periodic sweep reads the tag list page by page: over several pages, a row created on
/// another node becomes a tag, a deleted row stops being served, a changed record rebuilds its
/// tag, and the others keep their buffers (no reload).
#[tokio::test]
async fn the_tag_list_is_swept_page_by_page() {
    let store = Arc::new(MemoryStore::new());
    let (a, b) = (sweep_node(store.clone()), sweep_node(store.clone()));
    let tags = 2 * super::tags::SWEEP_PAGE + 7;
    for i in 0..tags {
        a.create_tag(&format!("t{i:06}"), 10, 1, None)
            .await
            .unwrap();
    }
    b.refresh_tags().await.unwrap();
    assert_eq!(b.next_ids("t000001", 1).await.unwrap(), 1);
    let buffer = b.tags.get(b"t000001").unwrap().loaded().cloned().unwrap();
    a.create_tag("u", 10, 1, None).await.unwrap();
    store.delete_row("t000002");
    store.delete_row(&format!("t{:06}", tags - 1));
    store
        .claim_split("t000003", None, Some("2:1"))
        .await
        .unwrap();
    assert_eq!(b.sweep_tags().await.unwrap(), tags + 1 - 2);
    assert!(b.tags.get(b"u").is_some(), "a row created elsewhere");
    assert!(b.tags.get(b"t000002").is_none(), "a deleted row");
    assert!(b.tags.get(format!("t{:06}", tags - 1).as_bytes()).is_none());
    let changed = b.tags.get(b"t000003").unwrap();
    assert_eq!(changed.recorded.as_deref(), Some("2:1"), "a changed record");
    let kept = b.tags.get(b"t000001").unwrap().loaded().cloned().unwrap();
    assert!(Arc::ptr_eq(&buffer, &kept), "a served tag keeps its buffer");
    assert_eq!(b.next_ids("t000001", 1).await.unwrap(), 2);
    assert_eq!(b.tags.names_after(b"", 100_000).0.len(), tags - 1);
}

/// The metrics and INFO read the tags in use from their own list, not by walking every tag:
/// exactly the tags a request built, each once; a tag whose row is gone, or whose entry a
/// changed record replaced, leaves it; a rebuilt tag is in it once.
#[tokio::test]
async fn only_the_tags_in_use_are_listed_for_the_metrics() {
    let store = Arc::new(MemoryStore::new());
    let node = sweep_node(store.clone());
    for i in 0..50 {
        node.create_tag(&format!("t{i:02}"), 10, 1, None)
            .await
            .unwrap();
    }
    node.refresh_tags().await.unwrap();
    let used = |node: &SegmentEngine| {
        let mut tags: Vec<String> = node.used_snapshot().into_iter().map(|t| t.tag).collect();
        tags.sort();
        tags
    };
    assert!(used(&node).is_empty(), "{:?}", used(&node));
    for tag in ["t01", "t02", "t03", "t01"] {
        node.next_ids(tag, 1).await.unwrap();
    }
    assert_eq!(used(&node), ["t01", "t02", "t03"]);
    store.delete_row("t02");
    let before = node.tags.get(b"t03").unwrap().loaded().cloned().unwrap();
    let strict = super::rule::STRICT_MARKER;
    store.claim_split("t03", None, Some(strict)).await.unwrap();
    node.sweep_tags().await.unwrap();
    // t03 follows its row's new rule: a new entry, in use from its next request on.
    assert_eq!(
        used(&node),
        ["t01"],
        "a gone row and a replaced entry leave"
    );
    node.next_ids("t03", 1).await.unwrap();
    let after = node.tags.get(b"t03").unwrap().loaded().cloned().unwrap();
    assert!(!Arc::ptr_eq(&before, &after) && after.kind.strict());
    node.rebuild_tag("t01", Some(strict));
    assert_eq!(used(&node), ["t01", "t03"], "each once");
    assert_eq!(node.tags.len(), 49);
}

/// A sweep whose cursor does not move (the store hands the same page back) ends with an error
/// instead of reading for ever, and removes nothing.
#[tokio::test]
async fn a_sweep_whose_cursor_does_not_move_stops() {
    let store = Arc::new(SlowStore {
        stuck_pages: true,
        late_table_steps: false,
        ..SlowStore::late()
    });
    let engine = sweep_node(store.clone());
    let tags = super::tags::SWEEP_PAGE + 3;
    for i in 0..tags {
        engine
            .create_tag(&format!("t{i:06}"), 10, 1, None)
            .await
            .unwrap();
    }
    store.inner.delete_row(&format!("t{:06}", tags - 1));
    let swept = tokio::time::timeout(Duration::from_secs(10), engine.sweep_tags())
        .await
        .expect("the sweep ended");
    let error = swept.unwrap_err().to_string();
    assert!(error.contains("did not move past 't009999'"), "{error}");
    assert_eq!(engine.tag_count(), tags, "nothing removed");
}

/// A node that does not list tag `p`, whose row records `period:daily:3:UTC:` at 30 November's
/// sixth number, with its clock at `now_ms`.
async fn unlisted_period_tag_at(now_ms: u64) -> (Arc<MemoryStore>, Arc<SegmentEngine>) {
    let store = Arc::new(MemoryStore::new());
    let new = crate::storage::NewTag {
        tag: "p".into(),
        start: 202611300006,
        step: 10,
        description: None,
        split: Some("period:daily:3:UTC:".into()),
        max_tags: 10,
    };
    store.create_tag(&new).await.unwrap();
    let engine = SegmentEngine::new(
        store.clone(),
        crate::storage::SegmentMarks::in_memory(),
        SegmentSettings::default(),
        Arc::new(ManualClock::new(now_ms)),
        Arc::new(()),
    );
    (store, engine)
}

/// SKIP of a period tag on a node that never served it (and does not list it) first moves the
/// row into the node's current period, by the rule the row records: after a restore the lost
/// numbers are the current period's (the simulation found the row skipped within yesterday,
/// and today's lost numbers served again).
#[tokio::test(flavor = "current_thread")]
async fn a_period_skip_moves_into_today_on_a_node_that_never_served_the_tag() {
    // 2026-12-01T00:00:10Z.
    let (store, engine) = unlisted_period_tag_at(1_796_083_210_000).await;
    engine.skip("p", 3).await.unwrap();
    let row = store.row("p").await.unwrap().unwrap();
    assert_eq!(
        row.max_id, 202612010004,
        "three numbers of 1 December skipped"
    );
    assert_eq!(engine.next_ids("p", 1).await.unwrap(), 20261201004);
}

/// SKIP of a period tag within PERIOD_AHEAD_MS of its period's end skips the next period's
/// numbers too: a node whose clock was ahead may have served them before a restore lost them
/// (the simulation found them served again after the runbook's SKIPALL); the row is left in
/// the next period, which a node this close to its start serves already. Earlier in the day
/// the skip stays in the day.
#[tokio::test(flavor = "current_thread")]
async fn a_period_skip_near_the_periods_end_skips_the_next_period_too() {
    // 2026-11-30T23:59:30Z, then 23:58:30Z.
    for (now_ms, skipped_to, next) in [
        (1_796_083_170_000, 202612010004, 20261201004),
        (1_796_083_110_000, 202611300009, 20261130009),
    ] {
        let (store, engine) = unlisted_period_tag_at(now_ms).await;
        engine.skip("p", 3).await.unwrap();
        let row = store.row("p").await.unwrap().unwrap();
        assert_eq!(row.max_id, skipped_to, "at {now_ms}");
        assert_eq!(engine.next_ids("p", 1).await.unwrap(), next, "at {now_ms}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_timeout_says_both_causes_and_how_late_a_starved_node_woke() {
    let deadline = tokio::time::Instant::now();
    let on_time = super::timed_out(
        "no segment loaded",
        Duration::from_millis(1000),
        super::LOAD_TIMEOUT_KEY,
        deadline,
    );
    assert_eq!(
        on_time,
        "no segment loaded within 1000 ms (segment.load_timeout_ms): the database did not answer in time, or this node was too busy to take the answer"
    );
    tokio::time::advance(Duration::from_millis(240)).await;
    let late = super::timed_out(
        "no allocation",
        Duration::from_millis(1000),
        super::LOAD_TIMEOUT_KEY,
        deadline,
    );
    assert!(
        late.ends_with("too busy to take the answer (its timer fired 240 ms late)"),
        "{late}"
    );
}
