//! The rollback guard across a process boundary, as an operator meets it: the SQLite database
//! file is restored from a backup between two runs of the real binary.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::resp;

struct Node {
    child: Child,
    port: u16,
}

impl Node {
    fn start(dir: &std::path::Path) -> Node {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_leafd"))
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .args(["--http-bind", "127.0.0.1:0"])
            .args([
                "--storage-url",
                &format!("sqlite://{}/leafd.db", dir.display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let node = Node { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while node.call(&[b"PING"]).as_deref() != Some("+PONG") {
            assert!(Instant::now() < deadline, "leafd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        node
    }

    /// One command, one single-line reply (None while the server does not answer).
    fn call(&self, args: &[&[u8]]) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(&resp(args)).ok()?;
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\r\n") {
            stream.read_exact(&mut byte).ok()?;
            reply.push(byte[0]);
        }
        Some(String::from_utf8(reply).unwrap().trim_end().to_string())
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().unwrap();
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
    assert_eq!(moved, 10_100);
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
        next,
        moved + 1,
        "the first ID past the skip, above everything served"
    );
    node.stop();
}
