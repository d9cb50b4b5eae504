//! A cluster of leafd nodes in one process: each node is the real [`SegmentEngine`] on its
//! own connection to the simulated database, with its own clock and its marks (its state
//! directory) kept across kills. The driver sends requests and admin commands, kills and
//! restarts nodes, steps clocks, fails the database over and restores it, all from the seed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leafd::clock::Clock;
use leafd::engine::segment::{PeriodRule, SegmentEngine, SegmentSettings};
use leafd::storage::{NewTag, SegmentMarks, SegmentStore};
use tokio::task::JoinHandle;

use super::database::{Connection, Database, Link, NetFaults};
use super::ledger::Ledger;
use super::rng::Rng;
use super::snowflake::SnowflakeRun;
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
    /// Restores of an earlier backup (with the runbook's SKIPALL).
    pub restores: bool,
    /// Requests of the period tag. (Seed 55337 found a restore near midnight, after a node
    /// whose clock was ahead served the new day's numbers, served them again: SKIPALL skipped
    /// only the day its node was in. Within PERIOD_AHEAD_MS of the day's end it now skips
    /// the next day's numbers too.)
    pub period: bool,
    /// Every node also serves SNOWFLAKE, its worker id leased from the simulated `leaf_worker`
    /// (failovers take the leases back with the rows; some runs wipe the table).
    pub snowflake: bool,
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
                hold_permille: 2,
            },
            restores: true,
            period: true,
            snowflake: true,
        }
    }
}

/// A run that kept every invariant.
#[derive(Debug)]
pub struct Outcome {
    pub ids: u64,
    /// Of them, SNOWFLAKE IDs.
    pub snowflake_ids: u64,
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

/// Trend tags, their steps; the strict tag; the period tag, its rule and sequence digits, and
/// the other rule a node configured otherwise serves it by.
const TREND: [(&str, i64); 2] = [("t0", 10), ("t1", 100)];
const STRICT: &str = "s0";
const PERIOD: &str = "p0";
const PERIOD_RULE: (&str, u32) = ("period:daily:3:UTC:", 3);
const OTHER_RULE: (&str, u32) = ("period:daily:2:UTC:", 2);
const DAY_MS: u64 = 86_400_000;

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
    snowflake: Option<SnowflakeRun>,
    link: Arc<Link>,
    tasks: Vec<JoinHandle<()>>,
}

struct Node {
    /// The state directory's marks, kept across kills.
    marks: Arc<SegmentMarks>,
    /// The state directory on disk (the time fence, the worker id held last).
    state_dir: tempfile::TempDir,
    /// The period rule its configuration gives the period tag, and its sequence digits.
    period: (&'static str, u32),
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
    /// The operator's node: a connection that never fails or waits, so the runbook's
    /// `LEAF.TAG SKIPALL` after a restore runs within one step of the run.
    operator: Option<Arc<SegmentEngine>>,
    /// The operator's node's clock: the runbook runs SKIPALL on the node whose clock is
    /// furthest ahead (a period tag moves into that node's period).
    operator_clock: Arc<SimClock>,
}

fn settings(config: &SimConfig, strict: &HashSet<String>, period: &str) -> SegmentSettings {
    let rule = PeriodRule::from_record(period).expect("a period rule");
    let mut configured = strict.clone();
    configured.insert(PERIOD.to_string());
    SegmentSettings {
        max_step: 10_000,
        max_tags: 100,
        failover_margin: config.failover_margin,
        strict: strict.clone(),
        period: [(PERIOD.to_string(), Arc::new(rule))].into(),
        configured,
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
        let connection = Arc::new(Connection {
            db: self.db.clone(),
            link: link.clone(),
            rng: self.rng.clone(),
            faults: self.config.faults,
            trace: self.trace.clone(),
        });
        let snowflake = self.config.snowflake.then(|| {
            SnowflakeRun::start(
                connection.clone(),
                node.clock.clone(),
                node.state_dir.path().to_path_buf(),
                link.name.clone(),
                self.trace.clone(),
            )
        });
        let store: Arc<dyn SegmentStore> = connection;
        let engine = SegmentEngine::new(
            store,
            node.marks.clone(),
            settings(&self.config, &self.strict, node.period.0),
            node.clock.clone(),
            Arc::new(()),
        );
        self.trace.note(format!("{} starts", link.name));
        node.live = Some(Incarnation {
            engine,
            snowflake,
            link,
            tasks: Vec::new(),
        });
    }

    fn operator_node(&self) -> Arc<SegmentEngine> {
        let store: Arc<dyn SegmentStore> = Arc::new(Connection {
            db: self.db.clone(),
            link: Arc::new(Link {
                dead: AtomicBool::new(false),
                name: "operator".into(),
            }),
            rng: self.rng.clone(),
            faults: NetFaults {
                cut_before: 0,
                lost_reply: 0,
                max_delay_ms: 0,
                hold_permille: 0,
            },
            trace: self.trace.clone(),
        });
        let clock = self.operator_clock.clone();
        let settings = settings(&self.config, &self.strict, PERIOD_RULE.0);
        SegmentEngine::new(
            store,
            SegmentMarks::in_memory(),
            settings,
            clock,
            Arc::new(()),
        )
    }

    /// kill -9: nothing more leaves the process, its requests get no reply.
    fn kill(&mut self, i: usize) {
        if let Some(run) = self.nodes[i].live.take() {
            run.link.dead.store(true, Ordering::SeqCst);
            for task in run.tasks {
                task.abort();
            }
            if let Some(snowflake) = run.snowflake {
                snowflake.kill();
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
        if self.config.snowflake && self.chance(20) {
            return self.snowflake_request(i);
        }
        let tags: Vec<&str> = TREND
            .iter()
            .map(|(t, _)| *t)
            .chain([STRICT])
            .chain(self.config.period.then_some(PERIOD))
            .collect();
        let tag = tags[self.roll(tags.len() as u64) as usize].to_string();
        let n = if self.chance(70) {
            1
        } else {
            1 + self.roll(50) as i64
        };
        let period = tag == PERIOD;
        // Period tags are served in strict order too.
        let strict = period || self.strict.contains(&tag);
        let floor = strict.then(|| self.ledger.strict_floor(&tag));
        let (ledger, trace) = (self.ledger.clone(), self.trace.clone());
        let (clock, digits) = (self.nodes[i].clock.clone(), self.nodes[i].period.1);
        let run = self.nodes[i].live.as_mut().expect("live");
        let (engine, who) = (run.engine.clone(), run.link.name.clone());
        let ahead = leafd::engine::segment::period::PERIOD_AHEAD_MS;
        let sent = clock.now_millis();
        let task = tokio::spawn(async move {
            match engine.next_ids(&tag, n).await {
                Ok(last) => {
                    trace.note(format!(
                        "{who} INCRBY {tag} {n} -> {}..={last}",
                        last - n + 1
                    ));
                    if period {
                        // The date of its node's clock when the request came or when it was
                        // answered, or of the next period a node up to PERIOD_AHEAD_MS ahead
                        // opened.
                        let now = clock.now_millis();
                        let dates = [sent, sent + ahead, now, now + ahead].map(utc_date);
                        ledger.dated(&who, &tag, n, last, digits, dates);
                    }
                    ledger.served(&who, &tag, n, last, floor);
                }
                Err(e) => trace.note(format!("{who} INCRBY {tag} {n} -> error {e}")),
            }
        });
        run.tasks.push(task);
    }

    /// `SNOWFLAKE` n on node `i`, once it holds a worker id.
    fn snowflake_request(&mut self, i: usize) {
        let n = if self.chance(70) {
            1
        } else {
            1 + self.roll(200) as usize
        };
        let (ledger, trace) = (self.ledger.clone(), self.trace.clone());
        let run = self.nodes[i].live.as_mut().expect("live");
        let Some(engine) = run.snowflake.as_ref().and_then(SnowflakeRun::engine) else {
            return;
        };
        let who = run.link.name.clone();
        let task = tokio::spawn(async move {
            match engine.next_ids(n).await {
                Ok(ids) => {
                    trace.note(format!(
                        "{who} SNOWFLAKE {n} -> {}..={}",
                        ids[0],
                        ids[ids.len() - 1]
                    ));
                    ledger.snowflake(&who, engine.worker_id(), &ids);
                }
                Err(e) => trace.note(format!("{who} SNOWFLAKE {n} -> error {e}")),
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
        let lag = self.roll(1500) as i64;
        self.db.go_back(rows, k, failover, lag);
        if failover {
            self.trace.note(format!(
                "database fails over, {k} commits lost: {back:?}; leaf_worker's last {lag} ms lost"
            ));
            return;
        }
        // The runbook: every tag moved past what was served since the backup, before a node
        // serves again (one step of the run: no request runs in between).
        self.trace
            .note(format!("database restored {k} commits back: {back:?}"));
        let past = back
            .iter()
            .map(|(tag, max_id)| now.get(tag).copied().unwrap_or(*max_id) - max_id + 1)
            .max()
            .unwrap_or(1);
        let ahead = self
            .nodes
            .iter()
            .map(|n| n.clock.offset_ms.load(Ordering::SeqCst));
        let ahead = ahead.max().unwrap_or(0);
        self.operator_clock.offset_ms.store(ahead, Ordering::SeqCst);
        let operator = self.operator.clone().expect("the operator's node");
        let moved = futures_now(operator.skip_all(past));
        self.trace
            .note(format!("operator: LEAF.TAG SKIPALL {past} -> {moved:?}"));
    }

    async fn drive(&mut self) {
        for (tag, step) in TREND.iter().copied().chain([(STRICT, 10), (PERIOD, 10)]) {
            let new = NewTag {
                tag: tag.to_string(),
                start: 1,
                step,
                description: None,
                // Recorded at creation, as LEAF.TAG CREATE … PERIOD does.
                split: (tag == PERIOD).then(|| PERIOD_RULE.0.to_string()),
                max_tags: 100,
            };
            self.db.store.create_tag(&new).await.expect("created");
        }
        self.db.committed_now();
        self.operator = Some(self.operator_node());
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
                            self.nodes[i].state_dir = tempfile::tempdir().expect("a state dir");
                            self.trace.note(format!("n{i} loses its state directory"));
                        }
                        self.start(i);
                    }
                }
                950..=964 => self.go_back(true),
                965..=972 if self.config.restores => self.go_back(false),
                973..=975 if self.config.snowflake => {
                    self.db.wipe_leases();
                    self.trace.note("leaf_worker wiped".to_string());
                }
                976..=984 => {
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

/// `20261207` for a UNIX time in ms, by the UTC calendar.
fn utc_date(ms: u64) -> i64 {
    let days = (ms / DAY_MS) as i64;
    let date = jiff::civil::date(1970, 1, 1) + jiff::Span::new().days(days);
    i64::from(date.year()) * 10_000 + i64::from(date.month()) * 100 + i64::from(date.day())
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
        // The engines' own randomness (a snowflake sequence's first number, a lease owner's
        // instance id) from the seed too: this thread runs the whole cluster.
        fastrand::seed(seed);
        let trace = Arc::new(Trace::new());
        let mut rng = Rng::new(seed);
        // Within half a minute before a midnight (UTC): the period tag crosses it.
        let epoch_ms = (1_796_000_000_000 / DAY_MS + 1) * DAY_MS - rng.below(30_000);
        // One run in three has a node configured with another period rule for the period tag.
        let otherwise = (config.nodes > 1 && seed.is_multiple_of(3)).then_some(1);
        let start = tokio::time::Instant::now();
        let nodes = (0..config.nodes)
            .map(|i| Node {
                marks: SegmentMarks::in_memory(),
                state_dir: tempfile::tempdir().expect("a state dir"),
                period: if otherwise == Some(i) {
                    OTHER_RULE
                } else {
                    PERIOD_RULE
                },
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
            db: Database::new(start, epoch_ms),
            trace: trace.clone(),
            ledger: Arc::new(Ledger::default()),
            nodes,
            strict: [STRICT.to_string()].into(),
            operator: None,
            operator_clock: Arc::new(SimClock {
                start,
                epoch_ms,
                offset_ms: AtomicI64::new(0),
            }),
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
                snowflake_ids: cluster.ledger.snowflake_ids(),
                trace: trace.all(),
            }),
        }
    })
}
