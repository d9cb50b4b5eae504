//! Sequences that restart each period (`period = "daily"`, …): an ID is the period's date in a
//! time zone followed by a sequence from 1 (`20261204000123`); the tag's one row orders periods.
//!
//! The row's `max_id` is a position, `period · 10^(digits + 1) + sequence`: one digit more than
//! the ID holds, so the sequence numbers a period did not have (its digits ran out) stay in the
//! gap below the next period and are never handed out. A period tag is served as a strict tag
//! ([`super::strict`]): a node entering a new period first raises the row to that period's
//! sequence 1 (never lowering it), and a node whose clock lags serves in whatever period the
//! row is in. So the row never goes back a period, whatever any node's clock says.

use jiff::tz::TimeZone;
use jiff::Timestamp;

/// How a period rule's record in the row begins (see [`PeriodRule::marker`]).
pub const PERIOD_MARKER: &str = crate::storage::PERIOD_RECORD;

/// The allocation window of the period rule a row records (`period:daily:4`), whatever this
/// node's configuration says; `None` for a row that records no period.
pub fn window_of_marker(recorded: Option<&str>) -> Option<crate::storage::Window> {
    let rule = recorded?.strip_prefix(PERIOD_MARKER)?;
    let digits: u32 = rule.split(':').nth(1)?.parse().ok()?;
    let scale = 10i64.checked_pow(digits)?;
    Some(crate::storage::Window {
        span: scale.checked_mul(10)?,
        usable: scale,
    })
}

/// The part of a row's period record that decides what a position means
/// (`period:daily:6` of `period:daily:6:Asia/Shanghai:ORD`); `None` for a row without one.
pub fn marker_of_record(recorded: Option<&str>) -> Option<String> {
    let recorded = recorded.filter(|r| r.starts_with(PERIOD_MARKER))?;
    Some(crate::storage::position_marker(recorded).to_string())
}

/// The calendar unit a period tag's sequence restarts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calendar {
    Day,
    Month,
    Year,
}

impl Calendar {
    pub fn name(self) -> &'static str {
        match self {
            Calendar::Day => "daily",
            Calendar::Month => "monthly",
            Calendar::Year => "yearly",
        }
    }

    /// The calendar a name (`daily`, `monthly`, `yearly`) stands for, in any case.
    pub fn from_name(name: &str) -> Option<Calendar> {
        [Calendar::Day, Calendar::Month, Calendar::Year]
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(name))
    }

    /// Digits of the period's date in an ID.
    pub fn date_digits(self) -> u32 {
        match self {
            Calendar::Day => 8,
            Calendar::Month => 6,
            Calendar::Year => 4,
        }
    }

    /// Most sequence digits: a row position keeps one digit more than the ID and must stay
    /// within 18 digits.
    pub fn max_sequence_digits(self) -> u32 {
        17 - self.date_digits()
    }
}

pub use crate::storage::same_rule;

/// How far a period tag's row may be ahead of a node's clock: a node whose clock lags the one
/// that opened the next period by less than this serves in the row's period (clocks a second
/// apart across midnight); by more, it refuses until its clock arrives.
pub const PERIOD_AHEAD_MS: u64 = 60_000;

/// How one period tag turns positions of its row into IDs.
#[derive(Debug)]
pub struct PeriodRule {
    calendar: Calendar,
    time_zone: TimeZone,
    /// The IANA name, as configured (for LEAF.TAGS).
    zone_name: String,
    digits: u32,
    prefix: String,
}

impl PeriodRule {
    /// `digits` sequence digits (checked by the configuration to keep positions in 18 digits).
    pub fn new(
        calendar: Calendar,
        time_zone: TimeZone,
        zone_name: &str,
        digits: u32,
        prefix: &str,
    ) -> PeriodRule {
        PeriodRule {
            calendar,
            time_zone,
            zone_name: zone_name.to_string(),
            digits,
            prefix: prefix.to_string(),
        }
    }

    /// The period a clock reading falls in, in the rule's time zone: `20261204` (daily),
    /// `202612` (monthly) or `2026` (yearly).
    pub fn period_at(&self, unix_ms: u64) -> i64 {
        let instant = i64::try_from(unix_ms)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .unwrap_or(Timestamp::MAX);
        let date = instant.to_zoned(self.time_zone.clone()).date();
        let (year, month, day) = (
            i64::from(date.year()),
            i64::from(date.month()),
            i64::from(date.day()),
        );
        match self.calendar {
            Calendar::Day => year * 10_000 + month * 100 + day,
            Calendar::Month => year * 100 + month,
            Calendar::Year => year,
        }
    }

    /// Whether `period` (as [`PeriodRule::period_of`] reads a row position) is a date of this
    /// rule's calendar: a year 1–9999, a month 1–12, a day of that month. A row raised by hand,
    /// by a trend use of the tag or by a node with other digits reads as no date (month 13, a
    /// nine-digit "day"); its numbers must never be served as one.
    pub fn is_date(&self, period: i64) -> bool {
        let (year, month, day) = match self.calendar {
            Calendar::Day => (period / 10_000, period / 100 % 100, period % 100),
            Calendar::Month => (period / 100, period % 100, 1),
            Calendar::Year => (period, 1, 1),
        };
        (1..=9999).contains(&year)
            && i16::try_from(year)
                .is_ok_and(|year| jiff::civil::Date::new(year, month as i8, day as i8).is_ok())
    }

    /// Why the row position `position` may not be served by a node whose clock reads
    /// `now_ms` (`None`: it may): its period is no date of this rule, or a period later than
    /// the one the clock reaches within [`PERIOD_AHEAD_MS`] (a row raised into the future
    /// would date IDs by the row, not by the clock).
    pub fn refuse_position(&self, position: i64, now_ms: u64) -> Option<String> {
        let period = self.period_of(position);
        // 0: a row no period has raised yet (the raise moves it to today's first number).
        if period == 0 {
            return None;
        }
        let latest = self.period_at(now_ms.saturating_add(PERIOD_AHEAD_MS));
        let what = if !self.is_date(period) {
            format!(
                "no date of a {} tag with {} sequence digits",
                self.calendar.name(),
                self.digits
            )
        } else if period > latest {
            format!("later than this node's period {}", self.period_at(now_ms))
        } else {
            return None;
        };
        Some(format!(
            "IDs refused: the row's position {position} reads as period {period}, {what}; nothing was taken. The row was set by hand, by a trend use of the tag or under another rule, and its numbers would be dated by the row, not the clock: serve the period from a new tag (LEAF.TAG CREATE <tag> <step> PERIOD {})",
            self.calendar.name()
        ))
    }

    /// Why a row that records no period rule (served in trend order until now, if at all) may
    /// not be raised into the period the clock is in: its position is above that period's
    /// first ID, so trend IDs it served may be IDs of the period (`None`: it may be raised). A
    /// position already in the period (a raise whose rule record was cut short) may.
    pub fn refuse_unrecorded(&self, position: i64, now_ms: u64) -> Option<String> {
        let now = self.period_at(now_ms);
        let first_id = now * self.scale() + 1;
        if position <= first_id || self.period_of(position) >= now {
            return None;
        }
        Some(format!(
            "IDs refused: the row's position {position} is above period {now}'s first ID {first_id} and the row records no period rule, so it may have served those numbers as trend IDs; nothing was taken. Serve the period from a new tag (LEAF.TAG CREATE <tag> <step> PERIOD {})",
            self.calendar.name()
        ))
    }

    /// Why a row at `position` recording `recorded` (its split column) may not be moved into
    /// or within this rule's period by a node whose clock reads `now_ms` (`None`: it may): at
    /// or past the period, [`PeriodRule::refuse_position`]; below it, a row that records no
    /// period must not have served trend IDs that are numbers of the period
    /// ([`PeriodRule::refuse_unrecorded`]). A row recording another period rule is left to the
    /// statements, which refuse it before it moves.
    pub fn refuse_row(&self, position: i64, recorded: Option<&str>, now_ms: u64) -> Option<String> {
        let record = recorded.filter(|r| r.starts_with(PERIOD_MARKER));
        if record.is_some_and(|r| !same_rule(r, &self.served_marker())) {
            None
        } else if self.period_of(position) >= self.period_at(now_ms) {
            self.refuse_position(position, now_ms)
        } else if record.is_none() {
            self.refuse_unrecorded(position, now_ms)
        } else {
            None
        }
    }

    /// What the tag's row records of this rule (in its `split` column, which a period tag does
    /// not otherwise use): the calendar and the digits, the two that decide which ID a row
    /// position is ([`PeriodRule::served_marker`] adds the time zone).
    pub fn marker(&self) -> String {
        format!("{PERIOD_MARKER}{}:{}", self.calendar.name(), self.digits)
    }

    /// How this node serves the tag, what a row's record must agree with
    /// ([`crate::storage::same_rule`]): the marker and the time zone, which decides the date a
    /// position is served on (`period:daily:6:Asia/Shanghai`). A node in another zone would open
    /// the next period hours before the others, which then refuse the row until their midnight.
    pub fn served_marker(&self) -> String {
        format!("{}:{}", self.marker(), self.zone_name)
    }

    /// What a row records of the whole rule: [`PeriodRule::marker`], then the time zone and the
    /// prefix, so a node that has no rule configured for the tag serves it as recorded
    /// (`period:daily:6:Asia/Shanghai:ORD`).
    pub fn record(&self) -> String {
        format!("{}:{}:{}", self.marker(), self.zone_name, self.prefix)
    }

    /// The rule a row records in full ([`PeriodRule::record`]); `None` for anything else,
    /// including a record of only the calendar and digits (written by a node configured with
    /// the rule, whose time zone a node without it cannot know).
    pub fn from_record(recorded: &str) -> Option<PeriodRule> {
        let mut parts = recorded.strip_prefix(PERIOD_MARKER)?.splitn(4, ':');
        let calendar = Calendar::from_name(parts.next()?)?;
        let digits: u32 = parts.next()?.parse().ok()?;
        let zone_name = parts.next()?;
        let prefix = parts.next()?;
        // `localtime`, `Factory` and `posixrules` resolve, but to another zone on each host (or
        // none): the config and CREATE refuse them, and so does a record edited to name one.
        if !(1..=calendar.max_sequence_digits()).contains(&digits)
            || !super::zone_names_a_place(zone_name)
        {
            return None;
        }
        let zone = TimeZone::get(zone_name).ok()?;
        Some(PeriodRule::new(calendar, zone, zone_name, digits, prefix))
    }

    /// `10^digits`: an ID is `period · scale + sequence`.
    fn scale(&self) -> i64 {
        10i64.pow(self.digits)
    }

    /// Positions of one period: one digit more than its sequence numbers.
    fn span(&self) -> i64 {
        10 * self.scale()
    }

    /// The row position of the period's sequence number 1.
    pub fn first_position(&self, period: i64) -> i64 {
        period * self.span() + 1
    }

    /// The period a row position belongs to (0 for a row no period has raised yet).
    pub fn period_of(&self, position: i64) -> i64 {
        position / self.span()
    }

    /// The ID at a row position; `None` past the period's last sequence number.
    pub fn id_at(&self, position: i64) -> Option<i64> {
        let sequence = position % self.span();
        (1..self.scale())
            .contains(&sequence)
            .then(|| self.period_of(position) * self.scale() + sequence)
    }

    /// The positions an allocation may take: those of one period's sequence numbers, never
    /// its gap nor the next period's.
    pub fn window(&self) -> crate::storage::Window {
        crate::storage::Window {
            span: self.span(),
            usable: self.scale(),
        }
    }

    /// The most sequence numbers one period has.
    pub fn last_sequence(&self) -> i64 {
        self.scale() - 1
    }

    /// The string form of an ID: the prefix, the period's date, the zero-padded sequence.
    pub fn code(&self, id: i64) -> String {
        format!(
            "{}{}{:0width$}",
            self.prefix,
            id / self.scale(),
            id % self.scale(),
            width = self.digits as usize
        )
    }

    /// How LEAF.TAGS shows the rule: `daily Asia/Shanghai 6`.
    pub fn describe(&self) -> String {
        format!(
            "{} {} {}",
            self.calendar.name(),
            self.zone_name,
            self.digits
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(calendar: Calendar, zone: &str, digits: u32) -> PeriodRule {
        PeriodRule::new(calendar, TimeZone::get(zone).unwrap(), zone, digits, "ORD")
    }

    fn ms(rfc3339: &str) -> u64 {
        rfc3339.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }

    #[test]
    fn the_period_follows_the_time_zone_calendar() {
        let shanghai = rule(Calendar::Day, "Asia/Shanghai", 6);
        // 16:00Z is midnight in Shanghai (+08:00).
        assert_eq!(shanghai.period_at(ms("2026-12-04T15:59:59.999Z")), 20261204);
        assert_eq!(shanghai.period_at(ms("2026-12-04T16:00:00Z")), 20261205);
        let utc = rule(Calendar::Day, "UTC", 6);
        assert_eq!(utc.period_at(ms("2026-12-04T16:00:00Z")), 20261204);
        let monthly = rule(Calendar::Month, "America/New_York", 4);
        assert_eq!(monthly.period_at(ms("2027-01-01T04:59:59Z")), 202612);
        assert_eq!(monthly.period_at(ms("2027-01-01T05:00:00Z")), 202701);
        let yearly = rule(Calendar::Year, "Asia/Kolkata", 9);
        assert_eq!(yearly.period_at(ms("2026-12-31T18:29:59Z")), 2026);
        assert_eq!(yearly.period_at(ms("2026-12-31T18:30:00Z")), 2027);
    }

    #[test]
    fn positions_map_to_ids_and_stop_at_the_last_sequence_number() {
        let daily = rule(Calendar::Day, "UTC", 3);
        let first = daily.first_position(20261204);
        assert_eq!(first, 202612040001);
        assert_eq!(daily.id_at(first), Some(20261204001));
        assert_eq!(daily.id_at(first + 998), Some(20261204999));
        assert_eq!(daily.last_sequence(), 999);
        // Past the last sequence number: the gap, never the next period's numbers.
        assert_eq!(daily.id_at(first + 999), None);
        assert_eq!(daily.id_at(daily.first_position(20261205) - 1), None);
        assert_eq!(daily.id_at(first - 1), None, "sequence 0 is never an ID");
        assert_eq!(daily.period_of(first + 5000), 20261204);
        assert_eq!(daily.period_of(1), 0);
        // The next period's positions are above every position of this one.
        assert!(daily.first_position(20261205) > first + 9_000);
        assert!(daily.first_position(20270101) > daily.first_position(20261231));
    }

    #[test]
    fn a_rule_recorded_in_full_is_read_back() {
        let daily = rule(Calendar::Day, "Asia/Shanghai", 6);
        assert_eq!(daily.record(), "period:daily:6:Asia/Shanghai:ORD");
        let back = PeriodRule::from_record(&daily.record()).unwrap();
        assert_eq!(back.describe(), "daily Asia/Shanghai 6");
        assert_eq!(back.code(20261204000123), "ORD20261204000123");
        assert!(same_rule(&daily.record(), "period:daily:6"));
        assert!(same_rule("period:daily:6", "period:daily:6"));
        assert!(!same_rule("period:daily:60", "period:daily:6"));
        // The zone decides which date a position is served on: it must agree where both name it.
        assert_eq!(daily.served_marker(), "period:daily:6:Asia/Shanghai");
        assert!(same_rule(&daily.record(), &daily.served_marker()));
        assert!(same_rule("period:daily:6", &daily.served_marker()));
        assert!(!same_rule("period:daily:6:UTC:ORD", &daily.served_marker()));
        assert!(!same_rule(
            "period:monthly:6:Asia/Shanghai:",
            &daily.served_marker()
        ));
        assert_eq!(
            marker_of_record(Some("period:daily:6:UTC:ORD")).as_deref(),
            Some("period:daily:6")
        );
        assert_eq!(marker_of_record(Some("2:0")), None);
        assert!(PeriodRule::from_record("period:daily:6").is_none());
        assert!(PeriodRule::from_record("period:daily:12:UTC:").is_none());
        assert!(PeriodRule::from_record("period:daily:6:Mars/Base:").is_none());
        // Zones that resolve but name no place: each host's own zone, or none.
        for zone in ["localtime", "Factory", "posixrules"] {
            let record = format!("period:daily:6:{zone}:");
            assert!(PeriodRule::from_record(&record).is_none(), "{record}");
        }
        assert_eq!(
            window_of_marker(Some("period:monthly:4:UTC:X")),
            Some(crate::storage::Window {
                span: 100_000,
                usable: 10_000
            })
        );
    }

    #[test]
    fn a_position_that_is_no_date_or_a_later_period_is_refused() {
        let daily = rule(Calendar::Day, "UTC", 6);
        let now = ms("2026-12-07T12:00:00Z");
        assert_eq!(
            daily.refuse_position(daily.first_position(20261207), now),
            None
        );
        assert_eq!(
            daily.refuse_position(daily.first_position(20261206) + 5, now),
            None
        );
        assert_eq!(
            daily.refuse_position(5, now),
            None,
            "a row no period raised yet"
        );
        // Month 13, day 32, 30 February, next year, a position of other digits.
        for position in [
            202613070000005,
            202612320000001,
            202602300000001,
            202712070000005,
        ] {
            let refusal = daily.refuse_position(position, now).expect("refused");
            assert!(
                refusal.starts_with("IDs refused: the row's position"),
                "{refusal}"
            );
        }
        let four = rule(Calendar::Day, "UTC", 4);
        let text = four.refuse_position(202612070000002, now).unwrap();
        assert!(
            text.contains("reads as period 2026120700, no date of a daily tag with 4"),
            "{text}"
        );
        // Tomorrow is served only within PERIOD_AHEAD_MS of midnight.
        let tomorrow = daily.first_position(20261208);
        assert!(daily.refuse_position(tomorrow, now).is_some());
        assert_eq!(
            daily.refuse_position(tomorrow, ms("2026-12-07T23:59:30Z")),
            None
        );
        let yearly = rule(Calendar::Year, "UTC", 1);
        assert!(yearly
            .refuse_position(yearly.first_position(9999), now)
            .is_some());
        assert!(!yearly.is_date(0) && yearly.is_date(2026) && !yearly.is_date(10_000));
        let monthly = rule(Calendar::Month, "UTC", 4);
        assert!(!monthly.is_date(202699) && monthly.is_date(202612) && !monthly.is_date(202600));
        assert!(daily.is_date(20240229) && !daily.is_date(20250229));
    }

    #[test]
    fn the_code_is_prefix_date_and_padded_sequence() {
        let daily = rule(Calendar::Day, "UTC", 6);
        assert_eq!(daily.code(20261204000123), "ORD20261204000123");
        assert_eq!(daily.code(20261204999999), "ORD20261204999999");
        assert_eq!(daily.describe(), "daily UTC 6");
    }

    #[test]
    fn the_widest_positions_fit_an_i64() {
        // 17 - date digits sequence digits: positions of the year 9999 stay in 18 digits.
        for (calendar, period, digits) in [
            (Calendar::Day, 99991231, 9),
            (Calendar::Month, 999912, 11),
            (Calendar::Year, 9999, 13),
        ] {
            let r = rule(calendar, "UTC", digits);
            let last = r.first_position(period) + r.last_sequence() - 1;
            assert!(last < 10i64.pow(18), "{calendar:?}");
            assert!(r.id_at(last).is_some());
        }
    }
}
