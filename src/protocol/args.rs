//! A cursor over a command's arguments: each is taken once, in order, typed; `finish` reports
//! any left over, so a command never reads `args[i]` by position after an arity check.

/// Why the arguments do not fit the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgError {
    /// Fewer arguments than the command takes.
    Missing,
    /// More arguments than the command takes.
    Extra,
    /// An argument that must be a 64-bit integer is not one.
    NotInteger,
}

/// The arguments after the command's name, taken one by one.
#[derive(Debug, Clone, Copy)]
pub struct ArgCursor<'a> {
    rest: &'a [&'a [u8]],
}

impl<'a> ArgCursor<'a> {
    /// A cursor over `args` past the command's name (`args[0]`).
    pub fn new(args: &'a [&'a [u8]]) -> ArgCursor<'a> {
        ArgCursor {
            rest: args.get(1..).unwrap_or(&[]),
        }
    }

    /// How many arguments are left: a command whose shape depends on a subcommand checks its
    /// count before parsing, so a wrong count is reported as such, not as a bad value.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// The next argument, if there is one.
    pub fn optional(&mut self) -> Option<&'a [u8]> {
        let (first, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(first)
    }

    pub fn next_bytes(&mut self) -> Result<&'a [u8], ArgError> {
        self.optional().ok_or(ArgError::Missing)
    }

    /// The next argument as a signed 64-bit decimal integer.
    pub fn next_i64(&mut self) -> Result<i64, ArgError> {
        parse_i64(self.next_bytes()?)
    }

    /// Every argument not taken yet (options a command scans as a list, patterns).
    pub fn rest(self) -> &'a [&'a [u8]] {
        self.rest
    }

    /// The next argument, lowercased for matching a subcommand or an option name.
    pub fn next_keyword(&mut self) -> Result<Vec<u8>, ArgError> {
        Ok(self.next_bytes()?.to_ascii_lowercase())
    }

    /// Succeeds when every argument was taken.
    pub fn finish(self) -> Result<(), ArgError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(ArgError::Extra)
        }
    }
}

/// A signed 64-bit decimal integer, as Redis reads one (an optional sign, digits, nothing else).
pub fn parse_i64(arg: &[u8]) -> Result<i64, ArgError> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or(ArgError::NotInteger)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_each_argument_once_and_reports_leftovers() {
        let args: [&[u8]; 4] = [b"INCRBY", b"segment:a", b"42", b"extra"];
        let mut cursor = ArgCursor::new(&args);
        assert_eq!(cursor.next_bytes(), Ok(&b"segment:a"[..]));
        assert_eq!(cursor.next_i64(), Ok(42));
        assert_eq!(cursor.finish(), Err(ArgError::Extra));
        let mut cursor = ArgCursor::new(&args[..2]);
        cursor.next_bytes().unwrap();
        assert_eq!(cursor.next_i64(), Err(ArgError::Missing));
        let bad: [&[u8]; 2] = [b"SNOWFLAKE", b"12x"];
        assert_eq!(ArgCursor::new(&bad).next_i64(), Err(ArgError::NotInteger));
        assert_eq!(ArgCursor::new(&bad[..1]).finish(), Ok(()));
    }
}
