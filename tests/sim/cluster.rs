//! A cluster of leafd nodes in one process: each node is the real [`SegmentEngine`] on its
//! own connection to the simulated database, with its own clock and its marks (its state
//! directory) kept across kills. The driver sends requests and admin commands, kills and
//! restarts nodes, steps clocks, fails the database over and restores it, all from the seed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leafd::clock::Clock;
use leafd::engine::segment::{SegmentEngine, SegmentSettings};
use leafd::storage::{Grant, NewTag, SegmentMarks, SegmentStore};
use tokio::task::JoinHandle;

use super::database::{Connection, Database, Link, NetFaults};
use super::ledger::Ledger;
use super::rng::Rng;
use super::trace::Trace;

/// What one run explores.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: usize,
    /// Driver steps (each a few simulated milliseconds and one action).
    pub steps: usize,
    /// The nodes' `segment.failover_margin`.
    pub failover_margin: i64,
    /// Most IDs of one tag a failover may lose: the premise of the margin (a replica at most
    /// this far behind).
    pub lost_bound: i64,
    pub faults: NetFaults,
}

impl SimConfig {
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            nodes: 1 + (seed % 5) as usize,
            steps: 1500,
            failover_margin: 100_000,
            lost_bound: 100_000,
            faults: NetFaults {
                cut_before: 3,
                lost_reply: 3,
                max_delay_ms: 3,
            },
        }
    }
}

/// A run that kept every invariant.
#[derive(Debug)]
pub struct Outcome {
    pub ids: u64,
    pub trace: Vec<String>,
}

/// A broken invariant: what, and how the run got there.
#[derive(Debug)]
pub struct Violation {
    pub seed: u64,
    pub what: String,
    pub trace: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n--- trace (the end) ---\n{}\n--- seed {}: replay with SIM_SEED={} cargo test --test sim replay -- --nocapture",
            self.what, self.trace, self.seed, self.seed
        )
    }
}

/// Trend tags, their steps; and the strict tag.
const TREND: [(&str, i64); 2] = [("t0", 10), ("t1", 100)];
const STRICT: &str = "s0";

/// A node's clock: the simulated time plus its own offset, which the driver steps.
struct SimClock {
    start: tokio::time::Instant,
    epoch_ms: u64,
    offset_ms: AtomicI64,
}

impl Clock for SimClock {
    fn now_millis(&self) -> u64 {
        let now = self.epoch_ms + self.start.elapsed().as_millis() as u64;
        now.saturating_add_signed(self.offset_ms.load(Ordering::SeqCst))
    }
}

/// One run of a process on a node.
struct Incarnation {
    engine: Arc<SegmentEngine>,
    link: Arc<Link>,
    tasks: Vec<JoinHandle<()>>,
}

struct Node {
    /// The state directory's marks, kept across kills.
    marks: Arc<SegmentMarks>,
    clock: Arc<SimClock>,
    runs: u32,
    live: Option<Incarnation>,
}

struct Cluster {
    config: SimConfig,
    rng: Arc<Mutex<Rng>>,
    db: Arc<Database>,
    trace: Arc<Trace>,
    ledger: Arc<Ledger>,
    nodes: Vec<Node>,
    strict: HashSet<String>,
}

fn settings(config: &SimConfig, strict: &HashSet<String>) -> SegmentSettings {
    SegmentSettings {
        max_step: 10_000,
        max_tags: 100,
        failover_margin: config.failover_margin,
        strict: strict.clone(),
        configured: strict.clone(),
        ..SegmentSettings::default()
    }
}

impl Cluster {
    fn roll(&self, n: u64) -> u64 {
        self.rng.lock().unwrap().below(n)
    }

    fn chance(&self, percent: u64) -> bool {
        self.rng.lock().unwrap().chance(percent)
    }

    fn start(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.runs += 1;
        let link = Arc::new(Link {
            dead: AtomicBool::new(false),
            name: format!("n{i}#{}", node.runs),
        });
        let store: Arc<dyn SegmentStore> = Arc::new(Connection {
            db: self.db.clone(),
            link: link.clone(),
            rng: self.rng.clone(),
            faults: self.config.faults,
            trace: self.trace.clone(),
        });
        let engine = SegmentEngine::new(
            store,
            node.marks.clone(),
            settings(&self.config, &self.strict),
            node.clock.clone(),
            Arc::new(()),
        );
        self.trace.note(format!("{} starts", link.name));
        node.live = Some(Incarnation {
            engine,
            link,
            tasks: Vec::new(),
        });
    }

    /// kill -9: nothing more leaves the process, its requests get no reply.
    fn kill(&mut self, i: usize) {
        if let Some(run) = self.nodes[i].live.take() {
            run.link.dead.store(true, Ordering::SeqCst);
            for task in run.tasks {
                task.abort();
            }
            self.trace.note(format!("{} killed", run.link.name));
        }
    }

    fn live_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].live.is_some())
            .collect()
    }

    fn request(&mut self, i: usize) {
        let tags: Vec<&str> = TREND.iter().map(|(t, _)| *t).chain([STRICT]).collect();
        let tag = tags[self.roll(tags.len() as u64) as usize].to_string();
        let n = if self.chance(70) {
            1
        } else {
            1 + self.roll(50) as i64
        };
        let strict = self.strict.contains(&tag);
        let floor = strict.then(|| self.ledger.strict_floor(&tag));
        let (ledger, trace) = (self.ledger.clone(), self.trace.clone());
        let run = self.nodes[i].live.as_mut().expect("live");
        let (engine, who) = (run.engine.clone(), run.link.name.clone());
        let task = tokio::spawn(async move {
            match engine.next_ids(&tag, n).await {
                Ok(last) => {
                    trace.note(format!(
                        "{who} INCRBY {tag} {n} -> {}..={last}",
                        last - n + 1
                    ));
                    ledger.served(&who, &tag, n, last, floor);
                }
                Err(e) => trace.note(format!("{who} INCRBY {tag} {n} -> error {e}")),
            }
        });
        run.tasks.push(task);
    }

    fn admin(&mut self, i: usize) {
        let tag = TREND[self.roll(TREND.len() as u64) as usize].0.to_string();
        let which = self.roll(3);
        let amount = 1 + self.roll(1000) as i64;
        let trace = self.trace.clone();
        let run = self.nodes[i].live.as_mut().expect("live");
        let (engine, who) = (run.engine.clone(), run.link.name.clone());
        let task = tokio::spawn(async move {
            let line = match which {
                0 => format!(
                    "SKIP {tag} {amount} -> {:?}",
                    engine.skip(&tag, amount).await
                ),
                1 => {
                    let step = 1 + amount % 200;
                    format!(
                        "STEP {tag} {step} -> {:?}",
                        engine.set_step(&tag, step).await
                    )
                }
                _ => format!(
                    "SKIPALL {amount} -> {:?}",
                    engine.skip_all(amount).await.map(|v| v.len())
                ),
            };
            trace.note(format!("{who} LEAF.TAG {line}"));
        });
        run.tasks.push(task);
    }

    /// The database goes back `k` commits: a failover to a replica that lacked them (another
    /// instance; at most `lost_bound` IDs of a tag lost, the margin's premise), or a restore of
    /// a backup followed at once by the runbook's skip past every ID served.
    fn go_back(&mut self, failover: bool) {
        let now: HashMap<String, i64> = self.db.store.snapshot().max_ids().into_iter().collect();
        let mut k = 1 + self.roll(8) as usize;
        let rows = loop {
            let Some(rows) = self.db.before(k) else {
                return;
            };
            let lost = rows
                .max_ids()
                .iter()
                .map(|(tag, max_id)| now.get(tag).copied().unwrap_or(0) - max_id)
                .max()
                .unwrap_or(0);
            if !failover || lost < self.config.lost_bound {
                break rows;
            }
            k -= 1;
            if k == 0 {
                return;
            }
        };
        let back = rows.max_ids();
        self.db.go_back(rows, k, failover);
        if failover {
            self.trace
                .note(format!("database fails over, {k} commits lost: {back:?}"));
            return;
        }
        // The runbook: every tag moved past what was served since the backup, before a node
        // serves again (one step of the run: no request runs in between).
        self.trace
            .note(format!("database restored {k} commits back: {back:?}"));
        for (tag, max_id) in back {
            let past = now.get(&tag).copied().unwrap_or(max_id) - max_id + 1;
            let moved = futures_now(
                self.db
                    .store
                    .allocate(&tag, Grant::step(Some(past), self.config.failover_margin)),
            );
            self.trace
                .note(format!("operator skips {tag} by {past} -> {moved:?}"));
        }
        self.db.committed_now();
    }

    async fn drive(&mut self) {
        for (tag, step) in TREND.iter().copied().chain([(STRICT, 10)]) {
            let new = NewTag {
                tag: tag.to_string(),
                start: 1,
                step,
                description: None,
                split: None,
                max_tags: 100,
            };
            self.db.store.create_tag(&new).await.expect("created");
        }
        self.db.committed_now();
        for i in 0..self.nodes.len() {
            self.start(i);
        }
        for _ in 0..self.config.steps {
            if self.ledger.violation().is_some() {
                return;
            }
            let pause = self.roll(4);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let live = self.live_nodes();
            if live.is_empty() {
                let i = self.roll(self.nodes.len() as u64) as usize;
                self.start(i);
                continue;
            }
            let pick = live[self.roll(live.len() as u64) as usize];
            match self.roll(1000) {
                0..=849 => self.request(pick),
                850..=879 => self.admin(pick),
                880..=909 => self.kill(pick),
                910..=949 => {
                    let dead: Vec<usize> = (0..self.nodes.len())
                        .filter(|&i| self.nodes[i].live.is_none())
                        .collect();
                    if let Some(&i) = dead.get(self.roll(dead.len().max(1) as u64) as usize) {
                        if self.chance(20) {
                            // Its state directory lost: a new disk.
                            self.nodes[i].marks = SegmentMarks::in_memory();
                            self.trace.note(format!("n{i} loses its state directory"));
                        }
                        self.start(i);
                    }
                }
                950..=964 => self.go_back(true),
                965..=972 => self.go_back(false),
                973..=984 => {
                    let step = self.roll(5001) as i64 - 2500;
                    self.nodes[pick]
                        .clock
                        .offset_ms
                        .fetch_add(step, Ordering::SeqCst);
                    self.trace.note(format!("n{pick}'s clock steps {step} ms"));
                }
                _ => {
                    let ms = self.roll(3000);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
        }
        // Let what is in flight finish.
        tokio::time::sleep(Duration::from_secs(5)).await;
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// Polls a future of the memory store once: it never waits, so it is done at once.
fn futures_now<T>(future: impl std::future::Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    let waker = std::task::Waker::noop();
    match future
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker))
    {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => panic!("the memory store waited"),
    }
}

/// Runs one seed on a fresh single-threaded runtime with paused time.
pub fn run(config: SimConfig) -> Result<Outcome, Violation> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let seed = config.seed;
        let trace = Arc::new(Trace::new());
        let mut rng = Rng::new(seed);
        let epoch_ms = 1_796_000_000_000 + rng.below(86_400_000);
        let start = tokio::time::Instant::now();
        let nodes = (0..config.nodes)
            .map(|_| Node {
                marks: SegmentMarks::in_memory(),
                clock: Arc::new(SimClock {
                    start,
                    epoch_ms,
                    offset_ms: AtomicI64::new(rng.between(-2000, 2000)),
                }),
                runs: 0,
                live: None,
            })
            .collect();
        let mut cluster = Cluster {
            config,
            rng: Arc::new(Mutex::new(rng)),
            db: Database::new(),
            trace: trace.clone(),
            ledger: Arc::new(Ledger::default()),
            nodes,
            strict: [STRICT.to_string()].into(),
        };
        cluster.drive().await;
        match cluster.ledger.violation() {
            Some(what) => Err(Violation {
                seed,
                what,
                trace: trace.tail(),
            }),
            None => Ok(Outcome {
                ids: cluster.ledger.ids(),
                trace: trace.all(),
            }),
        }
    })
}
