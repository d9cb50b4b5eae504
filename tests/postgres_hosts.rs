//! Multi-host PostgreSQL URLs (LEAFD_TEST_POSTGRES_URL): a host that refuses is passed over, the
//! pool leaves a host that stops answering for the next, and a session that cannot write is
//! never used. The hosts are TCP proxies in front of the one test server.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::backends::Backend;
use common::proxy::{split_server_url, TcpProxy};
use common::scenarios::create_tag;
use common::TestServer;
use leafd::config::Config;

fn config(url: String) -> Config {
    let mut config = Config::default();
    config.storage.url = url;
    config.segment.adaptive_step = false;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_moves_to_the_next_host_when_its_host_stops_answering() {
    let test = "the_pool_moves_to_the_next_host_when_its_host_stops_answering";
    let Some(db) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    let (prefix, server) = split_server_url(&db.url);
    let name = db.url.rsplit('/').next().unwrap().to_string();
    let (a, b) = (
        TcpProxy::start(server.clone(), true).await,
        TcpProxy::start(server.clone(), true).await,
    );
    // First a host that refuses (port 1), then the two proxies.
    let url = format!(
        "{prefix}127.0.0.1:1,{},{}/{name}?target_session_attrs=read-write",
        a.addr, b.addr
    );
    let leafd = TestServer::start(config(url)).await;
    create_tag(&leafd, "hosts", 5, None).await;
    let mut con = leafd.client().await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(
            redis::cmd("INCR")
                .arg("segment:hosts")
                .query_async::<i64>(&mut con)
                .await
                .unwrap(),
        );
    }

    // The pool's host (the first proxy) goes away: within a few seconds IDs come through the
    // second, and none repeats.
    a.cut();
    let cut_at = Instant::now();
    let mut recovered = None;
    while cut_at.elapsed() < Duration::from_secs(15) {
        match redis::cmd("INCR")
            .arg("segment:hosts")
            .query_async::<i64>(&mut con)
            .await
        {
            Ok(id) => {
                ids.push(id);
                if ids.len() > 60 {
                    recovered.get_or_insert(cut_at.elapsed());
                    break;
                }
            }
            Err(e) => assert!(e.to_string().contains("UNAVAILABLE"), "{e}"),
        }
    }
    let recovered = recovered.expect("IDs through the second host");
    assert!(recovered < Duration::from_secs(10), "{recovered:?}");
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        ids.len(),
        "{ids:?}"
    );
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    leafd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_cannot_write_is_never_chosen() {
    let test = "a_session_that_cannot_write_is_never_chosen";
    let Some(db) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    let (prefix, server) = split_server_url(&db.url);
    let name = db.url.rsplit('/').next().unwrap().to_string();
    // Every session of this database is read-only, as on a standby.
    Backend::Postgres
        .execute(
            &db.url,
            &format!("ALTER DATABASE {name} SET default_transaction_read_only = on"),
        )
        .await;
    let url = format!("{prefix}127.0.0.1:1,{server}/{name}?target_session_attrs=read-write");
    let err = leafd::app::App::open(common::test_config(config(url)))
        .await
        .err()
        .expect("no host fits");
    let text = err.to_string();
    assert!(text.contains("no host fits target_session_attrs"), "{text}");
    assert!(text.contains("session not ReadWrite"), "{text}");
    // `any` takes the read-only session (and leafd then fails to write, as libpq users expect).
    let any = format!("{prefix}127.0.0.1:1,{server}/{name}?target_session_attrs=any");
    let err = leafd::app::App::open(common::test_config(config(any)))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(!err.contains("no host fits"), "{err}");
    // From another database: every session of this one is read-only now.
    Backend::Postgres
        .execute(
            &format!("{prefix}{server}/postgres"),
            &format!("ALTER DATABASE {name} SET default_transaction_read_only = off"),
        )
        .await;
}
