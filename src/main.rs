//! The leafd binary: reads configuration (file, then `LEAFD_*` environment, then flags),
//! starts the application and the RESP listener, and shuts down on SIGINT/SIGTERM.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use leafd::config::Config;

/// leafd: unique IDs (Meituan Leaf segment mode) over the Redis protocol. Flags go before or
/// after the subcommand (`leafd migrate --config leafd.toml`).
#[derive(Parser, Debug)]
#[command(version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LEAFD_COMMIT"), ")"), about, long_about = None)]
struct Cli {
    /// TOML configuration file; keys it omits keep their defaults.
    #[arg(short, long, env = "LEAFD_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// RESP listen address (server.bind), e.g. 127.0.0.1:6380; "" for none (TLS only).
    #[arg(long, env = "LEAFD_BIND", global = true)]
    bind: Option<String>,
    /// RESP port, as redis-server's --port: the configured (or --bind) host with this port.
    #[arg(long, env = "LEAFD_PORT", global = true)]
    port: Option<u16>,
    /// HTTP listen address for /metrics and the Leaf HTTP API (http.bind).
    #[arg(long, env = "LEAFD_HTTP_BIND", global = true)]
    http_bind: Option<String>,
    /// Storage URL (storage.url): sqlite://path, mysql://…, postgres://….
    #[arg(long, env = "LEAFD_STORAGE_URL", global = true)]
    storage_url: Option<String>,
    /// Password clients must AUTH with (server.requirepass).
    #[arg(long, env = "LEAFD_REQUIREPASS", hide_env_values = true, global = true)]
    requirepass: Option<String>,
    /// Password of the etcd user (snowflake.etcd.password), kept out of the config file.
    #[arg(
        long,
        env = "LEAFD_ETCD_PASSWORD",
        hide_env_values = true,
        global = true
    )]
    etcd_password: Option<String>,
    /// Maximum simultaneous clients (server.max_clients).
    #[arg(long, env = "LEAFD_MAX_CLIENTS", global = true)]
    max_clients: Option<usize>,
    /// Close connections idle this many seconds; 0 = never (server.idle_timeout_secs).
    #[arg(long, env = "LEAFD_IDLE_TIMEOUT_SECS", global = true)]
    idle_timeout_secs: Option<u64>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the server (the default).
    Serve,
    /// Print the effective configuration as TOML leafd reads back (secrets redacted) and exit.
    CheckConfig,
    /// Create or upgrade the leaf_alloc schema in the configured database, then exit.
    Migrate,
}

impl Cli {
    fn load_config(&self) -> anyhow::Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(v) = &self.bind {
            config.server.bind = v.clone();
        }
        if let Some(port) = self.port {
            config.server.bind = with_port(&config.server.bind, port)?;
        }
        if let Some(v) = &self.http_bind {
            config.http.bind = v.clone();
        }
        if let Some(v) = &self.storage_url {
            config.storage.url = v.clone();
        }
        if let Some(v) = &self.requirepass {
            config.server.requirepass = Some(v.clone());
        }
        if let Some(v) = &self.etcd_password {
            config.snowflake.etcd.password = Some(v.clone());
        }
        if let Some(v) = self.max_clients {
            config.server.max_clients = v;
        }
        if let Some(v) = self.idle_timeout_secs {
            config.server.idle_timeout_secs = v;
        }
        leafd::app::validate_config(&config)?;
        Ok(config)
    }
}

/// `host:port` with the port replaced (IPv6 hosts in brackets, as in `[::]:6380`).
fn with_port(bind: &str, port: u16) -> anyhow::Result<String> {
    let host = match bind.rsplit_once(':') {
        Some((host, _)) if !host.is_empty() => host,
        _ => anyhow::bail!("--port needs server.bind to name a host (it is {bind:?})"),
    };
    Ok(format!("{host}:{port}"))
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(term) => term,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops leafd");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// SIGHUP re-reads the TLS certificate, key and client CA files; new connections use them,
/// connected clients keep theirs. A file that fails to load leaves the previous ones in use.
async fn reload_tls_on_hangup(settings: Vec<std::sync::Arc<leafd::tls::TlsSettings>>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hangup.recv().await.is_some() {
            if settings.is_empty() {
                tracing::info!("SIGHUP: no TLS listener, nothing to reload");
            }
            for listener in &settings {
                match listener.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificates reloaded"),
                    Err(e) => {
                        tracing::error!(error = %e, "SIGHUP: TLS reload failed; the previous certificates stay in use")
                    }
                }
            }
        }
    }
    #[cfg(not(unix))]
    drop(settings);
}

/// Logs one line naming the cause (library errors already carry their sources' text) and exits 1.
/// A fatal error: one line on stderr (not also a log line: logs go to stdout, where
/// `check-config` prints its TOML), then exit 1.
fn fail(err: &dyn std::fmt::Display) -> ! {
    eprintln!("leafd: {err}");
    std::process::exit(1)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        // Colour codes only for a terminal, so log files and journald stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // Kubernetes injects `<SERVICE>_PORT=tcp://ip:port` for every Service: one named leafd
    // sets LEAFD_PORT to that, which is not this node's port.
    if std::env::var("LEAFD_PORT").is_ok_and(|v| v.contains("://")) {
        tracing::warn!(
            "ignoring LEAFD_PORT: it holds a Kubernetes service link (tcp://…), not a port"
        );
        std::env::remove_var("LEAFD_PORT");
    }
    // A bad flag is a fatal error like any other: one `leafd: ` line, status 1 (help and
    // version are printed whole, status 0).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.render().to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            fail(&format!("{first} (leafd --help lists the flags)"))
        }
    };
    // One line naming the file, the line and what is allowed; no error chain, no backtrace.
    let config = match cli.load_config() {
        Ok(config) => config,
        Err(e) => fail(&e),
    };
    match cli.command {
        Some(Command::CheckConfig) => {
            print!("{}", config.to_toml_redacted());
            return Ok(());
        }
        Some(Command::Migrate) => {
            let url = config.storage.redacted_url();
            let mut before = None;
            for migrate in [false, true] {
                let store = match leafd::storage::open(&config.storage, migrate).await {
                    Ok(store) => store,
                    Err(e) => fail(&format!("cannot migrate {url}: {e}")),
                };
                let version = store.schema_version().await;
                store.close().await;
                if !migrate {
                    before = version;
                    continue;
                }
                let now = version.map_or("none".into(), |v| v.to_string());
                match before {
                    Some(b) if Some(b) == version => {
                        println!("schema of {url} is up to date (migration {now})")
                    }
                    Some(b) => println!("migrated {url} from migration {b} to {now}"),
                    None => println!("created the schema in {url} (migrations 1 to {now})"),
                }
            }
            return Ok(());
        }
        Some(Command::Serve) | None => {}
    }
    let server = match leafd::run::Server::open(config).await {
        Ok(server) => server,
        Err(e) => fail(&e),
    };
    tokio::spawn(reload_tls_on_hangup(server.tls_settings()));
    if let Err(e) = server.serve(shutdown_signal()).await {
        fail(&e);
    }
    Ok(())
}
