//! Redis-style glob patterns (`*`, `?`, `[...]`, `[^...]`, `\`), in time proportional to
//! pattern × text: no backtracking beyond the last `*` (CVE-2022-36021).

/// One pattern element; every element but `Star` matches exactly one byte.
#[derive(Debug, PartialEq, Eq)]
enum Token {
    Star,
    Any,
    Byte(u8),
    /// `[...]`: inclusive byte ranges (a single byte is a range of one), maybe negated.
    Class {
        negated: bool,
        ranges: Vec<(u8, u8)>,
    },
}

/// A compiled pattern.
#[derive(Debug)]
pub struct Glob {
    tokens: Vec<Token>,
    /// ASCII case-insensitive, as Redis matches `CONFIG GET` patterns (KEYS and SCAN match
    /// case-sensitively: [`Glob::case_sensitive`]).
    fold: bool,
}

impl Glob {
    /// Compiles `pattern`, ASCII case-insensitive (as Redis's `CONFIG GET`).
    pub fn new(pattern: &[u8]) -> Glob {
        Glob {
            fold: true,
            ..Glob::case_sensitive(pattern)
        }
    }

    /// Compiles `pattern` to match bytes exactly, as Redis's `KEYS` does: `ac-*` does not match
    /// `AC-x` (`segment.auto_create_pattern`).
    pub fn case_sensitive(pattern: &[u8]) -> Glob {
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < pattern.len() {
            match pattern[i] {
                b'*' => {
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                }
                b'?' => tokens.push(Token::Any),
                b'\\' if i + 1 < pattern.len() => {
                    i += 1;
                    tokens.push(Token::Byte(pattern[i]));
                }
                b'[' => {
                    i += 1;
                    let negated = pattern.get(i) == Some(&b'^');
                    if negated {
                        i += 1;
                    }
                    let mut ranges = Vec::new();
                    // As Redis: an unterminated class runs to the end of the pattern.
                    while i < pattern.len() && pattern[i] != b']' {
                        let mut low = pattern[i];
                        if low == b'\\' && i + 1 < pattern.len() {
                            i += 1;
                            low = pattern[i];
                        }
                        if pattern.get(i + 1) == Some(&b'-') && i + 2 < pattern.len() {
                            let high = pattern[i + 2];
                            ranges.push((low.min(high), low.max(high)));
                            i += 3;
                        } else {
                            ranges.push((low, low));
                            i += 1;
                        }
                    }
                    tokens.push(Token::Class { negated, ranges });
                }
                byte => tokens.push(Token::Byte(byte)),
            }
            i += 1;
        }
        Glob {
            tokens,
            fold: false,
        }
    }

    /// True when the whole of `text` matches.
    pub fn matches(&self, text: &[u8]) -> bool {
        let (mut t, mut p) = (0, 0);
        // Where to resume after the last star: its token index and the text position it
        // currently swallows up to. Earlier stars never need revisiting, which keeps this
        // O(pattern × text) instead of exponential.
        let mut resume: Option<(usize, usize)> = None;
        while t < text.len() {
            match self.tokens.get(p) {
                Some(Token::Star) => {
                    resume = Some((p, t));
                    p += 1;
                }
                Some(token) if one_matches(token, text[t], self.fold) => {
                    p += 1;
                    t += 1;
                }
                _ => match resume {
                    Some((star, swallowed)) => {
                        p = star + 1;
                        t = swallowed + 1;
                        resume = Some((star, t));
                    }
                    None => return false,
                },
            }
        }
        self.tokens[p..].iter().all(|token| *token == Token::Star)
    }
}

fn one_matches(token: &Token, byte: u8, fold: bool) -> bool {
    let lower = |b: u8| if fold { b.to_ascii_lowercase() } else { b };
    let byte = lower(byte);
    match token {
        Token::Star => false,
        Token::Any => true,
        Token::Byte(b) => lower(*b) == byte,
        Token::Class { negated, ranges } => {
            let inside = ranges.iter().any(|&(low, high)| {
                (lower(low)..=lower(high)).contains(&byte) || (low..=high).contains(&byte)
            });
            inside != *negated
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::Glob;

    fn m(pattern: &str, text: &str) -> bool {
        Glob::new(pattern.as_bytes()).matches(text.as_bytes())
    }

    #[test]
    fn case_sensitive_patterns_match_bytes_exactly() {
        let exact = |pattern: &str, text: &str| {
            Glob::case_sensitive(pattern.as_bytes()).matches(text.as_bytes())
        };
        assert!(exact("ac-*", "ac-case"));
        assert!(!exact("ac-*", "AC-case"));
        assert!(!exact("[a-c]x", "Bx"));
        assert!(m("ac-*", "AC-case"), "CONFIG GET folds case, as Redis");
    }

    #[test]
    fn matches_like_redis() {
        assert!(m("*", "maxclients"));
        assert!(m("*", ""));
        assert!(m("max*", "maxclients"));
        assert!(m("MAXCLIENTS", "maxclients"));
        assert!(m("t?meout", "timeout"));
        assert!(!m("max", "maxclients"));
        assert!(!m("*x", "maxclients"));
        assert!(m("*s", "maxclients"));
        assert!(m("m*c*s", "maxclients"));
        assert!(!m("m*c*z", "maxclients"));
        assert!(m("[bt]ind", "bind"));
        assert!(m("[a-c]ind", "bind"));
        assert!(
            m("[c-a]ind", "bind"),
            "a reversed range is swapped, as Redis"
        );
        assert!(!m("[^b]ind", "bind"));
        assert!(m("[^x]ind", "bind"));
        assert!(m("tls\\-port", "tls-port"));
        assert!(m("tls[\\-]port", "tls-port"));
        assert!(m("\\*", "*"));
        assert!(!m("\\*", "x"));
        assert!(m("bin[d", "bind"), "an unterminated class runs to the end");
        assert!(!m("?", ""));
        assert!(m("a*b*c*", "abc"));
    }

    #[test]
    fn hostile_patterns_take_microseconds() {
        for stars in [14usize, 30, 10_000] {
            let pattern = format!("{}x", "*".repeat(stars));
            let alternating = "a*".repeat(stars) + "x";
            let started = Instant::now();
            for _ in 0..100 {
                assert!(!Glob::new(pattern.as_bytes()).matches(b"proto-max-bulk-len"));
                assert!(!Glob::new(alternating.as_bytes()).matches(b"aaaaaaaaaaaaaaaaaaaaaaaa"));
            }
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "{stars} stars: {:?}",
                started.elapsed()
            );
        }
    }
}
