//! The invariants, checked on every reply: no segment ID twice per tag across every node and
//! incarnation (each ID of a block); a strict tag's reply larger than every reply of the tag
//! that came before its request was sent; nothing at or below 0 or past 2^63−1.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

#[derive(Default)]
pub struct Ledger {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    served: HashMap<String, HashSet<i64>>,
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
        if let Some(floor) = strict_floor {
            if first <= floor {
                broken = Some(format!(
                    "{who}: strict {tag} replied {first}..={last}, not above {floor} replied before the request was sent"
                ));
            }
            let top = state.replied.entry(tag.to_string()).or_insert(0);
            *top = (*top).max(last);
        }
        let seen = state.served.entry(tag.to_string()).or_default();
        for id in first..=last {
            if !seen.insert(id) {
                broken.get_or_insert_with(|| {
                    format!("{who}: {tag} ID {id} handed out twice (block {first}..={last})")
                });
            }
        }
        state.ids += n as u64;
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
}
