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

/// Where an allocation takes a locked row: its new `max_id`, and the skip when the row was
/// last allocated by another instance. `row_writer` is `None` for a row no allocation has
/// marked yet (created before leafd recorded writers): nothing to compare, no skip.
pub(crate) fn plan(
    tag: &str,
    row_max_id: i64,
    step: i64,
    row_writer: Option<&str>,
    current: &str,
    failover_margin: i64,
) -> Result<(i64, Option<FailoverSkip>), super::StoreError> {
    let skip = row_writer
        .filter(|previous| *previous != current)
        .map(|previous| FailoverSkip {
            previous: previous.to_string(),
            current: current.to_string(),
            margin: failover_margin,
        });
    let margin = skip.as_ref().map_or(0, |s| s.margin);
    let max_id = row_max_id
        .checked_add(step)
        .and_then(|m| m.checked_add(margin))
        .ok_or_else(|| super::StoreError::Exhausted(tag.to_string()))?;
    Ok((max_id, skip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_only_for_another_writer() {
        assert_eq!(plan("t", 100, 10, None, "a", 1000).unwrap(), (110, None));
        assert_eq!(
            plan("t", 100, 10, Some("a"), "a", 1000).unwrap(),
            (110, None)
        );
        let (max_id, skip) = plan("t", 100, 10, Some("b"), "a", 1000).unwrap();
        assert_eq!(max_id, 1110);
        assert_eq!(
            skip,
            Some(FailoverSkip {
                previous: "b".into(),
                current: "a".into(),
                margin: 1000
            })
        );
        assert!(matches!(
            plan("t", i64::MAX - 1005, 10, Some("b"), "a", 1000),
            Err(crate::storage::StoreError::Exhausted(_))
        ));
        assert!(plan("t", i64::MAX - 10, 10, Some("a"), "a", 1000).is_ok());
    }
}
