//! The text of every file a real node needs: the holder's mount script, containerd's and the
//! kubelet's configuration, the CNI conflist and the node's one-service proxy rules. Pure: paths
//! and addresses in, text out.

use std::net::Ipv4Addr;
use std::path::Path;

/// Everything about one real node that its files mention.
#[derive(Clone, Debug)]
pub(crate) struct NodeFiles<'a> {
    /// Node name (also the hostname inside its UTS namespace).
    pub name: &'a str,
    /// The node's address (its eth0).
    pub ip: Ipv4Addr,
    /// The node's position in the lab, which picks its pod subnet.
    pub position: usize,
    /// The node's directory under the lab dir.
    pub dir: &'a Path,
    /// The kubelet's cgroup root, e.g. `/hoststack-lab3-node-a`.
    pub cgroup_root: &'a str,
    /// The lab CA certificate.
    pub ca_cert: &'a Path,
    /// The sandbox image, already imported.
    pub pause_image: &'a str,
    /// runc.
    pub runc: &'a Path,
}

/// The service range's first address: the `kubernetes` Service's ClusterIP.
pub(crate) const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);

/// The Services' range (the API server's `--service-cluster-ip-range`).
pub(crate) const SERVICE_RANGE: &str = "198.19.255.0/24";

/// Node i's pod subnet: 198.19.(96+i).0/24, inside the pods' range 198.19.96.0/19.
pub(crate) fn pod_subnet(position: usize) -> Result<String, String> {
    u8::try_from(position)
        .ok()
        .filter(|i| *i < 32)
        .map(|i| format!("198.19.{}.0/24", 96 + i))
        .ok_or_else(|| {
            format!(
                "at most 32 real nodes (pod subnets in 198.19.96.0/19), not {}",
                position + 1
            )
        })
}

/// The paths a node's processes use, all under its directory.
impl NodeFiles<'_> {
    /// containerd's socket.
    pub fn containerd_socket(&self) -> std::path::PathBuf {
        self.dir.join("containerd").join("containerd.sock")
    }

    /// The file the holder writes once its mounts are in place.
    pub fn holder_ready(&self) -> std::path::PathBuf {
        self.dir.join("holder-ready")
    }
}

/// Mount points the holder covers with a tmpfs of its own, so the kubelet's and containerd's
/// fixed paths (/var/lib/kubelet/device-plugins, /var/log/pods, /var/log/containers,
/// /var/lib/cni, /run/containerd/s, /run/netns/cni-*, /run/nri, the agent's /var/lib/hoststack)
/// are per node and vanish with its mount namespace. Nothing is created on the host.
pub(crate) const PRIVATE_TREES: [&str; 3] = ["/run", "/var/lib", "/var/log"];

/// The holder: run with `unshare --mount --uts --propagation private` inside the node's
/// network namespace. It covers [`PRIVATE_TREES`] with tmpfs, mounts a bpffs of the node's own
/// at /sys/fs/bpf (shared, for the agent's Bidirectional mount), sets the hostname, writes the
/// ready file and sleeps; containerd and the kubelet join its namespaces.
pub(crate) fn holder_script(node: &NodeFiles<'_>) -> String {
    let mut script = String::from("set -e\n");
    for tree in PRIVATE_TREES {
        script.push_str(&format!(
            "mount -t tmpfs -o mode=0755 hoststack-lab {tree}\n"
        ));
    }
    script.push_str(
        "mkdir -p /run/netns /run/nri /run/containerd /var/lib/kubelet /var/lib/cni \
         /var/lib/hoststack /var/log/pods /var/log/containers\n\
         mount -t bpf -o mode=0700 bpf /sys/fs/bpf\n\
         mount --make-shared /sys/fs/bpf\n",
    );
    script.push_str(&format!("hostname {}\n", node.name));
    script.push_str(&format!(
        "echo $$ > {}\nexec sleep infinity\n",
        node.holder_ready().display()
    ));
    script
}

/// containerd 2.x configuration (version 3): state under the node's directory, runc with a
/// root of its own, the lab's pause image pinned as the sandbox, the node's CNI conf dir, and
/// `restrict_oom_score_adj` (root here lacks CAP_SYS_RESOURCE).
pub(crate) fn containerd_config(node: &NodeFiles<'_>) -> String {
    let d = |sub: &str| node.dir.join(sub).display().to_string();
    format!(
        "version = 3\n\
         root = '{root}'\n\
         state = '{state}'\n\
         \n\
         [grpc]\n  address = '{socket}'\n\
         [ttrpc]\n  address = '{socket}.ttrpc'\n\
         [debug]\n  address = ''\n\
         \n\
         [plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = '{pause}'\n\
         \n\
         [plugins.'io.containerd.cri.v1.runtime']\n  restrict_oom_score_adj = true\n  enable_selinux = false\n\
         [plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dirs = ['/usr/lib/cni']\n  conf_dir = '{cni}'\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  BinaryName = '{runc}'\n  Root = '{runc_root}'\n  SystemdCgroup = false\n",
        root = d("containerd/root"),
        state = d("containerd/state"),
        socket = node.containerd_socket().display(),
        pause = node.pause_image,
        cni = d("cni"),
        runc = node.runc.display(),
        runc_root = d("runc"),
    )
}

/// The CNI conflist: a bridge `cni0` inside the node's namespace, the node's pod subnet from
/// host-local IPAM (its data under the node's directory), and loopback.
pub(crate) fn cni_conflist(node: &NodeFiles<'_>) -> Result<String, String> {
    let subnet = pod_subnet(node.position)?;
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "hoststack-lab",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": node.dir.join("ipam").display().to_string(),
                },
            },
            {"type": "loopback"},
        ],
    });
    Ok(format!("{conf:#}\n"))
}

/// The KubeletConfiguration, with the settings this machine needs: cgroupfs on cgroup v1
/// (`failCgroupV1: false`), a cgroup root of the node's own, no swap check, no node allocatable
/// enforcement, no resolv.conf, eviction thresholds a busy disk never reaches, x509 client
/// certificates from the lab CA and no webhook authn/authz.
pub(crate) fn kubelet_config(node: &NodeFiles<'_>) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         address: {ip}\n\
         port: 10250\n\
         readOnlyPort: 0\n\
         healthzBindAddress: 127.0.0.1\n\
         authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\n  x509:\n    clientCAFile: {ca}\n\
         authorization:\n  mode: AlwaysAllow\n\
         cgroupDriver: cgroupfs\n\
         cgroupRoot: {cgroup_root}\n\
         cgroupsPerQOS: true\n\
         failCgroupV1: false\n\
         failSwapOn: false\n\
         enforceNodeAllocatable: []\n\
         resolvConf: \"\"\n\
         containerRuntimeEndpoint: unix://{socket}\n\
         volumePluginDir: {plugins}\n\
         serializeImagePulls: false\n\
         imageGCHighThresholdPercent: 100\n\
         imageGCLowThresholdPercent: 99\n\
         evictionHard:\n  memory.available: 1Mi\n  nodefs.available: 1%\n  nodefs.inodesFree: 1%\n  imagefs.available: 1%\n\
         syncFrequency: 10s\n\
         nodeStatusUpdateFrequency: 5s\n\
         shutdownGracePeriod: 0s\n",
        ip = node.ip,
        ca = node.ca_cert.display(),
        cgroup_root = node.cgroup_root,
        socket = node.containerd_socket().display(),
        plugins = node.dir.join("volume-plugins").display(),
    )
}

/// nftables rules for the node's namespace standing in for kube-proxy's one Service the pods
/// need: the `kubernetes` Service (ClusterIP:443) goes to the API server, for host-network pods
/// (output) and pod-network pods (prerouting), whose traffic leaving eth0 is masqueraded.
pub(crate) fn service_proxy_rules(api: Ipv4Addr, api_port: u16) -> String {
    format!(
        "table ip hoststack-lab-proxy {{\n\
         \tchain prerouting {{\n\t\ttype nat hook prerouting priority -100; policy accept;\n\
         \t\tip daddr {svc} tcp dport 443 dnat to {api}:{api_port}\n\t}}\n\
         \tchain output {{\n\t\ttype nat hook output priority -100; policy accept;\n\
         \t\tip daddr {svc} tcp dport 443 dnat to {api}:{api_port}\n\t}}\n\
         \tchain postrouting {{\n\t\ttype nat hook postrouting priority 100; policy accept;\n\
         \t\tip saddr 198.19.96.0/19 oifname \"eth0\" masquerade\n\t}}\n\
         }}\n",
        svc = KUBERNETES_SERVICE_IP,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(dir: &Path) -> NodeFiles<'_> {
        NodeFiles {
            name: "node-b",
            ip: Ipv4Addr::new(198, 18, 3, 11),
            position: 1,
            dir,
            cgroup_root: "/hoststack-lab3-node-b",
            ca_cert: Path::new("/lab/pki/ca.crt"),
            pause_image: "hoststack.lab/pause:dev",
            runc: Path::new("/usr/sbin/runc"),
        }
    }

    #[test]
    fn pod_subnets_stay_inside_the_pod_range() {
        assert_eq!(pod_subnet(0).unwrap(), "198.19.96.0/24");
        assert_eq!(pod_subnet(31).unwrap(), "198.19.127.0/24");
        assert!(pod_subnet(32).unwrap_err().contains("at most 32"));
    }

    #[test]
    fn every_node_path_is_under_its_directory() {
        let dir = Path::new("/lab/nodes/node-b/kubelet");
        let n = node(dir);
        let containerd = containerd_config(&n);
        for line in containerd.lines().filter(|l| l.contains("= '/")) {
            let path = line.split('\'').nth(1).unwrap();
            assert!(
                path.starts_with("/lab/") || path == "/usr/lib/cni" || path == "/usr/sbin/runc",
                "{line}"
            );
        }
        assert!(containerd.contains("restrict_oom_score_adj = true"));
        assert!(containerd.contains("sandbox = 'hoststack.lab/pause:dev'"));
        let kubelet = kubelet_config(&n);
        assert!(kubelet.contains("cgroupRoot: /hoststack-lab3-node-b\n"));
        assert!(kubelet.contains("failCgroupV1: false\n"));
        assert!(kubelet.contains("address: 198.18.3.11\n"));
        assert!(kubelet.contains("volumePluginDir: /lab/nodes/node-b/kubelet/volume-plugins\n"));
    }

    #[test]
    fn the_holder_mounts_only_inside_its_own_namespace() {
        let dir = Path::new("/lab/nodes/node-b/kubelet");
        let script = holder_script(&node(dir));
        // Every mount is a new tmpfs or bpffs instance: no bind mount of a host path.
        for line in script.lines().filter(|l| l.starts_with("mount ")) {
            assert!(
                line.starts_with("mount -t tmpfs") || line.contains("bpf"),
                "{line}"
            );
        }
        assert!(script.ends_with("exec sleep infinity\n"));
        assert!(script.contains("hostname node-b\n"));
    }

    #[test]
    fn the_conflist_gives_the_node_its_own_subnet() {
        let dir = Path::new("/lab/nodes/node-b/kubelet");
        let conf: serde_json::Value =
            serde_json::from_str(&cni_conflist(&node(dir)).unwrap()).unwrap();
        assert_eq!(
            conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "198.19.97.0/24"
        );
    }

    #[test]
    fn the_proxy_sends_the_kubernetes_service_to_the_api_server() {
        let rules = service_proxy_rules(Ipv4Addr::new(198, 18, 3, 1), 6443);
        assert_eq!(
            rules
                .matches("ip daddr 198.19.255.1 tcp dport 443 dnat to 198.18.3.1:6443")
                .count(),
            2
        );
    }
}
