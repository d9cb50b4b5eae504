//! The real binary as a child process, for the tests that need a process boundary (signals,
//! files surviving a restart): one launcher, one port picker.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `leafd` process; killed when dropped unless it was waited for.
pub struct LeafdProcess {
    child: Option<Child>,
}

impl LeafdProcess {
    /// Starts the binary with `args`, its output discarded.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> LeafdProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_leafd"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("leafd starts");
        LeafdProcess { child: Some(child) }
    }

    /// A node on the SQLite database `dir/leafd.db` (its state beside it), RESP on `port`,
    /// HTTP on a port the system picks; returns once it answers PING.
    pub fn sqlite_node(dir: &std::path::Path, port: u16) -> LeafdProcess {
        let process = LeafdProcess::spawn(&[
            "--bind".to_string(),
            format!("127.0.0.1:{port}"),
            "--http-bind".to_string(),
            "127.0.0.1:0".to_string(),
            "--storage-url".to_string(),
            format!("sqlite://{}/leafd.db", dir.display()),
        ]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while call(port, &[b"PING"]).as_deref() != Some("+PONG") {
            assert!(Instant::now() < deadline, "leafd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        process
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends a signal by name (`-TERM`, `-HUP`, `-KILL`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([name, &self.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {name} failed");
    }

    /// Waits for the process to exit.
    pub fn wait(mut self) -> ExitStatus {
        self.child.take().expect("running").wait().unwrap()
    }

    /// SIGTERM, then waits for the exit.
    pub fn stop(self) -> ExitStatus {
        self.signal("-TERM");
        self.wait()
    }
}

impl Drop for LeafdProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One command on a fresh connection to 127.0.0.1:`port`, one single-line reply (None while
/// the server does not answer).
pub fn call(port: u16, args: &[&[u8]]) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(&super::resp(args)).ok()?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        stream.read_exact(&mut byte).ok()?;
        reply.push(byte[0]);
    }
    Some(String::from_utf8(reply).unwrap().trim_end().to_string())
}
