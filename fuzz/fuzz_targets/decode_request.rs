//! Fuzz target: the RESP request decoder (and the command-name lookup) on arbitrary bytes fed
//! in arbitrary chunks. It must not panic, must consume input for every command it returns,
//! and must never keep more than the request limit of an incomplete request buffered.
#![no_main]

use bytes::BytesMut;
use leafd::protocol::{Args, RequestDecoder, RequestLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = RequestLimits {
        max_request_len: 64 * 1024,
        ..RequestLimits::default()
    };
    let decoder = RequestDecoder::new(limits);
    // The first byte chooses the chunk size, so split frames are explored too.
    let (chunk, data) = match data.split_first() {
        Some((c, rest)) => (usize::from(*c % 32) + 1, rest),
        None => return,
    };
    let mut buf = BytesMut::new();
    for piece in data.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            let mut args = Args::default();
            let Ok(used) = decoder.decode(&buf, &mut args) else {
                return;
            };
            assert!(used <= buf.len());
            if args.is_empty() {
                assert!(buf.len() - used <= limits.max_request_len + 64);
                drop(args);
                let _ = buf.split_to(used);
                break;
            }
            assert!(used > 0, "a command consumes input");
            let _ = leafd::cmd::table::lookup(args[0]);
            drop(args);
            let _ = buf.split_to(used);
        }
    }
});
