//! SQLite store, the embedded default: a WAL-mode file whose single-statement
//! `UPDATE … RETURNING` makes each allocation atomic even across processes.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool};
use sqlx::Sqlite;

use super::committed::{committed, pool_options};
use super::common::SharedSql;
use super::dialect::Dialect;
use super::sql_store::SqlStore;
use super::workers::LeaseTable;
use super::writer_turns::WriterTurns;
use super::{Grant, LeafAlloc, NewTag, StoreError};
use crate::config::StorageConfig;

pub struct SqliteStore {
    pool: SqlitePool,
    /// One allocation of this process at a time (see its `SqlStore` impl).
    writes: tokio::sync::Mutex<()>,
    /// And turns with the other processes on the file.
    turns: WriterTurns,
}

impl SqliteStore {
    /// Opens (creating if missing, with its directory) the database file and migrates it.
    /// Only the file's own directory is created (`data/` of the default URL): a mistyped path
    /// fails instead of growing a tree of directories from the root.
    pub async fn open(config: &StorageConfig, migrate: bool) -> Result<SqliteStore, StoreError> {
        let path = sqlite_path(&config.url)?;
        if let Some(dir) = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.exists())
        {
            std::fs::create_dir(dir).map_err(|e| {
                StoreError::FileAccess(format!(
                    "cannot create directory {} for the SQLite database: {e}",
                    dir.display()
                ))
            })?;
        }
        refuse_hard_links(&path)?;
        let options = SqliteConnectOptions::from_str("sqlite:")?
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        // Switching a new file to WAL mode needs the file to itself, and SQLite answers "database
        // is locked" at once, without its busy timeout, while another process opens it too
        // (nodes started together on a new file): retried for a few seconds.
        let mut attempts = 0;
        let pool = loop {
            match pool_options(config).connect_with(options.clone()).await {
                Err(sqlx::Error::Database(e))
                    if attempts < 50 && e.message().contains("locked") =>
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(20 + fastrand::u64(..60))).await;
                }
                Err(e) => {
                    return Err(StoreError::FileAccess(format!(
                        "cannot open the SQLite database {}: {e}",
                        path.display()
                    )))
                }
                Ok(pool) => break pool,
            }
        };
        let mut created = false;
        if migrate {
            created = super::migrate::lease_table_missing(&pool).await?;
            super::migrate::sqlite(&pool, sqlx::migrate!("./migrations/sqlite")).await?;
        }
        if created {
            LeaseTable::new(pool.clone())
                .record_new_lease_table()
                .await?;
        }
        SharedSql::<sqlx::Sqlite>::ensure_identity(&pool, created).await?;
        Ok(SqliteStore {
            pool,
            writes: tokio::sync::Mutex::new(()),
            turns: WriterTurns::beside(&path),
        })
    }
}

/// A database file with more than one name is refused: SQLite keeps its `-wal` and `-shm`
/// beside the name it was opened by, so processes reaching one file by two names (a hard link)
/// each see a database of their own, and both serve the same IDs (helper-7: 3,340,107 repeated
/// snowflake IDs, every segment ID twice). A symbolic link is one name, and is fine.
fn refuse_hard_links(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(meta) if meta.nlink() > 1 => Err(StoreError::FileAccess(format!(
            "the SQLite database {} has {} names (hard links): SQLite keeps its write-ahead log beside each name, so nodes opening it by different names would each see a database of their own and serve the same IDs; give every node the same path (a symbolic link is fine) and remove the other names",
            path.display(),
            meta.nlink()
        ))),
        _ => Ok(()),
    }
}

/// The file path inside `sqlite://path` / `sqlite:path` (query parameters are not supported).
fn sqlite_path(url: &str) -> Result<PathBuf, StoreError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| StoreError::UnsupportedUrl(url.to_string()))?;
    if rest.is_empty() || rest.contains('?') || rest.starts_with(':') {
        return Err(StoreError::UnsupportedUrl(url.to_string()));
    }
    Ok(Path::new(rest).to_path_buf())
}

/// What separates the tags [`rules`] reads as one text (a byte no tag leafd creates holds).
const TAG_SEPARATOR: char = '\u{1e}';

/// The tag list, `(tag, recorded rule)`, in two statements instead of a row each: the tags
/// recording no rule (nearly all of them) joined into one text by SQLite, the others row by
/// row. sqlx hands a SQLite row over in a few microseconds, which at 1,000,000 tags was most of
/// a node's start. Both read one snapshot (one read transaction).
async fn rules(store: &SqliteStore) -> Result<Vec<(String, Option<String>)>, StoreError> {
    rules_of(
        store,
        &format!("SELECT biz_tag, split FROM leaf_alloc WHERE {TEXT_TAG}"),
        None,
    )
    .await
}

/// A row is a tag when its `biz_tag` is text. A client that binds bytes stores a BLOB, which
/// no tag name (bound as text) ever equals, and which SQLite orders after every text: such a
/// row cannot be served, and left in a page it would keep the page's cursor from moving.
const TEXT_TAG: &str = "typeof(biz_tag) = 'text'";

/// A page of the tag list ([`super::SegmentStore::rules_after`]) read as [`rules`] reads it
/// all; sorted (SQLite's order of `biz_tag` is the bytes'), so the last is the cursor.
async fn rules_after(
    store: &SqliteStore,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, Option<String>)>, StoreError> {
    // Two texts, not `?1 IS NULL OR …`, which would keep the index from starting at `after`.
    let from = if after.is_some() {
        "AND biz_tag > ?1"
    } else {
        ""
    };
    let page = format!(
        "SELECT biz_tag, split FROM leaf_alloc WHERE {TEXT_TAG} {from} \
         ORDER BY biz_tag LIMIT {limit}"
    );
    let mut rules = rules_of(store, &page, after).await?;
    rules.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(rules)
}

/// The `(biz_tag, split)` rows `source` selects (binding `after` as `?1` when given), the ones
/// recording no rule joined into one text (see [`rules`]).
async fn rules_of(
    store: &SqliteStore,
    source: &str,
    after: Option<&str>,
) -> Result<Vec<(String, Option<String>)>, StoreError> {
    let joined_sql = format!(
        "SELECT group_concat(biz_tag, char(30)) FROM ({source}) \
         WHERE split IS NULL AND instr(biz_tag, char(30)) = 0"
    );
    let others_sql = format!(
        "SELECT biz_tag, split FROM ({source}) \
         WHERE split IS NOT NULL OR instr(biz_tag, char(30)) > 0"
    );
    let mut tx = store.pool.begin().await?;
    let mut joined = sqlx::query_scalar(&joined_sql);
    let mut others = sqlx::query_as(&others_sql);
    if let Some(after) = after {
        (joined, others) = (joined.bind(after), others.bind(after));
    }
    let joined: Option<String> = joined.fetch_one(&mut *tx).await?;
    let mut rules: Vec<(String, Option<String>)> = others.fetch_all(&mut *tx).await?;
    tx.rollback().await?;
    if let Some(joined) = joined {
        rules.extend(
            joined
                .split(TAG_SEPARATOR)
                .map(|tag| (tag.to_string(), None)),
        );
    }
    Ok(rules)
}

/// An allocation in one statement. It binds, in order: the step (`NULL`: the row's), the tag,
/// the window's span and usable positions (both `NULL` without a window) and the caller's
/// period rule (`NULL`: none; a row recording a period is moved only under it); it sets
/// `exclusive_max` to the new `max_id` (see [`super::SegmentStore::allocate`]). SET reads the
/// row as it was: the range starts at the old max_id when exclusive_max says a leafd
/// allocation left it unserved, else one above it (see migration 0005). The guard on `max_id`
/// keeps `max_id + step` from overflowing (SQLite would store a REAL).
const ALLOCATE: &str = "UPDATE leaf_alloc SET \
    max_id = max_id + COALESCE(?1, step) \
      + CASE WHEN exclusive_max = max_id THEN 0 ELSE 1 END, \
    exclusive_max = max_id + COALESCE(?1, step) \
      + CASE WHEN exclusive_max = max_id THEN 0 ELSE 1 END, \
    update_time = CURRENT_TIMESTAMP \
    WHERE biz_tag = ?2 AND COALESCE(?1, step) >= 1 \
    AND max_id <= 9223372036854775806 - COALESCE(?1, step) \
    AND (?3 IS NULL OR (max_id + CASE WHEN exclusive_max = max_id THEN 0 ELSE 1 END) % ?3 \
        + COALESCE(?1, step) <= ?4) \
    AND (split IS NULL OR split NOT LIKE 'period:%' OR split = ?5 OR split LIKE ?5 || ':%') \
    RETURNING biz_tag, max_id, step, description, opaque, split";

/// What an allocation that moved nothing found, binding the tag.
const EXISTS: &str = "SELECT max_id, exclusive_max, step, split FROM leaf_alloc WHERE biz_tag = ?1";

/// A new tag: tag, start (its `max_id` and `exclusive_max`), step, description, split.
const INSERT: &str =
    "INSERT INTO leaf_alloc (biz_tag, max_id, exclusive_max, step, description, split) \
    VALUES (?1, ?2, ?2, ?3, ?4, ?5)";

/// How long an allocation waits for its turn before it goes to SQLite's busy handler anyway
/// (a holder paused, or on a filesystem whose locks do not wake waiters).
const TURN_WAIT: Duration = Duration::from_secs(2);

const SET_STEP: &str =
    "UPDATE leaf_alloc SET step = ?1, update_time = CURRENT_TIMESTAMP WHERE biz_tag = ?2";

/// One file has one writer: a SQLite database has no replica to fail over to, so the failover
/// margin of a grant never applies, and `writes` lets one allocation of this process at a time
/// ask for the file's write lock: connections that find it taken sleep in SQLite's busy handler
/// (1 ms, 2 ms, 5 ms …) while the lock, held a tenth of a millisecond, goes unused. Processes
/// sharing the file take turns ([`WriterTurns`]) for the same reason.
#[async_trait]
impl SqlStore for SqliteStore {
    type DB = Sqlite;

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        let grant = &grant;
        let _one_writer = self.writes.lock().await;
        let _turn = self.turns.take(TURN_WAIT).await;
        committed(&self.pool, |mut tx| async move {
            let alloc =
                SharedSql::allocate_returning(&mut tx, tag, grant, ALLOCATE, EXISTS).await?;
            Ok((tx, alloc?))
        })
        .await
    }

    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        let _one_writer = self.writes.lock().await;
        let _turn = self.turns.take(TURN_WAIT).await;
        committed(&self.pool, |mut tx| async move {
            let mut out = Vec::with_capacity(requests.len());
            for (tag, grant) in requests {
                out.push(
                    SharedSql::allocate_returning(&mut tx, tag, grant, ALLOCATE, EXISTS).await?,
                );
            }
            Ok((tx, out))
        })
        .await
    }

    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        rules(self).await
    }

    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        rules_after(self, after, limit).await
    }

    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        committed(&self.pool, |mut tx| async move {
            SharedSql::guard_tag_count(&mut tx, new.max_tags).await?;
            sqlx::query(INSERT)
                .bind(new.tag.as_str())
                .bind(new.start)
                .bind(new.step)
                .bind(new.description.as_deref())
                .bind(new.split.as_deref())
                .execute(&mut *tx)
                .await
                .map_err(|e| super::insert_error(e, &new.tag))?;
            Ok((tx, ()))
        })
        .await
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        committed(&self.pool, |mut tx| async move {
            let done = sqlx::query(SET_STEP)
                .bind(step)
                .bind(tag)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::UnknownTag(tag.to_string()));
            }
            Ok((tx, ()))
        })
        .await
    }
}

impl Dialect for Sqlite {
    const BACKEND: &'static str = "sqlite";
    const NOW_MS: &'static str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

    fn placeholder(_: usize) -> String {
        "?".into()
    }

    /// One file, one instance: SQLite has no replica to fail over to.
    async fn instance(_: &mut SqliteConnection) -> Result<String, sqlx::Error> {
        Ok("sqlite".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{NewTag, SegmentStore};

    /// The tag list read in two statements is the table's: tags with and without a rule, one
    /// holding the separator byte, an empty name, and nothing at all.
    #[tokio::test]
    async fn the_tag_list_is_every_row_with_its_rule() {
        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig {
            url: format!("sqlite://{}", dir.path().join("l.db").display()),
            ..StorageConfig::default()
        };
        let store = SqliteStore::open(&config, true).await.unwrap();
        assert_eq!(rules(&store).await.unwrap(), vec![]);
        for (tag, split) in [
            ("a", None),
            ("b", Some("order:strict")),
            ("c", None),
            ("d\u{1e}e", None),
            ("", None),
            ("f", Some("2:1")),
        ] {
            let new = NewTag {
                tag: tag.into(),
                step: 10,
                start: 1,
                description: None,
                split: split.map(str::to_string),
                max_tags: 100,
            };
            SegmentStore::create_tag(&store, &new).await.unwrap();
        }
        let mut listed = rules(&store).await.unwrap();
        listed.sort();
        let expected: Vec<(String, Option<String>)> = [
            ("", None),
            ("a", None),
            ("b", Some("order:strict")),
            ("c", None),
            ("d\u{1e}e", None),
            ("f", Some("2:1")),
        ]
        .into_iter()
        .map(|(tag, split)| (tag.to_string(), split.map(str::to_string)))
        .collect();
        assert_eq!(listed, expected);
        SegmentStore::close(&store).await;
    }

    #[test]
    fn parses_sqlite_urls() {
        assert_eq!(
            sqlite_path("sqlite://data/x.db").unwrap(),
            Path::new("data/x.db")
        );
        assert_eq!(
            sqlite_path("sqlite:///tmp/x.db").unwrap(),
            Path::new("/tmp/x.db")
        );
        assert!(sqlite_path("sqlite::memory:").is_err());
        assert!(sqlite_path("sqlite://x.db?mode=ro").is_err());
    }
}
