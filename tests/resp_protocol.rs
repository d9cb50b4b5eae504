//! The RESP surface: exact error replies for bad input, connection survival after each,
//! protocol errors that close, HELLO/RESP3, AUTH, and the max-clients limit.

mod common;

use std::sync::Arc;

use common::{resp, TestServer};
use leafd::config::Config;
use leafd::storage::MemoryStore;

async fn memory_server(config: Config) -> TestServer {
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"LEAF.TAG", b"CREATE", b"order", b"100"]), 1)
            .await,
        "+OK\r\n"
    );
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commands_get_errors_and_the_connection_stays_usable() {
    let server = memory_server(Config::default()).await;
    let mut raw = server.raw().await;
    let cases: &[(&[&[u8]], &str)] = &[
        (&[b"FLUSHALL", b"x"], "-ERR unknown command 'FLUSHALL', with args beginning with: 'x' \r\n"),
        (&[b"INCR"], "-ERR wrong number of arguments for 'incr' command\r\n"),
        (&[b"INCR", b"segment:order", b"x"], "-ERR wrong number of arguments for 'incr' command\r\n"),
        (&[b"INCRBY", b"segment:order", b"abc"], "-ERR value is not an integer or out of range\r\n"),
        (&[b"INCRBY", b"segment:order", b"0"], "-ERR increment must be positive\r\n"),
        (&[b"INCRBY", b"segment:order", b"-5"], "-ERR increment must be positive\r\n"),
        (&[b"INCRBY", b"segment:order", b"100001"], "-ERR increment exceeds the maximum of 100000\r\n"),
        (&[b"INCR", b"segment:missing"], "-ERR unknown tag 'missing'\r\n"),
        (&[b"INCR", b"segment:\xff\xfe"], "-ERR unknown tag '\u{fffd}\u{fffd}'\r\n"),
        (&[b"INCR", b"counter"], "-ERR unsupported key 'counter': use segment:<tag> or snowflake\r\n"),
        (&[b"SELECT", b"1"], "-ERR DB index is out of range\r\n"),
        (&[b"LEAF.TAG", b"CREATE", b"order", b"10"], "-ERR tag 'order' already exists\r\n"),
        (&[b"LEAF.TAG", b"CREATE", b"new", b"0"], "-ERR step must be between 1 and 1000000\r\n"),
        (&[b"LEAF.TAG", b"STEP", b"missing", b"10"], "-ERR unknown tag 'missing'\r\n"),
        (&[b"CONFIG", b"SET", b"maxclients", b"1"], "-ERR CONFIG SET is not supported by leafd; edit leafd.toml instead\r\n"),
        (&[b"AUTH", b"pw"], "-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n"),
        (&[b"HELLO", b"4"], "-NOPROTO unsupported protocol version\r\n"),
        // With no password every client is the default user already, as on redis-server 7.
        (&[b"AUTH", b"default", b"anything"], "+OK\r\n"),
        (&[b"AUTH", b"someone", b"pw"], "-WRONGPASS invalid username-password pair or user is disabled.\r\n"),
        (&[b"CLIENT", b"SETINFO", b"lib-name"], "-ERR wrong number of arguments for 'client|setinfo' command\r\n"),
        (&[b"CLIENT", b"NOPE"], "-ERR unknown subcommand 'NOPE'. Try CLIENT HELP.\r\n"),
        (&[b"CLIENT", b"TRACKING", b"ON"], "-ERR leafd supports CLIENT TRACKING only in OPTIN mode: its replies are new IDs and must never be served from a client-side cache\r\n"),
        (&[b"HELLO", b"3", b"SETNAME"], "-ERR Syntax error in HELLO option 'SETNAME'\r\n"),
        (&[b"COMMAND", b"NOPE"], "-ERR unknown subcommand 'NOPE'. Try COMMAND HELP.\r\n"),
        (&[b"COMMAND", b"HELP", b"x"], "-ERR wrong number of arguments for 'command' command\r\n"),
        (&[b"CONFIG", b"GET"], "-ERR wrong number of arguments for 'config|get' command\r\n"),
    ];
    for (command, expected) in cases {
        assert_eq!(&raw.send(&resp(command), 1).await, expected, "{command:?}");
        assert_eq!(
            raw.send(b"PING\r\n", 1).await,
            "+PONG\r\n",
            "after {command:?}"
        );
    }
    let help = raw.send(&resp(&[b"COMMAND", b"HELP"]), 4).await;
    assert!(
        help.starts_with("*3\r\n+COMMAND <subcommand> [<arg> ...]. Subcommands are:\r\n"),
        "{help}"
    );
    // The block and INCR after all that still come from the tag's segment.
    assert_eq!(
        raw.send(&resp(&[b"INCR", b"segment:order"]), 1).await,
        ":1\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"INCRBY", b"segment:order", b"5"]), 1)
            .await,
        ":6\r\n"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unparseable_frames_get_an_error_then_the_connection_closes() {
    let server = memory_server(Config::default()).await;
    let cases: &[(&[u8], &str)] = &[
        (
            b"*2\r\n$4\r\nECHO\r\n$10000000\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*100000\r\n",
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\n$-3\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n*1\r\n$4\r\nPING\r\n",
            "-ERR Protocol error: expected '$', got '*'\r\n",
        ),
    ];
    for (bytes, expected) in cases {
        let mut raw = server.raw().await;
        assert_eq!(&raw.send(bytes, 1).await, expected);
        assert!(raw.closed().await, "connection closed after {bytes:?}");
    }
    let mut raw = server.raw().await;
    let long_line = vec![b'a'; 100 * 1024];
    assert_eq!(
        raw.send(&long_line, 1).await,
        "-ERR Protocol error: too big inline request\r\n"
    );
    assert!(raw.closed().await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_and_inline_commands_reply_in_order() {
    let server = memory_server(Config::default()).await;
    let mut raw = server.raw().await;
    let mut batch = Vec::new();
    for _ in 0..50 {
        batch.extend(resp(&[b"INCR", b"segment:order"]));
    }
    batch.extend_from_slice(b"PING\r\nECHO hello\r\nINCR segment:order\r\n");
    let replies = raw.send(&batch, 54).await;
    let mut expected: String = (1..=50).map(|i| format!(":{i}\r\n")).collect();
    expected.push_str("+PONG\r\n$5\r\nhello\r\n:51\r\n");
    assert_eq!(replies, expected);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_3_switches_to_resp3_and_real_clients_work_over_it() {
    let server = memory_server(Config::default()).await;
    let mut raw = server.raw().await;
    let hello = raw
        .send(&resp(&[b"HELLO", b"3", b"SETNAME", b"t1"]), 15)
        .await;
    assert!(
        hello.starts_with("%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n"),
        "{hello}"
    );
    assert!(hello.contains("$5\r\nproto\r\n:3\r\n"), "{hello}");
    assert_eq!(
        raw.send(&resp(&[b"CLIENT", b"GETNAME"]), 2).await,
        "$2\r\nt1\r\n"
    );
    assert_eq!(
        raw.send(b"GET-NOTHING\r\n", 1).await.chars().next(),
        Some('-')
    );

    let client = redis::Client::open(format!("{}?protocol=resp3", server.url())).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let a: i64 = redis::cmd("INCR")
        .arg("segment:order")
        .query_async(&mut con)
        .await
        .unwrap();
    let b: i64 = redis::cmd("INCR")
        .arg("segment:order")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(b, a + 1);
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(info.contains("redis_version:7.2.0"), "{info}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requirepass_gates_every_command_until_auth() {
    let mut config = Config::default();
    config.server.requirepass = Some("s3cret".into());
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"INCR", b"segment:x"]), 1).await,
        "-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"LEAF.TAG", b"CREATE", b"x", b"10"]), 1)
            .await,
        "-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"AUTH", b"wrong"]), 1).await,
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(raw.send(&resp(&[b"AUTH", b"s3cret"]), 1).await, "+OK\r\n");
    assert_eq!(
        raw.send(&resp(&[b"LEAF.TAG", b"CREATE", b"x", b"10"]), 1)
            .await,
        "+OK\r\n"
    );
    assert_eq!(raw.send(&resp(&[b"INCR", b"segment:x"]), 1).await, ":1\r\n");
    assert_eq!(raw.send(&resp(&[b"RESET"]), 1).await, "+RESET\r\n");
    assert_eq!(
        raw.send(b"PING\r\n", 1).await,
        "-NOAUTH Authentication required.\r\n"
    );

    // A real client authenticates through HELLO/AUTH from the URL.
    let url = format!("redis://:s3cret@{}/", server.addr);
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let id: i64 = redis::cmd("INCR")
        .arg("segment:x")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(id > 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_authenticate_and_only_admins_manage_tags() {
    let config = Config::from_toml(
        "[server]\nrequirepass = \"rootpw\"\n\
         [[server.users]]\nname = \"app\"\npassword = \"apppw\"\n\
         [[server.users]]\nname = \"ops\"\npassword = \"opspw\"\nadmin = true\n",
    )
    .unwrap();
    leafd::app::validate_config(&config).unwrap();
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut app = server.raw().await;
    assert_eq!(
        app.send(&resp(&[b"AUTH", b"app", b"opspw"]), 1).await,
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n",
        "one user's password does not open another user"
    );
    assert_eq!(
        app.send(&resp(&[b"AUTH", b"app", b"apppw"]), 1).await,
        "+OK\r\n"
    );
    assert_eq!(
        app.send(&resp(&[b"LEAF.TAG", b"CREATE", b"t", b"10"]), 1)
            .await,
        "-NOPERM this user has no permissions to run the 'leaf.tag' command\r\n"
    );
    assert_eq!(
        app.send(&resp(&[b"CONFIG", b"GET", b"*"]), 1).await,
        "-NOPERM this user has no permissions to run the 'config' command\r\n",
        "CONFIG reveals configuration: admins only"
    );
    let mut ops = server.raw().await;
    let hello = ops
        .send(&resp(&[b"HELLO", b"2", b"AUTH", b"ops", b"opspw"]), 15)
        .await;
    assert!(hello.starts_with("*14\r\n"), "{hello}");
    assert_eq!(
        ops.send(&resp(&[b"LEAF.TAG", b"CREATE", b"t", b"10"]), 1)
            .await,
        "+OK\r\n"
    );
    assert_eq!(app.send(&resp(&[b"INCR", b"segment:t"]), 1).await, ":1\r\n");
    let mut root = server.raw().await;
    assert_eq!(root.send(&resp(&[b"AUTH", b"rootpw"]), 1).await, "+OK\r\n");
    assert_eq!(
        root.send(&resp(&[b"LEAF.TAG", b"STEP", b"t", b"20"]), 1)
            .await,
        "+OK\r\n"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_beyond_max_clients_are_refused_with_an_error() {
    let mut config = Config::default();
    config.server.max_clients = 2;
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut first = server.raw().await;
    let mut second = server.raw().await;
    assert_eq!(first.send(b"PING\r\n", 1).await, "+PONG\r\n");
    assert_eq!(second.send(b"PING\r\n", 1).await, "+PONG\r\n");
    let mut third = server.raw().await;
    assert_eq!(
        third.read_lines(1).await,
        "-ERR max number of clients reached\r\n"
    );
    assert!(third.closed().await);
    drop(first);
    // The freed slot is reusable once the server noticed the close.
    let mut ok = false;
    for _ in 0..50 {
        let mut again = server.raw().await;
        if again.send(b"PING\r\n", 1).await == "+PONG\r\n" {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(ok, "a slot frees up after a client leaves");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_commands_answer_like_redis() {
    let server = memory_server(Config::default()).await;
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"CLIENT", b"SETINFO", b"LIB-NAME", b"x"]), 1)
            .await,
        "+OK\r\n"
    );
    assert_eq!(raw.send(&resp(&[b"SELECT", b"0"]), 1).await, "+OK\r\n");
    let count = raw.send(&resp(&[b"COMMAND", b"COUNT"]), 1).await;
    assert_eq!(count, format!(":{}\r\n", leafd::cmd::table::COMMANDS.len()));
    let config = raw
        .send(&resp(&[b"CONFIG", b"GET", b"maxclients"]), 4)
        .await;
    assert_eq!(config, "*2\r\n$10\r\nmaxclients\r\n$5\r\n10000\r\n");
    let time = raw.send(&resp(&[b"TIME"]), 5).await;
    assert!(time.starts_with("*2\r\n$10\r\n"), "{time}");
    assert_eq!(raw.send(&resp(&[b"QUIT"]), 1).await, "+OK\r\n");
    assert!(raw.closed().await);
    server.stop().await;
}

/// CVE-2022-36021's shape: patterns that make a backtracking glob exponential answer at once,
/// and other clients are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_config_get_patterns_answer_at_once() {
    let server = memory_server(Config::default()).await;
    let mut attackers = Vec::new();
    for _ in 0..3 {
        attackers.push(server.raw().await);
    }
    let pattern = format!("{}x", "*".repeat(30));
    let started = std::time::Instant::now();
    for attacker in &mut attackers {
        for _ in 0..100 {
            assert_eq!(
                attacker
                    .send(&resp(&[b"CONFIG", b"GET", pattern.as_bytes()]), 1)
                    .await,
                "*0\r\n"
            );
        }
    }
    let mut bystander = server.raw().await;
    assert_eq!(bystander.send(&resp(&[b"PING"]), 1).await, "+PONG\r\n");
    // 300 hostile requests in well under a second (a backtracking matcher needs minutes
    // for one); the exact cost per request is in the README, measured on the release build.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let mut matched = server.raw().await;
    let reply = matched
        .send(&resp(&[b"CONFIG", b"GET", b"*[xp]ort"]), 5)
        .await;
    assert!(reply.starts_with("*4\r\n$4\r\nport\r\n"), "{reply}");
    assert!(reply.contains("$8\r\ntls-port\r\n"), "{reply}");
    server.stop().await;
}

/// MULTI/EXEC/DISCARD/WATCH/UNWATCH with Redis's exact replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_queue_then_execute_like_redis() {
    let server = memory_server(Config::default()).await;
    let mut raw = server.raw().await;
    let cases: &[(&[&[u8]], &str)] = &[
        (&[b"EXEC"], "-ERR EXEC without MULTI\r\n"),
        (&[b"DISCARD"], "-ERR DISCARD without MULTI\r\n"),
        (&[b"WATCH", b"segment:order"], "+OK\r\n"),
        (&[b"UNWATCH"], "+OK\r\n"),
        (&[b"MULTI"], "+OK\r\n"),
        (&[b"MULTI"], "-ERR MULTI calls can not be nested\r\n"),
        (
            &[b"WATCH", b"x"],
            "-ERR WATCH inside MULTI is not allowed\r\n",
        ),
        (&[b"INCR", b"segment:order"], "+QUEUED\r\n"),
        (&[b"INCRBY", b"segment:order", b"10"], "+QUEUED\r\n"),
        (&[b"INCR", b"segment:missing"], "+QUEUED\r\n"),
        (&[b"PING"], "+QUEUED\r\n"),
    ];
    for (args, expected) in cases {
        assert_eq!(raw.send(&resp(args), 1).await, *expected, "{args:?}");
    }
    // The replies in order; a command failing at run time is an error element, as in Redis.
    assert_eq!(
        raw.send(&resp(&[b"EXEC"]), 5).await,
        "*4\r\n:1\r\n:11\r\n-ERR unknown tag 'missing'\r\n+PONG\r\n"
    );
    // An unknown command or a wrong arity while queueing aborts the whole transaction.
    assert_eq!(raw.send(&resp(&[b"MULTI"]), 1).await, "+OK\r\n");
    assert_eq!(
        raw.send(&resp(&[b"INCR", b"segment:order"]), 1).await,
        "+QUEUED\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"NOSUCH"]), 1).await,
        "-ERR unknown command 'NOSUCH', with args beginning with: \r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"INCR"]), 1).await,
        "-ERR wrong number of arguments for 'incr' command\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"EXEC"]), 1).await,
        "-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    // Nothing of the aborted transaction ran: the next ID follows the EXEC above.
    assert_eq!(
        raw.send(&resp(&[b"INCR", b"segment:order"]), 1).await,
        ":12\r\n"
    );
    // DISCARD drops the queue; RESET leaves a transaction too.
    assert_eq!(raw.send(&resp(&[b"MULTI"]), 1).await, "+OK\r\n");
    assert_eq!(
        raw.send(&resp(&[b"INCR", b"segment:order"]), 1).await,
        "+QUEUED\r\n"
    );
    assert_eq!(raw.send(&resp(&[b"DISCARD"]), 1).await, "+OK\r\n");
    assert_eq!(raw.send(&resp(&[b"MULTI"]), 1).await, "+OK\r\n");
    assert_eq!(raw.send(&resp(&[b"RESET"]), 1).await, "+RESET\r\n");
    assert_eq!(
        raw.send(&resp(&[b"EXEC"]), 1).await,
        "-ERR EXEC without MULTI\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"INCR", b"segment:order"]), 1).await,
        ":13\r\n"
    );
    server.stop().await;
}

/// redis-rs's atomic pipeline (MULTI … EXEC), the default of several clients, returns IDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_pipeline_of_a_real_client_gets_its_ids() {
    let server = memory_server(Config::default()).await;
    let mut con = server.client().await;
    let (a, b, c): (i64, i64, i64) = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg("segment:order")
        .cmd("INCR")
        .arg("segment:order")
        .cmd("SNOWFLAKE")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((a, b), (1, 2));
    assert!(c > 0);
    server.stop().await;
}

/// The queue is bounded: one command over `server.max_multi_commands` aborts the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_queue_is_bounded() {
    let mut config = Config::default();
    config.server.max_multi_commands = 3;
    let server = memory_server(config).await;
    let mut raw = server.raw().await;
    assert_eq!(raw.send(&resp(&[b"MULTI"]), 1).await, "+OK\r\n");
    for _ in 0..3 {
        assert_eq!(raw.send(&resp(&[b"PING"]), 1).await, "+QUEUED\r\n");
    }
    assert_eq!(
        raw.send(&resp(&[b"PING"]), 1).await,
        "-ERR MULTI queue is full (3 commands, server.max_multi_commands)\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"EXEC"]), 1).await,
        "-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    server.stop().await;
}

/// Client-side caching would serve one ID many times: only OPTIN tracking (rueidis' default
/// handshake) is accepted, and CLIENT CACHING YES, which would start caching, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_tracking_is_accepted_only_where_nothing_gets_cached() {
    let server = memory_server(Config::default()).await;
    let mut raw = server.raw().await;
    let cases: &[(&[&[u8]], &str)] = &[
        (&[b"CLIENT", b"TRACKING", b"ON", b"OPTIN"], "+OK\r\n"),
        (&[b"CLIENT", b"CACHING", b"YES"], "-ERR leafd replies are never cacheable: every INCR, SNOWFLAKE or GET snowflake is a new ID (use Do, not DoCache)\r\n"),
        (&[b"CLIENT", b"TRACKING", b"ON"], "-ERR leafd supports CLIENT TRACKING only in OPTIN mode: its replies are new IDs and must never be served from a client-side cache\r\n"),
        (&[b"CLIENT", b"TRACKING", b"ON", b"BCAST"], "-ERR leafd supports CLIENT TRACKING only in OPTIN mode: its replies are new IDs and must never be served from a client-side cache\r\n"),
        (&[b"CLIENT", b"TRACKING", b"OFF"], "+OK\r\n"),
        (&[b"CLIENT", b"TRACKING", b"MAYBE"], "-ERR syntax error\r\n"),
    ];
    for (args, expected) in cases {
        assert_eq!(raw.send(&resp(args), 1).await, *expected, "{args:?}");
    }
    server.stop().await;
}

/// `segment.max_tags` bounds the rows LEAF.TAG CREATE can add, with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_creation_is_bounded() {
    let mut config = Config::default();
    config.segment.max_tags = 2;
    let server = memory_server(config).await; // creates "order"
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"LEAF.TAG", b"CREATE", b"second", b"10"]), 1)
            .await,
        "+OK\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"LEAF.TAG", b"CREATE", b"third", b"10"]), 1)
            .await,
        "-ERR tag limit reached: the table has 2 tags (segment.max_tags = 2)\r\n"
    );
    server.stop().await;
}

/// CLIENT LIST shows every connected client with the name it gave itself, and forgets a
/// client once it disconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_shows_every_client() {
    let mut config = Config::default();
    config.snowflake.coordinator = leafd::config::CoordinatorKind::Static;
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut named = server.raw().await;
    assert_eq!(
        named
            .send(&resp(&[b"CLIENT", b"SETNAME", b"orders-api"]), 1)
            .await,
        "+OK\r\n"
    );
    let mut other = server.raw().await;
    assert_eq!(other.send(b"PING\r\n", 1).await, "+PONG\r\n");
    let mut asker = server.raw().await;
    // A bulk string: the header line, then the body (lines end in \n) and its CRLF.
    let list = asker.send(&resp(&[b"CLIENT", b"LIST"]), 2).await;
    assert_eq!(list.matches("id=").count(), 3, "{list}");
    assert!(list.contains(" name=orders-api "), "{list}");
    assert_eq!(other.send(b"QUIT\r\n", 1).await, "+OK\r\n");
    drop(other);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let list = asker.send(&resp(&[b"CLIENT", b"LIST"]), 2).await;
    assert_eq!(list.matches("id=").count(), 2, "{list}");
    drop(named);
    server.stop().await;
}
