//! Shared test helpers: an in-process leafd on 127.0.0.1:0 (the library entry point), raw RESP I/O, and a store wrapper
//! that counts allocations and can fail or hang on demand.
#![allow(dead_code)]

pub mod backends;
pub mod binary;
pub mod proxy;
pub mod scenarios;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leafd::app::App;
use leafd::clock::SystemClock;
use leafd::config::Config;
use leafd::run::{RunError, Server};
use leafd::storage::{Grant, LeafAlloc, NewTag, SegmentStore, StoreError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// leafd in-process, started through the library entry point users run
/// ([`leafd::run::Server`]), on ports the system picks.
pub struct TestServer {
    pub addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The TLS RESP listener, when the config has `tls.bind`.
    pub tls_addr: Option<SocketAddr>,
    pub app: Arc<App>,
    /// The TLS listeners' settings (reload them as SIGHUP does).
    pub tls_settings: Vec<Arc<leafd::tls::TlsSettings>>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), RunError>>>,
    /// A state directory the harness made for this server ([`own_state_dir`]): removed when the
    /// server is dropped, also when its test fails.
    owned_state_dir: Option<std::path::PathBuf>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(dir) = self.owned_state_dir.take() {
            let _ = std::fs::remove_dir_all(&dir);
            // The per-process parent goes with its last server.
            if let Some(parent) = dir.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

impl TestServer {
    /// Starts leafd with the configured store.
    pub async fn start(config: Config) -> TestServer {
        let app = App::open(test_config(config)).await.expect("leafd starts");
        TestServer::serve(app).await
    }

    /// Starts leafd on a given store (wrappers, memory store).
    pub async fn start_with_store(config: Config, store: Arc<dyn SegmentStore>) -> TestServer {
        let app = App::with_store(test_config(config), store, Arc::new(SystemClock))
            .await
            .expect("leafd starts");
        TestServer::serve(app).await
    }

    /// Serves an application a test opened itself on a config from [`test_config`].
    pub async fn serve_app(app: Arc<App>) -> TestServer {
        TestServer::serve(app).await
    }

    async fn serve(app: Arc<App>) -> TestServer {
        let state_dir = std::path::PathBuf::from(&app.context.config.storage.state_dir);
        let owned_state_dir = state_dir
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|name| name.to_string_lossy() == state_parent_name())
            .then_some(state_dir);
        let server = Server::with_app(app.clone()).await.expect("listeners bind");
        let addrs = server.addrs();
        let tls_settings = server.tls_settings();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(server.serve(async {
            let _ = rx.await;
        }));
        TestServer {
            addr: addrs.resp.expect("a RESP listener"),
            http_addr: addrs.http.expect("an HTTP listener"),
            tls_addr: addrs.resp_tls,
            app,
            tls_settings,
            shutdown: Some(tx),
            handle: Some(handle),
            owned_state_dir,
        }
    }

    /// `http://127.0.0.1:<port><path>` of this server's HTTP listener.
    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http_addr)
    }

    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// The next ID of `tag` from the HTTP Leaf API (`GET /api/segment/get/<tag>`).
    pub async fn http_id(&self, tag: &str) -> i64 {
        let url = self.http_url(&format!("/api/segment/get/{tag}"));
        let body = http_get(&url).await.unwrap().text().await.unwrap();
        body.parse().unwrap_or_else(|_| panic!("{url}: {body}"))
    }

    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        // A loaded CI machine can take longer than the default half second to answer a long
        // pipeline (8,999 INCRs loading one small segment after another).
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("client connects")
    }

    pub async fn raw(&self) -> RawClient {
        RawClient {
            stream: TcpStream::connect(self.addr).await.unwrap(),
        }
    }

    /// Graceful stop: listeners closed, connections drained, HTTP stopped, storage closed.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(handle) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(10), handle)
                .await
                .expect("server stops within 10 s")
                .unwrap()
                .unwrap();
        }
    }
}

/// A config for a server of the test harness: [`own_state_dir`], and every listener it has on
/// 127.0.0.1 with a port the system picks.
pub fn test_config(config: Config) -> Config {
    let mut config = own_state_dir(config);
    let any_port = "127.0.0.1:0".to_string();
    config.server.bind = any_port.clone();
    config.http.bind = any_port.clone();
    if config.tls.bind.is_some() {
        config.tls.bind = Some(any_port);
    }
    config
}

/// Servers of one test binary run at once: each gets its own state directory (snowflake
/// fence, segment marks) unless the test chose one or a SQLite file (whose directory is the
/// state directory), so none waits for another's fence.
pub fn own_state_dir(mut config: Config) -> Config {
    let sqlite_file = config.storage.url.starts_with("sqlite://")
        && config.storage.url != Config::default().storage.url;
    if config.storage.state_dir.is_empty() && !sqlite_file && config.snowflake.fence_file.is_empty()
    {
        config.storage.state_dir =
            fresh_state_dir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    }
    config
}

/// A fresh state directory in memory (/dev/shm where there is one), where the rollback
/// guard's fdatasync costs nothing: for tests that time the engine, not the disk.
pub fn memory_state_dir() -> String {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        fresh_state_dir(shm)
    } else {
        fresh_state_dir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")))
    }
}

/// The directory of this test process's server state directories (one per server), under
/// cargo's `target/tmp` (or /dev/shm): a server stopped or dropped removes its own; what a
/// server left running wrote after it was dropped goes at the end of the run
/// (tests/zz_skipped.rs).
fn state_parent_name() -> String {
    format!("leafd-test-state-{}", std::process::id())
}

/// A path under `base` no other server of this test process uses; the server that uses it
/// removes it when dropped (see [`TestServer`]).
fn fresh_state_dir(base: &std::path::Path) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    base.join(state_parent_name())
        .join(NEXT.fetch_add(1, Ordering::Relaxed).to_string())
        .display()
        .to_string()
}

/// An HTTP client for the tests. leafd builds reqwest on rustls without a crypto provider of
/// its own (leafd brings ring, as for its listeners), so a client is given ring's settings.
pub fn http_client() -> reqwest::Client {
    let tls = leafd::tls::client_config(None, None).expect("rustls with ring");
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .expect("an HTTP client")
}

/// `reqwest::get` through [`http_client`].
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http_client().get(url).send().await
}

/// A config on a fresh SQLite file inside `dir`, with tags created through `[[segment.tags]]`.
pub fn sqlite_config(dir: &tempfile::TempDir) -> Config {
    let mut config = Config::default();
    config.storage.url = format!("sqlite://{}", dir.path().join("leafd.db").display());
    config
}

/// Plain TCP access for exact reply bytes.
pub struct RawClient {
    pub stream: TcpStream,
}

impl RawClient {
    /// Sends bytes and reads until `lines` CRLF-terminated lines arrived (or EOF).
    pub async fn send(&mut self, bytes: &[u8], lines: usize) -> String {
        self.stream.write_all(bytes).await.unwrap();
        self.read_lines(lines).await
    }

    pub async fn read_lines(&mut self, lines: usize) -> String {
        read_lines(&mut self.stream, lines).await.unwrap()
    }

    /// True when the server closed the connection (EOF within 5 s).
    pub async fn closed(&mut self) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

/// Reads from any stream (plain or TLS) until `lines` CRLF-terminated lines arrived or EOF;
/// an error when nothing arrives for 5 s or the stream fails.
pub async fn read_lines(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    lines: usize,
) -> std::io::Result<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while out.windows(2).filter(|w| w == b"\r\n").count() < lines {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::other("no reply within 5 s"))??;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Encodes a command as a RESP array of bulk strings.
pub fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// How a [`FlakyStore`] behaves right now.
pub const STORE_OK: u8 = 0;
pub const STORE_FAILS: u8 = 1;
pub const STORE_HANGS: u8 = 2;

/// Wraps a store, counts its allocations, and can be switched to fail at once or to hang, like
/// a database that is down or unreachable behind a dead network.
pub struct FlakyStore {
    pub inner: Arc<dyn SegmentStore>,
    pub mode: std::sync::atomic::AtomicU8,
    allocations: AtomicU64,
}

impl FlakyStore {
    pub fn new(inner: Arc<dyn SegmentStore>) -> Arc<FlakyStore> {
        Arc::new(FlakyStore {
            inner,
            mode: std::sync::atomic::AtomicU8::new(STORE_OK),
            allocations: AtomicU64::new(0),
        })
    }

    /// Calls of `allocate` so far (failed ones included).
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::SeqCst)
    }

    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    async fn gate(&self) -> Result<(), StoreError> {
        match self.mode.load(Ordering::SeqCst) {
            STORE_FAILS => Err(StoreError::Unavailable("connection refused".into())),
            STORE_HANGS => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl SegmentStore for FlakyStore {
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        self.allocations.fetch_add(1, Ordering::SeqCst);
        self.gate().await?;
        self.inner.allocate(tag, grant).await
    }
    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        self.allocations
            .fetch_add(requests.len() as u64, Ordering::SeqCst);
        self.gate().await?;
        self.inner.allocate_many(requests).await
    }
    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        self.gate().await?;
        self.inner.list().await
    }
    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.gate().await?;
        self.inner.rules().await
    }
    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.gate().await?;
        self.inner.rules_after(after, limit).await
    }
    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        self.gate().await?;
        self.inner.row(tag).await
    }
    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.create_tag(new).await
    }
    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.gate().await?;
        self.inner.claim_split(tag, expected, split).await
    }
    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError> {
        self.gate().await?;
        self.inner.resplit(tag, split, start).await
    }
    async fn raise(&self, tag: &str, floor: i64, marker: &str) -> Result<i64, StoreError> {
        self.gate().await?;
        self.inner.raise(tag, floor, marker).await
    }
    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        self.gate().await?;
        self.inner.claim_opaque(tag, marker, below).await
    }
    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.set_step(tag, step).await
    }
    fn worker_leases(self: Arc<Self>) -> Option<Arc<dyn leafd::storage::WorkerLeaseStore>> {
        self.inner.clone().worker_leases()
    }
    async fn schema_version(&self) -> Option<i64> {
        self.inner.schema_version().await
    }

    async fn identity(&self) -> Result<Option<leafd::storage::DbIdentity>, StoreError> {
        self.inner.identity().await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn close(&self) {
        self.inner.close().await
    }
}
