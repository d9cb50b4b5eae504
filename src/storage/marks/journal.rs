//! The marks on disk: a snapshot in two slot files written in turn, and an append-only log of
//! the marks raised since, compacted into the next snapshot once it outgrows it.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A log shorter than this is never compacted: appending is cheaper than rewriting every mark.
const COMPACT_AT_LEAST: u64 = 1 << 20;

/// One snapshot: `{seq, marks}`. Slot `.a` holds even, `.b` odd sequence numbers; each write
/// truncates the older slot, writes and fdatasyncs it, so the newest slot that parses is
/// always complete, and a write torn by a crash leaves the other, one snapshot older.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Record {
    pub seq: u64,
    pub marks: HashMap<String, i64>,
}

/// The log's first line: the snapshot it follows. A process that finds another number there
/// knows another process compacted, and reads the snapshot and the log again.
#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    after: u64,
}

/// What the lock file holds besides its lock: the log's length (and the snapshot it followed)
/// after the last append or compaction, written once the log's bytes were synced. A log that
/// ends before it, or is gone, lost lines a crash cannot lose: whole marks, cut or deleted.
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq, Clone, Copy)]
pub(super) struct Tail {
    pub after: u64,
    pub len: u64,
}

/// The tail record is written at the lock file's start as one write of this many bytes
/// (padded with spaces), so it is never half old and half new.
const TAIL_BYTES: usize = 64;

/// The tail record of the lock file: `None` when there is none (a directory an older release
/// wrote, a first start, or zeros a crash left in a new file), `Err` when it is damaged.
pub(super) fn read_tail(path: &Path) -> Result<Option<Tail>, String> {
    let file = suffixed(path, ".lock");
    let bytes = match std::fs::read(&file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("segment marks {}: {e}", file.display())),
    };
    if bytes.iter().all(|&b| b == 0 || b.is_ascii_whitespace()) {
        return Ok(None);
    }
    serde_json::from_slice::<Tail>(bytes.trim_ascii())
        .map(Some)
        .map_err(|e| format!("{}: no record of the log's length ({e})", file.display()))
}

/// The directory's lock taken shared, while it is held (`None`: no lock file yet, or a
/// filesystem that does not lock, where a log read after the record still holds what it says).
fn shared_lock(path: &Path) -> Result<Option<LockGuard>, String> {
    let file = suffixed(path, ".lock");
    let lock = match File::open(&file) {
        Ok(lock) => lock,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("segment marks {}: {e}", file.display())),
    };
    match lock.lock_shared() {
        Ok(()) => Ok(Some(LockGuard(lock))),
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Ok(None),
        Err(e) => Err(format!("segment marks {}: {e}", file.display())),
    }
}

/// Why a log read as `log` (a missing one when `None`) lost what `tail` says it held, beside
/// a newest readable snapshot `snapshot_seq`.
fn tail_lost(tail: Tail, log: Option<&LogRead>, snapshot_seq: u64) -> Option<String> {
    let (follows, end) = log.map_or((0, 0), |l| (l.header.unwrap_or(0), l.end));
    if snapshot_seq > tail.after {
        // A compaction wrote a snapshot of the whole log the record describes, then crashed
        // before the log's new header (or its record): every mark is in the snapshot.
        None
    } else if log.is_none() && tail.len > 0 {
        Some(format!("it is gone, and it held {} bytes", tail.len))
    } else if tail.after > follows {
        Some(format!(
            "it follows snapshot {follows}, and it last followed snapshot {}",
            tail.after
        ))
    } else if tail.after == follows && end < tail.len {
        Some(format!(
            "it ends at byte {end}, and it held {} bytes",
            tail.len
        ))
    } else {
        // Shorter by a compaction that crashed before this record: its marks are in the
        // snapshot the header names.
        None
    }
}

pub(super) fn slot(path: &Path, seq: u64) -> PathBuf {
    suffixed(path, if seq.is_multiple_of(2) { ".a" } else { ".b" })
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn dir_of(path: &Path) -> PathBuf {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => dir.to_path_buf(),
        None => PathBuf::from("."),
    }
}

/// Raises `tag`'s mark in `marks` to `mark`.
pub(super) fn raise(marks: &mut HashMap<String, i64>, tag: &str, mark: i64) {
    match marks.get_mut(tag) {
        Some(known) => *known = (*known).max(mark),
        None => {
            marks.insert(tag.to_string(), mark);
        }
    }
}

/// The newest complete snapshot of the two slots, and the slots that could not be parsed.
pub(super) fn read_newest(path: &Path) -> Result<(Option<Record>, Vec<String>), String> {
    let mut newest: Option<Record> = None;
    let mut unreadable = Vec::new();
    for seq in [0, 1] {
        let file = slot(path, seq);
        match std::fs::read(&file) {
            // A torn or empty slot is the older one: the other holds the last record.
            Ok(bytes) => match serde_json::from_slice::<Record>(&bytes) {
                Ok(record) => {
                    if newest.as_ref().is_none_or(|n| record.seq > n.seq) {
                        newest = Some(record)
                    }
                }
                Err(e) => unreadable.push(format!("{}: {e}", file.display())),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("segment marks file {}: {e}", file.display())),
        }
    }
    Ok((newest, unreadable))
}

/// What a read of the log found: its header (the first line, when `at_start`), its entries,
/// the end of the last line read whole, and where it stopped on damage.
pub(super) struct LogRead {
    pub header: Option<u64>,
    pub entries: Vec<(String, i64)>,
    pub end: u64,
    /// A complete line that does not parse, or a last line without its newline that no write
    /// could have left: the log is damaged, and nothing from there on is believed.
    pub damage: Option<String>,
}

/// Reads log bytes line by line. A last line without its newline is a write torn by a crash or
/// a full disk (not an entry; the next append overwrites it) only when it is the beginning of
/// a line leafd writes, possibly followed by zero bytes (a size that grew before its data);
/// anything else, and any complete line that does not parse, is damage.
pub(super) fn parse_log(bytes: &[u8], at_start: bool) -> LogRead {
    let mut read = LogRead {
        header: None,
        entries: Vec::new(),
        end: 0,
        damage: None,
    };
    let mut at = 0usize;
    while let Some(len) = bytes[at..].iter().position(|&b| b == b'\n') {
        let line = &bytes[at..at + len];
        if at == 0 && at_start {
            if let Ok(h) = serde_json::from_slice::<Header>(line) {
                read.header = Some(h.after);
                at += len + 1;
                read.end = at as u64;
                continue;
            }
        }
        match serde_json::from_slice::<(String, i64)>(line) {
            Ok(entry) => read.entries.push(entry),
            Err(e) => {
                read.damage = Some(format!("line at byte {at} is not a mark ({e})"));
                return read;
            }
        }
        at += len + 1;
        read.end = at as u64;
    }
    let tail = &bytes[at..];
    // Zeros where the file's first line belongs are no torn append: that line was written
    // and synced before (a header, or marks whose ranges were served).
    let zeros_first = at == 0 && at_start && !tail.is_empty() && tail.iter().all(|&b| b == 0);
    if zeros_first || !torn_write(tail) {
        read.damage = Some(format!(
            "its last {} bytes (at byte {at}) are no line leafd writes",
            tail.len()
        ));
    }
    read
}

/// Whether bytes after the last newline may be a write cut short: the beginning of an entry
/// (`["<tag>",<mark>]`) or a header (`{"after":<seq>}`), then only zero bytes.
fn torn_write(tail: &[u8]) -> bool {
    let end = tail.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let written = &tail[..end];
    if written.is_empty() {
        return true;
    }
    let header = b"{\"after\":";
    if written[0] == b'{' {
        let fixed = written.len().min(header.len());
        return written[..fixed] == header[..fixed] && digits_then(&written[fixed..], Some(b'}'));
    }
    if written[0] != b'[' {
        return false;
    }
    // The tag: a JSON string, any bytes but an unescaped quote.
    let mut i = 1;
    if i == written.len() {
        return true;
    }
    if written[i] != b'"' {
        return false;
    }
    i += 1;
    loop {
        match written.get(i) {
            None => return true,
            Some(b'\\') => i += 2,
            Some(b'"') => break,
            Some(_) => i += 1,
        }
    }
    i += 1;
    match written.get(i) {
        None => true,
        Some(b',') => {
            let rest = &written[i + 1..];
            digits_then(rest.strip_prefix(b"-").unwrap_or(rest), Some(b']'))
        }
        Some(_) => false,
    }
}

/// `bytes` is digits, then at most the closing byte `close` and nothing after it.
fn digits_then(bytes: &[u8], close: Option<u8>) -> bool {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    match &bytes[digits..] {
        [] => true,
        [last] => Some(*last) == close && digits > 0,
        _ => false,
    }
}

/// This process's handle on the marks files; one write at a time (the caller serialises).
pub(super) struct Journal {
    path: PathBuf,
    /// `<path>.lock` and `<path>.log`, opened at the first write.
    files: Option<(File, File)>,
    /// The snapshot the log followed when this process last read it.
    generation: u64,
    /// Bytes of the log this process has read, up to the end of its last complete line.
    read_to: u64,
    /// Size of the newest snapshot: the log is compacted once it is twice as long.
    snapshot_bytes: u64,
    /// Sequence number of the newest complete snapshot.
    snapshot_seq: u64,
    /// The log is never compacted below this length.
    pub compact_at_least: u64,
}

/// What [`Journal::open`] found: the marks and the slots that could not be read.
pub(super) struct Opened {
    pub journal: Journal,
    pub marks: HashMap<String, i64>,
    pub unreadable: Vec<String>,
    /// Files that are damaged, not torn by a crash: what they held is not known.
    pub damaged: Vec<String>,
}

impl Journal {
    /// Reads the newest snapshot and the log after it.
    pub fn open(path: PathBuf) -> Result<Opened, String> {
        // Another process sharing the directory appends and compacts under its exclusive lock:
        // a shared one over these reads sees the snapshot, the log and the lock file's record
        // of one moment (not a snapshot from before its compaction and a log from after). A
        // directory without a lock file has no other writer; none is created here.
        let _shared = shared_lock(&path)?;
        // The lock file's record first: were the lock not taken (a filesystem without locks),
        // the log read after it still holds at least what it says.
        let tail = read_tail(&path);
        let (newest, unreadable) = read_newest(&path)?;
        let has_snapshot = newest.is_some();
        let (snapshot_seq, mut marks) = newest.map_or((0, HashMap::new()), |r| (r.seq, r.marks));
        let snapshot_bytes = std::fs::metadata(slot(&path, snapshot_seq)).map_or(0, |m| m.len());
        let log_path = suffixed(&path, ".log");
        let (bytes, found) = match std::fs::read(&log_path) {
            Ok(bytes) => (bytes, true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), false),
            Err(e) => return Err(format!("segment marks log {}: {e}", log_path.display())),
        };
        let log = parse_log(&bytes, true);
        let mut damaged = Vec::new();
        if let Some(damage) = &log.damage {
            damaged.push(format!("{}: {damage}", log_path.display()));
        }
        match tail {
            Ok(Some(tail)) => {
                if let Some(lost) = tail_lost(tail, found.then_some(&log), snapshot_seq) {
                    damaged.push(format!("{}: {lost}", log_path.display()));
                }
            }
            Ok(None) => {}
            Err(damage) => damaged.push(damage),
        }
        // The log's header names the snapshot its marks follow: a newest readable snapshot
        // older than that is a newer one lost (damaged or deleted), and its marks with it.
        let follows = log.header.unwrap_or(0);
        if follows > snapshot_seq {
            damaged.push(format!(
                "{} follows snapshot {follows}, and the newest readable snapshot is {}",
                log_path.display(),
                if snapshot_seq == 0 && !has_snapshot {
                    "none".to_string()
                } else {
                    snapshot_seq.to_string()
                }
            ));
        }
        for (tag, mark) in log.entries {
            raise(&mut marks, &tag, mark);
        }
        Ok(Opened {
            journal: Journal {
                path,
                files: None,
                generation: follows,
                read_to: log.end,
                snapshot_bytes,
                snapshot_seq,
                compact_at_least: COMPACT_AT_LEAST,
            },
            marks,
            unreadable,
            damaged,
        })
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> String {
        format!("segment marks {}{what}: {e}", self.path.display())
    }

    /// The lock and log files (handles of one open file each), opened (created) at the first
    /// call, the directory's new entries made durable.
    fn files(&mut self) -> Result<(File, File), String> {
        if self.files.is_none() {
            let dir = dir_of(&self.path);
            std::fs::create_dir_all(&dir).map_err(|e| self.fail("", e))?;
            let open = |suffix: &str| {
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .read(true)
                    .write(true)
                    .open(suffixed(&self.path, suffix))
                    .map_err(|e| self.fail(suffix, e))
            };
            let files = (open(".lock")?, open(".log")?);
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| self.fail("", e))?;
            self.files = Some(files);
        }
        let (lock, log) = self.files.as_ref().expect("opened above");
        let clone = |f: &File| f.try_clone().map_err(|e| self.fail("", e));
        Ok((clone(lock)?, clone(log)?))
    }

    /// Appends `batch` to the log and fdatasyncs it, under the directory's lock. Returns the
    /// marks other processes sharing the directory wrote since this one last looked.
    /// `known_len` is set to the log's new length once the bytes are written, before their
    /// fdatasync, when no other process had written since this one last looked (the common
    /// case): a reader comparing lengths then sees nothing new and need not wait for the sync.
    /// When another had, it is left for the caller to set after the returned marks are kept.
    /// The other processes' marks read are returned also when the write then fails.
    pub fn append(
        &mut self,
        batch: &HashMap<String, i64>,
        known_len: &AtomicU64,
    ) -> (Vec<(String, i64)>, Result<(), String>) {
        let mut others = Vec::new();
        let written = self.append_reading(batch, known_len, &mut others);
        (others, written)
    }

    fn append_reading(
        &mut self,
        batch: &HashMap<String, i64>,
        known_len: &AtomicU64,
        others: &mut Vec<(String, i64)>,
    ) -> Result<(), String> {
        let mut lines = Vec::with_capacity(batch.len() * 32);
        for entry in batch {
            serde_json::to_writer(&mut lines, &entry).map_err(|e| self.fail(".log", e))?;
            lines.push(b'\n');
        }
        let _locked = self.lock()?;
        let (generation, read_to) = (self.generation, self.read_to);
        *others = self.catch_up()?;
        let nothing_new = self.generation == generation && self.read_to == read_to;
        let (_, log) = self.files()?;
        let at = self.read_to;
        let written = log
            .set_len(at)
            .and_then(|()| log.write_all_at(&lines, at))
            .and_then(|()| {
                if nothing_new {
                    known_len.store(at + lines.len() as u64, Ordering::Release);
                }
                log.sync_data()
            });
        if let Err(e) = written {
            // The torn tail is cut off (or overwritten) by the next append.
            let _ = log.set_len(at);
            return Err(self.fail(".log", e));
        }
        self.read_to = at + lines.len() as u64;
        self.write_tail();
        Ok(())
    }

    /// Records the log's synced length in the lock file, for [`Journal::open`] to find a log
    /// that lost whole lines. Not synced itself: lost in a crash, it is an older, shorter
    /// length, which the log still holds. A failed write (a full disk) only leaves that older
    /// record; the marks are in the log.
    fn write_tail(&mut self) {
        let tail = Tail {
            after: self.generation,
            len: self.read_to,
        };
        let mut record = serde_json::to_vec(&tail).unwrap_or_default();
        if record.is_empty() || record.len() >= TAIL_BYTES {
            return;
        }
        record.resize(TAIL_BYTES - 1, b' ');
        record.push(b'\n');
        let written = self.files().and_then(|(lock, _)| {
            lock.write_all_at(&record, 0)
                .map_err(|e| self.fail(".lock", e))
        });
        if let Err(e) = written {
            tracing::warn!(error = %e, "segment marks: the log's length was not recorded");
        }
    }

    /// `<path>.log`.
    pub fn log_path(&self) -> PathBuf {
        suffixed(&self.path, ".log")
    }

    /// The log's length as this process last read or wrote it.
    pub fn read_to(&self) -> u64 {
        self.read_to
    }

    /// Reads, under the directory's lock, what other processes wrote since this one last
    /// looked.
    pub fn catch_up_locked(&mut self) -> Result<Vec<(String, i64)>, String> {
        let _locked = self.lock()?;
        self.catch_up()
    }

    /// True once this process appended to the log.
    pub fn appended(&self) -> bool {
        self.files.is_some()
    }

    /// True once the log is long enough that rewriting every mark costs less than reading it.
    pub fn wants_compaction(&self) -> bool {
        self.read_to > self.compact_at_least.max(2 * self.snapshot_bytes)
    }

    /// Writes `marks` merged with everything on disk (the newest snapshot and the whole
    /// log) as the next snapshot, then empties the log. A crash between the two leaves a log whose marks the snapshot already holds.
    pub fn compact(
        &mut self,
        mut marks: HashMap<String, i64>,
    ) -> Result<Vec<(String, i64)>, String> {
        let _locked = self.lock()?;
        let others = self.catch_up()?;
        // Every mark in the log goes into the snapshot, not only those read now: marks of other
        // processes that this one read earlier (by `others_mark`) are in the log too, and the
        // log is emptied below.
        let (_, log) = self.files()?;
        let mut bytes = vec![0u8; self.read_to as usize];
        log.read_exact_at(&mut bytes, 0)
            .map_err(|e| self.fail(".log", e))?;
        let log = parse_log(&bytes, true);
        if let Some(damage) = log.damage {
            return Err(self.fail(".log", damage));
        }
        for (tag, mark) in log.entries.into_iter().chain(others.iter().cloned()) {
            raise(&mut marks, &tag, mark);
        }
        let (on_disk, _) = read_newest(&self.path)?;
        let mut record = Record {
            seq: self.snapshot_seq + 1,
            marks,
        };
        if let Some(disk) = on_disk {
            record.seq = record.seq.max(disk.seq + 1);
            for (tag, mark) in disk.marks {
                raise(&mut record.marks, &tag, mark);
            }
        }
        self.snapshot_bytes = write_slot(&self.path, &record)?;
        self.snapshot_seq = record.seq;
        let mut header =
            serde_json::to_vec(&Header { after: record.seq }).map_err(|e| self.fail(".log", e))?;
        header.push(b'\n');
        let (_, log) = self.files()?;
        log.set_len(0)
            .and_then(|()| log.write_all_at(&header, 0))
            .and_then(|()| log.sync_data())
            .map_err(|e| self.fail(".log", e))?;
        self.generation = record.seq;
        self.read_to = header.len() as u64;
        self.write_tail();
        Ok(others)
    }

    /// Takes the directory's exclusive lock (released when the guard drops, and by the kernel
    /// if the process dies).
    fn lock(&mut self) -> Result<LockGuard, String> {
        let (lock, _) = self.files()?;
        lock.lock().map_err(|e| self.fail(".lock", e))?;
        Ok(LockGuard(lock))
    }

    /// Reads what other processes appended (or, after another's compaction, the snapshot and
    /// the whole log again); the caller holds the lock.
    fn catch_up(&mut self) -> Result<Vec<(String, i64)>, String> {
        let (_, log) = self.files()?;
        let len = log.metadata().map_err(|e| self.fail(".log", e))?.len();
        let mut first = [0u8; 64];
        let n = log
            .read_at(&mut first, 0)
            .map_err(|e| self.fail(".log", e))?;
        let header = parse_log(&first[..n], true).header.unwrap_or(0);
        if header == self.generation && len >= self.read_to {
            let mut bytes = vec![0u8; (len - self.read_to) as usize];
            log.read_exact_at(&mut bytes, self.read_to)
                .map_err(|e| self.fail(".log", e))?;
            let read = parse_log(&bytes, self.read_to == 0);
            if let Some(damage) = read.damage {
                return Err(self.fail(".log", damage));
            }
            self.read_to += read.end;
            return Ok(read.entries);
        }
        let mut bytes = vec![0u8; len as usize];
        log.read_exact_at(&mut bytes, 0)
            .map_err(|e| self.fail(".log", e))?;
        let read = parse_log(&bytes, true);
        if let Some(damage) = read.damage {
            return Err(self.fail(".log", damage));
        }
        let (header, mut entries, end) = (read.header, read.entries, read.end);
        let (newest, _) = read_newest(&self.path)?;
        if let Some(snapshot) = newest {
            self.snapshot_seq = snapshot.seq;
            entries.extend(snapshot.marks);
        }
        self.generation = header.unwrap_or(0);
        self.read_to = end;
        Ok(entries)
    }
}

struct LockGuard(File);

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Writes `record` to its slot and fdatasyncs it; returns its size.
fn write_slot(path: &Path, record: &Record) -> Result<u64, String> {
    let file = slot(path, record.seq);
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", file.display());
    let json = serde_json::to_vec(record).map_err(|e| fail(&e))?;
    let created = !file.exists();
    let mut out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&file)
        .map_err(|e| fail(&e))?;
    out.write_all(&json).map_err(|e| fail(&e))?;
    out.sync_data().map_err(|e| fail(&e))?;
    if created {
        // A new file's directory entry must be durable too (once per slot).
        File::open(dir_of(path))
            .and_then(|d| d.sync_all())
            .map_err(|e| fail(&e))?;
    }
    Ok(json.len() as u64)
}
