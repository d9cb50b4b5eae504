//! Connection commands that Redis clients send during their handshake and health checks:
//! PING, HELLO, AUTH, CLIENT …, SELECT, RESET (ECHO and QUIT are one-liners in the dispatcher).

use std::sync::Arc;

use bytes::Bytes;

use super::{lossy, not_an_integer, parse_i64, wrong_arity, Session};
use crate::auth::{self, Role};
use crate::context::Context;
use crate::protocol::{Reply, RespVersion};

/// The Redis version leafd reports, so clients enable the RESP3/HELLO features it implements.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

pub fn ping(args: &[&[u8]], _session: &Session) -> Reply {
    match args.len() {
        1 => Reply::Simple("PONG".into()),
        2 => Reply::Bulk(Bytes::copy_from_slice(args[1])),
        _ => wrong_arity("ping"),
    }
}

/// Checks a username/password pair and returns whether the user is an admin.
fn check_credentials(ctx: &Context, user: &[u8], pass: &[u8]) -> Result<bool, Reply> {
    let server = &ctx.config.server;
    if !server.auth_required() {
        return Err(Reply::error(
            "ERR AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        ));
    }
    match auth::authenticate(server, user, pass) {
        Some(role) => Ok(role == Role::Admin),
        None => Err(Reply::error(auth::WRONGPASS)),
    }
}

/// `AUTH <password>` or `AUTH <username> <password>`.
pub fn auth(args: &[&[u8]], ctx: &Arc<Context>, session: &mut Session) -> Reply {
    let result = match args.len() {
        2 => check_credentials(ctx, b"default", args[1]),
        3 => check_credentials(ctx, args[1], args[2]),
        _ => return wrong_arity("auth"),
    };
    match result {
        Ok(admin) => {
            session.authenticated = true;
            session.admin = admin;
            Reply::ok()
        }
        Err(reply) => reply,
    }
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`.
pub fn hello(args: &[&[u8]], ctx: &Arc<Context>, session: &mut Session) -> Reply {
    let mut protocol = session.protocol;
    if let Some(version) = args.get(1) {
        protocol = match parse_i64(version) {
            Ok(2) => RespVersion::Resp2,
            Ok(3) => RespVersion::Resp3,
            Ok(_) => return Reply::error("NOPROTO unsupported protocol version"),
            Err(_) => {
                return Reply::error("ERR Protocol version is not an integer or out of range")
            }
        };
    }
    let mut name = None;
    let mut i = 2;
    while i < args.len() {
        let option = &args[i];
        if option.eq_ignore_ascii_case(b"auth") && i + 2 < args.len() {
            match check_credentials(ctx, args[i + 1], args[i + 2]) {
                Ok(admin) => session.admin = admin,
                Err(reply) => return reply,
            }
            session.authenticated = true;
            i += 3;
        } else if option.eq_ignore_ascii_case(b"setname") && i + 1 < args.len() {
            if let Err(reply) = validate_client_name(args[i + 1]) {
                return reply;
            }
            name = Some(Bytes::copy_from_slice(args[i + 1]));
            i += 2;
        } else {
            return Reply::error(format!(
                "ERR Syntax error in HELLO option '{}'",
                lossy(option)
            ));
        }
    }
    if !session.authenticated {
        return Reply::error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time",
        );
    }
    if name.is_some() {
        session.name = name;
    }
    session.protocol = protocol;
    Reply::map([
        ("server", Reply::bulk("redis")),
        ("version", Reply::bulk(REDIS_COMPAT_VERSION)),
        ("proto", Reply::Integer(protocol.number())),
        ("id", Reply::Integer(session.id as i64)),
        ("mode", Reply::bulk("standalone")),
        ("role", Reply::bulk("master")),
        ("modules", Reply::Array(Vec::new())),
    ])
}

fn validate_client_name(name: &[u8]) -> Result<(), Reply> {
    if name.iter().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(Reply::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ))
    }
}

/// One line describing the connection, in the format of Redis's CLIENT INFO.
fn client_info_line(session: &Session) -> String {
    let text = |v: &Option<Bytes>| v.as_deref().map(lossy).unwrap_or_default();
    format!(
        "id={} addr={} name={} age={} db=0 resp={} lib-name={} lib-ver={}\n",
        session.id,
        session.addr,
        text(&session.name),
        session.created.elapsed().as_secs(),
        session.protocol.number(),
        text(&session.lib_name),
        text(&session.lib_ver),
    )
}

/// `CLIENT ID | SETNAME | GETNAME | SETINFO | INFO | LIST | NO-EVICT | NO-TOUCH | HELP`.
pub fn client(args: &[&[u8]], session: &mut Session) -> Reply {
    let sub = args[1].to_ascii_lowercase();
    match (sub.as_slice(), args.len()) {
        (b"id", 2) => Reply::Integer(session.id as i64),
        (b"getname", 2) => session.name.clone().map(Reply::Bulk).unwrap_or(Reply::Null),
        (b"setname", 3) => match validate_client_name(args[2]) {
            Ok(()) => {
                session.name = (!args[2].is_empty()).then(|| Bytes::copy_from_slice(args[2]));
                Reply::ok()
            }
            Err(reply) => reply,
        },
        (b"setinfo", 4) => {
            let attr = args[2].to_ascii_lowercase();
            match attr.as_slice() {
                b"lib-name" => session.lib_name = Some(Bytes::copy_from_slice(args[3])),
                b"lib-ver" => session.lib_ver = Some(Bytes::copy_from_slice(args[3])),
                _ => return Reply::error(format!("ERR Unrecognized option '{}'", lossy(args[2]))),
            }
            Reply::ok()
        }
        (b"info", 2) => Reply::Verbatim(client_info_line(session)),
        (b"list", _) => Reply::Verbatim(client_info_line(session)),
        (b"no-evict" | b"no-touch", 3) => Reply::ok(),
        (b"tracking", n) if n >= 3 => tracking(&args[2..]),
        (b"caching", 3) => Reply::error(
            "ERR leafd replies are never cacheable: every INCR, SNOWFLAKE or GET snowflake is a new ID (use Do, not DoCache)",
        ),
        (b"help", 2) => Reply::Array(
            [
                "CLIENT <subcommand> [<arg> ...]. Subcommands are:",
                "ID, GETNAME, SETNAME <name>, SETINFO <LIB-NAME|LIB-VER> <value>,",
                "INFO, LIST, NO-EVICT <ON|OFF>, NO-TOUCH <ON|OFF>,",
                "TRACKING <ON OPTIN|OFF> (no reply is ever cached), HELP",
            ]
            .into_iter()
            .map(|l| Reply::Simple(l.into()))
            .collect(),
        ),
        (
            b"id" | b"getname" | b"setname" | b"setinfo" | b"info" | b"no-evict" | b"no-touch"
            | b"help" | b"tracking" | b"caching",
            _,
        ) => wrong_arity(&format!("client|{}", String::from_utf8_lossy(&sub))),
        _ => Reply::error(format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            lossy(args[1])
        )),
    }
}

/// `CLIENT TRACKING ON OPTIN …` is accepted (rueidis sends it in its default handshake): in
/// OPTIN mode nothing is tracked until `CLIENT CACHING YES`, which leafd refuses, so no ID can
/// ever be served from a client's cache. Tracking without OPTIN would let a client cache
/// `GET snowflake` and hand out one ID many times: refused. `OFF` is accepted.
fn tracking(args: &[&[u8]]) -> Reply {
    let on = args[0].eq_ignore_ascii_case(b"on");
    if args[0].eq_ignore_ascii_case(b"off") {
        return Reply::ok();
    }
    if !on {
        return Reply::error("ERR syntax error");
    }
    if args[1..].iter().any(|a| a.eq_ignore_ascii_case(b"optin")) {
        return Reply::ok();
    }
    Reply::error(
        "ERR leafd supports CLIENT TRACKING only in OPTIN mode: its replies are new IDs and must never be served from a client-side cache",
    )
}

/// `SELECT 0`: leafd has one logical database.
pub fn select(args: &[&[u8]]) -> Reply {
    match parse_i64(args[1]) {
        Ok(0) => Reply::ok(),
        Ok(_) => Reply::error("ERR DB index is out of range"),
        Err(_) => not_an_integer(),
    }
}

/// `RESET`: back to RESP2, no name, and unauthenticated when a password is set.
pub fn reset(ctx: &Arc<Context>, session: &mut Session) -> Reply {
    session.protocol = RespVersion::Resp2;
    session.name = None;
    session.authenticated = !ctx.config.server.auth_required();
    session.admin = session.authenticated && session.admin_without_auth;
    session.transaction = None;
    Reply::Simple("RESET".into())
}
