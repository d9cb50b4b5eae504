//! Failover detection: which database instance answers, and how far an allocation moves past
//! a row another instance wrote last (the allocations a lossy failover may have lost).

/// An allocation that found its row last written by another database instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverSkip {
    /// The instance that made the row's previous allocation.
    pub previous: String,
    /// The instance answering now.
    pub current: String,
    /// IDs left unused before the granted range.
    pub margin: i64,
}

/// Where an allocation takes a locked row: the first ID it grants, its new `max_id` (the
/// range is `first..max_id`, `step` IDs), and the skip when the row was last allocated by
/// another instance. The range starts at the row's `max_id` only when `row_exclusive_max`
/// shows a leafd allocation left that ID unserved; Leaf, or a leafd release before the column,
/// may have served it, so the range then starts one above. `row_writer` is `None` for a row no
/// allocation has marked yet (created before leafd recorded writers): nothing to compare, no
/// failover skip.
///
/// With a window, a range that would cross the window's end is refused whole
/// ([`super::StoreError::PastEnd`]), unless the failover margin is what crosses it: the rest
/// of the window is then used up, `first == max_id` at its end (never lower than the row).
pub(crate) fn plan(
    tag: &str,
    row_max_id: i64,
    row_exclusive_max: Option<i64>,
    step: i64,
    row_writer: Option<&str>,
    current: &str,
    grant: &super::Grant,
) -> Result<(i64, i64, Option<FailoverSkip>), super::StoreError> {
    super::check_step(tag, step)?;
    let skip = row_writer
        .filter(|previous| *previous != current)
        .map(|previous| FailoverSkip {
            previous: previous.to_string(),
            current: current.to_string(),
            margin: grant.failover_margin,
        });
    let margin = skip.as_ref().map_or(0, |s| s.margin);
    let unserved = i64::from(row_exclusive_max != Some(row_max_id));
    let exhausted = || super::StoreError::Exhausted(tag.to_string());
    let base = row_max_id.checked_add(unserved).ok_or_else(exhausted)?;
    if let Some(window) = grant.window {
        let end = window.end_of(base);
        let fits = |first: i64| first.checked_add(step).is_some_and(|max| max <= end);
        if !fits(base.saturating_add(margin)) {
            if skip.is_some() {
                let used_up = end.max(row_max_id);
                return Ok((used_up, used_up, skip));
            }
            return Err(super::StoreError::PastEnd {
                tag: tag.to_string(),
                max_id: row_max_id,
                left: (end - base).max(0),
            });
        }
    }
    let first = base.checked_add(margin).ok_or_else(exhausted)?;
    let max_id = first
        .checked_add(step)
        .ok_or_else(|| match i64::MAX - first {
            left if left >= 1 => super::StoreError::NearEnd {
                tag: tag.to_string(),
                left,
            },
            _ => exhausted(),
        })?;
    Ok((first, max_id, skip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Grant;

    fn g(failover_margin: i64) -> Grant {
        Grant::step(None, failover_margin)
    }

    #[test]
    fn skips_only_for_another_writer() {
        // A leafd allocation left 100 unserved: the range starts there.
        assert_eq!(
            plan("t", 100, Some(100), 10, None, "a", &g(1000)).unwrap(),
            (100, 110, None)
        );
        assert_eq!(
            plan("t", 100, Some(100), 10, Some("a"), "a", &g(1000)).unwrap(),
            (100, 110, None)
        );
        let (first, max_id, skip) =
            plan("t", 100, Some(100), 10, Some("b"), "a", &g(1000)).unwrap();
        assert_eq!((first, max_id), (1100, 1110));
        assert_eq!(
            skip,
            Some(FailoverSkip {
                previous: "b".into(),
                current: "a".into(),
                margin: 1000
            })
        );
        // Past the margin, 5 IDs are left of the space: the caller may ask for those.
        assert!(matches!(
            plan(
                "t",
                i64::MAX - 1005,
                Some(i64::MAX - 1005),
                10,
                Some("b"),
                "a",
                &g(1000)
            ),
            Err(crate::storage::StoreError::NearEnd { left: 5, .. })
        ));
        assert!(plan(
            "t",
            i64::MAX - 10,
            Some(i64::MAX - 10),
            10,
            Some("a"),
            "a",
            &g(1000)
        )
        .is_ok());
        assert!(plan("t", i64::MAX - 10, None, 10, Some("a"), "a", &g(1000)).is_err());
    }

    #[test]
    fn a_max_id_another_reader_may_have_served_is_skipped() {
        // Leaf (or a leafd before exclusive_max) raised max_id to 100: the column is behind it
        // or empty, and 100 may have been served.
        assert_eq!(
            plan("t", 100, Some(90), 10, None, "a", &g(0)).unwrap(),
            (101, 111, None)
        );
        assert_eq!(
            plan("t", 100, None, 10, None, "a", &g(0)).unwrap(),
            (101, 111, None)
        );
        // The failover margin comes on top.
        assert_eq!(
            plan("t", 100, None, 10, Some("b"), "a", &g(50)).unwrap().0,
            151
        );
    }

    #[test]
    fn a_window_is_never_crossed() {
        // Windows of 100 positions, the first 10 usable (a period tag with one digit).
        let window = Some(crate::storage::Window {
            span: 100,
            usable: 10,
        });
        let grant = |margin| Grant {
            step: None,
            failover_margin: margin,
            window,
            serves: crate::storage::Serves::Unchecked,
            seen: None,
        };
        assert_eq!(
            plan("t", 2001, Some(2001), 9, None, "a", &grant(0)).unwrap(),
            (2001, 2010, None)
        );
        match plan("t", 2001, Some(2001), 10, None, "a", &grant(0)) {
            Err(crate::storage::StoreError::PastEnd { left, max_id, .. }) => {
                assert_eq!((left, max_id), (9, 2001))
            }
            other => panic!("{other:?}"),
        }
        // A row at the window's end, or in its gap: nothing left, never the next window.
        assert!(plan("t", 2010, Some(2010), 1, None, "a", &grant(0)).is_err());
        assert!(plan("t", 2050, Some(2050), 1, None, "a", &grant(0)).is_err());
        // The margin that crosses the end uses the window up, and no more.
        let (first, max_id, skip) =
            plan("t", 2003, Some(2003), 1, Some("b"), "a", &grant(1000)).unwrap();
        assert_eq!((first, max_id), (2010, 2010));
        assert!(skip.is_some());
        let (first, max_id, _) = plan("t", 2003, Some(2003), 2, Some("b"), "a", &grant(3)).unwrap();
        assert_eq!((first, max_id), (2006, 2008));
    }
}
