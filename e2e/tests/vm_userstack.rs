//! The user-space stack on DPDK on a VM node: a lab with one VM node (qemu/TCG, an emulated
//! Intel IOMMU, the virtio-net data NIC `eth1` at 0000:00:03.0 with iommu_platform), and one
//! NetworkTuning that gives it hugepages, binds the data NIC to vfio-pci and runs
//! `userspaceStack` with backend Dpdk on core 1. The guest's agent (in its 9p chroot of the
//! host root) starts the runner `hoststack-userstack` built with `--features dpdk`, which
//! takes the device through DPDK's EAL and virtio PMD. A client namespace on the lab bridge
//! (which the data NIC's tap reaches) fetches the http service with curl and talks to the
//! echo service with kernel TCP, byte-exact, with TCP checksum offload on both ways (the
//! runner's stats); then the tuning is deleted and the agent stops the runner and gives the
//! NIC back to virtio-pci.
//!
//! A second test, on a VM node of its own with the data NIC on virtio_net (qemu `rss=on`),
//! is the steering proof:
//! a non-default RSS key (`ethtool -X eth1 hkey ...` in the guest; the channels stay at the
//! boot count, see docs/vm-node.md); TCP SYNs from the client namespace with chosen source
//! ports land on the rx queue the stack's `RssTable::queue` predicts from the key and table
//! `ethtool -x` shows (the queue counters of `ethtool -S`); and a tuning with backend AfXdp
//! on `eth1` makes the guest's agent read that same key and table (through the
//! `ETHTOOL_GRSSH` ioctl: the guest's Linux 6.1 predates `ETHTOOL_MSG_RSS_GET`) and hand them
//! to the runner (its `config.json`), which reports steering source `nic` with that key in
//! the NodeTuning status.
//!
//! A correctness proof under TCG emulation, not a speed figure: the counts are small and
//! every wait is bounded by a budget of the guest's progress (`Vm::wait_for`). The DPDK-featured runner is built by this test into
//! `<target>/dpdk/` (`cargo build -p userstack-runner --features dpdk --bin hoststack-userstack
//! --target-dir <target>/dpdk`), so the workspace's default build needs no DPDK;
//! `HOSTSTACK_DPDK_RUNNER` names a runner built elsewhere instead.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hoststack_e2e::vm::{Vm, DATA_IF, DATA_PCI};
use hoststack_e2e::{Lab, LabConfig, NodeSpec};
use userstack::rss::{to_hex, RssTable, MICROSOFT_KEY};

const NODE: &str = "vm-dpdk";
/// How long the guest's agent may take to apply a revision and start the stack (TCG).
const CONVERGE: Duration = Duration::from_secs(300);
/// The http service's body.
const BODY: &str = "hoststack userstack on DPDK in a VM\n";
/// The stack's core: the guest has CPUs 0 and 1, the agent keeps 0.
const CORE: u32 = 1;

/// Builds (or finds, `HOSTSTACK_DPDK_RUNNER`) the runner with the feature `dpdk`.
fn dpdk_runner() -> PathBuf {
    if let Some(path) = std::env::var_os("HOSTSTACK_DPDK_RUNNER") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // <target>/<profile>/deps/<test>: the target dir is three levels up.
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary lives in <target>/<profile>/deps")
        .to_path_buf();
    let target_dir = target.join("dpdk");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let started = Instant::now();
    let out = Command::new(&cargo)
        .current_dir(repo)
        .args([
            "build",
            "--quiet",
            "-p",
            "userstack-runner",
            "--features",
            "dpdk",
            "--bin",
            "hoststack-userstack",
            "--target-dir",
        ])
        .arg(&target_dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building the DPDK runner needs dpdk-dev and libclang (scripts/setup.sh installs \
         them): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "DPDK runner built (or up to date) in {:?}",
        started.elapsed()
    );
    target_dir.join("debug").join("hoststack-userstack")
}

/// A client namespace on the lab bridge with one veth; deleted (with its veth) when dropped.
struct ClientNs {
    name: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl ClientNs {
    fn create(k: u8) -> ClientNs {
        let name = format!("hs{k}-vm-dpdk-client");
        ip(&["netns", "add", &name]);
        let ns = ClientNs { name };
        let veth = format!("hs{k}n251");
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ]);
        ip(&["link", "set", &veth, "master", &format!("hs{k}br"), "up"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("198.18.{k}.251/24"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &ns.name, "link", "set", "eth0", "up"]);
        ns
    }
}

impl Drop for ClientNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}

/// The node's NodeTuning status (`null` until there is one).
fn status(lab: &Lab) -> serde_json::Value {
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", "json"]);
    if !out.status.success() {
        return serde_json::Value::Null;
    }
    let object: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    object["status"].clone()
}

/// What the guest says about the runner: its log under the agent's state dir and the
/// agent's last lines.
fn runner_diagnostics(vm: &Vm) -> String {
    let runner = vm.exec("tail -n 60 /run/hoststack/state/userstack/runner.log");
    let agent = std::fs::read_to_string(vm.agent_log()).unwrap_or_default();
    let tail: Vec<&str> = agent.lines().rev().take(30).collect();
    format!(
        "runner.log:\n{}{}\nagent log (last lines, newest first):\n{}",
        runner.stdout,
        runner.stderr,
        tail.join("\n")
    )
}

/// Waits for `check` on the status while [`CONVERGE`]'s worth of the guest's progress lasts;
/// panics with the runner's log and the guest's state.
fn await_status(
    lab: &Lab,
    vm: &Vm,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    vm.wait_for(CONVERGE, || {
        last = status(lab);
        check(&last).then(|| last.clone())
    })
    .unwrap_or_else(|why| {
        panic!(
            "{what}: not within a budget of {CONVERGE:?} of the guest's progress ({why}); \
             status {last:#}\n{}\n{}",
            runner_diagnostics(vm),
            vm.guest_state()
        )
    })
}

/// Sends `payload` to the echo service from namespace `ns` and reads as many bytes back.
fn echo_from(ns: &str, addr: SocketAddr, payload: Vec<u8>) -> Vec<u8> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        hoststack_e2e::clients::enter(&ns).expect("entering the client namespace");
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let writer = {
            let mut stream = stream.try_clone().expect("clone");
            let payload = payload.clone();
            std::thread::spawn(move || stream.write_all(&payload))
        };
        let mut back = vec![0u8; payload.len()];
        stream
            .read_exact(&mut back)
            .unwrap_or_else(|e| panic!("reading the echo from {addr}: {e}"));
        writer
            .join()
            .expect("writer")
            .expect("writing to the echo service");
        back
    })
    .join()
    .expect("the echo client")
}

/// `curl` of `url` from namespace `ns`: the body.
fn curl_from(ns: &str, url: &str) -> Vec<u8> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-sS",
            "--max-time",
            "60",
            "-o",
            "-",
            url,
        ])
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `ethtool -x` of the data NIC in the guest: its RSS key and indirection table, with the
/// hash function checked to be Toeplitz.
fn ethtool_rss(vm: &Vm) -> RssTable {
    let out = vm.run(&format!("ethtool -x {DATA_IF}"));
    let mut lines = out.lines();
    let mut indirection = Vec::new();
    let mut key = Vec::new();
    while let Some(line) = lines.next() {
        let line = line.trim();
        if let Some((index, queues)) = line.split_once(':') {
            if index.chars().all(|c| c.is_ascii_digit()) && !index.is_empty() {
                indirection.extend(queues.split_whitespace().map(|q| {
                    q.parse::<u32>()
                        .unwrap_or_else(|_| panic!("queue {q:?} in {out}"))
                }));
                continue;
            }
        }
        if line.starts_with("RSS hash key") {
            let hex = lines.next().expect("a key line").trim();
            key = hex
                .split(':')
                .map(|b| u8::from_str_radix(b, 16).unwrap_or_else(|_| panic!("{hex}")))
                .collect();
        }
    }
    assert!(
        out.contains("toeplitz: on"),
        "the data NIC does not hash with Toeplitz:\n{out}"
    );
    assert!(!key.is_empty() && !indirection.is_empty(), "{out}");
    RssTable { key, indirection }
}

/// The received-packet counters of the data NIC's rx queues (`ethtool -S`).
fn rx_queue_packets(vm: &Vm) -> Vec<u64> {
    let out = vm.run(&format!("ethtool -S {DATA_IF}"));
    let mut counters: Vec<(u32, u64)> = out
        .lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            let queue = name.strip_prefix("rx_queue_")?.strip_suffix("_packets")?;
            Some((queue.parse().ok()?, value.trim().parse().ok()?))
        })
        .collect();
    counters.sort_unstable();
    assert!(!counters.is_empty(), "no rx queue counters in\n{out}");
    counters.into_iter().map(|(_, n)| n).collect()
}

/// A non-blocking TCP connect from local port `port` to `to` in the calling thread's
/// namespace (std cannot bind before connecting): the SYN is on its way when this returns.
fn connect_from_port(port: u16, to: SocketAddrV4) -> std::io::Result<OwnedFd> {
    let address = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is new and nobody else's.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    let local = address(Ipv4Addr::UNSPECIFIED, port);
    let remote = address(*to.ip(), to.port());
    // SAFETY: setsockopt, bind and connect with pointers to live values of the given sizes.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        if libc::bind(
            fd.as_raw_fd(),
            (&local as *const libc::sockaddr_in).cast(),
            len,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        if libc::connect(
            fd.as_raw_fd(),
            (&remote as *const libc::sockaddr_in).cast(),
            len,
        ) != 0
        {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(error);
            }
        }
    }
    Ok(fd)
}

/// Sends `count` TCP SYNs from port `port` of namespace `ns` to `to`: each a non-blocking
/// connect closed at once (a socket closed in SYN-SENT sends nothing more).
fn send_syns(ns: &str, port: u16, to: SocketAddrV4, count: usize) {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        hoststack_e2e::clients::enter(&ns).expect("entering the client namespace");
        for _ in 0..count {
            let socket = connect_from_port(port, to)
                .unwrap_or_else(|e| panic!("a SYN from :{port} to {to}: {e}"));
            // Let the SYN leave before the socket goes.
            std::thread::sleep(Duration::from_millis(20));
            drop(socket);
        }
    })
    .join()
    .expect("the SYN sender");
}

/// The steering proof on the virtio data NIC (see the module doc); leaves no tuning behind.
fn step_rss_steering(lab: &Lab, vm: &Vm, client: &ClientNs, k: u8, mac: &str) {
    // A key no driver uses by default.
    let key: Vec<u8> = (0..40u32).map(|i| (i * 37 + 11) as u8).collect();
    let colons: Vec<String> = key.iter().map(|b| format!("{b:02x}")).collect();
    vm.run(&format!(
        "ip link set {DATA_IF} up && ethtool -X {DATA_IF} hkey {}",
        colons.join(":")
    ));
    let table = ethtool_rss(vm);
    assert_eq!(table.key, key, "ethtool -X hkey did not take");
    let queues = rx_queue_packets(vm).len() as u32;
    eprintln!(
        "eth1 RSS: {}-byte key {}, {} entries over {queues} rx queues",
        table.key.len(),
        to_hex(&table.key),
        table.indirection.len()
    );
    assert!(table.indirection.iter().all(|&q| q < queues), "{table:?}");

    // (b) The table predicts the queue the NIC puts each flow on.
    let client_ip = Ipv4Addr::new(198, 18, k, 251);
    let target = SocketAddrV4::new(Ipv4Addr::new(198, 18, k, 248), 7);
    ip(&[
        "-n",
        &client.name,
        "neigh",
        "replace",
        &target.ip().to_string(),
        "lladdr",
        mac,
        "dev",
        "eth0",
        "nud",
        "permanent",
    ]);
    const SYNS: usize = 5;
    let mut seen = vec![0u32; queues as usize];
    for port in 41000..41016u16 {
        // The NIC's source is the client, its destination the guest.
        let predicted = table.queue(SocketAddrV4::new(client_ip, port), target);
        let before = rx_queue_packets(vm);
        send_syns(&client.name, port, target, SYNS);
        let after = rx_queue_packets(vm);
        let moved: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        let landed = (0..queues)
            .filter(|&q| moved[q as usize] >= SYNS as u64)
            .collect::<Vec<_>>();
        assert_eq!(
            landed,
            [predicted],
            "{SYNS} SYNs from port {port}: rx queue packets moved by {moved:?}, the table \
             predicts queue {predicted}"
        );
        seen[predicted as usize] += 1;
    }
    eprintln!("16 flows, each on the predicted rx queue; flows per queue: {seen:?}");
    assert!(
        seen.iter().filter(|&&n| n > 0).count() > 1,
        "all flows on one queue prove nothing about the hash: {seen:?}"
    );

    // (a) The agent reads the same key and table and hands them to an AF_XDP runner.
    let stack_ip = Ipv4Addr::new(198, 18, k, 249);
    let yaml = format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: vm-afxdp\n\
         spec:\n  nodeSelector:\n    matchLabels:\n      pool: vm-dpdk\n  userspaceStack:\n    \
         cores: \"{CORE}\"\n    interface: {DATA_IF}\n    backend: AfXdp\n    address: \
         {stack_ip}/24\n    services:\n    - kind: Echo\n      port: 7\n"
    );
    lab.apply_yaml(&yaml)
        .unwrap_or_else(|e| panic!("kubectl apply of\n{yaml}\nfailed: {e}"));
    let running = await_status(lab, vm, "the AF_XDP stack's steering", |s| {
        s["userspaceStack"]["steering"]["source"].is_string()
    });
    let steering = &running["userspaceStack"]["steering"];
    eprintln!("status.userspaceStack: {:#}", running["userspaceStack"]);
    let config: serde_json::Value =
        serde_json::from_str(&vm.run("cat /run/hoststack/state/userstack/config.json"))
            .expect("the runner's config is JSON");
    assert_eq!(config["rss"]["key"], to_hex(&key), "{config:#}");
    let indirection: Vec<u32> = serde_json::from_value(config["rss"]["indirection"].clone())
        .expect("the table is a list of queues");
    assert_eq!(indirection, table.indirection, "{config:#}");
    assert_eq!(steering["source"], "nic", "{steering:#}");
    assert_eq!(steering["key"], to_hex(&key), "{steering:#}");
    assert_eq!(
        steering["indirectionSize"],
        table.indirection.len(),
        "{steering:#}"
    );
    let out = lab.kubectl(&["delete", "networktuning", "vm-afxdp", "--wait=true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    await_status(lab, vm, "the AF_XDP stack's revert", |s| {
        s["state"] == "Reverted" && s["userspaceStack"].is_null()
    });
    assert!(
        !vm.exec("pgrep -x hoststack-users").success(),
        "an AF_XDP runner is left in the guest"
    );
    ip(&[
        "-n",
        &client.name,
        "neigh",
        "del",
        &target.ip().to_string(),
        "dev",
        "eth0",
    ]);
}

/// A lab whose only node is the VM node (pool=vm-dpdk), its agent starting `runner`.
fn vm_lab(runner: &std::path::Path) -> Lab {
    let mut config = LabConfig::with_nodes(0);
    config
        .nodes
        .push(NodeSpec::vm(NODE).label("pool", "vm-dpdk"));
    config.agent_args = vec!["--userstack-binary".into(), runner.display().to_string()];
    let lab = Lab::start(config).expect("lab with a VM node starts");
    let vm = lab.vm(NODE);
    eprintln!(
        "VM node {NODE}: prepared in {:?}, guest ready in {:?}",
        vm.prepared_in(),
        vm.booted_in()
    );
    assert_eq!(vm.pci_driver(DATA_PCI), "virtio-pci");
    lab
}

/// The data NIC's MAC address.
fn data_mac(vm: &Vm) -> String {
    vm.run(&format!("cat /sys/class/net/{DATA_IF}/address"))
        .trim()
        .to_string()
}

#[test]
fn vm_node_steers_flows_like_its_nic() {
    let lab = vm_lab(&dpdk_runner());
    let vm = lab.vm(NODE);
    let k = lab.index();
    let client = ClientNs::create(k);
    let mac = data_mac(vm);
    let started = Instant::now();
    step_rss_steering(&lab, vm, &client, k, &mac);
    eprintln!("the RSS steering step took {:?}", started.elapsed());
    drop(client);
    lab.stop()
        .expect("the lab stops cleanly (VM powered off, taps removed)");
}

#[test]
fn vm_node_serves_from_the_userstack_on_dpdk() {
    let lab = vm_lab(&dpdk_runner());
    let vm = lab.vm(NODE);
    let k = lab.index();
    let client = ClientNs::create(k);
    let stack_ip = Ipv4Addr::new(198, 18, k, 250);
    let mac = data_mac(vm);

    let applied = Instant::now();
    let yaml = format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: vm-dpdk\n\
         spec:\n  nodeSelector:\n    matchLabels:\n      pool: vm-dpdk\n  hugepages:\n  \
         - size: 2Mi\n    numaNode: 0\n    count: 64\n  - size: 2Mi\n    numaNode: 1\n    \
         count: 64\n  interfaces:\n  - match:\n      name: {DATA_IF}\n    dpdk:\n      \
         driver: vfio-pci\n  userspaceStack:\n    cores: \"{CORE}\"\n    interface: \
         \"{DATA_PCI}\"\n    backend: Dpdk\n    address: {stack_ip}/24\n    services:\n    \
         - kind: Echo\n      port: 7\n    - kind: Http\n      port: 80\n      body: {BODY:?}\n"
    );
    lab.apply_yaml(&yaml)
        .unwrap_or_else(|e| panic!("kubectl apply of\n{yaml}\nfailed: {e}"));
    let running = await_status(&lab, vm, "the stack on DPDK running", |s| {
        s["userspaceStack"]["state"] == "Running"
    });
    let took = applied.elapsed();
    eprintln!("tuning applied and the stack serving after {took:?}: {running:#}");
    let stack = &running["userspaceStack"];
    assert_eq!(stack["backend"], "Dpdk", "{stack:#}");
    assert_eq!(stack["mode"], "dpdk", "{stack:#}");
    assert_eq!(stack["cores"], CORE.to_string(), "{stack:#}");
    assert_eq!(stack["shards"][0]["core"], CORE, "{stack:#}");
    // A DPDK port is no netdev the agent could read: the runner's configured key.
    assert_eq!(stack["steering"]["source"], "configured", "{stack:#}");
    assert_eq!(
        stack["steering"]["key"],
        to_hex(&MICROSOFT_KEY),
        "{stack:#}"
    );
    assert_eq!(vm.pci_driver(DATA_PCI), "vfio-pci");
    let log = vm.run("cat /run/hoststack/state/userstack/runner.log");
    eprintln!("runner.log in the guest:\n{log}");
    assert!(
        log.contains("net_virtio"),
        "EAL did not probe the virtio PMD:\n{log}"
    );

    // http: curl from the client namespace, byte-exact, on fresh connections.
    let started = Instant::now();
    for _ in 0..3 {
        let body = curl_from(&client.name, &format!("http://{stack_ip}/"));
        assert_eq!(String::from_utf8_lossy(&body), BODY);
    }
    eprintln!("3 curl fetches over DPDK took {:?}", started.elapsed());
    // The answers came from the data NIC's MAC, now driven by DPDK.
    let neighbour = Command::new("ip")
        .args(["-n", &client.name, "neigh", "show", &stack_ip.to_string()])
        .output()
        .expect("ip neigh");
    let neighbour = String::from_utf8_lossy(&neighbour.stdout).to_string();
    assert!(
        neighbour.contains(&mac),
        "{stack_ip} is at {neighbour}, not {mac}"
    );

    // echo: kernel TCP from the client, several segments and windows, byte-exact.
    let started = Instant::now();
    let addr = SocketAddr::from((stack_ip, 7));
    for size in [1usize, 1460, 64 * 1024] {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let back = echo_from(&client.name, addr, payload.clone());
        assert!(back == payload, "the echo of {size} bytes differs");
    }
    eprintln!(
        "echo of 1 B, 1460 B and 64 KiB over DPDK took {:?}",
        started.elapsed()
    );

    // The runner's own counters, reported by the agent.
    let counted = await_status(&lab, vm, "the shard's packet counters", |s| {
        let shard = &s["userspaceStack"]["shards"][0];
        shard["rxPackets"].as_u64().unwrap_or(0) > 50
            && shard["txPackets"].as_u64().unwrap_or(0) > 50
    });
    eprintln!("shard counters: {:#}", counted["userspaceStack"]["shards"]);
    // TCP checksum offload both ways: QEMU's tap netdev negotiates VIRTIO_NET_F_CSUM and
    // VIRTIO_NET_F_GUEST_CSUM, so the virtio PMD offers RTE_ETH_RX/TX_OFFLOAD_TCP_CKSUM and
    // the runner enables both (its own stats file: the status does not carry it); every
    // segment above arrived with a checksum the port vouched for or the device verified.
    let stats: serde_json::Value =
        serde_json::from_str(&vm.run("cat /run/hoststack/state/userstack/stats.json"))
            .expect("the runner's stats are JSON");
    assert_eq!(
        stats["checksumOffload"],
        serde_json::json!({ "rx": true, "tx": true }),
        "{stats:#}"
    );
    assert_eq!(
        stats["shards"][0]["drops"]["checksumErrors"], 0,
        "{stats:#}"
    );

    // Delete: the agent stops the runner first, then gives the NIC back to virtio-pci.
    let deleted = Instant::now();
    let out = lab.kubectl(&["delete", "networktuning", "vm-dpdk", "--wait=true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    await_status(&lab, vm, "the revert", |s| {
        s["state"] == "Reverted" && s["userspaceStack"].is_null()
    });
    eprintln!("reverted after {:?}", deleted.elapsed());
    assert!(
        !vm.exec("pgrep -x hoststack-users").success(),
        "a runner is left in the guest"
    );
    assert_eq!(vm.pci_driver(DATA_PCI), "virtio-pci");
    assert_eq!(
        vm.run(&format!("cat /sys/class/net/{DATA_IF}/address"))
            .trim(),
        mac
    );
    drop(client);
    lab.stop()
        .expect("the lab stops cleanly (VM powered off, taps removed)");
}
