//! ID engines and what they share: the segment allocator (database-backed) and the
//! clock abstraction that lets tests drive time by hand.

pub mod clock;
pub mod segment;
pub mod snowflake;
