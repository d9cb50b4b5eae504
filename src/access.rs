//! Who may talk to leafd without a password: Redis's protected mode (only loopback clients when
//! no password is set) and the admin rule (admin commands only from loopback, unless allowed).

use std::net::{IpAddr, SocketAddr};

use crate::config::Config;

/// The reply to a client refused by protected mode (its first word, `DENIED`, is Redis's).
pub const PROTECTED_MODE_DENIED: &str = "DENIED leafd is running in protected mode because protected mode is enabled and no password is set. In this mode connections are only accepted from the loopback interface. To accept clients from other hosts, either 1) set a password (server.requirepass, or users in [[server.users]]) and have clients AUTH, or 2) set server.protected_mode = false and make sure only trusted clients can reach leafd.";

/// The reply to an admin command from another host when no password is set.
pub const ADMIN_NEEDS_PASSWORD: &str = "NOPERM admin commands from other hosts need a password (server.requirepass, or an admin user in [[server.users]]), or admin.allow_unauthenticated = true";

/// True for 127.0.0.0/8, ::1 and their IPv4-mapped IPv6 forms.
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// True when protected mode refuses `peer`: it is on, no password or user is configured, and
/// the client is not on loopback.
pub fn protected_mode_refuses(config: &Config, peer: SocketAddr) -> bool {
    config.server.protected_mode && !config.server.auth_required() && !is_loopback(peer.ip())
}

/// Whether `peer`, unauthenticated because no password is configured, may run admin commands.
pub fn unauthenticated_admin(config: &Config, peer: SocketAddr) -> bool {
    !config.server.auth_required() && (is_loopback(peer.ip()) || config.admin.allow_unauthenticated)
}

/// True when some listener is on a non-loopback address (a wildcard counts).
pub fn listens_beyond_loopback(binds: &[&str]) -> bool {
    binds.iter().any(|bind| match bind.parse::<SocketAddr>() {
        Ok(addr) => !is_loopback(addr.ip()),
        // A host name: only "localhost" is known to be loopback.
        Err(_) => !bind.is_empty() && !bind.starts_with("localhost:"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_in_every_form() {
        for ip in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.0.0.1", "0.0.0.0", "::", "::ffff:10.0.0.1", "fe80::1"] {
            assert!(!is_loopback(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn protected_mode_and_admin_rules() {
        let mut config = Config::default();
        assert!(protected_mode_refuses(&config, peer("10.1.1.1:5000")));
        assert!(!protected_mode_refuses(&config, peer("127.0.0.1:5000")));
        assert!(unauthenticated_admin(&config, peer("127.0.0.1:5000")));
        assert!(!unauthenticated_admin(&config, peer("10.1.1.1:5000")));
        config.admin.allow_unauthenticated = true;
        assert!(unauthenticated_admin(&config, peer("10.1.1.1:5000")));
        config.server.requirepass = Some("pw".into());
        assert!(!protected_mode_refuses(&config, peer("10.1.1.1:5000")));
        assert!(
            !unauthenticated_admin(&config, peer("127.0.0.1:5000")),
            "with a password: AUTH decides"
        );
        config.server.requirepass = None;
        config.server.protected_mode = false;
        assert!(!protected_mode_refuses(&config, peer("10.1.1.1:5000")));
        assert!(listens_beyond_loopback(&["0.0.0.0:6380"]));
        assert!(listens_beyond_loopback(&["127.0.0.1:6380", "[::]:6381"]));
        assert!(!listens_beyond_loopback(&[
            "127.0.0.1:6380",
            "localhost:9380",
            ""
        ]));
    }
}
