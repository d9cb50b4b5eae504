//! Opaque segment IDs: a keyed permutation of a tag's sequential IDs onto the numbers of a
//! fixed count of decimal digits, so an ID reveals neither how many came before nor their order.
//!
//! The permutation is a balanced Feistel network over the smallest even number of bits that
//! holds the domain, with HMAC-SHA256 as the round function, and cycle-walking (re-applying the
//! network until the value falls inside the domain) to make it a bijection of the domain
//! itself. Being a bijection, distinct sequential IDs give distinct opaque IDs.

use ring::hmac;

/// Feistel rounds: as many as NIST's FF1 uses, well past the four Luby–Rackoff needs.
const ROUNDS: u8 = 10;
pub use crate::storage::{
    opaque_digits as marker_digits, OPAQUE_MAX_DIGITS as MAX_DIGITS,
    OPAQUE_MIN_DIGITS as MIN_DIGITS,
};

/// The permutation of one tag under one key.
pub struct OpaqueCipher {
    key: hmac::Key,
    /// Opaque IDs are `first ..= first + size - 1`: every number of exactly `digits` digits.
    first: u64,
    size: u64,
    half_bits: u32,
    /// Names the key, the tag and the digit count without revealing the key (stored in the
    /// database so that a key change is noticed before it can repeat an ID).
    marker: String,
}

impl std::fmt::Debug for OpaqueCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpaqueCipher")
            .field("marker", &self.marker)
            .finish()
    }
}

impl OpaqueCipher {
    /// The permutation of `tag` under `secret`, onto the IDs of `digits` decimal digits
    /// (`MIN_DIGITS ..= MAX_DIGITS`, checked by the configuration).
    pub fn new(secret: &[u8], tag: &str, digits: u32) -> OpaqueCipher {
        assert!((MIN_DIGITS..=MAX_DIGITS).contains(&digits));
        // One key per tag, so two tags under one secret permute differently.
        let master = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let mut context = hmac::Context::with_key(&master);
        context.update(b"leafd opaque segment ids v1\0");
        context.update(tag.as_bytes());
        let key = hmac::Key::new(hmac::HMAC_SHA256, context.sign().as_ref());
        let first = 10u64.pow(digits - 1);
        let size = 9 * first;
        let bits = 64 - (size - 1).leading_zeros();
        let half_bits = bits.div_ceil(2);
        let fingerprint = hmac::sign(&key, b"fingerprint");
        let marker = format!(
            "d{digits}:{}",
            fingerprint.as_ref()[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        OpaqueCipher {
            key,
            first,
            size,
            half_bits,
            marker,
        }
    }

    /// What the database records for a tag served under this key (`d<digits>:<fingerprint>`).
    pub fn marker(&self) -> &str {
        &self.marker
    }

    /// The smallest opaque ID (10^(digits − 1)): plain IDs below it can never meet one.
    pub fn first_id(&self) -> i64 {
        self.first as i64
    }

    /// Sequential IDs from 0 up to (not including) this have an opaque ID; the tag can serve
    /// no more.
    pub fn capacity(&self) -> i64 {
        self.size as i64
    }

    /// The opaque ID of sequential ID `position`; `None` past the capacity.
    pub fn encode(&self, position: i64) -> Option<i64> {
        let position = u64::try_from(position).ok().filter(|&p| p < self.size)?;
        let mut x = position;
        loop {
            x = self.rounds(x, false);
            if x < self.size {
                return Some((self.first + x) as i64);
            }
        }
    }

    /// The sequential ID behind an opaque ID; `None` for a number this tag never hands out.
    pub fn decode(&self, id: i64) -> Option<i64> {
        let x = u64::try_from(id).ok()?.checked_sub(self.first)?;
        if x >= self.size {
            return None;
        }
        let mut y = x;
        loop {
            y = self.rounds(y, true);
            if y < self.size {
                return Some(y as i64);
            }
        }
    }

    /// The whole network forwards, or backwards to invert it.
    fn rounds(&self, x: u64, inverse: bool) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        if inverse {
            for round in (0..ROUNDS).rev() {
                (left, right) = (right ^ (self.round(round, left) & mask), left);
            }
        } else {
            for round in 0..ROUNDS {
                (left, right) = (right, left ^ (self.round(round, right) & mask));
            }
        }
        (left << self.half_bits) | right
    }

    fn round(&self, round: u8, half: u64) -> u64 {
        let mut input = [0u8; 9];
        input[0] = round;
        input[1..].copy_from_slice(&half.to_le_bytes());
        let tag = hmac::sign(&self.key, &input);
        u64::from_le_bytes(tag.as_ref()[..8].try_into().expect("SHA-256 has 32 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_digits_are_a_bijection_onto_every_four_digit_number() {
        let cipher = OpaqueCipher::new(b"a secret of sixteen+ bytes", "order", 4);
        assert_eq!((cipher.first_id(), cipher.capacity()), (1000, 9000));
        let mut seen = vec![false; 9000];
        for position in 0..9000 {
            let id = cipher.encode(position).unwrap();
            assert!((1000..=9999).contains(&id), "{id}");
            let slot = &mut seen[(id - 1000) as usize];
            assert!(!*slot, "{id} twice");
            *slot = true;
            assert_eq!(cipher.decode(id), Some(position));
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(cipher.encode(9000), None);
        assert_eq!(cipher.encode(-1), None);
        assert_eq!(cipher.decode(999), None);
        assert_eq!(cipher.decode(10_000), None);
    }

    #[test]
    fn the_order_is_hidden_and_depends_on_key_and_tag() {
        let a = OpaqueCipher::new(b"a secret of sixteen+ bytes", "order", 10);
        let ids: Vec<i64> = (1..=1000).map(|p| a.encode(p).unwrap()).collect();
        let rising = ids.windows(2).filter(|w| w[1] > w[0]).count();
        assert!((400..=600).contains(&rising), "{rising} of 999 rise");
        assert!(ids
            .iter()
            .all(|id| (1_000_000_000..10_000_000_000).contains(id)));
        let other_key = OpaqueCipher::new(b"another secret of 16+ bytes", "order", 10);
        let other_tag = OpaqueCipher::new(b"a secret of sixteen+ bytes", "payment", 10);
        assert_ne!(a.marker(), other_key.marker());
        assert_ne!(a.marker(), other_tag.marker());
        let differ = (1..=100)
            .filter(|&p| a.encode(p) != other_key.encode(p))
            .count();
        assert!(differ > 95);
        // Deterministic: the same key and tag give the same IDs on every node.
        let again = OpaqueCipher::new(b"a secret of sixteen+ bytes", "order", 10);
        assert_eq!(again.encode(12_345), a.encode(12_345));
        assert_eq!(a.decode(a.encode(12_345).unwrap()), Some(12_345));
        assert!(a.marker().starts_with("d10:") && a.marker().len() == 20);
        assert_eq!(marker_digits(a.marker()), Some(10));
        assert_eq!(marker_digits("x10:ab"), None);
    }

    #[test]
    fn eighteen_digits_stay_inside_i64() {
        let cipher = OpaqueCipher::new(b"a secret of sixteen+ bytes", "big", 18);
        let last = cipher.capacity() - 1;
        for position in [0, 1, last - 1, last] {
            let id = cipher.encode(position).unwrap();
            assert!((10i64.pow(17)..10i64.pow(18)).contains(&id));
            assert_eq!(cipher.decode(id), Some(position));
        }
        assert_eq!(cipher.encode(last + 1), None);
    }
}
