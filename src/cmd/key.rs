//! The key of INCR, INCRBY and GET, parsed once into what it names: a segment tag or the
//! snowflake sequence.

use super::lossy;
use crate::protocol::Reply;

/// `INCR snowflake`, `GET snowflake`: the next snowflake ID (any case).
pub const SNOWFLAKE_KEY: &[u8] = b"snowflake";
const SEGMENT_PREFIX: &[u8] = b"segment:";

/// What a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    /// `segment:<tag>`: the tag's bytes as the client sent them.
    Segment(&'a [u8]),
    Snowflake,
}

impl<'a> Key<'a> {
    /// The key's meaning, or `None` for a key leafd does not serve (no error built: the hot
    /// path tries this first).
    // Always: left out of line it costs 15 instructions per INCR (callgrind).
    #[inline(always)]
    pub fn of(key: &'a [u8]) -> Option<Key<'a>> {
        if key.eq_ignore_ascii_case(SNOWFLAKE_KEY) {
            Some(Key::Snowflake)
        } else {
            key.strip_prefix(SEGMENT_PREFIX).map(Key::Segment)
        }
    }

    /// [`Key::of`], with the error reply for a key leafd does not serve.
    pub fn parse(key: &'a [u8]) -> Result<Key<'a>, Reply> {
        Key::of(key).ok_or_else(|| {
            Reply::error(format!(
                "ERR unsupported key '{}': use segment:<tag> or snowflake",
                lossy(key)
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_a_tag_or_the_snowflake_sequence() {
        assert_eq!(Key::of(b"segment:order"), Some(Key::Segment(b"order")));
        assert_eq!(Key::of(b"SnowFlake"), Some(Key::Snowflake));
        assert_eq!(Key::of(b"order"), None);
        let err = Key::parse(b"order").unwrap_err();
        assert_eq!(
            err,
            Reply::error("ERR unsupported key 'order': use segment:<tag> or snowflake")
        );
    }
}
