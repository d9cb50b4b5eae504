//! The invariants, checked on every reply: no segment ID twice per tag across every node and
//! incarnation (each ID of a block); a strict tag's reply larger than every reply of the tag
//! that came before its request was sent; a period ID dated by its node's clock; nothing at or
//! below 0 or past 2^63−1.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

#[derive(Default)]
pub struct Ledger {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    served: HashMap<String, HashSet<i64>>,
    /// Every SNOWFLAKE ID replied, by every node, with who replied it.
    snowflake: HashMap<i64, String>,
    /// Per strict tag, the largest ID replied so far.
    replied: HashMap<String, i64>,
    ids: u64,
    violation: Option<String>,
}

impl Ledger {
    /// The floor a strict request sent now must reply above.
    pub fn strict_floor(&self, tag: &str) -> i64 {
        let state = self.state.lock().unwrap();
        state.replied.get(tag).copied().unwrap_or(0)
    }

    /// Records the block `last-n+1..=last` of `tag` replied by `who`; the first violation is kept.
    pub fn served(&self, who: &str, tag: &str, n: i64, last: i64, strict_floor: Option<i64>) {
        let mut state = self.state.lock().unwrap();
        let first = last - n + 1;
        let mut broken = None;
        if first < 1 {
            broken = Some(format!(
                "{who}: {tag} replied {first}..={last}, at or below 0"
            ));
        }
        let seen = state.served.entry(tag.to_string()).or_default();
        for id in first..=last {
            if !seen.insert(id) {
                broken.get_or_insert_with(|| {
                    format!("{who}: {tag} ID {id} handed out twice (block {first}..={last})")
                });
            }
        }
        if let Some(floor) = strict_floor {
            if first <= floor && broken.is_none() {
                broken = Some(format!(
                    "{who}: strict {tag} replied {first}..={last}, not above {floor} replied before the request was sent"
                ));
            }
            let top = state.replied.entry(tag.to_string()).or_insert(0);
            *top = (*top).max(last);
        }
        state.ids += n as u64;
        if state.violation.is_none() {
            state.violation = broken;
        }
    }

    /// Checks that each ID of the period block `last-n+1..=last` is a date of `dates` followed by
    /// a sequence number of `digits` digits from 1.
    pub fn dated(&self, who: &str, tag: &str, n: i64, last: i64, digits: u32, dates: [i64; 4]) {
        let scale = 10i64.pow(digits);
        let mut state = self.state.lock().unwrap();
        for id in [last - n + 1, last] {
            let (date, sequence) = (id / scale, id % scale);
            if !dates.contains(&date) || sequence < 1 {
                let what = format!(
                    "{who}: period {tag} replied {id} (date {date}, number {sequence}); its clock's dates are {dates:?}"
                );
                state.violation.get_or_insert(what);
            }
        }
    }

    /// Records the SNOWFLAKE reply `ids` of `who` holding `worker_id`: each ID once across
    /// every node, increasing within the reply, carrying its worker id.
    pub fn snowflake(&self, who: &str, worker_id: u64, ids: &[i64]) {
        let layout = super::snowflake::layout();
        let mut state = self.state.lock().unwrap();
        let mut broken = None;
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 && id <= ids[i - 1] {
                broken.get_or_insert_with(|| {
                    format!("{who}: SNOWFLAKE {id} after {} in one reply", ids[i - 1])
                });
            }
            if layout.decode(id).map(|d| d.worker_id) != Some(worker_id) {
                broken.get_or_insert_with(|| {
                    format!("{who}: SNOWFLAKE {id} does not carry worker id {worker_id}")
                });
            }
            if let Some(before) = state.snowflake.insert(id, who.to_string()) {
                broken.get_or_insert_with(|| {
                    format!("{who}: SNOWFLAKE ID {id} (worker id {worker_id}) handed out twice: {before} replied it first")
                });
            }
        }
        state.ids += ids.len() as u64;
        if state.violation.is_none() {
            state.violation = broken;
        }
    }

    pub fn violation(&self) -> Option<String> {
        self.state.lock().unwrap().violation.clone()
    }

    pub fn ids(&self) -> u64 {
        self.state.lock().unwrap().ids
    }

    pub fn snowflake_ids(&self) -> u64 {
        self.state.lock().unwrap().snowflake.len() as u64
    }
}
