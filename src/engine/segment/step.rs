//! Leaf's adaptive step: a tag whose segments are used up quickly gets larger segments,
//! so a busy tag needs fewer database round trips, and a quiet tag drifts back down.

/// A segment that lasted less than this asks for twice the step next time.
pub const FAST_SEGMENT_MS: u64 = 15 * 60 * 1000;
/// A segment that lasted more than this asks for half the step next time.
pub const SLOW_SEGMENT_MS: u64 = 2 * FAST_SEGMENT_MS;

/// The step for the next load, given the step of the last load, the table's step (the floor),
/// the cap, and how long ago the last load happened.
pub fn next_step(current: i64, table_step: i64, max_step: i64, since_last_load_ms: u64) -> i64 {
    let current = current.max(table_step);
    let next = if since_last_load_ms < FAST_SEGMENT_MS {
        if current * 2 > max_step {
            current
        } else {
            current * 2
        }
    } else if since_last_load_ms < SLOW_SEGMENT_MS {
        current
    } else {
        current / 2
    };
    next.max(table_step)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60 * 1000;

    #[test]
    fn doubles_when_fast_up_to_the_cap() {
        assert_eq!(next_step(1000, 1000, 1_000_000, 14 * MIN), 2000);
        assert_eq!(next_step(600_000, 1000, 1_000_000, MIN), 600_000);
        assert_eq!(next_step(500_000, 1000, 1_000_000, MIN), 1_000_000);
    }

    #[test]
    fn keeps_between_15_and_30_minutes() {
        assert_eq!(next_step(4000, 1000, 1_000_000, 15 * MIN), 4000);
        assert_eq!(next_step(4000, 1000, 1_000_000, 30 * MIN - 1), 4000);
    }

    #[test]
    fn halves_when_slow_never_below_table_step() {
        assert_eq!(next_step(4000, 1000, 1_000_000, 30 * MIN), 2000);
        assert_eq!(next_step(1500, 1000, 1_000_000, 60 * MIN), 1000);
        assert_eq!(next_step(1000, 1000, 1_000_000, 60 * MIN), 1000);
    }

    #[test]
    fn a_raised_table_step_lifts_the_current_step() {
        assert_eq!(next_step(1000, 5000, 1_000_000, 20 * MIN), 5000);
    }
}
