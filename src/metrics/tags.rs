//! The per-tag segment series, rendered by hand at each scrape for the busiest tags only, the
//! others summed under `tag="_other"`, so a node with a million tags has a page of kilobytes.

use std::fmt::Write as _;

use super::names::*;

/// The label value of the series that sums every tag without its own.
pub const OTHER_TAGS: &str = "_other";

/// Reads one figure of a tag.
type Figure<T> = fn(&TagFigures) -> T;

/// One tag's figures, as the engine last counted them.
#[derive(Clone, Debug, Default)]
pub struct TagFigures {
    pub tag: String,
    pub order: &'static str,
    pub period: Option<String>,
    pub served: u64,
    pub loads_ok: u64,
    pub loads_failed: u64,
    pub rollbacks: u64,
    pub failover_skips: u64,
    pub step: i64,
    pub remaining_current: i64,
    pub remaining_next: i64,
    pub preload_threshold: i64,
}

/// Appends the per-tag series: the `limit` tags that served most get their own (ties by
/// name), the rest are added into one `_other` series of each counter and of the remaining
/// IDs, so sums over `tag` stay the node's totals.
pub fn render_tag_series(mut figures: Vec<TagFigures>, limit: usize, out: &mut String) {
    figures.sort_unstable_by(|a, b| b.served.cmp(&a.served).then_with(|| a.tag.cmp(&b.tag)));
    let rest = figures.split_off(limit.min(figures.len()));
    let other = (!rest.is_empty()).then(|| {
        rest.iter().fold(
            TagFigures {
                tag: OTHER_TAGS.to_string(),
                ..TagFigures::default()
            },
            |mut sum, t| {
                sum.served += t.served;
                sum.loads_ok += t.loads_ok;
                sum.loads_failed += t.loads_failed;
                sum.rollbacks += t.rollbacks;
                sum.failover_skips += t.failover_skips;
                sum.remaining_current += t.remaining_current;
                sum.remaining_next += t.remaining_next;
                sum
            },
        )
    });
    figures.sort_unstable_by(|a, b| a.tag.cmp(&b.tag));
    let all: Vec<&TagFigures> = figures.iter().chain(other.as_ref()).collect();
    let counters: [(&str, Figure<u64>); 4] = [
        (SEGMENT_IDS_TOTAL, |t| t.served),
        (SEGMENT_ROLLBACKS_TOTAL, |t| t.rollbacks),
        (SEGMENT_FAILOVER_SKIPS_TOTAL, |t| t.failover_skips),
        (SEGMENT_LOADS_TOTAL, |_| 0),
    ];
    for (name, value) in counters {
        header(out, name, "counter");
        for t in &all {
            let tag = escaped(&t.tag);
            if name == SEGMENT_LOADS_TOTAL {
                let _ = writeln!(out, "{name}{{tag=\"{tag}\",result=\"ok\"}} {}", t.loads_ok);
                let _ = writeln!(
                    out,
                    "{name}{{tag=\"{tag}\",result=\"error\"}} {}",
                    t.loads_failed
                );
            } else {
                let _ = writeln!(out, "{name}{{tag=\"{tag}\"}} {}", value(t));
            }
        }
    }
    header(out, SEGMENT_REMAINING_IDS, "gauge");
    for t in &all {
        let tag = escaped(&t.tag);
        let _ = writeln!(
            out,
            "{SEGMENT_REMAINING_IDS}{{tag=\"{tag}\",buffer=\"current\"}} {}",
            t.remaining_current
        );
        let _ = writeln!(
            out,
            "{SEGMENT_REMAINING_IDS}{{tag=\"{tag}\",buffer=\"next\"}} {}",
            t.remaining_next
        );
    }
    // A sum of steps or of rules means nothing: these have no `_other` series.
    let gauges: [(&str, Figure<i64>); 2] = [
        (SEGMENT_STEP, |t| t.step),
        (SEGMENT_PRELOAD_THRESHOLD_IDS, |t| t.preload_threshold),
    ];
    for (name, value) in gauges {
        header(out, name, "gauge");
        for t in &figures {
            let _ = writeln!(out, "{name}{{tag=\"{}\"}} {}", escaped(&t.tag), value(t));
        }
    }
    header(out, SEGMENT_TAG_INFO, "gauge");
    for t in &figures {
        let period = t.period.as_deref().unwrap_or("none");
        let _ = writeln!(
            out,
            "{SEGMENT_TAG_INFO}{{tag=\"{}\",order=\"{}\",period=\"{}\"}} 1",
            escaped(&t.tag),
            t.order,
            escaped(period)
        );
    }
}

fn header(out: &mut String, name: &str, kind: &str) {
    let help = super::DESCRIPTIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, h)| *h);
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the exposition format writes it.
pub(super) fn escaped(value: &str) -> std::borrow::Cow<'_, str> {
    if value.contains(['\\', '"', '\n']) {
        value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        value.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(name: &str, served: u64) -> TagFigures {
        TagFigures {
            tag: name.into(),
            order: "trend",
            served,
            loads_ok: 1,
            remaining_current: 10,
            step: 1000,
            ..TagFigures::default()
        }
    }

    #[test]
    fn the_busiest_tags_get_series_and_the_rest_sum_into_other() {
        let figures = vec![tag("a", 5), tag("b", 50), tag("c", 7), tag("d\"q", 1)];
        let mut out = String::new();
        render_tag_series(figures, 2, &mut out);
        assert!(
            out.contains("leafd_segment_ids_total{tag=\"b\"} 50\n"),
            "{out}"
        );
        assert!(
            out.contains("leafd_segment_ids_total{tag=\"c\"} 7\n"),
            "{out}"
        );
        assert!(
            out.contains("leafd_segment_ids_total{tag=\"_other\"} 6\n"),
            "{out}"
        );
        assert!(!out.contains("tag=\"a\""), "{out}");
        assert!(
            out.contains("leafd_segment_loads_total{tag=\"_other\",result=\"ok\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("leafd_segment_remaining_ids{tag=\"_other\",buffer=\"current\"} 20\n"),
            "{out}"
        );
        assert!(!out.contains("leafd_segment_step{tag=\"_other\"}"), "{out}");
        assert_eq!(
            out.matches("# TYPE leafd_segment_ids_total counter")
                .count(),
            1
        );
        let mut all = String::new();
        render_tag_series(vec![tag("d\"q", 1)], 10, &mut all);
        assert!(
            all.contains("leafd_segment_ids_total{tag=\"d\\\"q\"} 1\n"),
            "{all}"
        );
        assert!(!all.contains("_other"), "{all}");
    }
}
