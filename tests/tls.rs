//! TLS: RESP over TLS beside the plain listener, mutual TLS, HTTPS, handshake limits, bad
//! certificate files, and redis-cli --tls against the real binary (LEAFD_TEST_REDIS_CLI).

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::backends::required_env;
use common::{read_lines, resp, sqlite_config};
use leafd::config::{Config, TlsConfig};
use leafd::tls::TlsSettings;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A test CA, a server certificate for localhost/127.0.0.1 and a client certificate, as PEM
/// files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertificateDer<'static>,
    client_cert: CertificateDer<'static>,
    client_key: Vec<u8>,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "leafd test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let server_cert = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .unwrap()
            .signed_by(&server_key, &ca)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let client_cert = CertificateParams::new(vec!["orders-service".into()])
            .unwrap()
            .signed_by(&client_key, &ca)
            .unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.crt", ca.pem());
        write("server.crt", server_cert.pem());
        write("server.key", server_key.serialize_pem());
        write("client.crt", client_cert.pem());
        write("client.key", client_key.serialize_pem());
        Pki {
            ca: ca.der().clone(),
            client_cert: client_cert.der().clone(),
            client_key: client_key.serialize_der(),
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `[tls]` with this server certificate; `mutual` also requires client certificates.
    fn server_config(&self, mutual: bool) -> TlsConfig {
        TlsConfig {
            bind: Some("127.0.0.1:0".into()),
            cert_file: Some(self.path("server.crt")),
            key_file: Some(self.path("server.key")),
            client_ca_file: mutual.then(|| self.path("ca.crt")),
            handshake_timeout_ms: 300,
            ..TlsConfig::default()
        }
    }

    /// A client trusting this CA, presenting the client certificate of `identity` if any.
    fn connector(&self, identity: Option<&Pki>, alpn: &[&[u8]]) -> TlsConnector {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
        let mut config = match identity {
            Some(id) => {
                let key = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(id.client_key.clone()));
                builder
                    .with_client_auth_cert(vec![id.client_cert.clone()], key)
                    .unwrap()
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }
}

/// leafd in-process (the harness's [`common::TestServer`]) with a plain and a TLS RESP listener.
struct TlsServer {
    plain: SocketAddr,
    tls: SocketAddr,
    settings: Arc<TlsSettings>,
    server: common::TestServer,
    _data: tempfile::TempDir,
}

impl TlsServer {
    async fn start(tls: TlsConfig, max_clients: usize) -> TlsServer {
        let data = tempfile::tempdir().unwrap();
        let mut config = sqlite_config(&data);
        config.server.max_clients = max_clients;
        config.tls = TlsConfig {
            bind: Some("127.0.0.1:0".into()),
            ..tls
        };
        let server = common::TestServer::start(config).await;
        server
            .app
            .segments
            .create_tag("tls", 1000, 1, None)
            .await
            .unwrap();
        TlsServer {
            plain: server.addr,
            tls: server.tls_addr.expect("a TLS listener"),
            settings: server.tls_settings[0].clone(),
            server,
            _data: data,
        }
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

async fn tls_connect(
    connector: &TlsConnector,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// Sends `request` and reads until `lines` CRLF lines arrived, EOF or an error.
async fn exchange(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    request: &[u8],
    lines: usize,
) -> std::io::Result<String> {
    stream.write_all(request).await?;
    read_lines(stream, lines).await
}

#[tokio::test]
async fn resp_over_tls_serves_the_same_ids_as_the_plain_listener() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.server_config(false), 100).await;
    let connector = pki.connector(None, &[]);
    let mut secure = tls_connect(&connector, server.tls).await.unwrap();
    let incr = resp(&[b"INCR", b"segment:tls"]);
    assert_eq!(exchange(&mut secure, &incr, 1).await.unwrap(), ":1\r\n");
    let mut plain = TcpStream::connect(server.plain).await.unwrap();
    assert_eq!(exchange(&mut plain, &incr, 1).await.unwrap(), ":2\r\n");
    // A pipeline of 1,000 over TLS: replies in order, one per command.
    let batch: Vec<u8> = incr.repeat(1000);
    let replies = exchange(&mut secure, &batch, 1000).await.unwrap();
    let expected: String = (3..=1002).map(|id| format!(":{id}\r\n")).collect();
    assert_eq!(replies, expected);
    let info = exchange(&mut secure, &resp(&[b"INFO", b"server"]), 14)
        .await
        .unwrap();
    assert!(
        info.contains(&format!("tls_port:{}\r\n", server.tls.port())),
        "{info}"
    );
    server.stop().await;
}

/// True when a PING through `connector` gets no reply: the handshake or the first read fails.
async fn refused_ping(connector: &TlsConnector, addr: SocketAddr) -> bool {
    match tls_connect(connector, addr).await {
        Err(_) => true,
        Ok(mut stream) => match exchange(&mut stream, &resp(&[b"PING"]), 1).await {
            Err(_) => true,
            Ok(reply) => reply.is_empty(),
        },
    }
}

#[tokio::test]
async fn mutual_tls_serves_only_clients_with_a_certificate_from_the_ca() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.server_config(true), 100).await;
    let ping = resp(&[b"PING"]);
    let mut with_cert = tls_connect(&pki.connector(Some(&pki), &[]), server.tls)
        .await
        .unwrap();
    assert_eq!(
        exchange(&mut with_cert, &ping, 1).await.unwrap(),
        "+PONG\r\n"
    );
    // Without a certificate: with TLS 1.3 the client's side of the handshake may complete, but
    // the server refuses before any command runs.
    assert!(
        refused_ping(&pki.connector(None, &[]), server.tls).await,
        "a client without a certificate was served"
    );
    // A certificate from another CA is refused as well.
    let stranger = Pki::new();
    assert!(
        refused_ping(&pki.connector(Some(&stranger), &[]), server.tls).await,
        "a client certificate from another CA was accepted"
    );
    // The good client is unaffected.
    assert_eq!(
        exchange(&mut with_cert, &ping, 1).await.unwrap(),
        "+PONG\r\n"
    );
    server.stop().await;
}

#[tokio::test]
async fn plaintext_and_silent_clients_on_the_tls_port_are_dropped() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.server_config(false), 100).await;
    // Plain RESP sent to the TLS port is not a ClientHello: no reply, connection closed.
    let mut confused = TcpStream::connect(server.tls).await.unwrap();
    let reply = exchange(&mut confused, b"PING\r\n", 1).await;
    assert!(
        !matches!(&reply, Ok(r) if r.contains("PONG")),
        "plaintext was answered on the TLS port: {reply:?}"
    );
    // A client that connects and says nothing is closed after the 300 ms handshake timeout.
    let mut silent = TcpStream::connect(server.tls).await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("silent client closed within 5 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    // The listener still serves TLS clients.
    let mut secure = tls_connect(&pki.connector(None, &[]), server.tls)
        .await
        .unwrap();
    assert_eq!(
        exchange(&mut secure, &resp(&[b"INCR", b"segment:tls"]), 1)
            .await
            .unwrap(),
        ":1\r\n"
    );
    server.stop().await;
}

#[tokio::test]
async fn max_clients_is_shared_and_its_error_readable_over_tls() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.server_config(false), 1).await;
    let connector = pki.connector(None, &[]);
    let mut first = TcpStream::connect(server.plain).await.unwrap();
    assert_eq!(
        exchange(&mut first, &resp(&[b"PING"]), 1).await.unwrap(),
        "+PONG\r\n"
    );
    // The plain client holds the only slot: a TLS client is told so, over TLS.
    let mut second = tls_connect(&connector, server.tls).await.unwrap();
    let mut reply = String::new();
    tokio::time::timeout(Duration::from_secs(5), second.read_to_string(&mut reply))
        .await
        .expect("rejection within 5 s")
        .ok();
    assert_eq!(reply, "-ERR max number of clients reached\r\n");
    server.stop().await;
}

#[tokio::test]
async fn https_serves_the_leaf_http_api() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let mut config = sqlite_config(&data);
    config.tls = TlsConfig {
        http: true,
        ..pki.server_config(false)
    };
    config.tls.handshake_timeout_ms = 300;
    let server = common::TestServer::start(config).await;
    server
        .app
        .segments
        .create_tag("web", 10, 1, None)
        .await
        .unwrap();
    let addr = server.http_addr;
    let connector = pki.connector(None, &[b"http/1.1"]);
    // A client stuck in its handshake does not delay the others.
    let _stuck = TcpStream::connect(addr).await.unwrap();
    for expected in ["1", "2"] {
        let mut stream = tls_connect(&connector, addr).await.unwrap();
        let mut response = String::new();
        stream
            .write_all(
                b"GET /api/segment/get/web HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            )
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
            .await
            .expect("response within 5 s")
            .ok();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.ends_with(&format!("\r\n\r\n{expected}")),
            "{response}"
        );
    }
    server.stop().await;
}

impl Pki {
    /// Puts `other`'s server certificate and key where this one's were (a rotation).
    fn install_server_files_of(&self, other: &Pki) {
        for name in ["server.crt", "server.key"] {
            std::fs::copy(other.path(name), self.path(name)).unwrap();
        }
    }
}

#[tokio::test]
async fn certificates_reload_without_dropping_connected_clients() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.server_config(false), 100).await;
    let ping = resp(&[b"PING"]);
    let mut before = tls_connect(&pki.connector(None, &[]), server.tls)
        .await
        .unwrap();
    assert_eq!(exchange(&mut before, &ping, 1).await.unwrap(), "+PONG\r\n");
    // Rotate to a certificate from another CA.
    let rotated = Pki::new();
    pki.install_server_files_of(&rotated);
    server.settings.reload().unwrap();
    let mut after = tls_connect(&rotated.connector(None, &[]), server.tls)
        .await
        .unwrap();
    assert_eq!(exchange(&mut after, &ping, 1).await.unwrap(), "+PONG\r\n");
    assert!(
        refused_ping(&pki.connector(None, &[]), server.tls).await,
        "the old certificate is still served to new clients"
    );
    // The client connected before the rotation keeps its session.
    assert_eq!(exchange(&mut before, &ping, 1).await.unwrap(), "+PONG\r\n");
    // A broken file: the reload fails naming it and the rotated certificate stays.
    std::fs::write(pki.path("server.crt"), "not a certificate").unwrap();
    let err = server.settings.reload().expect_err("refused").to_string();
    assert!(err.ends_with("server.crt holds no certificate"), "{err}");
    let mut again = tls_connect(&rotated.connector(None, &[]), server.tls)
        .await
        .unwrap();
    assert_eq!(exchange(&mut again, &ping, 1).await.unwrap(), "+PONG\r\n");
    server.stop().await;
}

#[test]
fn bad_certificate_files_are_refused_naming_the_file() {
    let pki = Pki::new();
    let missing = TlsConfig {
        cert_file: Some(pki.path("nope.crt")),
        ..pki.server_config(false)
    };
    let err = TlsSettings::load(&missing, &[])
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.starts_with("cannot read certificate file") && err.contains("nope.crt"),
        "{err}"
    );
    // A key file given as the certificate holds no certificate.
    let swapped = TlsConfig {
        cert_file: Some(pki.path("server.key")),
        ..pki.server_config(false)
    };
    let err = TlsSettings::load(&swapped, &[])
        .err()
        .expect("refused")
        .to_string();
    assert!(err.ends_with("server.key holds no certificate"), "{err}");
    // A key that does not belong to the certificate.
    let mismatched = TlsConfig {
        key_file: Some(pki.path("client.key")),
        ..pki.server_config(false)
    };
    let err = TlsSettings::load(&mismatched, &[])
        .err()
        .expect("refused")
        .to_string();
    assert!(err.starts_with("certificate and key rejected"), "{err}");
    // And configuration validation wants both files.
    let mut config = Config::default();
    config.tls.bind = Some("127.0.0.1:6390".into());
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("cert_file and key_file are required"), "{err}");
}

/// The real binary, TLS only (no plaintext RESP listener), from a config file: redis-cli --tls
/// (when LEAFD_TEST_REDIS_CLI names it) and a Rust TLS client on the RESP port, HTTPS on the
/// HTTP port, and SIGHUP rotating both listeners' certificate.
#[tokio::test]
async fn binary_serves_tls_to_redis_cli_and_https() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let free_port = common::binary::free_port;
    let (tls, http) = (free_port(), free_port());
    let config_path = data.path().join("leafd.toml");
    std::fs::write(
        &config_path,
        format!(
            "[server]\nbind = \"\"\n\
             [http]\nbind = \"127.0.0.1:{http}\"\n\
             [tls]\nbind = \"127.0.0.1:{tls}\"\nhttp = true\n\
             cert_file = \"{}\"\nkey_file = \"{}\"\n\
             [storage]\nurl = \"sqlite://{}/leafd.db\"\n\
             [[segment.tags]]\ntag = \"cli\"\nstep = 100\n",
            pki.path("server.crt"),
            pki.path("server.key"),
            data.path().display()
        ),
    )
    .unwrap();
    let child =
        common::binary::LeafdProcess::spawn(&["--config", &config_path.display().to_string()]);
    let connector = pki.connector(None, &[]);
    let tls_addr: SocketAddr = format!("127.0.0.1:{tls}").parse().unwrap();
    let mut secure = None;
    for _ in 0..100 {
        if let Ok(stream) = tls_connect(&connector, tls_addr).await {
            secure = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut secure = secure.expect("leafd listens on its TLS port");
    let incr = resp(&[b"INCR", b"segment:cli"]);
    assert_eq!(exchange(&mut secure, &incr, 1).await.unwrap(), ":1\r\n");

    let https = pki.connector(None, &[b"http/1.1"]);
    let mut stream = tls_connect(&https, format!("127.0.0.1:{http}").parse().unwrap())
        .await
        .unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    let _ =
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response)).await;
    assert!(
        response.starts_with("HTTP/1.1 200 OK\r\n") && response.ends_with("ok\n"),
        "{response}"
    );

    if let Some(redis_cli) = required_env("LEAFD_TEST_REDIS_CLI", "redis-cli --tls") {
        let ca = pki.path("ca.crt");
        let output = tokio::task::spawn_blocking(move || {
            Command::new(redis_cli)
                .args(["--tls", "--cacert", &ca, "--sni", "localhost"])
                .args(["-h", "127.0.0.1", "-p", &tls.to_string()])
                .args(["INCR", "segment:cli"])
                .output()
                .expect("redis-cli runs")
        })
        .await
        .unwrap();
        assert!(output.status.success(), "{output:?}");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "2\n");
    }
    // SIGHUP rotates the certificate of both listeners.
    let rotated = Pki::new();
    pki.install_server_files_of(&rotated);
    child.signal("-HUP");
    let mut reloaded = false;
    for _ in 0..100 {
        if !refused_ping(&rotated.connector(None, &[]), tls_addr).await {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reloaded, "SIGHUP did not load the rotated certificate");
    let https_rotated = rotated.connector(None, &[b"http/1.1"]);
    assert!(
        tls_connect(&https_rotated, format!("127.0.0.1:{http}").parse().unwrap())
            .await
            .is_ok()
    );
    let status = child.stop();
    assert!(status.success(), "leafd exit status {status}");
}
