//! The lab's credentials, made with the openssl CLI: a CA, the API server's serving
//! certificate, the service-account signing key pair, an admin client certificate, and the
//! kubeconfigs that use them.

use crate::command::{cmd, run};
use crate::{Error, Result};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Files of the lab's PKI, all under one directory.
#[derive(Clone, Debug)]
pub(crate) struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
}

/// The CA certificate of the PKI in `dir`.
pub(crate) fn ca_cert(dir: &Path) -> PathBuf {
    dir.join("ca.crt")
}

/// Creates the PKI in `dir`. The serving certificate is valid for `server_ips` (besides
/// 127.0.0.1, the service IP 198.19.255.1 and the kubernetes.default names).
pub(crate) fn generate(dir: &Path, server_ips: &[Ipv4Addr]) -> Result<Pki> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let path = |name: &str| dir.join(name);
    let mut alt = vec![
        "IP.1 = 127.0.0.1".to_string(),
        "IP.2 = 198.19.255.1".to_string(),
    ];
    alt.extend(
        server_ips
            .iter()
            .enumerate()
            .map(|(i, ip)| format!("IP.{} = {ip}", i + 3)),
    );
    for (i, name) in [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .iter()
    .enumerate()
    {
        alt.push(format!("DNS.{} = {name}", i + 1));
    }
    let config = format!(
        "[req]\n\
         distinguished_name = dn\n\
         [dn]\n\
         [ca]\n\
         basicConstraints = critical, CA:TRUE\n\
         keyUsage = critical, keyCertSign, cRLSign, digitalSignature\n\
         subjectKeyIdentifier = hash\n\
         [server]\n\
         basicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature, keyEncipherment\n\
         extendedKeyUsage = serverAuth\n\
         subjectAltName = @alt\n\
         [client]\n\
         basicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature, keyEncipherment\n\
         extendedKeyUsage = clientAuth\n\
         [alt]\n{}\n",
        alt.join("\n")
    );
    let cnf = path("openssl.cnf");
    write(&cnf, &config)?;

    let pki = Pki {
        ca_cert: ca_cert(dir),
        serving_cert: path("apiserver.crt"),
        serving_key: path("apiserver.key"),
        sa_key: path("sa.key"),
        sa_pub: path("sa.pub"),
        admin_cert: path("admin.crt"),
        admin_key: path("admin.key"),
    };
    let ca_key = path("ca.key");
    ec_key(&ca_key)?;
    openssl(&[
        "req",
        "-x509",
        "-new",
        "-key",
        s(&ca_key),
        "-subj",
        "/CN=hoststack-lab-ca",
        "-days",
        "30",
        "-config",
        s(&cnf),
        "-extensions",
        "ca",
        "-out",
        s(&pki.ca_cert),
    ])?;
    sign(
        dir,
        "apiserver",
        "/CN=kube-apiserver",
        "server",
        &pki.serving_key,
        &pki.serving_cert,
    )?;
    sign(
        dir,
        "admin",
        "/O=system:masters/CN=hoststack-lab-admin",
        "client",
        &pki.admin_key,
        &pki.admin_cert,
    )?;
    ec_key(&pki.sa_key)?;
    openssl(&[
        "pkey",
        "-in",
        s(&pki.sa_key),
        "-pubout",
        "-out",
        s(&pki.sa_pub),
    ])?;
    Ok(pki)
}

/// Signs a client certificate for `subject` (e.g. `/O=system:nodes/CN=system:node:node-a`)
/// with the CA that [`generate`] made in `dir`; returns `<dir>/<name>.crt` and `<dir>/<name>.key`.
pub(crate) fn client_certificate(
    dir: &Path,
    name: &str,
    subject: &str,
) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    sign(dir, name, subject, "client", &key, &cert)?;
    Ok((cert, key))
}

/// Signs a serving certificate for `ip` with the CA that [`generate`] made in `dir`, for a
/// helper that serves TLS; returns `<dir>/<name>.crt` and `<dir>/<name>.key`.
pub(crate) fn serving_certificate(
    dir: &Path,
    name: &str,
    ip: Ipv4Addr,
) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let section = format!("serving_{name}");
    let mut config = std::fs::read_to_string(dir.join("openssl.cnf"))
        .map_err(|e| Error::io("reading the lab's openssl.cnf", e))?;
    if !config.contains(&format!("[{section}]")) {
        config.push_str(&format!(
            "[{section}]\n\
             basicConstraints = critical, CA:FALSE\n\
             keyUsage = critical, digitalSignature, keyEncipherment\n\
             extendedKeyUsage = serverAuth\n\
             subjectAltName = IP:{ip}\n"
        ));
        write(&dir.join("openssl.cnf"), &config)?;
    }
    sign(dir, name, &format!("/CN={ip}"), &section, &key, &cert)?;
    Ok((cert, key))
}

/// Makes `key` and a certificate `cert` for `subject` with extensions section `ext` of
/// `<dir>/openssl.cnf`, signed by the CA in `dir`.
fn sign(dir: &Path, name: &str, subject: &str, ext: &str, key: &Path, cert: &Path) -> Result<()> {
    let path = |file: &str| dir.join(file);
    ec_key(key)?;
    let csr = path(&format!("{name}.csr"));
    openssl(&[
        "req",
        "-new",
        "-key",
        s(key),
        "-subj",
        subject,
        "-config",
        s(&path("openssl.cnf")),
        "-out",
        s(&csr),
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        s(&csr),
        "-CA",
        s(&path("ca.crt")),
        "-CAkey",
        s(&path("ca.key")),
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        s(&path("openssl.cnf")),
        "-extensions",
        ext,
        "-out",
        s(cert),
    ])?;
    let _ = std::fs::remove_file(csr);
    Ok(())
}

/// How a kubeconfig's user authenticates.
pub(crate) enum Credentials<'a> {
    /// A client certificate and key (files).
    Certificate { cert: &'a Path, key: &'a Path },
    /// A bearer token.
    Token(&'a str),
}

/// Writes a kubeconfig for `server` (an https URL) trusting `ca`.
pub(crate) fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    credentials: Credentials<'_>,
) -> Result<()> {
    // JSON strings are valid YAML scalars, and quote whatever needs quoting.
    let q = |v: &str| serde_json::Value::from(v).to_string();
    let auth = match credentials {
        Credentials::Certificate { cert, key } => format!(
            "    client-certificate: {}\n    client-key: {}\n",
            q(s(cert)),
            q(s(key))
        ),
        Credentials::Token(token) => format!("    token: {}\n", q(token)),
    };
    let text = format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: hoststack-lab\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority: {ca}\n\
         users:\n\
         - name: {user}\n  \
           user:\n{auth}\
         contexts:\n\
         - name: hoststack-lab\n  \
           context:\n    \
             cluster: hoststack-lab\n    \
             user: {user}\n\
         current-context: hoststack-lab\n",
        server = q(server),
        ca = q(s(ca)),
        user = q(user),
    );
    write(path, &text)
}

fn ec_key(path: &Path) -> Result<()> {
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        s(path),
    ])
}

fn openssl(args: &[&str]) -> Result<()> {
    run(&mut cmd("openssl", args), None).map(drop)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Lab paths are built from UTF-8 parts.
fn s(path: &Path) -> &str {
    path.to_str().expect("lab paths are UTF-8")
}
