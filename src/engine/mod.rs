//! The two ID engines: segment (ranges reserved in a database, handed out from memory) and
//! snowflake (time, worker id and sequence packed into a configured layout of at most 63 bits).

pub mod segment;
pub mod snowflake;
