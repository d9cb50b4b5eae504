//! Connection commands that Redis clients send during their handshake and health checks:
//! PING, HELLO, AUTH, CLIENT …, SELECT, RESET (ECHO and QUIT are one-liners in the dispatcher).

use std::sync::Arc;

use bytes::Bytes;

use super::{lossy, not_an_integer, parse_i64, wrong_arity, Session};
use crate::auth::{self, Role};
use crate::context::{ClientLine, Context};
use crate::protocol::{ArgCursor, Reply, RespVersion};

/// The Redis version leafd reports, so clients enable the RESP3/HELLO features it implements.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

pub fn ping(args: &[&[u8]], _session: &Session) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let message = cursor.optional();
    if cursor.finish().is_err() {
        return wrong_arity("ping");
    }
    match message {
        None => Reply::Simple("PONG".into()),
        Some(message) => Reply::Bulk(Bytes::copy_from_slice(message)),
    }
}

/// Checks a username/password pair and returns whether the user is an admin. With no password
/// configured every client is the `default` user already, as on redis-server 7: `AUTH default
/// <anything>` succeeds, another user name is a wrong password.
fn check_credentials(ctx: &Context, user: &[u8], pass: &[u8]) -> Result<bool, Reply> {
    let server = &ctx.config.server;
    if !server.auth_required() {
        return if user == b"default" {
            Ok(false)
        } else {
            Err(Reply::error(auth::WRONGPASS))
        };
    }
    match auth::authenticate(server, user, pass) {
        Some(role) => Ok(role == Role::Admin),
        None => Err(Reply::error(auth::WRONGPASS)),
    }
}

/// `AUTH <password>` or `AUTH <username> <password>`.
pub fn auth(args: &[&[u8]], ctx: &Arc<Context>, session: &mut Session) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let (first, second) = (cursor.optional(), cursor.optional());
    let result = match (first, second, cursor.finish()) {
        (Some(_), None, Ok(())) if !ctx.config.server.auth_required() => Err(Reply::error(
            "ERR AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        )),
        (Some(password), None, Ok(())) => check_credentials(ctx, b"default", password),
        (Some(user), Some(password), Ok(())) => check_credentials(ctx, user, password),
        _ => return wrong_arity("auth"),
    };
    match result {
        Ok(admin) => {
            session.authenticated = true;
            session.admin = admin || (session.admin && !ctx.config.server.auth_required());
            Reply::ok()
        }
        Err(reply) => reply,
    }
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`.
pub fn hello(args: &[&[u8]], ctx: &Arc<Context>, session: &mut Session) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let mut protocol = session.protocol;
    if let Some(version) = cursor.optional() {
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
    let mut admin = None;
    while let Some(option) = cursor.optional() {
        let syntax_error = || {
            Reply::error(format!(
                "ERR Syntax error in HELLO option '{}'",
                lossy(option)
            ))
        };
        if option.eq_ignore_ascii_case(b"auth") && cursor.remaining() >= 2 {
            let (user, password) = (cursor.optional(), cursor.optional());
            match check_credentials(ctx, user.unwrap_or_default(), password.unwrap_or_default()) {
                Ok(is_admin) => admin = Some(is_admin),
                Err(reply) => return reply,
            }
        } else if option.eq_ignore_ascii_case(b"setname") && cursor.remaining() >= 1 {
            let given = cursor.optional().unwrap_or_default();
            if let Err(reply) = validate_client_name(given) {
                return reply;
            }
            name = Some(Bytes::copy_from_slice(given));
        } else {
            return syntax_error();
        }
    }
    if let Some(is_admin) = admin {
        session.authenticated = true;
        session.admin = is_admin || (session.admin && !ctx.config.server.auth_required());
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

/// What CLIENT LIST shows of this session.
pub fn client_line(session: &Session) -> ClientLine {
    let text = |v: &Option<Bytes>| v.as_deref().map(lossy).unwrap_or_default();
    ClientLine {
        id: session.id,
        addr: session.addr.clone(),
        name: text(&session.name),
        created: session.created,
        resp: session.protocol.number(),
        lib_name: text(&session.lib_name),
        lib_ver: text(&session.lib_ver),
    }
}

/// One line describing a connection, in the format of Redis's CLIENT INFO.
fn client_info_line(line: &ClientLine) -> String {
    format!(
        "id={} addr={} name={} age={} db=0 resp={} lib-name={} lib-ver={}\n",
        line.id,
        line.addr,
        line.name,
        line.created.elapsed().as_secs(),
        line.resp,
        line.lib_name,
        line.lib_ver,
    )
}

/// `CLIENT ID | SETNAME | GETNAME | SETINFO | INFO | LIST | NO-EVICT | NO-TOUCH | HELP`.
pub fn client(args: &[&[u8]], ctx: &Context, session: &mut Session) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let Ok(sub) = cursor.next_keyword() else {
        return wrong_arity("client");
    };
    // The subcommand fixes how many arguments follow: a wrong count is reported as such.
    let arity_error = || wrong_arity(&format!("client|{}", String::from_utf8_lossy(&sub)));
    let expected = match sub.as_slice() {
        b"id" | b"getname" | b"info" | b"help" => Some(0),
        b"setname" | b"no-evict" | b"no-touch" | b"caching" => Some(1),
        b"setinfo" => Some(2),
        b"tracking" if cursor.remaining() >= 1 => None,
        b"tracking" => return arity_error(),
        b"list" => None,
        _ => {
            return Reply::error(format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                lossy(args[1])
            ))
        }
    };
    if expected.is_some_and(|n| n != cursor.remaining()) {
        return arity_error();
    }
    match sub.as_slice() {
        b"id" => Reply::Integer(session.id as i64),
        b"getname" => session.name.clone().map(Reply::Bulk).unwrap_or(Reply::Null),
        b"setname" => {
            let name = cursor.optional().unwrap_or_default();
            match validate_client_name(name) {
                Ok(()) => {
                    session.name = (!name.is_empty()).then(|| Bytes::copy_from_slice(name));
                    Reply::ok()
                }
                Err(reply) => reply,
            }
        }
        b"setinfo" => {
            let (attr, value) = (
                cursor.optional().unwrap_or_default(),
                cursor.optional().unwrap_or_default(),
            );
            match attr.to_ascii_lowercase().as_slice() {
                b"lib-name" => session.lib_name = Some(Bytes::copy_from_slice(value)),
                b"lib-ver" => session.lib_ver = Some(Bytes::copy_from_slice(value)),
                _ => return Reply::error(format!("ERR Unrecognized option '{}'", lossy(attr))),
            }
            Reply::ok()
        }
        b"info" => Reply::Verbatim(client_info_line(&client_line(session))),
        // Every client; this one as it is now (the registry is updated after this command).
        b"list" => Reply::Verbatim(
            ctx.clients
                .lines()
                .into_iter()
                .map(|line| match line.id == session.id {
                    true => client_info_line(&client_line(session)),
                    false => client_info_line(&line),
                })
                .collect(),
        ),
        b"no-evict" | b"no-touch" => Reply::ok(),
        b"tracking" => tracking(cursor.rest()),
        b"caching" => Reply::error(
            "ERR leafd replies are never cacheable: every INCR, SNOWFLAKE or GET snowflake is a new ID (use Do, not DoCache)",
        ),
        _ => Reply::Array(
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
    }
}

/// `CLIENT TRACKING ON OPTIN …` is accepted (rueidis sends it in its default handshake): in
/// OPTIN mode nothing is tracked until `CLIENT CACHING YES`, which leafd refuses, so no ID can
/// ever be served from a client's cache. Tracking without OPTIN would let a client cache
/// `GET snowflake` and hand out one ID many times: refused. `OFF` is accepted.
fn tracking(args: &[&[u8]]) -> Reply {
    let Some((mode, options)) = args.split_first() else {
        return Reply::error("ERR syntax error");
    };
    if mode.eq_ignore_ascii_case(b"off") {
        return Reply::ok();
    }
    if !mode.eq_ignore_ascii_case(b"on") {
        return Reply::error("ERR syntax error");
    }
    if options.iter().any(|a| a.eq_ignore_ascii_case(b"optin")) {
        return Reply::ok();
    }
    Reply::error(
        "ERR leafd supports CLIENT TRACKING only in OPTIN mode: its replies are new IDs and must never be served from a client-side cache",
    )
}

/// `SELECT 0`: leafd has one logical database.
pub fn select(args: &[&[u8]]) -> Reply {
    let mut cursor = ArgCursor::new(args);
    let index = cursor.next_i64();
    if cursor.finish().is_err() {
        return wrong_arity("select");
    }
    match index {
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
