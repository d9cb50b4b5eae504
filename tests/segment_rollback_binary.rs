//! The rollback guard across a process boundary, as an operator meets it: the SQLite database
//! file is restored from a backup between two runs of the real binary.

mod common;

use std::time::{Duration, Instant};

use common::binary::{call, free_port, LeafdProcess};

/// A node on the SQLite database in `dir`, and its RESP port.
struct Node {
    process: LeafdProcess,
    port: u16,
}

impl Node {
    fn start(dir: &std::path::Path) -> Node {
        let port = free_port();
        Node {
            process: LeafdProcess::sqlite_node(dir, port),
            port,
        }
    }

    fn call(&self, args: &[&[u8]]) -> Option<String> {
        call(self.port, args)
    }

    fn stop(self) {
        self.process.stop();
    }
}

fn copy_db(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let name = format!("leafd.db{suffix}");
        let _ = std::fs::remove_file(to.join(&name));
        if from.join(&name).exists() {
            std::fs::copy(from.join(&name), to.join(&name)).unwrap();
        }
    }
}

#[test]
fn a_restored_backup_is_refused_until_the_tag_is_moved_forward() {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    let node = Node::start(dir.path());
    assert_eq!(
        node.call(&[b"LEAF.TAG", b"CREATE", b"restored", b"100"])
            .as_deref(),
        Some("+OK")
    );
    node.stop();
    copy_db(dir.path(), &backup); // the backup, taken after the tag was created

    let node = Node::start(dir.path());
    let mut highest = 0;
    for _ in 0..250 {
        highest = node.call(&[b"INCR", b"segment:restored"]).unwrap()[1..]
            .parse::<i64>()
            .unwrap();
    }
    assert_eq!(highest, 250);
    // Segments of 100, then 200 and 400 (the adaptive step doubles): loaded up to 700.
    node.stop();

    copy_db(&backup, dir.path()); // the restore
    let node = Node::start(dir.path());
    let refused = node.call(&[b"INCR", b"segment:restored"]).unwrap();
    assert!(
        refused.starts_with(
            "-ROLLBACK tag 'restored': the database returned IDs from 1, at or below 700, the highest this node already loaded"
        ),
        "{refused}"
    );
    let moved: i64 = node
        .call(&[b"LEAF.TAG", b"SKIP", b"restored", b"10000"])
        .unwrap()[1..]
        .parse()
        .unwrap();
    // The refused load moved the row by one step (100) already; those IDs are never served.
    // max_id is the next ID, as Leaf reads the table: 1 + 100 + 10,000.
    assert_eq!(moved, 10_101);
    let deadline = Instant::now() + Duration::from_secs(10);
    let next = loop {
        let reply = node.call(&[b"INCR", b"segment:restored"]).unwrap();
        if let Some(id) = reply.strip_prefix(':') {
            break id.parse::<i64>().unwrap();
        }
        assert!(Instant::now() < deadline, "{reply}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        next, moved,
        "the first ID past the skip (the table's max_id), above everything served"
    );
    node.stop();
}

/// The binary on the SQLite database in `dir`, expected to refuse to start: its stderr.
fn refused_start(dir: &std::path::Path) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leafd"))
        .args([
            "--bind",
            &format!("127.0.0.1:{}", free_port()),
            "--http-bind",
            "127.0.0.1:0",
        ])
        .arg("--storage-url")
        .arg(format!("sqlite://{}/leafd.db", dir.display()))
        .stdout(std::process::Stdio::null())
        .output()
        .expect("leafd runs");
    assert_eq!(
        output.status.code(),
        Some(1),
        "leafd started on damaged marks"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A restore beside a marks log damaged from its first byte (or by one line that does not
/// parse), emptied or deleted is refused at start, never served from the marks left: the node
/// had served IDs up to the INCRBY block and the 300 INCRs after it before it was killed.
#[test]
fn a_damaged_marks_log_is_refused_with_a_restored_database() {
    // `None`: the log is deleted.
    for damage in [
        Some(&b"garbage"[..]),
        Some(b"[\"t\",12x]\n"),
        Some(b"\n"),
        Some(b""),
        None,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let backup = dir.path().join("backup");
        let node = Node::start(dir.path());
        assert_eq!(
            node.call(&[b"LEAF.TAG", b"CREATE", b"t", b"100"])
                .as_deref(),
            Some("+OK")
        );
        for _ in 0..3 {
            assert!(node
                .call(&[b"INCR", b"segment:t"])
                .unwrap()
                .starts_with(':'));
        }
        node.stop();
        copy_db(dir.path(), &backup);
        let node = Node::start(dir.path());
        let block = node.call(&[b"INCRBY", b"segment:t", b"1000"]).unwrap();
        assert!(block.starts_with(':'), "{block}");
        for _ in 0..300 {
            assert!(node
                .call(&[b"INCR", b"segment:t"])
                .unwrap()
                .starts_with(':'));
        }
        node.process.signal("-KILL");
        node.process.wait();
        copy_db(&backup, dir.path());
        let log = dir.path().join("segment-marks.json.log");
        assert!(log.exists(), "the killed node's marks are in the log");
        match damage {
            Some(bytes) => std::fs::write(&log, bytes).unwrap(),
            None => std::fs::remove_file(&log).unwrap(),
        }
        let refused = refused_start(dir.path());
        assert!(
            refused.starts_with("leafd: ")
                && refused.contains("segment-marks.json.log")
                && refused.contains("storage.discard_unreadable_marks"),
            "{:?}: {refused}",
            damage.map(String::from_utf8_lossy)
        );
    }
}
