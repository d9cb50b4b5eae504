//! Engine and codec benchmarks: segment and snowflake `next_id`, the RESP decode/encode of an
//! `INCR segment:x` round trip, and the cost of the per-command metrics on the hot path.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion};
use leafd::clock::SystemClock;
use leafd::engine::segment::{OpaqueCipher, SegmentEngine, SegmentSettings};
use leafd::engine::snowflake::{Attempt, IssueLimit, Layout, SnowflakeEngine};
use leafd::metrics::Metrics;
use leafd::protocol::{Args, Reply, RequestDecoder, RespVersion};
use leafd::storage::MemoryStore;

/// Polls a future that is expected to be ready at once (an ID from a loaded segment).
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("benchmark future was not ready"),
    }
}

/// An engine with one tag, `bench`; `opaque_digits`: it hands out opaque IDs of that many digits.
fn segment_engine(
    rt: &tokio::runtime::Runtime,
    metrics: Arc<Metrics>,
    opaque_digits: Option<u32>,
) -> Arc<SegmentEngine> {
    let settings = SegmentSettings {
        adaptive_step: false,
        max_step: 1_000_000,
        load_timeout: Duration::from_secs(1),
        max_tags: 1000,
        failover_margin: 0,
        opaque: opaque_digits
            .map(|digits| {
                let cipher = OpaqueCipher::new(b"a benchmark key of 16+ bytes", "bench", digits);
                ("bench".to_string(), Arc::new(cipher))
            })
            .into_iter()
            .collect(),
        ..SegmentSettings::default()
    };
    let engine = SegmentEngine::new(
        Arc::new(MemoryStore::new()),
        leafd::storage::SegmentMarks::in_memory(),
        settings,
        Arc::new(SystemClock),
        metrics,
    );
    rt.block_on(async {
        engine
            .create_tag("bench", 1_000_000, 1, None)
            .await
            .unwrap();
        engine.next_ids("bench", 1).await.unwrap();
        // Let the preload of the next segment finish before measuring.
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    engine
}

fn segment(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let names = leafd::cmd::table::names();

    let engine = segment_engine(&rt, Arc::new(Metrics::disabled()), None);
    c.bench_function("segment/next_id", |b| {
        b.iter(|| ready(engine.next_ids("bench", 1)).unwrap())
    });
    // What opaque IDs cost: the same, with the keyed permutation onto 10 and 18 digits.
    for digits in [10, 18] {
        let opaque = segment_engine(&rt, Arc::new(Metrics::disabled()), Some(digits));
        c.bench_function(&format!("segment/next_id_opaque_{digits}_digits"), |b| {
            b.iter(|| ready(opaque.next_ids("bench", 1)).unwrap())
        });
    }

    // What a pipelined connection adds per command: a note in the batch; the batch's two clock
    // reads and its flush to the shared histogram come once per 32.
    let recorded = Arc::new(Metrics::new(&names));
    let engine = segment_engine(&rt, recorded.clone(), None);
    let mut batch = leafd::metrics::BatchMetrics::default();
    let mut in_batch = 0;
    c.bench_function("segment/next_id+command_metrics", |b| {
        b.iter(|| {
            if in_batch == 0 {
                batch.start();
            }
            let id = ready(engine.next_ids("bench", 1)).unwrap();
            batch.record(&recorded, 0, false, false);
            in_batch += 1;
            if in_batch == 32 {
                batch.flush(&recorded);
                in_batch = 0;
            }
            id
        })
    });

    let engine = segment_engine(&rt, Arc::new(Metrics::disabled()), None);
    c.bench_function("segment/next_id_2_threads", |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            std::thread::scope(|scope| {
                for _ in 0..2 {
                    let engine = engine.clone();
                    let handle = rt.handle().clone();
                    scope.spawn(move || {
                        let _guard = handle.enter();
                        for _ in 0..iters / 2 {
                            ready(engine.next_ids("bench", 1)).unwrap();
                        }
                    });
                }
            });
            started.elapsed()
        })
    });
}

fn snowflake(c: &mut Criterion) {
    // The limit is checked on every ID as in production (a fence far ahead never stops it).
    let engine = SnowflakeEngine::new(
        Layout::default(),
        1,
        5,
        Arc::new(SystemClock),
        Arc::new(IssueLimit::unbounded()),
        Duration::from_secs(1),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // Includes the waits for the next millisecond once a millisecond's 4,096 IDs are used.
    c.bench_function("snowflake/next_id", |b| {
        b.iter(|| rt.block_on(engine.next_id()).unwrap())
    });
    // The work of one ID alone (what `SNOWFLAKE` answered at once costs): a 22-bit sequence
    // holds 4 million IDs a millisecond, so the loop never waits for the next one.
    let wide = SnowflakeEngine::new(
        Layout {
            timestamp_bits: 41,
            worker_bits: 0,
            sequence_bits: 22,
            ..Layout::default()
        },
        0,
        5,
        Arc::new(SystemClock),
        Arc::new(IssueLimit::unbounded()),
        Duration::from_secs(1),
    );
    c.bench_function("snowflake/try_next_id", |b| {
        b.iter(|| wide.try_next_id().unwrap().unwrap())
    });
    c.bench_function("snowflake/batch_of_100", |b| {
        b.iter(|| loop {
            if let Attempt::Ids(ids) = engine.try_next(100).unwrap() {
                break ids;
            }
        })
    });
}

fn resp(c: &mut Criterion) {
    let decoder = RequestDecoder::default();
    let frame = b"*2\r\n$4\r\nINCR\r\n$13\r\nsegment:order\r\n";
    c.bench_function("resp/decode_incr", |b| {
        b.iter(|| {
            let mut args = Args::default();
            decoder.decode(&frame[..], &mut args).unwrap()
        })
    });
    let mut out = BytesMut::with_capacity(1 << 16);
    c.bench_function("resp/encode_integer", |b| {
        b.iter(|| {
            if out.len() > 60_000 {
                out.clear();
            }
            Reply::Integer(1_234_567_890_123).encode(RespVersion::Resp2, &mut out);
        })
    });
}

criterion_group!(benches, segment, snowflake, resp);
criterion_main!(benches);
