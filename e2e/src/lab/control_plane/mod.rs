//! The control plane and its PKI: etcd on the lab's own loopback address, kube-apiserver on
//! the bridge address (so agents inside node namespaces reach it) with its audit log
//! ([`audit`]), the certificates they use ([`pki`]) and the kubeconfigs that reach the API
//! server ([`kubeconfigs`]). It comes up
//! first and goes down last: the API server before etcd, which it hangs in shutdown without.

pub(crate) mod audit;
pub(crate) mod kubeconfigs;
pub(crate) mod pki;

use super::network::free_port;
use crate::process::{self, args, tail, Managed, ProcessState, Signal, Spawner};
use crate::{Error, Result};
use pki::Pki;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long etcd and the API server get between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// A member of the control plane, for a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Member {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    ApiServer,
}

impl Member {
    /// Where it is in the control plane's processes (etcd starts first).
    fn index(self) -> usize {
        match self {
            Member::Etcd => 0,
            Member::ApiServer => 1,
        }
    }
}

/// The lab's etcd and kube-apiserver.
pub(crate) struct ControlPlane {
    lab_dir: PathBuf,
    /// etcd, then kube-apiserver, as far as started.
    processes: Mutex<Vec<Managed>>,
    /// etcd's client URL.
    etcd_url: String,
    /// etcd's client address.
    etcd_address: Option<SocketAddr>,
    /// The API server's URL, `https://198.18.k.1:<port>`.
    api_url: String,
    /// The API server's port.
    api_port: u16,
}

impl ControlPlane {
    /// The control plane of the lab in `lab_dir`, not started yet.
    pub fn new(lab_dir: &Path) -> ControlPlane {
        ControlPlane {
            lab_dir: lab_dir.to_path_buf(),
            processes: Mutex::new(Vec::new()),
            etcd_url: String::new(),
            etcd_address: None,
            api_url: String::new(),
            api_port: 0,
        }
    }

    /// Starts etcd on `loopback`, where only the API server reaches it (a node namespace has a
    /// loopback of its own), on an address of this lab's own (127.18.k.1): labs starting at
    /// the same time never race for a port, and the API server never finds another lab's
    /// etcd. Returns once it accepts connections.
    pub fn start_etcd(&mut self, spawner: &Spawner, etcd: &Path, loopback: Ipv4Addr) -> Result<()> {
        let (client, peer) = (free_port(loopback)?, free_port(loopback)?);
        self.etcd_url = format!("http://{loopback}:{client}");
        let peer_url = format!("http://{loopback}:{peer}");
        let etcd_args = args(&[
            "--name=lab",
            &format!("--data-dir={}", self.lab_dir.join("etcd").display()),
            &format!("--listen-client-urls={}", self.etcd_url),
            &format!("--advertise-client-urls={}", self.etcd_url),
            &format!("--listen-peer-urls={peer_url}"),
            &format!("--initial-advertise-peer-urls={peer_url}"),
            &format!("--initial-cluster=lab={peer_url}"),
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]);
        let process = spawner.spawn("etcd", etcd, &etcd_args, &[])?;
        self.processes().push(process);
        self.etcd_address = Some(SocketAddr::from((loopback, client)));
        self.await_etcd()
    }

    /// Waits until etcd accepts connections.
    fn await_etcd(&self) -> Result<()> {
        let address = self.etcd_address.expect("etcd was started");
        self.await_ready("etcd", Duration::from_secs(30), || {
            TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok()
        })
    }

    /// Sends `signal` to `member`, waits until it has exited (SIGKILL after 30 s), and starts it
    /// again as it was started: etcd on the same data directory and ports, the API server with
    /// the same flags. Returns once etcd accepts connections again; the API server is not ready
    /// yet when this returns.
    pub fn restart(&self, spawner: &Spawner, member: Member, signal: Signal) -> Result<()> {
        {
            let mut processes = self.processes();
            let index = member.index();
            let process = processes
                .get_mut(index)
                .ok_or_else(|| Error::Setup(format!("{member:?} was never started")))?;
            process
                .signal(signal)
                .map_err(|e| Error::io(format!("signalling {}", process.name), e))?;
            if process.wait_timeout(Duration::from_secs(30)).is_none() {
                process.kill().map_err(Error::Setup)?;
            }
            processes[index] = spawner.respawn(&processes[index])?;
        }
        match member {
            Member::Etcd => self.await_etcd(),
            Member::ApiServer => Ok(()),
        }
    }

    /// Sends `signal` to `member` and returns at once (SIGSTOP and SIGCONT pause and resume it).
    pub fn signal(&self, member: Member, signal: Signal) -> Result<()> {
        let mut processes = self.processes();
        let process = processes
            .get_mut(member.index())
            .ok_or_else(|| Error::Setup(format!("{member:?} was never started")))?;
        process
            .signal(signal)
            .map_err(|e| Error::io(format!("signalling {}", process.name), e))
    }

    /// Starts kube-apiserver on `bridge` (port 6443 if free there, else any free port), with
    /// etcd as its storage, `pki`'s certificates, the lab's audit log ([`audit`]) and `extra`
    /// flags; it is not ready yet when this returns.
    pub fn start_apiserver(
        &mut self,
        spawner: &Spawner,
        kube_apiserver: &Path,
        bridge: Ipv4Addr,
        pki: &Pki,
        extra: &[String],
    ) -> Result<()> {
        self.api_port = if TcpListener::bind((bridge, 6443)).is_ok() {
            6443
        } else {
            free_port(bridge)?
        };
        self.api_url = format!("https://{bridge}:{}", self.api_port);
        let p = |path: &Path| path.display().to_string();
        let mut apiserver_args = args(&[
            &format!("--etcd-servers={}", self.etcd_url),
            &format!("--bind-address={bridge}"),
            &format!("--advertise-address={bridge}"),
            &format!("--secure-port={}", self.api_port),
            &format!("--cert-dir={}", p(&self.lab_dir.join("apiserver"))),
            &format!("--tls-cert-file={}", p(&pki.serving_cert)),
            &format!("--tls-private-key-file={}", p(&pki.serving_key)),
            &format!("--client-ca-file={}", p(&pki.ca_cert)),
            "--service-cluster-ip-range=198.19.255.0/24",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            &format!("--service-account-key-file={}", p(&pki.sa_pub)),
            &format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
            "--allow-privileged=true",
            "--profiling=false",
            // Real nodes: logs and exec reach kubelets at their addresses, as the lab admin
            // (the kubelets trust the lab CA and authorize every authenticated client).
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            &format!("--kubelet-client-certificate={}", p(&pki.admin_cert)),
            &format!("--kubelet-client-key={}", p(&pki.admin_key)),
        ]);
        apiserver_args.extend(audit::apiserver_flags(&self.lab_dir)?);
        apiserver_args.extend(extra.iter().cloned());
        let process = spawner.spawn("kube-apiserver", kube_apiserver, &apiserver_args, &[])?;
        self.processes().push(process);
        Ok(())
    }

    /// etcd's client URL, `http://127.18.k.1:<port>` (its /metrics is there too).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The API server's URL, `https://198.18.k.1:<port>`.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The API server's port.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// Polls `ready` until it holds; fails early when etcd or the API server exits, and with
    /// the tails of their logs after `timeout`.
    pub fn await_ready(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            if let Some(error) = self
                .processes()
                .iter_mut()
                .find_map(|p| p.exited_while_waiting(what))
            {
                return Err(error);
            }
            if Instant::now() >= deadline {
                let mut logs = String::new();
                for log in ["etcd", "kube-apiserver"] {
                    let path = process::log_path(&self.lab_dir, log);
                    logs.push_str(&format!("--- {log} ---\n{}\n", tail(&path, 20)));
                }
                return Err(Error::Setup(format!(
                    "timed out after {timeout:?} waiting for {what}\n{logs}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// etcd and the API server as they are now.
    pub fn states(&self) -> Vec<ProcessState> {
        self.processes().iter_mut().map(Managed::state).collect()
    }

    /// Stops the API server, then etcd; the failures.
    pub fn stop(&mut self) -> Vec<String> {
        let processes = self
            .processes
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let mut errors = Vec::new();
        while let Some(mut p) = processes.pop() {
            if let Err(e) = p.stop(GRACE) {
                errors.push(e);
            }
        }
        errors
    }

    fn processes(&self) -> std::sync::MutexGuard<'_, Vec<Managed>> {
        self.processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
