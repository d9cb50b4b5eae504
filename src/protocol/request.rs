//! Request decoding: RESP multibulk arrays through redis-protocol, inline commands (telnet/nc)
//! by hand, and the configured size limits checked before any large buffer can build up.

#[cfg(test)]
use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::{decode::decode_range, types::RangeFrame};

/// Upper bounds on what one request may contain; exceeding one is a protocol error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Longest inline command line, in bytes (Redis: 64 KiB).
    pub max_inline_len: usize,
    /// Longest single bulk string argument, in bytes.
    pub max_bulk_len: usize,
    /// Most arguments in one multibulk request.
    pub max_array_len: usize,
    /// Most bytes one request may occupy in total while it is still arriving.
    pub max_request_len: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_inline_len: 64 * 1024,
            max_bulk_len: 512 * 1024,
            max_array_len: 1024,
            max_request_len: 4 * 1024 * 1024,
        }
    }
}

/// A request that cannot be framed. The connection answers with this text and closes,
/// because the byte stream can no longer be split into commands reliably.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    #[error("Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    #[error("Protocol error: request too large")]
    RequestTooLarge,
    #[error("Protocol error: {0}")]
    Malformed(String),
}

/// Longest header line (`*N\r\n` / `$N\r\n`) we wait for before calling it malformed.
const MAX_HEADER_LINE: usize = 32;

/// Splits a byte stream into commands (each a list of arguments), enforcing [`RequestLimits`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestDecoder {
    limits: RequestLimits,
}

/// Arguments kept inline before a command's list moves to the heap: every hot command fits.
const FEW_ARGS: usize = 4;

/// One command's arguments, borrowed from the input buffer: decoding copies nothing.
#[derive(Debug, Default)]
pub struct Args<'b> {
    few: [&'b [u8]; FEW_ARGS],
    count: usize,
    many: Vec<&'b [u8]>,
}

impl<'b> Args<'b> {
    fn clear(&mut self) {
        self.count = 0;
        self.many.clear();
    }

    fn push(&mut self, arg: &'b [u8]) {
        if self.count < FEW_ARGS {
            self.few[self.count] = arg;
        } else {
            if self.many.is_empty() {
                self.many.extend_from_slice(&self.few);
            }
            self.many.push(arg);
        }
        self.count += 1;
    }
}

impl<'b> std::ops::Deref for Args<'b> {
    type Target = [&'b [u8]];

    fn deref(&self) -> &Self::Target {
        if self.count <= FEW_ARGS {
            &self.few[..self.count]
        } else {
            &self.many
        }
    }
}

impl RequestDecoder {
    pub fn new(limits: RequestLimits) -> Self {
        Self { limits }
    }

    /// Decodes the next complete command at the front of `buf` into `args` (which must be
    /// empty) without consuming anything: `args` stays empty while more bytes are needed. Returns
    /// how many bytes to drop from the front of the buffer once done with `args`: the command
    /// and any empty requests before it (blank inline lines, `*0`, skipped as Redis does), which
    /// are dropped even when no command follows yet.
    pub fn decode<'b>(&self, buf: &'b [u8], args: &mut Args<'b>) -> Result<usize, ProtocolError> {
        let mut used = 0;
        while let Some(&first) = buf.get(used) {
            let rest = &buf[used..];
            let decoded = if first == b'*' {
                self.decode_multibulk(rest, args)?
            } else {
                self.decode_inline(rest, args)?
            };
            match decoded {
                Some(len) => used += len,
                None => break,
            }
            if !args.is_empty() {
                break;
            }
        }
        Ok(used)
    }

    /// A multibulk request into `args`: its length, or `None` while incomplete.
    fn decode_multibulk<'b>(
        &self,
        buf: &'b [u8],
        args: &mut Args<'b>,
    ) -> Result<Option<usize>, ProtocolError> {
        // `*<digit>\r\n`, the header of every command clients send, read without the general
        // header parser.
        let header = match buf.get(..4) {
            Some(&[b'*', digit @ b'1'..=b'9', b'\r', b'\n']) => Some((i64::from(digit - b'0'), 4)),
            _ => parse_header_line(buf, 0, ProtocolError::InvalidMultibulkLength)?,
        };
        let Some((count, header_len)) = header else {
            return Ok(None);
        };
        if count > self.limits.max_array_len as i64 {
            return Err(ProtocolError::InvalidMultibulkLength);
        }
        if count <= 0 {
            return Ok(Some(header_len));
        }
        if let Some(len) = self.decode_complete_bulk_array(buf, header_len, count as usize, args) {
            return Ok(Some(len));
        }
        match decode_range(buf) {
            Ok(Some((RangeFrame::Array(items), len))) => {
                for item in items {
                    match item {
                        RangeFrame::BulkString((start, end))
                            if end - start <= self.limits.max_bulk_len =>
                        {
                            args.push(&buf[start..end])
                        }
                        RangeFrame::BulkString(_) | RangeFrame::Null => {
                            return Err(ProtocolError::InvalidBulkLength)
                        }
                        RangeFrame::SimpleString(_) => {
                            return Err(ProtocolError::ExpectedBulk('+'))
                        }
                        RangeFrame::Error(_) => return Err(ProtocolError::ExpectedBulk('-')),
                        RangeFrame::Integer(_) => return Err(ProtocolError::ExpectedBulk(':')),
                        RangeFrame::Array(_) => return Err(ProtocolError::ExpectedBulk('*')),
                    }
                }
                Ok(Some(len))
            }
            Ok(Some(_)) => Err(ProtocolError::InvalidMultibulkLength),
            Ok(None) => {
                self.check_partial(buf, header_len, count)?;
                Ok(None)
            }
            Err(e) => {
                // Prefer our precise message (bad length, wrong type) over the crate's.
                self.check_partial(buf, header_len, count)?;
                Err(ProtocolError::Malformed(e.details().to_string()))
            }
        }
    }

    /// The common case, parsed directly: a complete array of in-limit bulk strings. Anything
    /// else (incomplete, malformed, oversized) returns `None` and goes through redis-protocol and
    /// the limit checks, which produce the right answer or error. This path exists because the
    /// general decoder costs several times more per command (see `resp/decode_incr` in
    /// `bench/engines.rs`).
    fn decode_complete_bulk_array<'b>(
        &self,
        buf: &'b [u8],
        header_len: usize,
        count: usize,
        args: &mut Args<'b>,
    ) -> Option<usize> {
        let len = self.split_bulk_array(buf, header_len, count, args);
        if len.is_none() {
            args.clear();
        }
        len
    }

    /// [`RequestDecoder::decode_complete_bulk_array`] before it leaves `args` empty on failure.
    fn split_bulk_array<'b>(
        &self,
        buf: &'b [u8],
        header_len: usize,
        count: usize,
        args: &mut Args<'b>,
    ) -> Option<usize> {
        if count > FEW_ARGS {
            return None;
        }
        let mut pos = header_len;
        for _ in 0..count {
            if buf.get(pos) != Some(&b'$') {
                return None;
            }
            let mut len = 0usize;
            let mut i = pos + 1;
            while let Some(&digit @ b'0'..=b'9') = buf.get(i) {
                len = len
                    .checked_mul(10)?
                    .checked_add(usize::from(digit - b'0'))?;
                i += 1;
            }
            if i == pos + 1 || buf.get(i..i + 2) != Some(b"\r\n") || len > self.limits.max_bulk_len
            {
                return None;
            }
            let start = i + 2;
            let end = start.checked_add(len)?;
            if buf.get(end..end + 2) != Some(b"\r\n") {
                return None;
            }
            args.push(&buf[start..end]);
            pos = end + 2;
        }
        Some(pos)
    }

    /// Validates the element headers that have arrived so far of an incomplete request, so a
    /// declared oversized bulk string is refused at once instead of being buffered.
    fn check_partial(&self, buf: &[u8], mut pos: usize, count: i64) -> Result<(), ProtocolError> {
        if buf.len() > self.limits.max_request_len {
            return Err(ProtocolError::RequestTooLarge);
        }
        for _ in 0..count {
            if pos >= buf.len() {
                break;
            }
            if buf[pos] != b'$' {
                return Err(ProtocolError::ExpectedBulk(buf[pos] as char));
            }
            let Some((len, header_len)) =
                parse_header_line(buf, pos, ProtocolError::InvalidBulkLength)?
            else {
                break;
            };
            if len < 0 || len > self.limits.max_bulk_len as i64 {
                return Err(ProtocolError::InvalidBulkLength);
            }
            pos += header_len + len as usize + 2;
        }
        Ok(())
    }

    /// An inline (telnet-style) request into `args`: words separated by whitespace, up to a
    /// newline. Its length, or `None` while incomplete.
    fn decode_inline<'b>(
        &self,
        buf: &'b [u8],
        args: &mut Args<'b>,
    ) -> Result<Option<usize>, ProtocolError> {
        let Some(newline) = buf.iter().position(|&b| b == b'\n') else {
            if buf.len() > self.limits.max_inline_len {
                return Err(ProtocolError::InlineTooBig);
            }
            return Ok(None);
        };
        if newline > self.limits.max_inline_len {
            return Err(ProtocolError::InlineTooBig);
        }
        for word in buf[..newline + 1]
            .split(|b| b.is_ascii_whitespace())
            .filter(|word| !word.is_empty())
        {
            args.push(word);
        }
        Ok(Some(newline + 1))
    }
}

/// Parses a `<type><integer>\r\n` line starting at `at`. Returns the integer and the line's
/// length including CRLF, or `None` when the line has not fully arrived yet.
fn parse_header_line(
    buf: &[u8],
    at: usize,
    invalid: ProtocolError,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    let window = &buf[at..buf.len().min(at + MAX_HEADER_LINE)];
    let Some(newline) = window.iter().position(|&b| b == b'\n') else {
        return if window.len() >= MAX_HEADER_LINE {
            Err(invalid)
        } else {
            Ok(None)
        };
    };
    if newline < 2 || window[newline - 1] != b'\r' {
        return Err(invalid);
    }
    let value = parse_decimal(&window[1..newline - 1]).ok_or(invalid)?;
    Ok(Some((value, newline + 1)))
}

/// An optionally negative decimal that fits an `i64`, as `str::parse` reads it but without
/// the UTF-8 check and the generality: a header is one to twenty ASCII digits.
fn parse_decimal(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        (b'+', rest) => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    for &digit in digits {
        let digit = i64::from(digit.wrapping_sub(b'0'));
        if digit > 9 {
            return None;
        }
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// The next command copied out of `buf`, its bytes consumed: what the tests compare.
#[cfg(test)]
fn decode_owned(
    decoder: &RequestDecoder,
    buf: &mut BytesMut,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let mut args = Args::default();
    let used = decoder.decode(buf, &mut args)?;
    let owned =
        (!args.is_empty()).then(|| args.iter().map(|a| Bytes::copy_from_slice(a)).collect());
    drop(args);
    let _ = buf.split_to(used);
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> (Vec<Vec<Bytes>>, Result<(), ProtocolError>, usize) {
        let decoder = RequestDecoder::default();
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match decode_owned(&decoder, &mut buf) {
                Ok(Some(args)) => out.push(args),
                Ok(None) => return (out, Ok(()), buf.len()),
                Err(e) => return (out, Err(e), buf.len()),
            }
        }
    }

    #[test]
    fn decodes_pipelined_multibulk_and_inline() {
        let (cmds, res, rest) = decode_all(
            b"*2\r\n$4\r\nINCR\r\n$11\r\nsegment:abc\r\nPING\r\n  echo   hi \r\n\r\n*1\r\n$4\r\nPI",
        );
        assert_eq!(res, Ok(()));
        assert_eq!(
            cmds,
            vec![
                vec![Bytes::from("INCR"), Bytes::from("segment:abc")],
                vec![Bytes::from("PING")],
                vec![Bytes::from("echo"), Bytes::from("hi")],
            ]
        );
        assert_eq!(
            rest,
            b"*1\r\n$4\r\nPI".len(),
            "partial frame stays buffered"
        );
    }

    #[test]
    fn refuses_declared_oversized_bulk_before_it_arrives() {
        let (_, res, _) = decode_all(b"*2\r\n$4\r\nECHO\r\n$999999999\r\nabc");
        assert_eq!(res, Err(ProtocolError::InvalidBulkLength));
    }

    #[test]
    fn refuses_huge_or_bad_multibulk_lengths() {
        assert_eq!(
            decode_all(b"*100000\r\n").1,
            Err(ProtocolError::InvalidMultibulkLength)
        );
        assert_eq!(
            decode_all(b"*abc\r\n").1,
            Err(ProtocolError::InvalidMultibulkLength)
        );
        assert_eq!(
            decode_all(b"*1\r\n$-5\r\n").1,
            Err(ProtocolError::InvalidBulkLength)
        );
        assert_eq!(
            decode_all(b"*1\r\n:5\r\n").1,
            Err(ProtocolError::ExpectedBulk(':'))
        );
        assert_eq!(
            decode_all(b"*1\r\n*1\r\n$1\r\na\r\n").1,
            Err(ProtocolError::ExpectedBulk('*'))
        );
    }

    #[test]
    fn refuses_inline_line_over_limit() {
        let line = vec![b'a'; 70 * 1024];
        assert_eq!(decode_all(&line).1, Err(ProtocolError::InlineTooBig));
    }

    #[test]
    fn fast_and_general_paths_agree() {
        // Long arrays and partial frames take the general path; both give the same arguments.
        let mut frame = b"*9\r\n".to_vec();
        for i in 0..9 {
            frame.extend_from_slice(format!("${}\r\n{}\r\n", i.to_string().len(), i).as_bytes());
        }
        frame.extend_from_slice(b"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n");
        let (cmds, res, rest) = decode_all(&frame);
        assert_eq!(res, Ok(()));
        assert_eq!(rest, 0);
        assert_eq!(cmds[0].len(), 9);
        assert_eq!(cmds[0][8], Bytes::from("8"));
        assert_eq!(cmds[1], vec![Bytes::from("ECHO"), Bytes::new()]);
        // A frame split anywhere decodes to the same command once complete.
        let whole = b"*2\r\n$4\r\nINCR\r\n$11\r\nsegment:abc\r\n";
        for cut in 1..whole.len() {
            let decoder = RequestDecoder::default();
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(decode_owned(&decoder, &mut buf), Ok(None), "cut at {cut}");
            buf.extend_from_slice(&whole[cut..]);
            let args = decode_owned(&decoder, &mut buf).unwrap().unwrap();
            assert_eq!(args, vec![Bytes::from("INCR"), Bytes::from("segment:abc")]);
        }
    }

    #[test]
    fn header_numbers_read_as_str_parse_reads_them() {
        for text in [
            "0",
            "7",
            "-1",
            "+5",
            "123456789",
            "9223372036854775807",
            "-9223372036854775808",
        ] {
            assert_eq!(
                parse_decimal(text.as_bytes()),
                text.parse::<i64>().ok(),
                "{text}"
            );
        }
        for text in ["", "-", "+", "1a", " 1", "9223372036854775808", "--1", "1-"] {
            assert_eq!(parse_decimal(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn skips_empty_requests() {
        let (cmds, res, rest) = decode_all(b"*0\r\n\r\n*-1\r\nPING\r\n");
        assert_eq!(res, Ok(()));
        assert_eq!(cmds, vec![vec![Bytes::from("PING")]]);
        assert_eq!(rest, 0);
    }
}

#[cfg(test)]
mod robustness {
    //! Randomised inputs for the decoder: mutations of valid frames and random bytes, fed in
    //! random chunk sizes. The decoder must never panic, must make progress or ask for more,
    //! and must never leave more than `max_request_len` bytes of an incomplete request buffered.

    use super::*;

    fn valid_frames() -> Vec<Vec<u8>> {
        vec![
            b"*2\r\n$4\r\nINCR\r\n$13\r\nsegment:order\r\n".to_vec(),
            b"*3\r\n$6\r\nINCRBY\r\n$9\r\nsegment:x\r\n$3\r\n100\r\n".to_vec(),
            b"*1\r\n$9\r\nSNOWFLAKE\r\n".to_vec(),
            b"PING\r\n".to_vec(),
            b"*5\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$4\r\nAUTH\r\n$1\r\na\r\n$1\r\nb\r\n".to_vec(),
        ]
    }

    fn mutate(rng: &mut fastrand::Rng, frame: &mut Vec<u8>) {
        for _ in 0..rng.usize(1..4) {
            if frame.is_empty() {
                frame.push(rng.u8(..));
                continue;
            }
            let at = rng.usize(..frame.len());
            match rng.u8(0..5) {
                0 => frame[at] = rng.u8(..),
                1 => frame[at] = *b"*$:+-\r\n0123456789".get(rng.usize(..17)).unwrap(),
                2 => {
                    frame.remove(at);
                }
                3 => frame.insert(at, rng.u8(..)),
                _ => frame.truncate(at),
            }
        }
    }

    #[test]
    fn random_and_mutated_input_never_panics_or_grows_unbounded() {
        let limits = RequestLimits {
            max_request_len: 64 * 1024,
            ..RequestLimits::default()
        };
        let decoder = RequestDecoder::new(limits);
        let mut rng = fastrand::Rng::with_seed(0x1eaf);
        let frames = valid_frames();
        for _ in 0..20_000 {
            let mut input = Vec::new();
            for _ in 0..rng.usize(1..6) {
                let mut frame = if rng.u8(0..10) == 0 {
                    (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect()
                } else {
                    frames[rng.usize(..frames.len())].clone()
                };
                if rng.bool() {
                    mutate(&mut rng, &mut frame);
                }
                input.extend(frame);
            }
            let mut buf = BytesMut::new();
            let mut offset = 0;
            'feed: while offset < input.len() {
                let chunk = rng.usize(1..=16).min(input.len() - offset);
                buf.extend_from_slice(&input[offset..offset + chunk]);
                offset += chunk;
                loop {
                    let before = buf.len();
                    match decode_owned(&decoder, &mut buf) {
                        Ok(Some(args)) => {
                            assert!(!args.is_empty());
                            assert!(buf.len() < before, "a decoded command consumes input");
                        }
                        Ok(None) => {
                            assert!(buf.len() <= limits.max_request_len + 16);
                            break;
                        }
                        Err(_) => break 'feed, // the connection would close here
                    }
                }
            }
        }
    }
}
