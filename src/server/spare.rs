//! Spare connection buffers, kept per thread: a connection takes one when data arrives and gives
//! it back once empty, so idle connections hold no buffer and busy ones do not call malloc per request.

use std::cell::RefCell;

use bytes::BytesMut;

/// The size a buffer is made with: one socket read's worth.
pub(crate) const BUFFER_SIZE: usize = 4096;

/// Buffers kept per thread at most, and the largest kept (a long pipeline grows its buffers;
/// those go back to the allocator).
const KEPT: usize = 64;
const LARGEST_KEPT: usize = 64 * 1024;

thread_local! {
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for at least [`BUFFER_SIZE`] bytes.
pub(crate) fn take() -> BytesMut {
    SPARE
        .with(|spare| spare.borrow_mut().pop())
        .unwrap_or_else(|| BytesMut::with_capacity(BUFFER_SIZE))
}

/// Gives `buffer` back for this thread's next [`take`], if it is worth keeping; leaves an
/// empty, unallocated buffer in its place.
pub(crate) fn give_back(buffer: &mut BytesMut) {
    if buffer.capacity() == 0 {
        return;
    }
    let mut buffer = std::mem::take(buffer);
    buffer.clear();
    // `reserve` reclaims the room before an advanced start, so this is the whole allocation.
    buffer.reserve(BUFFER_SIZE);
    if buffer.capacity() > LARGEST_KEPT {
        return;
    }
    SPARE.with(|spare| {
        let mut spare = spare.borrow_mut();
        if spare.len() < KEPT {
            spare.push(buffer);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_and_huge_ones_are_not_kept() {
        let mut buffer = take();
        assert!(buffer.capacity() >= BUFFER_SIZE);
        buffer.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        let address = buffer.as_ptr();
        let _ = buffer.split_to(4);
        give_back(&mut buffer);
        assert_eq!(buffer.capacity(), 0, "nothing stays with the connection");
        let again = take();
        assert!(again.is_empty() && again.capacity() >= BUFFER_SIZE);
        assert_eq!(
            again.as_ptr(),
            address,
            "the same allocation, its start reclaimed"
        );
        let mut huge = BytesMut::with_capacity(LARGEST_KEPT * 2);
        give_back(&mut huge);
        assert_ne!(take().capacity(), LARGEST_KEPT * 2);
    }
}
