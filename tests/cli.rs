//! The command line as a newcomer types it: flags before or after the subcommand, one line for
//! a config error, `check-config` printing TOML that leafd reads back, `migrate` on a SQLite
//! path whose directory tree does not exist.

use std::process::Command;

fn leafd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leafd"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn flags_work_after_the_subcommand_and_migrate_creates_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    let (code, out, err) = leafd(&["migrate", "--storage-url", &url]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("created the schema in {url} (migrations 1 to 10)\n")
    );
    let (code, out, err) = leafd(&["migrate", "--storage-url", &url]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("schema of {url} is up to date (migration 10)\n")
    );
    let (code, _, err) = leafd(&[
        "migrate",
        "--storage-url",
        "sqlite:///nonexistent-leafd-dir/sub/x.db",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot create directory /nonexistent-leafd-dir/sub"),
        "{err}"
    );
    assert!(!std::path::Path::new("/nonexistent-leafd-dir").exists());
}

#[test]
fn a_config_error_is_one_line_naming_file_line_and_the_allowed_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[server]\nbind = \"127.0.0.1:6380\"\nbindd = 1\n").unwrap();
    let (code, _, err) = leafd(&["check-config", "--config", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "leafd: invalid config file {}, line 3, column 1: unknown field `bindd`, expected one of `bind`",
            file.display()
        )),
        "{err}"
    );
}

#[test]
fn check_config_prints_toml_that_leafd_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let (code, shown, err) = leafd(&[
        "check-config",
        "--config",
        "leafd.example.toml",
        "--requirepass",
        "s3cret",
        "--etcd-password",
        "e7cd-pw",
        "--bind",
        "localhost:6390",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(shown.contains("requirepass = \"<redacted>\""), "{shown}");
    assert!(!shown.contains("s3cret"));
    let etcd = shown
        .split("[snowflake.etcd]")
        .nth(1)
        .expect("the etcd section");
    assert!(etcd.contains("\npassword = \"<redacted>\""), "{shown}");
    assert!(!shown.contains("e7cd-pw"));
    for key in [
        "shutdown_timeout_secs",
        "max_multi_commands",
        "protected_mode",
        "state_dir",
        "failover_margin",
    ] {
        assert!(
            shown.contains(&format!("\n{key} = ")),
            "{key} missing:\n{shown}"
        );
    }
    let file = dir.path().join("effective.toml");
    std::fs::write(&file, &shown).unwrap();
    let (code, again, err) = leafd(&["check-config", "--config", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        again, shown,
        "the printed configuration reads back as itself"
    );
}

/// A Kubernetes Service named `leafd` makes the kubelet set `LEAFD_PORT=tcp://ip:port` in
/// every pod: it is not a port, and leafd starts with its configured address.
#[test]
fn a_kubernetes_service_link_in_leafd_port_is_ignored() {
    let out = Command::new(env!("CARGO_BIN_EXE_leafd"))
        .args(["check-config"])
        .env("LEAFD_PORT", "tcp://10.96.0.12:6380")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("bind = \"127.0.0.1:6380\""), "{shown}");
}

#[test]
fn start_errors_are_one_line_on_stderr_naming_their_cause() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_leafd"))
            .args(args)
            .env_remove("RUST_BACKTRACE")
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // A data directory that cannot be made: the path and the cause, at once (not retried).
    let (code, out, err) = run(&["migrate", "--storage-url", "sqlite:///dev/null/leafd/x.db"]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("leafd: cannot migrate sqlite:///dev/null/leafd/x.db: cannot create directory /dev/null/leafd for the SQLite database: Not a directory"),
        "{err}"
    );
    assert!(
        !out.contains("ERROR"),
        "the error is not logged a second time: {out}"
    );
    // A database file that cannot be opened (also as root: nothing can be created in /proc).
    let (code, _, err) = run(&["migrate", "--storage-url", "sqlite:///proc/leafd-test.db"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot open the SQLite database /proc/leafd-test.db: ")
            && err.contains("unable to open database file"),
        "{err}"
    );
    // Nothing listening: said as such, not "pool timed out".
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("mysql://root@127.0.0.1:{port}/leafd");
    let (code, _, err) = run(&["migrate", "--storage-url", &url]);
    assert_eq!(code, 1);
    assert!(err.contains("Connection refused"), "{err}");
    // A config error, with logs on: one line on stderr, nothing on stdout.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[server]\nmax_clients = \"lots\"\n").unwrap();
    let (code, out, err) = run(&["check-config", "--config", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(out, "", "no TOML and no log line on stdout");
    assert_eq!(
        err,
        format!(
            "leafd: invalid config file {}, line 2, column 15: server.max_clients: invalid type: string \"lots\", expected usize\n",
            file.display()
        )
    );
}

/// A bad flag or flag value is a fatal error like the others: one `leafd: ` line, status 1;
/// `--help` and `--version` still print whole with status 0.
#[test]
fn a_bad_flag_is_one_line_with_status_1() {
    for args in [
        &["--idle-timeout-secs", "x"][..],
        &["--no-such-flag"],
        &["frobnicate"],
    ] {
        let (code, out, err) = leafd(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("leafd: "), "{args:?}: {err}");
        assert!(err.contains("leafd --help"), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    let (code, _, err) = leafd(&["--idle-timeout-secs", "x"]);
    assert!(
        err.contains("'x'") && err.contains("--idle-timeout-secs"),
        "{code}: {err}"
    );
    let (code, out, _) = leafd(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Usage"), "{out}");
    let (code, out, _) = leafd(&["--version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("leafd "), "{out}");
}
