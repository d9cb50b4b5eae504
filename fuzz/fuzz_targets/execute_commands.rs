//! Fuzz target: whole requests through the decoder and every command's argument parsing and
//! execution, against a fresh in-memory leafd per input (segment tags on a memory store, static
//! snowflake worker). No input may panic, and every reply must encode in RESP2 and RESP3.
#![no_main]

use std::sync::{Arc, OnceLock};

use bytes::{Buf, BytesMut};
use leafd::app::App;
use leafd::cmd::{self, Session};
use leafd::config::Config;
use leafd::clock::SystemClock;
use leafd::metrics::BatchMetrics;
use leafd::protocol::{Args, RequestDecoder, RequestLimits, RespVersion};
use leafd::storage::MemoryStore;
use libfuzzer_sys::fuzz_target;

/// Commands run per input at most, so one input cannot run for long (SNOWFLAKE 4096 waits for
/// the next millisecond).
const MAX_COMMANDS: usize = 64;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        let mut config = Config::default();
        config.http.enabled = false;
        // The snowflake fence and the segment marks are synced at every start, stop and load:
        // on tmpfs that costs nothing (on disk it cut the executions per second twentyfold).
        // FUZZ_STATE_DIR: a directory the caller removes afterwards (.ci/run makes one).
        config.storage.state_dir = std::env::var("FUZZ_STATE_DIR")
            .unwrap_or_else(|_| format!("/dev/shm/leafd-fuzz-{}", std::process::id()));
        config.segment.tags = vec![leafd::config::TagSeed::new("t", 10)];
        let app = App::with_store(config, Arc::new(MemoryStore::new()), Arc::new(SystemClock))
            .await
            .unwrap();
        let decoder = RequestDecoder::new(RequestLimits::default());
        let mut session = Session::new(1, "127.0.0.1:1".into(), false);
        let mut batch = BatchMetrics::default();
        let mut input = BytesMut::from(data);
        let mut out = BytesMut::new();
        for _ in 0..MAX_COMMANDS {
            let mut args = Args::default();
            let Ok(used) = decoder.decode(&input, &mut args) else {
                break;
            };
            if args.is_empty() {
                break;
            }
            batch.start();
            let reply = cmd::execute(&app.context, &mut session, &args, &mut batch).await;
            batch.flush(&app.metrics);
            drop(args);
            input.advance(used);
            reply.encode(RespVersion::Resp2, &mut out);
            reply.encode(RespVersion::Resp3, &mut out);
            out.clear();
            if session.closing {
                break;
            }
        }
        app.close().await;
        drop(app);
        // A current-thread runtime only polls spawned tasks (the tag refresher, preloads) while
        // the main future waits, so let them run to their end here; otherwise they would pile
        // up across inputs.
        let runtime = tokio::runtime::Handle::current();
        while runtime.metrics().num_alive_tasks() > 0 {
            tokio::task::yield_now().await;
        }
    });
});
