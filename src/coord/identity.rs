//! The `ip:port` a node registers as: never a wildcard address, which every node bound to
//! `0.0.0.0` would share, but `advertise` or this host's first non-loopback interface address.

use std::net::{IpAddr, SocketAddr};

use super::CoordError;

/// `advertise` if set (and not a wildcard), else `bind`; a wildcard bind becomes this host's
/// first non-loopback interface address with the bind port, as Leaf does.
pub fn endpoint(advertise: Option<&str>, bind: &str) -> Result<String, CoordError> {
    if let Some(advertise) = advertise {
        if let Ok(addr) = advertise.parse::<SocketAddr>() {
            if addr.ip().is_unspecified() {
                return Err(CoordError::Identity(format!(
                    "snowflake.zookeeper.advertise = \"{advertise}\" is a wildcard address; give this node's own address"
                )));
            }
        }
        return Ok(advertise.to_string());
    }
    let Ok(addr) = bind.parse::<SocketAddr>() else {
        return Ok(bind.to_string()); // a host name: it names this node
    };
    if !addr.ip().is_unspecified() {
        return Ok(bind.to_string());
    }
    let want_v6 = addr.is_ipv6();
    let ip = host_addresses()
        .into_iter()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified() && ip.is_ipv6() == want_v6)
        .find(|ip| !matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        .ok_or_else(|| {
            CoordError::Identity(format!(
                "server.bind {bind} is a wildcard address and this host has no non-loopback {} address; set snowflake.zookeeper.advertise to this node's ip:port",
                if want_v6 { "IPv6" } else { "IPv4" }
            ))
        })?;
    Ok(SocketAddr::new(ip, addr.port()).to_string())
}

/// The addresses of this host's interfaces that are up, in the kernel's order.
fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we only read and then free exactly once.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cursor = head;
        while !cursor.is_null() {
            let entry = &*cursor;
            cursor = entry.ifa_next;
            if entry.ifa_addr.is_null() || entry.ifa_flags & libc::IFF_UP as u32 == 0 {
                continue;
            }
            match i32::from((*entry.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(entry.ifa_addr as *const libc::sockaddr_in);
                    out.push(IpAddr::from(
                        u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    ));
                }
                libc::AF_INET6 => {
                    let sin6 = &*(entry.ifa_addr as *const libc::sockaddr_in6);
                    out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                }
                _ => {}
            }
        }
        libc::freeifaddrs(head);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_bind_never_becomes_the_identity() {
        assert_eq!(
            endpoint(None, "10.1.2.3:6380").unwrap(),
            "10.1.2.3:6380",
            "a concrete bind is kept"
        );
        assert_eq!(
            endpoint(Some("leafd-0.leafd:6380"), "0.0.0.0:6380").unwrap(),
            "leafd-0.leafd:6380"
        );
        let err = endpoint(Some("0.0.0.0:6380"), "0.0.0.0:6380").unwrap_err();
        assert!(err.to_string().contains("wildcard"), "{err}");
        match endpoint(None, "0.0.0.0:6380") {
            Ok(found) => {
                let addr: SocketAddr = found.parse().unwrap();
                assert!(
                    !addr.ip().is_unspecified() && !addr.ip().is_loopback(),
                    "{found}"
                );
                assert_eq!(addr.port(), 6380);
            }
            Err(e) => assert!(e.to_string().contains("advertise"), "{e}"),
        }
    }
}
