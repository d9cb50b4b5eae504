//! The etcd coordinator (`snowflake.coordinator = "etcd"`) against a real etcd
//! (LEAFD_TEST_ETCD, e.g. http://127.0.0.1:2379): distinct ids, a restart keeps its id, a holder
//! cut off from etcd stops before another node may take its id, the layout record. Each test
//! uses its own cluster name.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::backends::required_env;
use common::proxy::TcpProxy;
use common::scenarios::unique_tag;
use leafd::app::App;
use leafd::clock::{Clock, SystemClock};
use leafd::config::{Config, CoordinatorKind};
use leafd::engine::snowflake::Layout;

fn node(endpoint: &str, cluster: &str, state: &tempfile::TempDir) -> Config {
    let mut config = Config::default();
    config.storage.url = format!("sqlite://{}/leafd.db", state.path().display());
    config.storage.state_dir = state.path().display().to_string();
    config.snowflake.coordinator = CoordinatorKind::Etcd;
    config.snowflake.etcd.endpoints = vec![endpoint.to_string()];
    config.snowflake.etcd.cluster = cluster.to_string();
    config.snowflake.etcd.lease_ms = 2000;
    config.snowflake.etcd.request_timeout_ms = 500;
    common::test_config(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_take_distinct_ids_and_a_restart_keeps_its_own() {
    let Some(etcd) = required_env("LEAFD_TEST_ETCD", "nodes_take_distinct_ids") else {
        return;
    };
    let cluster = unique_tag("etcd");
    let states: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut apps = Vec::new();
    for state in &states {
        apps.push(
            App::open(node(&etcd, &cluster, state))
                .await
                .expect("starts"),
        );
    }
    let ids: Vec<u64> = apps
        .iter()
        .map(|a| a.snowflake().unwrap().worker_id())
        .collect();
    assert_eq!(ids, vec![0, 1, 2], "the lowest free ids, in start order");
    let mut seen = HashSet::new();
    for app in &apps {
        let engine = app.snowflake().unwrap();
        for id in engine.next_ids(2000).await.unwrap() {
            assert!(seen.insert(id), "repeated {id}");
            assert_eq!(
                Layout::default().decode(id).unwrap().worker_id,
                engine.worker_id()
            );
        }
    }
    // INFO's coordinator section.
    let status = apps[0].context.coordinator.clone().expect("a link status");
    assert_eq!(status.kind(), "etcd");
    assert!(status.connected());
    // A clean stop frees the id at once; the restart asks for its own first and gets it.
    let second = apps.remove(1);
    second.close().await;
    let again = App::open(node(&etcd, &cluster, &states[1])).await.unwrap();
    assert_eq!(again.snowflake().unwrap().worker_id(), 1);
    for id in again.snowflake().unwrap().next_ids(2000).await.unwrap() {
        assert!(seen.insert(id), "repeated {id} after the restart");
    }
    again.close().await;
    for app in apps {
        app.close().await;
    }
}

/// Two worker ids (1 worker bit), both held; the first holder's path to etcd is cut. It stops
/// issuing within half its lease; a third node waits for the etcd lease to end, takes the id,
/// and issues only past the fence the first wrote: every one of its IDs is above every ID the
/// first issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_etcd_stops_before_its_id_is_taken() {
    let Some(etcd) = required_env("LEAFD_TEST_ETCD", "a_holder_cut_off_from_etcd") else {
        return;
    };
    let cluster = unique_tag("etcd-cut");
    let target = etcd.trim_start_matches("http://").to_string();
    let proxy = TcpProxy::start(target, true).await;
    let states: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let layout = Layout {
        worker_bits: 1,
        sequence_bits: 21,
        ..Layout::default()
    };
    let narrow = |mut config: Config| {
        config.snowflake.worker_id_bits = 1;
        config.snowflake.sequence_bits = 21;
        config
    };
    let cut_off = App::open(narrow(node(
        &format!("http://{}", proxy.addr),
        &cluster,
        &states[0],
    )))
    .await
    .unwrap();
    let other = App::open(narrow(node(&etcd, &cluster, &states[1])))
        .await
        .unwrap();
    assert_eq!(cut_off.snowflake().unwrap().worker_id(), 0);
    proxy.cut();
    let cut_at = SystemClock.now_millis();
    // It goes on issuing until half its lease (1 s) past its last renewal, then refuses.
    let engine = cut_off.snowflake().unwrap();
    let mut last_issued = 0;
    let stopped_at = loop {
        match engine.next_ids(100).await {
            Ok(ids) => last_issued = *ids.last().unwrap(),
            Err(e) => {
                assert!(e.to_string().contains("lease renewal"), "{e}");
                break SystemClock.now_millis();
            }
        }
        assert!(SystemClock.now_millis() < cut_at + 5_000, "never stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // A request that meets the end waits `fence_wait_ms` (1 s) before it is refused: the time
    // of the last ID is when issuing stopped, at most half a lease and a renewal interval on.
    let last_at = layout.decode(last_issued).unwrap().timestamp_ms;
    assert!(
        last_at <= cut_at + 1_400 && stopped_at >= last_at,
        "the last ID is {} ms after the cut",
        last_at as i64 - cut_at as i64
    );
    // A newcomer finds both ids held until the first's etcd lease (2 s) runs out, then takes it.
    let newcomer = loop {
        match App::open(narrow(node(&etcd, &cluster, &states[2]))).await {
            Ok(app) => break app,
            Err(e) => {
                assert!(e.to_string().contains("ids"), "{e}");
                assert!(SystemClock.now_millis() < cut_at + 15_000, "{e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let taken = newcomer.snowflake().unwrap();
    assert_eq!(taken.worker_id(), 0, "the cut-off node's id");
    let first = taken.next_ids(1).await.unwrap()[0];
    let issued_until = layout.decode(last_issued).unwrap().timestamp_ms;
    assert!(
        layout.decode(first).unwrap().timestamp_ms > issued_until && first > last_issued,
        "{first} after {last_issued}"
    );
    // The cut-off node never resumes on an id it lost: etcd answers again, its alive key is
    // another's, so its renewal revokes the id for good.
    proxy.restore();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let err = engine.next_ids(1).await.unwrap_err().to_string();
    assert!(err.contains("leased by another node"), "{err}");
    for app in [cut_off, other, newcomer] {
        app.close().await;
    }
}

/// The layout is recorded in `{root}/{cluster}/layout`: another layout is refused while a node
/// holds a lease, and one whose IDs could go back is refused by the value check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layout_is_recorded_and_a_change_checked() {
    let Some(etcd) = required_env("LEAFD_TEST_ETCD", "the_layout_is_recorded") else {
        return;
    };
    let cluster = unique_tag("etcd-layout");
    let states: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let running = App::open(node(&etcd, &cluster, &states[0])).await.unwrap();
    let mut javascript_safe = node(&etcd, &cluster, &states[1]);
    javascript_safe.snowflake.timestamp_bits = 41;
    javascript_safe.snowflake.worker_id_bits = 4;
    javascript_safe.snowflake.sequence_bits = 8;
    javascript_safe.snowflake.time_unit_ms = 10;
    let err = App::open(javascript_safe.clone())
        .await
        .err()
        .expect("refused while a node holds a lease")
        .to_string();
    assert!(err.contains("are leased by nodes issuing IDs of"), "{err}");
    running.close().await;
    // No lease now, but the smaller layout's IDs would start below the recorded one's.
    let err = App::open(javascript_safe)
        .await
        .err()
        .expect("refused by the value check")
        .to_string();
    assert!(err.contains("snowflake layout change refused"), "{err}");
}

/// A private etcd member of one test: TLS or authentication must not touch the shared one.
struct PrivateEtcd {
    child: std::process::Child,
    dir: tempfile::TempDir,
    endpoint: String,
    /// The command line, to start the member again on the same ports.
    args: Vec<String>,
}

impl PrivateEtcd {
    /// Starts `etcd` (from PATH) on free ports, its data and log in `dir`, with `extra` flags.
    fn spawn(dir: tempfile::TempDir, scheme: &str, extra: &[String]) -> PrivateEtcd {
        let (port, peer) = (common::binary::free_port(), common::binary::free_port());
        let data = dir.path().join("data").display().to_string();
        let endpoint = format!("{scheme}://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut args: Vec<String> = [
            "--name",
            "leafd-private",
            "--data-dir",
            &data,
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("leafd-private={peer_url}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().cloned());
        let child = PrivateEtcd::run(dir.path(), &args);
        PrivateEtcd {
            child,
            dir,
            endpoint,
            args,
        }
    }

    fn run(dir: &std::path::Path, args: &[String]) -> std::process::Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("etcd.log"))
            .unwrap();
        std::process::Command::new("etcd")
            .args(args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd on PATH (LEAFD_TEST_ETCD is set: scripts/etcd.sh installs it)")
    }

    /// SIGKILLs the member, empties its data directory and starts it again on the same ports:
    /// a rebuilt member, or one restored from nothing, as an operator may leave it.
    async fn wipe_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::remove_dir_all(self.dir.path().join("data")).unwrap();
        self.child = PrivateEtcd::run(self.dir.path(), &self.args);
        self.wait_ready().await;
    }

    /// A plain `http://` member.
    fn start_plain() -> PrivateEtcd {
        PrivateEtcd::spawn(tempfile::tempdir().unwrap(), "http", &[])
    }

    /// Writes a CA, the member's certificate (127.0.0.1) and a client certificate, then starts
    /// a member that serves only TLS clients with a certificate from its CA
    /// (`--client-cert-auth`).
    fn start_tls() -> PrivateEtcd {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        let issuer = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
        };
        let ca = issuer("leafd etcd test CA");
        let other_ca = issuer("another CA");
        let member_key = KeyPair::generate().unwrap();
        let member = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
            .unwrap()
            .signed_by(&member_key, &ca)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let client = CertificateParams::new(vec!["leafd".into()])
            .unwrap()
            .signed_by(&client_key, &ca)
            .unwrap();
        write("ca.crt", ca.pem());
        write("other-ca.crt", other_ca.pem());
        write("member.crt", member.pem());
        write("member.key", member_key.serialize_pem());
        write("client.crt", client.pem());
        write("client.key", client_key.serialize_pem());
        let path = |name: &str| dir.path().join(name).display().to_string();
        let flags = [
            "--cert-file".to_string(),
            path("member.crt"),
            "--key-file".into(),
            path("member.key"),
            "--trusted-ca-file".into(),
            path("ca.crt"),
            "--client-cert-auth".into(),
        ];
        PrivateEtcd::spawn(dir, "https", &flags)
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("etcd.log")).unwrap_or_default()
    }

    /// One gateway call of the test's own (plain members only), with an auth token or none.
    async fn post(
        &self,
        path: &str,
        body: serde_json::Value,
        token: Option<&str>,
    ) -> serde_json::Value {
        let mut request = common::http_client()
            .post(format!("{}/v3/{path}", self.endpoint))
            .body(body.to_string());
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        let reply = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap()
    }

    /// A token for a user of a member with authentication on.
    async fn token(&self, name: &str, password: &str) -> String {
        let reply = self
            .post(
                "auth/authenticate",
                serde_json::json!({"name": name, "password": password}),
                None,
            )
            .await;
        reply["token"].as_str().unwrap().to_string()
    }

    /// Waits until the member answers (it takes a moment to listen).
    async fn wait_ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while common::http_get(format!("{}/health", self.endpoint))
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "etcd did not start: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `https://` endpoints: a node with the members' CA and a client certificate takes its lease;
/// one without a client certificate, or trusting another CA, does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_requires_client_certificates() {
    if required_env(
        "LEAFD_TEST_ETCD",
        "a_member_that_requires_client_certificates",
    )
    .is_none()
    {
        return;
    }
    let etcd = PrivateEtcd::start_tls();
    let cluster = unique_tag("etcd-tls");
    let states: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let with_tls = |state, ca: &str, client: bool| {
        let mut config = node(&etcd.endpoint, &cluster, state);
        config.snowflake.etcd.tls_ca_file = Some(etcd.path(ca));
        if client {
            config.snowflake.etcd.tls_cert_file = Some(etcd.path("client.crt"));
            config.snowflake.etcd.tls_key_file = Some(etcd.path("client.key"));
        }
        config
    };
    // The member takes a moment to listen: the node with everything right is tried until then.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let app = loop {
        match App::open(with_tls(&states[0], "ca.crt", true)).await {
            Ok(app) => break app,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!(
                "no lease from the TLS member: {e}; etcd log: {}",
                etcd.log()
            ),
        }
    };
    let engine = app.snowflake().unwrap();
    assert_eq!(engine.worker_id(), 0);
    let ids = engine.next_ids(1000).await.unwrap();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 1000);

    let no_client_cert = App::open(with_tls(&states[1], "ca.crt", false))
        .await
        .err()
        .expect("a member with --client-cert-auth refuses a client without a certificate")
        .to_string();
    // The member's alert is not always read before the connection closes ("connection was not
    // ready"): the hint is what the operator can count on.
    assert!(
        no_client_cert.contains("etcd: https://127.0.0.1:")
            && no_client_cert.contains(
                "no client certificate is configured: a member started with --client-cert-auth \
                 also needs snowflake.etcd.tls_cert_file and tls_key_file"
            ),
        "{no_client_cert}"
    );
    let other_ca = App::open(with_tls(&states[2], "other-ca.crt", true))
        .await
        .err()
        .expect("a member whose certificate the CA file did not sign is not trusted")
        .to_string();
    assert!(
        other_ca.contains("invalid peer certificate: UnknownIssuer"),
        "{other_ca}"
    );
    // The refused nodes took no id: the next node gets 1.
    let second = App::open(with_tls(&states[1], "ca.crt", true))
        .await
        .expect("starts");
    assert_eq!(second.snowflake().unwrap().worker_id(), 1);
    second.close().await;
    app.close().await;
}

/// A member with authentication on: a node with a user whose role covers the cluster's prefix
/// takes its lease and keeps it across a revoked token (auth turned off and on again, which
/// drops every token); a node without credentials, with a wrong password, or with a user whose
/// role covers another prefix does not start, each with a line that says what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_authentication_on() {
    if required_env("LEAFD_TEST_ETCD", "a_member_with_authentication_on").is_none() {
        return;
    }
    authentication_on(PrivateEtcd::start_plain()).await;
}

/// The same with JWT tokens (`--auth-token jwt`, ES256): a token carries the auth store's
/// revision, so any change of users or roles makes every token issued before it refused with
/// 400 "revision of auth store is old"; the nodes replace theirs and go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_jwt_tokens() {
    if required_env("LEAFD_TEST_ETCD", "a_member_with_jwt_tokens").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let (private, public) = (dir.path().join("jwt.key"), dir.path().join("jwt.pub"));
    std::fs::write(&private, key.serialize_pem()).unwrap();
    std::fs::write(&public, key.public_key_pem()).unwrap();
    let token = format!(
        "jwt,pub-key={},priv-key={},sign-method=ES256,ttl=10m",
        public.display(),
        private.display()
    );
    authentication_on(PrivateEtcd::spawn(
        dir,
        "http",
        &["--auth-token".to_string(), token],
    ))
    .await;
}

async fn authentication_on(etcd: PrivateEtcd) {
    use base64::Engine;
    use serde_json::json;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    etcd.wait_ready().await;
    let cluster = unique_tag("etcd-auth");
    let prefix = format!("/leafd/snowflake/{cluster}/");
    let range_end = format!("/leafd/snowflake/{cluster}0");
    for (path, body) in [
        ("auth/role/add", json!({"name": "root"})),
        (
            "auth/user/add",
            json!({"name": "root", "password": "root-pw"}),
        ),
        ("auth/user/grant", json!({"user": "root", "role": "root"})),
        ("auth/role/add", json!({"name": "leafd"})),
        (
            "auth/role/grant",
            json!({"name": "leafd", "perm": {"permType": "READWRITE", "key": b64(&prefix), "range_end": b64(&range_end)}}),
        ),
        (
            "auth/user/add",
            json!({"name": "leafd", "password": "leafd-pw"}),
        ),
        ("auth/user/grant", json!({"user": "leafd", "role": "leafd"})),
        ("auth/role/add", json!({"name": "elsewhere"})),
        (
            "auth/role/grant",
            json!({"name": "elsewhere", "perm": {"permType": "READWRITE", "key": b64("/elsewhere/"), "range_end": b64("/elsewhere0")}}),
        ),
        (
            "auth/user/add",
            json!({"name": "other", "password": "other-pw"}),
        ),
        (
            "auth/user/grant",
            json!({"user": "other", "role": "elsewhere"}),
        ),
        ("auth/enable", json!({})),
    ] {
        let reply = etcd.post(path, body, None).await;
        assert!(reply.get("error").is_none(), "{path}: {reply}");
    }
    let states: Vec<_> = (0..5).map(|_| tempfile::tempdir().unwrap()).collect();
    let as_user = |state, user: Option<(&str, &str)>| {
        let mut config = node(&etcd.endpoint, &cluster, state);
        config.snowflake.etcd.username = user.map(|u| u.0.to_string());
        config.snowflake.etcd.password = user.map(|u| u.1.to_string());
        config
    };
    let app = App::open(as_user(&states[0], Some(("leafd", "leafd-pw"))))
        .await
        .expect("the user whose role covers the prefix takes a lease");
    let engine = app.snowflake().unwrap();
    assert_eq!(engine.worker_id(), 0);
    assert_eq!(
        engine
            .next_ids(1000)
            .await
            .unwrap()
            .iter()
            .collect::<HashSet<_>>()
            .len(),
        1000
    );

    let refused =
        |config| async move { App::open(config).await.err().expect("refused").to_string() };
    let anonymous = refused(as_user(&states[1], None)).await;
    assert!(
        anonymous.contains("user name is empty")
            && anonymous.contains(
                "the members have authentication on: set snowflake.etcd.username and password"
            ),
        "{anonymous}"
    );
    let wrong = refused(as_user(&states[2], Some(("leafd", "nope")))).await;
    assert!(
        wrong.contains("authentication failed")
            && wrong.contains("snowflake.etcd.username \"leafd\""),
        "{wrong}"
    );
    let other = refused(as_user(&states[3], Some(("other", "other-pw")))).await;
    assert!(
        other.contains("permission denied")
            && other.contains(&format!(
                "etcd user \"other\" needs a role with readwrite on the prefix {prefix}"
            )),
        "{other}"
    );

    // Every token dropped: the node's next renewal is refused (401), asks for a new token and
    // goes on. Past twice the lease's TTL, a node whose renewals had failed would have stopped
    // issuing and lost its id to the next node.
    let root = etcd.token("root", "root-pw").await;
    let off = etcd.post("auth/disable", json!({}), Some(&root)).await;
    assert!(off.get("error").is_none(), "{off}");
    let on = etcd.post("auth/enable", json!({}), None).await;
    assert!(on.get("error").is_none(), "{on}");
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(
        engine.next_ids(1000).await.unwrap().len(),
        1000,
        "still issuing"
    );
    // An unrelated user added: etcd's auth store moves on, and a token issued before is
    // refused with 400 "revision of auth store is old" (not a 401): replaced all the same.
    let root = etcd.token("root", "root-pw").await;
    let added = etcd
        .post(
            "auth/user/add",
            json!({"name": "unrelated", "password": "x"}),
            Some(&root),
        )
        .await;
    assert!(added.get("error").is_none(), "{added}");
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(
        engine.next_ids(1000).await.unwrap().len(),
        1000,
        "still issuing after the user list changed"
    );
    let second = App::open(as_user(&states[4], Some(("leafd", "leafd-pw"))))
        .await
        .expect("starts");
    assert_eq!(
        second.snowflake().unwrap().worker_id(),
        1,
        "id 0 still held"
    );
    second.close().await;
    app.close().await;
}

/// etcd wiped under load (worker_id_bits = 1: two ids, both held): a third node started at once
/// claims an id the wipe freed and waits a whole lease; the holders see etcd's new cluster id
/// at their next renewal, stop at once and claim their ids again. Every ID of the three nodes
/// is collected: no ID and no (millisecond, worker id) pair is issued by two nodes, and the
/// holders that kept an id issue again by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_etcd_gives_no_worker_id_to_two_nodes() {
    if required_env(
        "LEAFD_TEST_ETCD",
        "a_wiped_etcd_gives_no_worker_id_to_two_nodes",
    )
    .is_none()
    {
        return;
    }
    let mut etcd = PrivateEtcd::start_plain();
    etcd.wait_ready().await;
    let cluster = unique_tag("etcd-wipe");
    let states: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let endpoint = etcd.endpoint.clone();
    let narrow = |state: &tempfile::TempDir| {
        let mut config = node(&endpoint, &cluster, state);
        config.snowflake.worker_id_bits = 1;
        config.snowflake.sequence_bits = 21;
        config
    };
    let layout = Layout {
        worker_bits: 1,
        sequence_bits: 21,
        ..Layout::default()
    };
    let a = App::open(narrow(&states[0])).await.expect("a starts");
    let b = App::open(narrow(&states[1])).await.expect("b starts");
    let issued = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(usize, i64)>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let load = |node: usize, app: std::sync::Arc<App>| {
        let (issued, stop) = (issued.clone(), stop.clone());
        tokio::spawn(async move {
            let engine = app.snowflake().unwrap();
            while !stop.is_cancelled() {
                if let Ok(ids) = engine.next_ids(50).await {
                    issued
                        .lock()
                        .unwrap()
                        .extend(ids.into_iter().map(|id| (node, id)));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let (la, lb) = (load(0, a.clone()), load(1, b.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    etcd.wipe_and_restart().await;
    let wiped_at = std::time::Instant::now();
    let wiped_ms = SystemClock.now_millis();
    let c = App::open(narrow(&states[2])).await.expect("c starts");
    assert!(
        wiped_at.elapsed() >= Duration::from_millis(1900),
        "c issued {:?} after the wipe: it must wait a whole lease",
        wiped_at.elapsed()
    );
    let lc = load(2, c.clone());
    tokio::time::sleep(Duration::from_millis(4500)).await;
    stop.cancel();
    for task in [la, lb, lc] {
        task.await.unwrap();
    }
    let issued = issued.lock().unwrap().clone();
    let mut ids = HashSet::new();
    let mut pairs: std::collections::HashMap<(u64, u64), usize> = Default::default();
    let mut shared_pairs = 0;
    for &(node, id) in &issued {
        assert!(ids.insert(id), "ID {id} issued twice");
        let fields = layout.decode(id).unwrap();
        let owner = *pairs
            .entry((fields.timestamp_ms, fields.worker_id))
            .or_insert(node);
        if owner != node {
            shared_pairs += 1;
        }
    }
    assert_eq!(shared_pairs, 0, "(ms, worker id) pairs issued by two nodes");
    // c, and the one of a and b whose id c did not take (it claimed it again), issue a lease
    // and more after the wipe.
    let after: HashSet<usize> = issued
        .iter()
        .filter(|(_, id)| layout.decode(*id).unwrap().timestamp_ms > wiped_ms + 3000)
        .map(|(n, _)| *n)
        .collect();
    // The holder whose id c took stops for good, saying why; the other issues.
    let mut stopped = Vec::new();
    for app in [&a, &b] {
        if let Err(e) = app.snowflake().unwrap().next_ids(1).await {
            stopped.push(e.to_string());
        }
    }
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert!(
        stopped[0].contains("was taken by another node after etcd lost its leases"),
        "{stopped:?}"
    );
    assert!(after.contains(&2), "c never issued");
    assert_eq!(
        after.len(),
        2,
        "nodes issuing again after the wipe: {after:?}"
    );
    for app in [a, b, c] {
        app.close().await;
    }
}

/// One call to the shared etcd's JSON gateway.
async fn etcd_call(etcd: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
    let reply = common::http_client()
        .post(format!("{etcd}/v3/{path}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap()
}

/// A `worker/0` value nobody wrote (edited by hand, damaged) refuses the id: nothing is issued on
/// a fence that cannot be read, the lease taken for it is given back (no `alive/0` stays), and a
/// layout change is refused too. Put right, the id is taken past the fence it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_value_nobody_can_read_refuses_the_id() {
    use base64::Engine;
    use serde_json::json;
    let Some(etcd) = required_env("LEAFD_TEST_ETCD", "a_worker_value_nobody_can_read") else {
        return;
    };
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let cluster = unique_tag("etcd-damaged");
    let worker = format!("/leafd/snowflake/{cluster}/worker/0");
    let alive = format!("/leafd/snowflake/{cluster}/alive/0");
    let state = tempfile::tempdir().unwrap();
    let one_id = || {
        let mut config = node(&etcd, &cluster, &state);
        config.snowflake.worker_id_bits = 1;
        config.snowflake.sequence_bits = 21;
        config
    };
    for damaged in [
        "garbage".to_string(),
        r#"{"owner":"x","fence_ms":0}"#.to_string(),
        r#"{"owner":"x","fence_ms":-5}"#.to_string(),
    ] {
        let put = etcd_call(
            &etcd,
            "kv/put",
            json!({"key": b64(&worker), "value": b64(&damaged)}),
        )
        .await;
        assert!(put.get("error").is_none(), "{put}");
        let err = App::open(one_id())
            .await
            .err()
            .expect("refused on a fence nobody can read")
            .to_string();
        assert!(
            err.contains(&format!(
                "etcd key {worker} holds {damaged:?}, not the owner and fence leafd writes"
            )),
            "{err}"
        );
        let range = etcd_call(&etcd, "kv/range", json!({"key": b64(&alive)})).await;
        assert!(
            range.get("kvs").is_none(),
            "alive/0 kept after the refusal: {range}"
        );
    }
    // A layout change reads every fence: refused on it too.
    let mut other = one_id();
    other.snowflake.time_unit_ms = 10;
    let err = App::open(other).await.err().expect("refused").to_string();
    assert!(err.contains(&format!("etcd key {worker} holds")), "{err}");
    // Put right (a fence 3 s ahead of this clock, past the 2 s a claim waits anyway), and this
    // node's state naming id 0 as the one it held: taken, and nothing issued before the fence.
    std::fs::write(
        state.path().join("snowflake-worker-etcd.json"),
        br#"{"worker_id":0}"#,
    )
    .unwrap();
    let fence = SystemClock.now_millis() + 3000;
    let value = format!(r#"{{"owner":"x","fence_ms":{fence}}}"#);
    etcd_call(
        &etcd,
        "kv/put",
        json!({"key": b64(&worker), "value": b64(&value)}),
    )
    .await;
    let app = App::open(one_id()).await.expect("starts");
    let engine = app.snowflake().unwrap();
    assert_eq!(engine.worker_id(), 0);
    let layout = Layout {
        worker_bits: 1,
        sequence_bits: 21,
        ..Layout::default()
    };
    for id in engine.next_ids(100).await.unwrap() {
        let issued_ms = layout.decode(id).unwrap().timestamp_ms;
        assert!(
            issued_ms > fence,
            "ID {id} at {issued_ms}, at or before the fence {fence}"
        );
    }
    app.close().await;
}
