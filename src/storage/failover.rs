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
pub(crate) fn plan(
    tag: &str,
    row_max_id: i64,
    row_exclusive_max: Option<i64>,
    step: i64,
    row_writer: Option<&str>,
    current: &str,
    failover_margin: i64,
) -> Result<(i64, i64, Option<FailoverSkip>), super::StoreError> {
    let skip = row_writer
        .filter(|previous| *previous != current)
        .map(|previous| FailoverSkip {
            previous: previous.to_string(),
            current: current.to_string(),
            margin: failover_margin,
        });
    let margin = skip.as_ref().map_or(0, |s| s.margin);
    let unserved = i64::from(row_exclusive_max != Some(row_max_id));
    let exhausted = || super::StoreError::Exhausted(tag.to_string());
    let first = row_max_id
        .checked_add(unserved)
        .and_then(|m| m.checked_add(margin))
        .ok_or_else(exhausted)?;
    let max_id = first.checked_add(step).ok_or_else(exhausted)?;
    Ok((first, max_id, skip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_only_for_another_writer() {
        // A leafd allocation left 100 unserved: the range starts there.
        assert_eq!(
            plan("t", 100, Some(100), 10, None, "a", 1000).unwrap(),
            (100, 110, None)
        );
        assert_eq!(
            plan("t", 100, Some(100), 10, Some("a"), "a", 1000).unwrap(),
            (100, 110, None)
        );
        let (first, max_id, skip) = plan("t", 100, Some(100), 10, Some("b"), "a", 1000).unwrap();
        assert_eq!((first, max_id), (1100, 1110));
        assert_eq!(
            skip,
            Some(FailoverSkip {
                previous: "b".into(),
                current: "a".into(),
                margin: 1000
            })
        );
        assert!(matches!(
            plan(
                "t",
                i64::MAX - 1005,
                Some(i64::MAX - 1005),
                10,
                Some("b"),
                "a",
                1000
            ),
            Err(crate::storage::StoreError::Exhausted(_))
        ));
        assert!(plan(
            "t",
            i64::MAX - 10,
            Some(i64::MAX - 10),
            10,
            Some("a"),
            "a",
            1000
        )
        .is_ok());
        assert!(plan("t", i64::MAX - 10, None, 10, Some("a"), "a", 1000).is_err());
    }

    #[test]
    fn a_max_id_another_reader_may_have_served_is_skipped() {
        // Leaf (or a leafd before exclusive_max) raised max_id to 100: the column is behind it
        // or empty, and 100 may have been served.
        assert_eq!(
            plan("t", 100, Some(90), 10, None, "a", 0).unwrap(),
            (101, 111, None)
        );
        assert_eq!(
            plan("t", 100, None, 10, None, "a", 0).unwrap(),
            (101, 111, None)
        );
        // The failover margin comes on top.
        assert_eq!(plan("t", 100, None, 10, Some("b"), "a", 50).unwrap().0, 151);
    }
}
