//! The client against a real Prometheus (Debian's, as `scripts/setup.sh` installs it) started
//! with `--web.config.file`: TLS with a certificate from a CA of the test's own (openssl) and
//! basic auth. The right CA and password get an answer; a wrong password, no credentials, the
//! system's roots instead of the CA, and plain http to the TLS port each fail with an error
//! that says which — never an answer.

use hoststack_promql::{Access, Client, Credentials, Data, Endpoint, Error};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Prometheus process and its directory, both gone when dropped (also on a failed assert).
struct Server {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(dir: &Path, program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed");
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and Prometheus serving TLS with
/// user alice (password s3cret) on a free loopback port.
fn start() -> Server {
    let dir = std::env::temp_dir().join(format!("promql-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem", "-days", "1"]);
    ca.extend(["-subj", "/CN=hoststack test CA"]);
    run(&dir, "openssl", &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&dir, "openssl", &csr);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    let mut sign = vec![
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
    ];
    sign.extend([
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
    ]);
    sign.extend(["-extfile", "ext.cnf"]);
    run(&dir, "openssl", &sign);
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let web = format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n\
         basic_auth_users:\n  alice: {hash}\n"
    );
    std::fs::write(dir.join("web.yml"), web).unwrap();
    std::fs::write(dir.join("prometheus.yml"), "scrape_configs: []\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .args([
            "--config.file=prometheus.yml",
            "--web.config.file=web.yml",
            &format!("--web.listen-address=127.0.0.1:{port}"),
            "--storage.tsdb.path=data",
        ])
        .current_dir(&dir)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("prometheus runs (scripts/setup.sh installs it)");
    Server { child, dir, port }
}

fn client(server: &Server, scheme: &str, access: &Access) -> Client {
    let endpoint = Endpoint::parse(&format!("{scheme}://127.0.0.1:{}", server.port)).unwrap();
    Client::with_access(endpoint, access).unwrap()
}

fn alice(password: &str) -> Option<Credentials> {
    Some(Credentials::Basic {
        username: "alice".into(),
        password: password.into(),
    })
}

#[tokio::test]
async fn tls_and_basic_auth_let_the_right_client_in_and_name_every_refusal() {
    let server = start();
    let ca = std::fs::read(server.dir.join("ca.pem")).unwrap();
    let trusted = |credentials| Access {
        ca_pem: Some(ca.clone()),
        credentials,
        headers: vec![("X-Scope-OrgID".into(), "team-a".into())],
    };
    let good = client(&server, "https", &trusted(alice("s3cret")));
    // Prometheus takes a moment to listen; the deadline is there to fail with its log.
    let deadline = Instant::now() + Duration::from_secs(120);
    let answer = loop {
        match good.query("vector(1)", None).await {
            Ok(data) => break data,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!(
                "{e}; prometheus.log:\n{}",
                std::fs::read_to_string(server.dir.join("prometheus.log")).unwrap_or_default()
            ),
        }
    };
    let Data::Vector(samples) = answer else {
        panic!("not a vector: {answer:?}");
    };
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0].value, 1.0);

    let wrong = client(&server, "https", &trusted(alice("wrong")));
    match wrong.query("vector(1)", None).await {
        Err(Error::Status { status, .. }) => assert_eq!(status.as_u16(), 401),
        other => panic!("a wrong password got {other:?}"),
    }
    let anonymous = client(&server, "https", &trusted(None));
    match anonymous.query("vector(1)", None).await {
        Err(Error::Status { status, .. }) => assert_eq!(status.as_u16(), 401),
        other => panic!("no credentials got {other:?}"),
    }
    let system_roots = Access {
        credentials: alice("s3cret"),
        ..Access::default()
    };
    match client(&server, "https", &system_roots)
        .query("vector(1)", None)
        .await
    {
        Err(e @ Error::Tls { .. }) => {
            let message = e.to_string();
            let prefix = "TLS with Prometheus at https://127.0.0.1:";
            assert!(message.starts_with(prefix), "{message}");
            assert!(message.contains("certificate"), "{message}");
        }
        other => panic!("an untrusted certificate got {other:?}"),
    }
    let plain = client(&server, "http", &trusted(alice("s3cret")));
    assert!(
        plain.query("vector(1)", None).await.is_err(),
        "plain http to the TLS port got an answer"
    );
}
