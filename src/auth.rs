//! Who a client is: the `default` user of `requirepass` and `[[server.users]]`, checked with a
//! constant-time comparison. RESP (AUTH, HELLO … AUTH) and HTTP (Basic/Bearer) both ask here.

use crate::config::ServerConfig;

/// Reply text (after `-` in RESP, the body of a 401 in HTTP) for a client that has not
/// authenticated, and for wrong credentials, worded as Redis words them.
pub const NOAUTH: &str = "NOAUTH Authentication required.";
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// What an authenticated user may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Fetch IDs and read state.
    User,
    /// Also create tags and change steps (LEAF.TAG, the HTTP tag endpoints).
    Admin,
}

/// Compares secrets in time that depends only on their lengths, not on where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    diff == 0
}

/// Checks a username/password pair. The `default` user's password is `requirepass` (an
/// admin); other users come from `[[server.users]]`. Every configured password is compared,
/// so the time taken does not tell which user exists. `None` when the pair is wrong or no
/// authentication is configured.
pub fn authenticate(server: &ServerConfig, user: &[u8], pass: &[u8]) -> Option<Role> {
    let mut role = None;
    if let Some(expected) = server.requirepass.as_deref() {
        let matches = constant_time_eq(pass, expected.as_bytes());
        if matches && user.eq_ignore_ascii_case(b"default") {
            role = Some(Role::Admin);
        }
    }
    for configured in &server.users {
        let matches = constant_time_eq(pass, configured.password.as_bytes());
        if matches && user == configured.name.as_bytes() {
            role = Some(if configured.admin {
                Role::Admin
            } else {
                Role::User
            });
        }
    }
    role
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ServerConfig, UserConfig};

    #[test]
    fn constant_time_eq_compares_whole_secrets() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn roles_follow_the_configuration() {
        let server = ServerConfig {
            requirepass: Some("rootpw".into()),
            users: vec![
                UserConfig {
                    name: "orders".into(),
                    password: "o-pw".into(),
                    admin: false,
                },
                UserConfig {
                    name: "ops".into(),
                    password: "ops-pw".into(),
                    admin: true,
                },
            ],
            ..ServerConfig::default()
        };
        assert_eq!(
            authenticate(&server, b"default", b"rootpw"),
            Some(Role::Admin)
        );
        assert_eq!(authenticate(&server, b"orders", b"o-pw"), Some(Role::User));
        assert_eq!(authenticate(&server, b"ops", b"ops-pw"), Some(Role::Admin));
        // A password is only good for its own user.
        assert_eq!(authenticate(&server, b"orders", b"ops-pw"), None);
        assert_eq!(authenticate(&server, b"default", b"o-pw"), None);
        assert_eq!(authenticate(&server, b"nobody", b"rootpw"), None);
        assert_eq!(
            authenticate(&ServerConfig::default(), b"default", b""),
            None
        );
    }
}
