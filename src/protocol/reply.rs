//! Replies: one protocol-neutral [`Reply`] tree per command, encoded with redis-protocol as
//! RESP2 or RESP3 depending on what the connection negotiated with HELLO.

use bytes::{Bytes, BytesMut};
use redis_protocol::bytes_utils::Str;
use redis_protocol::resp2::types::BytesFrame as Frame2;
use redis_protocol::resp3::types::{BytesFrame as Frame3, FrameMap, VerbatimStringFormat};

/// The protocol a connection speaks; RESP2 until the client sends `HELLO 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RespVersion {
    #[default]
    Resp2,
    Resp3,
}

impl RespVersion {
    pub fn number(self) -> i64 {
        match self {
            RespVersion::Resp2 => 2,
            RespVersion::Resp3 => 3,
        }
    }
}

/// A reply to one command. Maps become flat arrays and verbatim strings bulk strings in RESP2.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Simple(String),
    /// An error; the text starts with its code word (`ERR`, `NOAUTH`, `UNAVAILABLE`, …).
    Error(String),
    Integer(i64),
    Bulk(Bytes),
    Null,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    /// Human-readable text (INFO, CLIENT INFO): RESP3 verbatim string `txt`.
    Verbatim(String),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// An error reply; `text` must start with the error code, e.g. `ERR unknown tag 'x'`.
    /// Line breaks are replaced so the reply cannot break RESP framing.
    pub fn error(text: impl Into<String>) -> Reply {
        let mut text: String = text.into();
        if text.contains(['\r', '\n']) {
            text = text.replace(['\r', '\n'], " ");
        }
        Reply::Error(text)
    }

    pub fn bulk(data: impl Into<Bytes>) -> Reply {
        Reply::Bulk(data.into())
    }

    /// A map whose keys are short ASCII names, the common shape of HELLO and LEAF.TAGS.
    pub fn map<const N: usize>(entries: [(&str, Reply); N]) -> Reply {
        Reply::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Reply::bulk(Bytes::copy_from_slice(k.as_bytes())), v))
                .collect(),
        )
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Appends the encoded reply to `buf`.
    pub fn encode(&self, version: RespVersion, buf: &mut BytesMut) {
        if let Reply::Integer(value) = self {
            // The reply of every ID command, written directly: `:<n>\r\n` is the same in RESP2
            // and RESP3, and this costs a fraction of building a frame (`resp/encode_integer`).
            // One copy into the buffer, not three: for replies this small the copies' overhead
            // is most of the cost.
            let mut digits = itoa::Buffer::new();
            let digits = digits.format(*value).as_bytes();
            let mut line = [0u8; 24];
            line[0] = b':';
            line[1..1 + digits.len()].copy_from_slice(digits);
            line[1 + digits.len()..3 + digits.len()].copy_from_slice(b"\r\n");
            buf.extend_from_slice(&line[..3 + digits.len()]);
            return;
        }
        let result = match version {
            RespVersion::Resp2 => {
                redis_protocol::resp2::encode::extend_encode(buf, &self.to_resp2(), false)
            }
            RespVersion::Resp3 => {
                redis_protocol::resp3::encode::complete::extend_encode(buf, &self.to_resp3(), false)
            }
        };
        if let Err(e) = result {
            // Every Reply maps to a valid frame, so this is a bug; keep the stream in sync anyway.
            tracing::error!(error = %e, "failed to encode reply");
            buf.extend_from_slice(b"-ERR internal error encoding reply\r\n");
        }
    }

    fn to_resp2(&self) -> Frame2 {
        match self {
            Reply::Simple(s) => Frame2::SimpleString(Bytes::copy_from_slice(s.as_bytes())),
            Reply::Error(e) => Frame2::Error(Str::from(e.as_str())),
            Reply::Integer(i) => Frame2::Integer(*i),
            Reply::Bulk(b) => Frame2::BulkString(b.clone()),
            Reply::Null => Frame2::Null,
            Reply::Array(items) => Frame2::Array(items.iter().map(Reply::to_resp2).collect()),
            Reply::Map(entries) => Frame2::Array(
                entries
                    .iter()
                    .flat_map(|(k, v)| [k.to_resp2(), v.to_resp2()])
                    .collect(),
            ),
            Reply::Verbatim(s) => Frame2::BulkString(Bytes::copy_from_slice(s.as_bytes())),
        }
    }

    fn to_resp3(&self) -> Frame3 {
        match self {
            Reply::Simple(s) => Frame3::SimpleString {
                data: Bytes::copy_from_slice(s.as_bytes()),
                attributes: None,
            },
            Reply::Error(e) => Frame3::SimpleError {
                data: Str::from(e.as_str()),
                attributes: None,
            },
            Reply::Integer(i) => Frame3::Number {
                data: *i,
                attributes: None,
            },
            Reply::Bulk(b) => Frame3::BlobString {
                data: b.clone(),
                attributes: None,
            },
            Reply::Null => Frame3::Null,
            Reply::Array(items) => Frame3::Array {
                data: items.iter().map(Reply::to_resp3).collect(),
                attributes: None,
            },
            Reply::Map(entries) => {
                let mut map = FrameMap::with_capacity(entries.len());
                for (k, v) in entries {
                    map.insert(k.to_resp3(), v.to_resp3());
                }
                Frame3::Map {
                    data: map,
                    attributes: None,
                }
            }
            Reply::Verbatim(s) => Frame3::VerbatimString {
                data: Bytes::copy_from_slice(s.as_bytes()),
                format: VerbatimStringFormat::Text,
                attributes: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(reply: &Reply, version: RespVersion) -> String {
        let mut buf = BytesMut::new();
        reply.encode(version, &mut buf);
        String::from_utf8(buf.to_vec()).unwrap()
    }

    #[test]
    fn encodes_both_protocols() {
        let map = Reply::map([("proto", Reply::Integer(3)), ("x", Reply::Null)]);
        assert_eq!(
            encoded(&map, RespVersion::Resp2),
            "*4\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n$-1\r\n"
        );
        assert_eq!(
            encoded(&map, RespVersion::Resp3),
            "%2\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n_\r\n"
        );
        assert_eq!(encoded(&Reply::Integer(-7), RespVersion::Resp2), ":-7\r\n");
        assert_eq!(
            encoded(&Reply::error("ERR a\r\nb"), RespVersion::Resp2),
            "-ERR a  b\r\n"
        );
        assert_eq!(
            encoded(&Reply::Verbatim("hi".into()), RespVersion::Resp3),
            "=6\r\ntxt:hi\r\n"
        );
    }
}
