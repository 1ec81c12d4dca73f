//! Real nodes ([`crate::NodeKind::Kubelet`]): containerd and a kubelet inside each node's network
//! namespace, kube-controller-manager and kube-scheduler beside the API server, and the lab's
//! images (scripts/build-images.sh) imported into every node's containerd.
//!
//! Per node, a holder process (`unshare --mount --uts --propagation private` inside the node's
//! network namespace) covers the kubelet's and containerd's fixed paths with tmpfs mounts of its
//! own (see [`files::holder_script`]); containerd and the kubelet join its namespaces
//! (`nsenter -t <holder> -n -m -u`), so two kubelets never share /var/lib/kubelet/device-plugins
//! or /run/containerd/s and runc sees the kubelet's tmpfs for projected tokens. Each kubelet has
//! a cgroup root of its own (`/hoststack-lab<k>-<node>` in every hierarchy), or the kubelets
//! would delete each other's pod cgroups as orphans. The kubelet changes three host-wide
//! sysctls when it starts: they are saved in the lab directory first and written back at
//! teardown (and by the sweeper after a crash).
//!
//! Pods reach the API server through the `kubernetes` Service's ClusterIP: there is no
//! kube-proxy, so each node namespace gets nftables rules for that one Service
//! ([`files::service_proxy_rules`]).

mod files;
mod host;

use super::control_plane::pki;
use super::network::free_port;
use crate::command::{cmd, output, run};
use crate::process::{processes_of, send_signal, Managed, Spawner};
use crate::{Error, Result, Signal};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The image with the operator and the agent that every real node has imported.
pub const LAB_IMAGE: &str = "hoststack.lab/hoststack:dev";

/// The sandbox image of every real node.
const PAUSE_IMAGE: &str = "hoststack.lab/pause:dev";

/// How long kubelets, containerd and the controllers get between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// File in the lab directory with the host sysctls as they were before the first kubelet.
const SAVED_SYSCTLS: &str = "host-sysctls";

/// One node to make real.
pub(crate) struct NodeInput<'a> {
    /// Node name.
    pub name: &'a str,
    /// Its network namespace (under /run/netns).
    pub netns: &'a str,
    /// Its eth0 address.
    pub ip: Ipv4Addr,
    /// Its position in the lab (picks the pod subnet).
    pub position: usize,
    /// Labels the kubelet registers the Node with.
    pub labels: Vec<(String, String)>,
}

/// What the pool needs from the lab.
pub(crate) struct PoolInput<'a> {
    /// The lab index k.
    pub index: u8,
    /// The lab directory.
    pub lab_dir: &'a Path,
    /// The repository root (for scripts/build-images.sh).
    pub repo: &'a Path,
    /// The directory with the hoststack-operator and hoststack-agent the image is built from.
    pub workload_bin: &'a Path,
    /// The directory with kubelet, kube-controller-manager, kube-scheduler, containerd, ctr and
    /// containerd-shim-runc-v2.
    pub control_plane_bin: &'a Path,
    /// The lab PKI's directory (CA, service-account key).
    pub pki_dir: &'a Path,
    /// The API server's URL and address.
    pub api_url: &'a str,
    /// The API server's address and port, for the nodes' Service rules.
    pub api: (Ipv4Addr, u16),
    /// Where the controllers serve their health endpoints (the lab's loopback address).
    pub loopback: Ipv4Addr,
    /// The nodes.
    pub nodes: Vec<NodeInput<'a>>,
    /// Starts the lab's processes.
    pub spawner: &'a Spawner,
}

/// The real nodes of one lab and the controllers they need; [`Pool::teardown`] removes it all.
pub(crate) struct Pool {
    lab_dir: PathBuf,
    index: u8,
    controllers: Vec<Managed>,
    nodes: Vec<RealNode>,
    saved_sysctls: Option<String>,
}

struct RealNode {
    name: String,
    cgroup_root: String,
    holder: Option<Managed>,
    containerd: Option<Managed>,
    kubelet: Option<Managed>,
}

impl Pool {
    /// Builds the lab images, starts kube-controller-manager and kube-scheduler, and per node
    /// the holder, containerd (with the images imported) and the kubelet. Returns once every
    /// kubelet is started; the caller waits for the Nodes to be Ready. On failure everything
    /// started so far is removed again.
    pub fn start(input: &PoolInput<'_>) -> Result<Pool> {
        let mut pool = Pool {
            lab_dir: input.lab_dir.to_path_buf(),
            index: input.index,
            controllers: Vec::new(),
            nodes: Vec::new(),
            saved_sysctls: None,
        };
        match pool.boot(input) {
            Ok(()) => Ok(pool),
            Err(e) => {
                let errors = pool.teardown();
                if errors.is_empty() {
                    Err(e)
                } else {
                    Err(Error::Setup(format!(
                        "{e}; and removing the partial pool: {}",
                        errors.join("; ")
                    )))
                }
            }
        }
    }

    fn boot(&mut self, input: &PoolInput<'_>) -> Result<()> {
        let saved = host::save_sysctls().map_err(Error::Setup)?;
        write(&self.lab_dir.join(SAVED_SYSCTLS), &saved)?;
        self.saved_sysctls = Some(saved);
        let images = build_images(input.repo, input.workload_bin, &self.lab_dir.join("images"))?;
        self.start_controllers(input)?;
        let bin = |name: &str| input.control_plane_bin.join(name);
        let runc = which("runc")?;
        let ca = input.pki_dir.join("ca.crt");
        for node in &input.nodes {
            let dir = self.lab_dir.join("nodes").join(node.name).join("kubelet");
            let cgroup_root = cgroup_root(self.index, node.name);
            let files = files::NodeFiles {
                name: node.name,
                ip: node.ip,
                position: node.position,
                dir: &dir,
                cgroup_root: &cgroup_root,
                ca_cert: &ca,
                pause_image: PAUSE_IMAGE,
                runc: &runc,
            };
            for sub in [
                "containerd",
                "cni",
                "ipam",
                "runc",
                "root",
                "volume-plugins",
            ] {
                mkdir(&dir.join(sub))?;
            }
            self.nodes.push(RealNode {
                name: node.name.to_string(),
                cgroup_root: cgroup_root.clone(),
                holder: None,
                containerd: None,
                kubelet: None,
            });
            let real = self.nodes.last_mut().expect("just pushed");
            host::create_cgroup_root(&cgroup_root).map_err(Error::Setup)?;

            // The holder, and the node's one-Service proxy and forwarding for pod networking.
            let netns = format!("--net=/run/netns/{}", node.netns);
            let holder_args = vec![
                netns.clone(),
                "unshare".into(),
                "--mount".into(),
                "--uts".into(),
                "--propagation".into(),
                "private".into(),
                "sh".into(),
                "-c".into(),
                files::holder_script(&files),
            ];
            let holder = input.spawner.spawn(
                &format!("holder {}", node.name),
                Path::new("nsenter"),
                &holder_args,
                &[],
            )?;
            let holder_pid = holder.pid().to_string();
            real.holder = Some(holder);
            await_file(
                &files.holder_ready(),
                real.holder.as_mut(),
                "the holder's mounts",
            )?;
            run(
                &mut cmd("nsenter", &[netns.as_str(), "nft", "-f", "-"]),
                Some(files::service_proxy_rules(input.api.0, input.api.1).as_bytes()),
            )?;
            run(
                &mut cmd(
                    "nsenter",
                    &[netns.as_str(), "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                ),
                None,
            )?;
            // Host-network clients need a route to the ClusterIP for their connect to reach the
            // output hook's DNAT at all (the namespace has no default route).
            run(
                &mut cmd(
                    "ip",
                    &[
                        "-n",
                        node.netns,
                        "route",
                        "add",
                        files::SERVICE_RANGE,
                        "via",
                        &input.api.0.to_string(),
                        "dev",
                        "eth0",
                    ],
                ),
                None,
            )?;
            let join = |program: &Path| -> Vec<String> {
                vec![
                    "-t".into(),
                    holder_pid.clone(),
                    "-n".into(),
                    "-m".into(),
                    "-u".into(),
                    program.display().to_string(),
                ]
            };

            // containerd, with the lab's images.
            let containerd_toml = dir.join("containerd.toml");
            write(&containerd_toml, &files::containerd_config(&files))?;
            write(
                &dir.join("cni").join("10-hoststack-lab.conflist"),
                &files::cni_conflist(&files).map_err(Error::Setup)?,
            )?;
            let mut args = join(&bin("containerd"));
            args.extend(["--config".into(), containerd_toml.display().to_string()]);
            let path = format!(
                "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                input.control_plane_bin.display()
            );
            let env = [("PATH".to_string(), path)];
            real.containerd = Some(input.spawner.spawn(
                &format!("containerd {}", node.name),
                Path::new("nsenter"),
                &args,
                &env,
            )?);
            let socket = files.containerd_socket();
            let ctr = |args: &[&str]| {
                let mut all = vec!["--address", socket.to_str().expect("UTF-8 lab paths")];
                all.extend(args);
                cmd(bin("ctr").to_str().expect("UTF-8 lab paths"), &all)
            };
            await_ok(
                "containerd's socket",
                Duration::from_secs(30),
                real.containerd.as_mut(),
                || output(&mut ctr(&["version"]), None).is_ok_and(|o| o.status.success()),
            )?;
            for archive in &images {
                run(
                    &mut ctr(&[
                        "-n",
                        "k8s.io",
                        "images",
                        "import",
                        archive.to_str().expect("UTF-8 lab paths"),
                    ]),
                    None,
                )?;
            }

            // The kubelet.
            let (cert, key) = pki::client_certificate(
                input.pki_dir,
                &format!("kubelet-{}", node.name),
                &format!("/O=system:nodes/CN=system:node:{}", node.name),
            )?;
            let kubeconfig = dir.join("kubelet.kubeconfig");
            pki::write_kubeconfig(
                &kubeconfig,
                input.api_url,
                &ca,
                &format!("system:node:{}", node.name),
                pki::Credentials::Certificate {
                    cert: &cert,
                    key: &key,
                },
            )?;
            let kubelet_yaml = dir.join("kubelet.yaml");
            write(&kubelet_yaml, &files::kubelet_config(&files))?;
            let labels = node
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut args = join(&bin("kubelet"));
            args.extend([
                format!("--config={}", kubelet_yaml.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--root-dir={}", dir.join("root").display()),
                format!("--node-ip={}", node.ip),
                format!("--hostname-override={}", node.name),
                format!("--node-labels={labels}"),
            ]);
            real.kubelet = Some(input.spawner.spawn(
                &format!("kubelet {}", node.name),
                Path::new("nsenter"),
                &args,
                &env,
            )?);
        }
        Ok(())
    }

    /// kube-controller-manager (every controller but node IPAM, per-controller service
    /// accounts) and kube-scheduler, each with a client certificate from the lab CA.
    fn start_controllers(&mut self, input: &PoolInput<'_>) -> Result<()> {
        for (name, subject) in [
            (
                "kube-controller-manager",
                "/CN=system:kube-controller-manager",
            ),
            ("kube-scheduler", "/CN=system:kube-scheduler"),
        ] {
            let (cert, key) = pki::client_certificate(input.pki_dir, name, subject)?;
            let kubeconfig = self.lab_dir.join(format!("{name}.kubeconfig"));
            pki::write_kubeconfig(
                &kubeconfig,
                input.api_url,
                &input.pki_dir.join("ca.crt"),
                subject.trim_start_matches("/CN="),
                pki::Credentials::Certificate {
                    cert: &cert,
                    key: &key,
                },
            )?;
            let mut args = vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                "--leader-elect=false".to_string(),
                format!("--bind-address={}", input.loopback),
                format!("--secure-port={}", free_port(input.loopback)?),
            ];
            if name == "kube-controller-manager" {
                args.extend([
                    "--use-service-account-credentials=true".to_string(),
                    "--controllers=*,-nodeipam".to_string(),
                    format!(
                        "--service-account-private-key-file={}",
                        input.pki_dir.join("sa.key").display()
                    ),
                    format!("--root-ca-file={}", input.pki_dir.join("ca.crt").display()),
                ]);
            }
            let process =
                input
                    .spawner
                    .spawn(name, &input.control_plane_bin.join(name), &args, &[])?;
            self.controllers.push(process);
        }
        Ok(())
    }

    /// The running processes of the pool as (name, pid): the controllers, and per node its
    /// holder, containerd and kubelet.
    pub fn processes(&mut self) -> Vec<(String, u32)> {
        let mut list = Vec::new();
        for p in self.controllers.iter_mut().chain(
            self.nodes
                .iter_mut()
                .flat_map(|n| [&mut n.holder, &mut n.containerd, &mut n.kubelet])
                .flatten(),
        ) {
            if p.exited().is_none() {
                list.push((p.name.clone(), p.pid()));
            }
        }
        list
    }

    /// The processes named `program` (their `comm`) in the pods of node `node`: those in the
    /// node's cgroup root. `None` when the pool has no node `node`.
    pub fn pod_processes(&self, node: &str, program: &str) -> Option<Vec<u32>> {
        let node = self.nodes.iter().find(|n| n.name == node)?;
        let in_root = format!(":{}/", node.cgroup_root);
        let pids = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let file = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}"));
                file("comm").is_ok_and(|c| c.trim_end() == program)
                    && file("cgroup").is_ok_and(|c| c.lines().any(|l| l.contains(&in_root)))
            })
            .collect();
        Some(pids)
    }

    /// The path at which `path` inside node `node`'s mount namespace (e.g. the agent's
    /// /var/lib/hoststack, a tmpfs of its own) is seen from here: under its holder's
    /// `/proc/<pid>/root`. `None` when the pool has no such node or its holder is gone.
    pub fn node_path(&mut self, node: &str, path: &Path) -> Option<PathBuf> {
        let node = self.nodes.iter_mut().find(|n| n.name == node)?;
        let holder = node.holder.as_mut()?;
        holder.exited().is_none().then_some(())?;
        let inside = path.strip_prefix("/").unwrap_or(path);
        Some(
            Path::new("/proc")
                .join(holder.pid().to_string())
                .join("root")
                .join(inside),
        )
    }

    /// Stops the kubelets, then containerd, kills every pod (by the nodes' cgroups) and every
    /// shim, stops the holders (their mounts go with their mount namespaces), removes the
    /// cgroups, restores the host sysctls and stops the controllers. Returns the failures.
    pub fn teardown(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        let stop_all = |processes: Vec<&mut Managed>, errors: &mut Vec<String>| {
            for p in &processes {
                let _ = send_signal(p.pid(), Signal::Term);
            }
            let deadline = Instant::now() + GRACE;
            for p in processes {
                let left = deadline.saturating_duration_since(Instant::now());
                if p.wait_timeout(left).is_none() {
                    if let Err(e) = p.kill() {
                        errors.push(e);
                    }
                }
            }
        };
        stop_all(
            self.nodes
                .iter_mut()
                .filter_map(|n| n.kubelet.as_mut())
                .collect(),
            &mut errors,
        );
        stop_all(
            self.nodes
                .iter_mut()
                .filter_map(|n| n.containerd.as_mut())
                .collect(),
            &mut errors,
        );
        for node in &self.nodes {
            errors.extend(host::remove_cgroup_root(&node.cgroup_root));
        }
        kill_shims(&self.lab_dir);
        stop_all(
            self.nodes
                .iter_mut()
                .filter_map(|n| n.holder.as_mut())
                .collect(),
            &mut errors,
        );
        for node in &self.nodes {
            if host::cgroup_root_exists(&node.cgroup_root) {
                errors.push(format!(
                    "node {}: cgroup {} is left",
                    node.name, node.cgroup_root
                ));
            }
        }
        self.nodes.clear();
        if let Some(saved) = self.saved_sysctls.take() {
            errors.extend(host::restore_sysctls(&saved));
            let _ = std::fs::remove_file(self.lab_dir.join(SAVED_SYSCTLS));
        }
        stop_all(self.controllers.iter_mut().collect(), &mut errors);
        self.controllers.clear();
        errors
    }
}

/// Removes what a dead lab's real nodes left on the host: the pods (by cgroup) and their
/// cgroups, and the host sysctls (from the lab directory's saved copy). Its processes have
/// been killed by the sweeper already. Returns the failures.
pub(crate) fn sweep(index: u8, lab_dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let prefix = format!("hoststack-lab{index}-");
    let roots: std::collections::BTreeSet<String> = host::cgroup_hierarchies()
        .unwrap_or_default()
        .iter()
        .filter_map(|h| std::fs::read_dir(h).ok())
        .flat_map(|entries| entries.flatten())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect();
    for root in roots {
        errors.extend(host::remove_cgroup_root(&format!("/{root}")));
    }
    if let Ok(saved) = std::fs::read_to_string(lab_dir.join(SAVED_SYSCTLS)) {
        errors.extend(host::restore_sysctls(&saved));
    }
    errors
}

/// Writes `values-lab.yaml` in `lab_dir`: the chart's values for a real pool (the image every
/// node imported, [`LAB_IMAGE`], never pulled) plus `extra` (YAML appended as is); its path.
pub(crate) fn chart_values(lab_dir: &Path, extra: &str) -> PathBuf {
    let (repository, tag) = LAB_IMAGE.rsplit_once(':').expect("the lab image has a tag");
    let path = lab_dir.join("values-lab.yaml");
    let values =
        format!("image:\n  repository: {repository}\n  tag: {tag}\n  pullPolicy: Never\n{extra}");
    std::fs::write(&path, values).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// The kubelet's cgroup root for `node` of lab k.
fn cgroup_root(index: u8, node: &str) -> String {
    format!("/hoststack-lab{index}-{node}")
}

/// Runs scripts/build-images.sh into `out` with the operator and agent from `binaries`; the
/// OCI archives of the operator/agent image and the pause image.
fn build_images(repo: &Path, binaries: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    let script = repo.join("scripts").join("build-images.sh");
    let mut build = cmd(script.to_str().expect("UTF-8 repo path"), &[out]);
    build
        .current_dir(repo)
        .env("HOSTSTACK_IMAGE_BINARIES", binaries);
    run(&mut build, None)?;
    Ok(["hoststack.oci", "pause.oci"]
        .iter()
        .map(|f| out.join(f))
        .collect())
}

/// containerd's shims outlive containerd by design; they carry the lab's marker.
fn kill_shims(lab_dir: &Path) {
    for pid in processes_of(lab_dir) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim().starts_with("containerd-shim") {
            let _ = send_signal(pid, Signal::Kill);
        }
    }
}

/// Waits until `path` exists, failing early when `process` exits.
fn await_file(path: &Path, process: Option<&mut Managed>, what: &str) -> Result<()> {
    await_ok(what, Duration::from_secs(10), process, || path.exists())
}

/// Polls `ready` for up to `timeout`, failing early (with its log) when `process` exits.
fn await_ok(
    what: &str,
    timeout: Duration,
    mut process: Option<&mut Managed>,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        if let Some(error) = process
            .as_deref_mut()
            .and_then(|p| p.exited_while_waiting(what))
        {
            return Err(error);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn which(program: &str) -> Result<PathBuf> {
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join(program))
    .find(|p| p.exists())
    .ok_or_else(|| {
        Error::Setup(format!(
            "{program} is missing: real nodes need it (scripts/setup.sh installs it)"
        ))
    })
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io(format!("creating {}", path.display()), e))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
