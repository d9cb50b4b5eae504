//! RESP framing: requests decoded with the redis-protocol crate (plus inline commands and
//! size limits), replies built as [`Reply`] and encoded as RESP2 or RESP3 per connection.

mod args;
mod reply;
mod request;

pub use args::{parse_i64, ArgCursor, ArgError};
pub use reply::{Reply, RespVersion};
pub use request::{Args, ProtocolError, RequestDecoder, RequestLimits};
