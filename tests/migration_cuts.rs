//! A schema migration cut at any statement (kill -9, a lost connection, a certification
//! failure) is completed by the nodes that start next, three of them at once. MariaDB commits
//! each DDL statement by itself, so every cut point is made here exactly as sqlx leaves it: the
//! migrations before applied, the version row in progress, the first statements applied.
//! PostgreSQL runs each migration in one transaction: a cut leaves the migrations before it.

mod common;

use std::borrow::Cow;

use common::backends::Backend;
use leafd::app::App;
use leafd::config::Config;
use sqlx::migrate::Migrator;

/// The migrations before `version` only.
fn migrations_before(all: &Migrator, version: i64) -> Migrator {
    Migrator {
        migrations: Cow::Owned(
            all.iter()
                .filter(|m| m.version < version)
                .cloned()
                .collect(),
        ),
        ..Migrator::DEFAULT
    }
}

/// Leaves the MySQL database `url` as a start cut in `migration` leaves it: the migrations
/// before it applied, its version row in progress (sqlx writes it first) and its first
/// `applied` statements run (MySQL commits each DDL statement by itself).
async fn cut_mysql_migration(
    url: &str,
    all: &Migrator,
    migration: &sqlx::migrate::Migration,
    applied: usize,
) {
    use sqlx::Connection;
    let mut db = sqlx::MySqlConnection::connect(url).await.unwrap();
    // (With no migration before, this creates sqlx's table only.)
    migrations_before(all, migration.version)
        .run_direct(&mut db)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (?, ?, FALSE, ?, -1)",
    )
    .bind(migration.version)
    .bind(&*migration.description)
    .bind(&*migration.checksum)
    .execute(&mut db)
    .await
    .unwrap();
    for statement in &leafd::storage::migration_statements(&migration.sql)[..applied] {
        sqlx::query(statement).execute(&mut db).await.unwrap();
    }
}

/// Three nodes start at once on `url`: each must, and the schema must end complete.
async fn three_nodes_start(url: &str, cut: &str) {
    let states: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let open = |i: usize| {
        let mut config = Config::default();
        config.storage.url = url.to_string();
        config.storage.state_dir = states[i].path().display().to_string();
        config.snowflake.database_lease_ms = 1000;
        App::open(common::test_config(config))
    };
    let (a, b, c) = tokio::join!(open(0), open(1), open(2));
    let apps: Vec<_> = [a, b, c]
        .into_iter()
        .map(|app| app.unwrap_or_else(|e| panic!("{cut}: a node did not start: {e}")))
        .collect();
    for app in &apps {
        app.snowflake().unwrap().next_ids(1).await.unwrap();
        app.close().await;
    }
}

async fn check_schema(backend: Backend, url: &str, cut: &str, last: i64) {
    let checks = [
        "SELECT biz_tag, max_id, step, writer, opaque, exclusive_max, split FROM leaf_alloc",
        "SELECT counter FROM leafd_guard WHERE name = 'tags'",
    ];
    for sql in checks {
        backend.execute(url, sql).await;
    }
    let applied = backend
        .query_i64(url, "SELECT COUNT(*) FROM _sqlx_migrations WHERE success")
        .await;
    assert_eq!(applied, last, "{cut}: every migration applied");
    let record = backend
        .query_i64(url, "SELECT COUNT(*) FROM leaf_worker WHERE worker_id = -1")
        .await;
    assert_eq!(record, 1, "{cut}: row -1 of leaf_worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_migration_cut_at_each_statement() {
    if Backend::MySql
        .server_url("mysql_a_migration_cut_at_each_statement")
        .is_none()
    {
        return;
    }
    let all = sqlx::migrate!("./migrations/mysql");
    let last = all.iter().map(|m| m.version).max().unwrap();
    let mut states = 0;
    for migration in all.iter() {
        let statements = leafd::storage::migration_statements(&migration.sql);
        for applied in 0..=statements.len() {
            let cut = format!(
                "migration {} cut after {applied} of {} statements",
                migration.version,
                statements.len()
            );
            let url = Backend::MySql
                .fresh_database("mysql_a_migration_cut_at_each_statement")
                .await
                .unwrap();
            cut_mysql_migration(&url, &all, migration, applied).await;
            three_nodes_start(&url, &cut).await;
            check_schema(Backend::MySql, &url, &cut, last).await;
            states += 1;
        }
    }
    assert_eq!(states, 21, "cut points tried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_migration_cut_at_each_migration() {
    if Backend::Postgres
        .server_url("postgres_a_migration_cut_at_each_migration")
        .is_none()
    {
        return;
    }
    let all = sqlx::migrate!("./migrations/postgres");
    let last = all.iter().map(|m| m.version).max().unwrap();
    for migration in all.iter() {
        let cut = format!("cut in migration {}", migration.version);
        let url = Backend::Postgres
            .fresh_database("postgres_a_migration_cut_at_each_migration")
            .await
            .unwrap();
        {
            use sqlx::Connection;
            let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
            migrations_before(&all, migration.version)
                .run_direct(&mut db)
                .await
                .unwrap();
        }
        three_nodes_start(&url, &cut).await;
        check_schema(Backend::Postgres, &url, &cut, last).await;
    }
}

/// A node killed while it held the migration lock (a row with a lease) and cut its migration
/// part-way: the next nodes wait out the lease, then one takes the lock and completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_lock_left_by_a_killed_migration_is_taken_over() {
    let Some(url) = Backend::MySql
        .fresh_database("mysql_a_lock_left_by_a_killed_migration_is_taken_over")
        .await
    else {
        return;
    };
    let all = sqlx::migrate!("./migrations/mysql");
    let cut = all.iter().find(|m| m.version == 7).unwrap();
    cut_mysql_migration(&url, &all, cut, 1).await;
    {
        use sqlx::Connection;
        let mut db = sqlx::MySqlConnection::connect(&url).await.unwrap();
        // The lock as the killed node left it: 3 s of its lease left.
        sqlx::query("CREATE TABLE leafd_migration_lock (id INT NOT NULL PRIMARY KEY, holder VARCHAR(64) NOT NULL, until_ms BIGINT NOT NULL)")
            .execute(&mut db)
            .await
            .unwrap();
        sqlx::query("INSERT INTO leafd_migration_lock VALUES (1, 'killed', CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 3000)")
            .execute(&mut db)
            .await
            .unwrap();
    }
    let started = std::time::Instant::now();
    three_nodes_start(&url, "a killed holder's lock").await;
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(2500)
            && waited < std::time::Duration::from_secs(10),
        "the lock's lease is waited out, no more: {waited:?}"
    );
    let last = all.iter().map(|m| m.version).max().unwrap();
    check_schema(Backend::MySql, &url, "a killed holder's lock", last).await;
}

/// An upgrade from migration 8 onto a lease table with no rows (a table wiped just before the
/// upgrade, or one no node ever claimed in): the first claim waits a whole lease, since a node
/// of the previous release may hold an id the table lost. Only a database this start creates
/// is known to have no holder.
async fn an_upgrade_onto_an_empty_lease_table_waits_a_lease(backend: Backend, url: &str) {
    use sqlx::Connection;
    let all = match backend {
        Backend::MySql => sqlx::migrate!("./migrations/mysql"),
        Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
    };
    match backend {
        Backend::MySql => {
            let mut db = sqlx::MySqlConnection::connect(url).await.unwrap();
            migrations_before(&all, 9)
                .run_direct(&mut db)
                .await
                .unwrap();
        }
        Backend::Postgres => {
            let mut db = sqlx::PgConnection::connect(url).await.unwrap();
            migrations_before(&all, 9)
                .run_direct(&mut db)
                .await
                .unwrap();
        }
    }
    let state = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.storage.url = url.to_string();
    config.storage.state_dir = state.path().display().to_string();
    config.snowflake.database_lease_ms = 2000;
    let started = std::time::Instant::now();
    let app = App::open(common::test_config(config)).await.unwrap();
    app.snowflake().unwrap().next_ids(1).await.unwrap();
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1900),
        "the first claim after the upgrade waits a lease ({:?})",
        started.elapsed()
    );
    app.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_an_upgrade_onto_an_empty_lease_table_waits_a_lease() {
    let Some(url) = Backend::MySql
        .fresh_database("mysql_an_upgrade_onto_an_empty_lease_table_waits_a_lease")
        .await
    else {
        return;
    };
    an_upgrade_onto_an_empty_lease_table_waits_a_lease(Backend::MySql, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_upgrade_onto_an_empty_lease_table_waits_a_lease() {
    let Some(url) = Backend::Postgres
        .fresh_database("postgres_an_upgrade_onto_an_empty_lease_table_waits_a_lease")
        .await
    else {
        return;
    };
    an_upgrade_onto_an_empty_lease_table_waits_a_lease(Backend::Postgres, &url).await;
}
