//! The lab itself: it starts, serves the API with the chart's RBAC, keeps nodes' network
//! stacks apart, and leaves nothing behind.

use hoststack_e2e::{Identity, Lab, LabConfig, NAMESPACE};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use std::process::Command;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
}

fn lines_of(program: &str, args: &[&str]) -> Vec<String> {
    let out = Command::new(program).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn lab_starts_serves_the_api_isolates_nodes_and_leaves_nothing_behind() {
    let lab = Lab::start(LabConfig::default()).expect("the lab starts");
    assert_eq!(lab.node_names(), ["node-a", "node-b", "node-c"]);

    // The Nodes with their labels.
    let edge = lab.kubectl(&["get", "nodes", "-l", "pool=edge", "-o", "name"]);
    assert_eq!(ok(edge, "get nodes"), "node/node-a\nnode/node-b");

    // The CRDs are served, with their documentation.
    let resources = ok(
        lab.kubectl(&["api-resources", "--api-group=hoststack.dev", "-o", "name"]),
        "api-resources",
    );
    assert!(
        resources.contains("networktunings.hoststack.dev"),
        "{resources}"
    );
    assert!(
        resources.contains("nodetunings.hoststack.dev"),
        "{resources}"
    );
    let explain = ok(
        lab.kubectl(&["explain", "networktuning.spec.sysctls"]),
        "kubectl explain",
    );
    assert!(explain.contains("sysctls"), "{explain}");

    // A kube client with the admin credentials (rustls, IP SANs) sees the same.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let nodes = runtime.block_on(async {
        let client = lab.client().await.expect("kube client");
        let nodes: Api<Node> = Api::all(client);
        let list = nodes.list(&Default::default()).await.expect("list nodes");
        list.items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect::<Vec<_>>()
    });
    assert_eq!(nodes, ["node-a", "node-b", "node-c"]);

    // The operator and agents run with the chart's least-privilege RBAC, not as admin.
    let can = |identity, args: &[&str]| {
        let mut argv = vec!["auth", "can-i"];
        argv.extend_from_slice(args);
        stdout(&lab.kubectl_as(identity, &argv, None)) == "yes"
    };
    assert!(can(
        Identity::Operator,
        &["watch", "networktunings.hoststack.dev"]
    ));
    assert!(can(
        Identity::Operator,
        &["create", "nodetunings.hoststack.dev"]
    ));
    assert!(!can(
        Identity::Operator,
        &["create", "networktunings.hoststack.dev"]
    ));
    assert!(!can(Identity::Operator, &["delete", "nodes"]));
    assert!(can(
        Identity::Operator,
        &["create", "leases.coordination.k8s.io", "-n", NAMESPACE]
    ));
    assert!(can(
        Identity::Agent,
        &["watch", "nodetunings.hoststack.dev"]
    ));
    assert!(can(
        Identity::Agent,
        &["patch", "nodetunings.hoststack.dev", "--subresource=status"]
    ));
    assert!(!can(
        Identity::Agent,
        &["patch", "nodetunings.hoststack.dev"]
    ));
    assert!(!can(Identity::Agent, &["list", "secrets", "-A"]));

    // The whole chart renders to objects the API server accepts (server-side dry run).
    let cp = hoststack_e2e::control_plane_dir();
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/hoststack");
    let helm_home = lab.dir().join("helm");
    let rendered = Command::new(cp.join("helm"))
        .args(["template", "hoststack", chart, "--namespace", NAMESPACE])
        .env("HELM_CACHE_HOME", helm_home.join("cache"))
        .env("HELM_CONFIG_HOME", helm_home.join("config"))
        .env("HELM_DATA_HOME", helm_home.join("data"))
        .output()
        .unwrap();
    let rendered = ok(rendered, "helm template");
    assert!(rendered.contains("kind: Deployment"), "{rendered}");
    let dry_run = lab.kubectl_as(
        Identity::Admin,
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&rendered),
    );
    ok(dry_run, "kubectl apply --dry-run=server of the chart");

    // Each node reaches the API server at the bridge address from inside its namespace.
    let url = lab.api_url().trim_start_matches("https://").to_string();
    let (host, port) = url.split_once(':').unwrap();
    for node in lab.node_names() {
        let probe = format!("exec 3<>/dev/tcp/{host}/{port}");
        let out = lab.exec_in_node(&node, &["bash", "-c", &probe]);
        ok(out, &format!("{node} connects to {url}"));
        let addr = ok(
            lab.exec_in_node(&node, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]),
            "ip addr",
        );
        assert!(addr.contains(&lab.node_ip(&node).to_string()), "{addr}");
    }

    // net.* sysctls are per node: a write in one namespace leaves the others alone.
    let root_sack = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_sack").unwrap();
    assert_eq!(lab.sysctl("node-a", "net.ipv4.tcp_sack"), "1");
    assert_eq!(lab.sysctl("node-b", "net.ipv4.tcp_sack"), "1");
    ok(
        lab.exec_in_node("node-a", &["sysctl", "-w", "net.ipv4.tcp_sack=0"]),
        "sysctl -w",
    );
    assert_eq!(lab.sysctl("node-a", "net.ipv4.tcp_sack"), "0");
    assert_eq!(lab.sysctl("node-b", "net.ipv4.tcp_sack"), "1");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_sack").unwrap(),
        root_sack
    );
    lab.write_sysctl("node-a", "net.ipv4.tcp_sack", "1");
    assert_eq!(lab.sysctl("node-a", "net.ipv4.tcp_sack"), "1");
    let rmem = lab.sysctl("node-c", "net.ipv4.tcp_rmem");
    assert_eq!(rmem.split(' ').count(), 3, "{rmem:?}");

    // The operator and one agent per node run; an extra operator replica runs beside them.
    lab.start_operator_replica("replica-2");
    let processes = lab.processes();
    let names: Vec<&str> = processes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "etcd",
            "kube-apiserver",
            "operator",
            "operator replica-2",
            "agent node-a",
            "agent node-b",
            "agent node-c"
        ]
    );
    for node in lab.node_names() {
        assert!(lab.agent_pid(&node).is_some(), "agent on {node}");
    }

    // Dropping the lab leaves nothing behind.
    let k = lab.index();
    let dir = lab.dir().to_path_buf();
    drop(lab);
    for (name, pid) in processes {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "{name} (pid {pid}) still runs"
        );
    }
    let netns_prefix = format!("hs{k}-");
    let namespaces = lines_of("ip", &["netns", "list"]);
    assert!(
        !namespaces.iter().any(|l| l.starts_with(&netns_prefix)),
        "{namespaces:?}"
    );
    let links = lines_of("ip", &["-o", "link", "show"]);
    let bridge = format!(": hs{k}br");
    let veth = format!(": hs{k}n");
    assert!(
        !links
            .iter()
            .any(|l| l.contains(&bridge) || l.contains(&veth)),
        "{links:?}"
    );
    let addrs = lines_of("ip", &["-4", "-o", "addr", "show"]);
    let subnet = format!(" 198.18.{k}.");
    assert!(!addrs.iter().any(|l| l.contains(&subnet)), "{addrs:?}");
    assert!(!dir.exists(), "{} remains", dir.display());
}

/// Set in the helper process of `a_killed_labs_leftovers_are_swept_by_the_next_lab`.
const HELPER_ENV: &str = "HOSTSTACK_E2E_OWNER_HELPER";

/// What the helper prints once its lab runs, followed by the lab index and directory.
const READY: &str = "HELPER-LAB-READY ";

/// Not a test of its own: the process that owns a lab and gets SIGKILLed. Does nothing unless
/// started by the test below.
#[test]
#[ignore = "helper process of a_killed_labs_leftovers_are_swept_by_the_next_lab"]
fn helper_owns_a_lab_until_killed() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let lab = Lab::start(LabConfig::with_nodes(2)).expect("the helper's lab starts");
    println!("{READY}{} {}", lab.index(), lab.dir().display());
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

#[test]
fn a_killed_labs_leftovers_are_swept_by_the_next_lab() {
    use std::io::BufRead;
    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "helper_owns_a_lab_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // libtest prints "test <name> ... " before the test's own output, on the same line.
    let stdout = std::io::BufReader::new(helper.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let line = stdout
            .lines()
            .map_while(Result::ok)
            .find_map(|l| Some(l[l.find(READY)? + READY.len()..].to_string()));
        let _ = tx.send(line);
    });
    let Ok(Some(line)) = rx.recv_timeout(std::time::Duration::from_secs(300)) else {
        let _ = helper.kill();
        panic!("the helper did not report its lab");
    };
    let mut parts = line.split(' ');
    let k: u8 = parts.next().unwrap().parse().unwrap();
    let dir = std::path::PathBuf::from(parts.next().unwrap());
    let environ_marker = format!("HOSTSTACK_LAB_DIR={}", dir.display());
    let lab_pids = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|pid: &u32| {
                std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                    env.split(|&b| b == 0)
                        .any(|e| e == environ_marker.as_bytes())
                })
            })
            .collect()
    };
    assert!(
        lab_pids().len() >= 4,
        "etcd, apiserver, operator, agents run"
    );

    // SIGKILL: no teardown runs. The lab's processes die with their owner (PDEATHSIG); the
    // namespaces, devices and directory stay.
    helper.kill().unwrap();
    helper.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !lab_pids().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        lab_pids(),
        Vec::<u32>::new(),
        "the lab's processes died with it"
    );
    let netns_prefix = format!("hs{k}-");
    assert!(lines_of("ip", &["netns", "list"])
        .iter()
        .any(|l| l.starts_with(&netns_prefix)));
    assert!(dir.exists());

    // The next lab sweeps them.
    let lab = Lab::start(LabConfig::with_nodes(1).control_plane_only()).expect("next lab");
    assert!(
        lab.dir() == dir || !dir.exists(),
        "{} was not swept",
        dir.display()
    );
    let namespaces = lines_of("ip", &["netns", "list"]);
    let stale: Vec<&String> = namespaces
        .iter()
        .filter(|l| l.starts_with(&netns_prefix) && !l.starts_with(lab.netns("node-a")))
        .collect();
    assert!(stale.is_empty(), "{stale:?}");
    lab.stop().expect("clean teardown");
}
