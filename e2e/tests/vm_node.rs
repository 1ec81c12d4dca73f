//! The host appliers on real PCI devices: a lab with one VM node (qemu, an emulated Intel
//! IOMMU, 2 NUMA nodes, a 4-queue virtio-net data NIC `eth1` at 0000:00:03.0), the real agent
//! inside it, and every step driven by a NetworkTuning applied with kubectl and read back in
//! the guest (sysfs, procfs, ethtool over netlink) through the VM's command channel.
//!
//! One lab and one boot for every step ([`STEPS`]), each of which leaves the guest as it found
//! it: the management-NIC guard and the facts; Plan mode changes nothing (and lifts the guard
//! only there); hugepages per NUMA node and an impossible count; NIC channels, rings, offloads
//! and MTU, IRQ affinity, RPS and XPS, and their revert; the DPDK binding to vfio-pci, a real
//! dpdk-testpmd answering pings from a namespace on the lab bridge, and the revert to
//! virtio-pci; SIGKILL of the agent between unbind and bind; a power cut while the node is on a
//! revision (the first boot after it made to stop and power-cycled by the lab; the agent
//! re-applies the revision after the boot that comes up, and the delete restores the
//! pre-tuning values from its journal). A failing step names itself and hides none of the
//! others. Waits on the guest are budgets of its progress, not of wall time
//! (`Lab::wait_for_guest`).

use std::collections::BTreeMap;
use std::time::Duration;

use hoststack_e2e::faults::inject;
use hoststack_e2e::prometheus::{revision_transactions, sample, scrape};
use hoststack_e2e::vm::{Vm, DATA_IF, DATA_PCI, MGMT_IF, MGMT_PCI};
use hoststack_e2e::{Lab, LabConfig, NodeSpec};

const NODE: &str = "vm-a";
/// How much of the guest's progress the agent may take to converge in any one step (TCG).
const CONVERGE: Duration = Duration::from_secs(180);
/// The boot timeout of the power-cut step, whose first boot after the cut is made not to come
/// up: short, so that the step does not wait long for the lab to power-cycle it, and still
/// twice what a boot takes beside two busy cores.
const STUCK_BOOT_TIMEOUT: Duration = Duration::from_secs(60);
const HUGE_NODE0: &str = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages";
const HUGE_NODE1: &str = "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages";

/// Applies NetworkTuning `vm-tuning` for the VM node with `spec_body` (YAML lines indented by
/// two spaces, below `spec:`).
fn apply(lab: &Lab, spec_body: &str) {
    let yaml = format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: vm-tuning\n\
         spec:\n  nodeSelector:\n    matchLabels:\n      pool: vm\n{spec_body}"
    );
    lab.apply_yaml(&yaml)
        .unwrap_or_else(|e| panic!("kubectl apply of\n{yaml}\nfailed: {e}"));
}

/// Deletes the tuning and waits until the agent has reverted everything.
fn delete_and_await_revert(lab: &Lab) {
    let out = lab.kubectl(&["delete", "networktuning", "vm-tuning", "--wait=true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    await_reverted(lab);
}

/// The node's NodeTuning (`null` until the operator has made it).
fn nodetuning(lab: &Lab) -> serde_json::Value {
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", "json"]);
    if !out.status.success() {
        return serde_json::Value::Null;
    }
    serde_json::from_slice(&out.stdout).expect("kubectl prints JSON")
}

/// The node's NodeTuning status.
fn status(lab: &Lab) -> serde_json::Value {
    nodetuning(lab)["status"].clone()
}

/// The NetworkTuning's status once the operator has observed its newest generation.
fn tuning_status(lab: &Lab) -> Option<serde_json::Value> {
    let out = lab.kubectl(&["get", "networktuning", "vm-tuning", "-o", "json"]);
    if !out.status.success() {
        return None;
    }
    let object: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let observed = object["status"]["observedGeneration"] == object["metadata"]["generation"];
    observed.then(|| object["status"].clone())
}

/// Waits until the node has applied the tuning's newest revision and confirmed it; the NodeTuning
/// status.
fn await_applied(lab: &Lab) -> serde_json::Value {
    lab.wait_for_guest(
        NODE,
        &format!("{NODE} to apply vm-tuning"),
        CONVERGE,
        || {
            let revision = tuning_status(lab)?["currentRevision"].clone();
            let object = nodetuning(lab);
            let status = &object["status"];
            // Applied and confirmed (no longer provisional), as the operator counts it.
            (revision.is_string()
                && object["spec"]["revision"] == revision
                && status["observedRevision"] == revision
                && status["state"] == "Applied"
                && status["confirmation"].is_null())
            .then(|| status.clone())
        },
    )
}

/// Waits until the rollout of the tuning's newest revision was rolled back (the node failed
/// to apply it); the tuning's message and the rolled-back revision.
fn await_rolled_back(lab: &Lab) -> (String, String) {
    lab.wait_for_guest(NODE, "vm-tuning to be rolled back", CONVERGE, || {
        let status = tuning_status(lab)?;
        (status["phase"] == "RolledBack").then(|| {
            let text = |key: &str| status[key].as_str().unwrap_or_default().to_string();
            (text("message"), text("currentRevision"))
        })
    })
}

/// Panics unless the node's agent ran `revision` exactly once, and that transaction failed:
/// its own per-revision transaction counters (a second attempt of a failed revision is what
/// the agent must never make).
fn assert_failed_once(lab: &Lab, revision: &str) {
    let metrics = scrape(lab.agent_metrics_address(NODE)).expect("the agent's /metrics answers");
    assert_eq!(
        revision_transactions(&metrics, revision),
        BTreeMap::from([("failed".to_string(), 1)]),
        "{NODE}'s transactions of revision {revision}"
    );
}

/// Waits until the node's agent has restored everything (no tuning governs it).
fn await_reverted(lab: &Lab) -> serde_json::Value {
    lab.wait_for_guest(NODE, &format!("{NODE} to revert"), CONVERGE, || {
        let object = nodetuning(lab);
        let status = &object["status"];
        (object["spec"]["revision"].is_null() && status["state"] == "Reverted")
            .then(|| status.clone())
    })
}

/// The status items as (kind, target) → item.
fn items_of(status: &serde_json::Value) -> BTreeMap<(String, String), serde_json::Value> {
    status["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                (
                    i["kind"].as_str().unwrap_or_default().to_string(),
                    i["target"].as_str().unwrap_or_default().to_string(),
                ),
                i.clone(),
            )
        })
        .collect()
}

fn item<'a>(
    items: &'a BTreeMap<(String, String), serde_json::Value>,
    kind: &str,
    target: &str,
) -> &'a serde_json::Value {
    items
        .get(&(kind.to_string(), target.to_string()))
        .unwrap_or_else(|| panic!("no item {kind} {target} in {items:#?}"))
}

/// A one-line value read in the guest.
fn read(vm: &Vm, path: &str) -> String {
    vm.run(&format!("cat {path}")).trim().to_string()
}

/// The current combined channels of `eth1` as ethtool prints them.
fn combined_channels(vm: &Vm) -> String {
    let out = vm.run(&format!("ethtool -l {DATA_IF}"));
    out.split("Current hardware settings:")
        .nth(1)
        .and_then(|current| {
            current
                .lines()
                .find_map(|l| l.strip_prefix("Combined:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_else(|| panic!("no current combined channels in {out}"))
}

/// Everything observable about the data NIC and the hugepage pools, to prove "nothing
/// changed": link, ethtool -l/-g/-k, queue directories, IRQ affinities, RPS/XPS masks, the
/// per-node hugepage counts, the PCI driver and somaxconn. Not the link's index, which the
/// kernel gives anew when the device is bound to its driver again (the DPDK steps do) and when
/// the guest boots.
fn snapshot(vm: &Vm) -> String {
    vm.run(&format!(
        "ip -o link show {DATA_IF} | sed 's/^[0-9]*: //; s/ state [A-Z]*//'; ethtool -l {DATA_IF}; \
         ethtool -g {DATA_IF}; ethtool -k {DATA_IF}; ls /sys/class/net/{DATA_IF}/queues; \
         for q in /sys/class/net/{DATA_IF}/queues/rx-*; do echo $q $(cat $q/rps_cpus); done; \
         for q in /sys/class/net/{DATA_IF}/queues/tx-*; do echo $q $(cat $q/xps_cpus); done; \
         for i in $(ls /sys/bus/pci/devices/{DATA_PCI}/msi_irqs); do \
           echo irq $i $(cat /proc/irq/$i/smp_affinity_list); done; \
         cat {HUGE_NODE0} {HUGE_NODE1}; readlink /sys/bus/pci/devices/{DATA_PCI}/driver; \
         echo somaxconn $(cat /proc/sys/net/core/somaxconn)"
    ))
}

/// Panics with `what`, the snapshot lines that differ and the guest kernel's last messages when
/// the guest no longer matches `before` (whole snapshots are too long to read in a failure).
fn assert_guest_unchanged(vm: &Vm, before: &str, what: &str) {
    let after = snapshot(vm);
    if after == before {
        return;
    }
    let (was, now): (Vec<&str>, Vec<&str>) = (before.lines().collect(), after.lines().collect());
    let gone: Vec<&&str> = was.iter().filter(|l| !now.contains(l)).collect();
    let new: Vec<&&str> = now.iter().filter(|l| !was.contains(l)).collect();
    let dmesg = vm.run("dmesg | tail -n 30");
    panic!("{what}:\nbefore only: {gone:#?}\nafter only: {new:#?}\nthe guest's dmesg:\n{dmesg}");
}

/// The data NIC's queue interrupts from its own MSI-X vectors (msi_irqs) named in
/// /proc/interrupts: (name, irq), e.g. ("virtio2-input.0", 29).
fn queue_irqs(vm: &Vm) -> Vec<(String, u32)> {
    let msi: Vec<u32> = vm
        .run(&format!("ls /sys/bus/pci/devices/{DATA_PCI}/msi_irqs"))
        .split_whitespace()
        .map(|n| n.parse().expect("an IRQ number"))
        .collect();
    let interrupts = vm.run("cat /proc/interrupts");
    let mut out: Vec<(String, u32)> = interrupts
        .lines()
        .filter_map(|l| {
            let (irq, rest) = l.trim().split_once(':')?;
            let irq: u32 = irq.parse().ok()?;
            let name = rest.split_whitespace().last()?.to_string();
            (msi.contains(&irq) && (name.contains("-input.") || name.contains("-output.")))
                .then_some((name, irq))
        })
        .collect();
    out.sort();
    out
}

/// A lab whose only node is the VM node, labelled pool=vm; a boot of its guest that is not
/// ready within `boot_timeout` is power-cycled.
fn vm_lab(boot_timeout: Duration) -> Lab {
    let mut config = LabConfig::with_nodes(0);
    config.nodes.push(NodeSpec::vm(NODE).label("pool", "vm"));
    config.vm_boot_timeout = boot_timeout;
    let lab = Lab::start(config).expect("lab with a VM node starts");
    let vm = lab.vm(NODE);
    eprintln!(
        "VM node {NODE}: kernel {} prepared in {:?}, guest ready in {:?}",
        vm.kernel_release(),
        vm.prepared_in(),
        vm.booted_in()
    );
    lab.wait_for_guest(NODE, "the guest's agent to start", CONVERGE, || {
        vm.agent_running().then_some(())
    });
    lab
}

/// A step of the VM node's test: what it proves, and the step, which leaves the guest as it
/// found it (each ends with the tuning deleted and its revert confirmed), so that the next
/// step starts from the same guest.
type Step = (&'static str, fn(&Lab, &Vm));

/// The steps, in the order they run on the one guest; the power cut last (it leaves its
/// pre-tuning values behind).
const STEPS: [Step; 7] = [
    (
        "the management-NIC guard and the facts",
        step_guard_and_facts,
    ),
    ("Plan mode changes nothing", step_plan_changes_nothing),
    ("hugepages per NUMA node", step_hugepages),
    (
        "channels, rings, offloads, MTU, IRQs, RPS and XPS",
        step_nic_irq_rps_xps,
    ),
    (
        "the DPDK binding and dpdk-testpmd",
        step_dpdk_binding_and_testpmd,
    ),
    (
        "an agent killed between unbind and bind",
        step_kill_between_unbind_and_bind,
    ),
    ("a power cut on a revision", step_power_cut),
];

/// Every step on one VM node, one boot for all (a lab and a boot under TCG cost more CPU than
/// most steps: docs/testing.md). A failing step does not hide the
/// others: each runs whatever failed before it, and the test fails at the end naming every
/// step that failed, in order (a step after a failed one may fail for what that one left).
#[test]
fn vm_node_guards_plans_and_tunes_hugepages_the_nic_and_dpdk_and_survives_kills_and_power_cuts() {
    // The power cut's boot timeout for every boot: its first boot after the cut is made not
    // to come up, and the lab power-cycles it after that long.
    let lab = vm_lab(STUCK_BOOT_TIMEOUT);
    let vm = lab.vm(NODE);
    let mut failed = Vec::new();
    for (name, step) in STEPS {
        eprintln!("=== step: {name}");
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&lab, vm)));
        if let Err(panic) = ran {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!("=== step failed: {name}: {why}");
            failed.push(format!("{name}: {why}"));
        }
    }
    lab.stop()
        .expect("the lab stops cleanly (VM powered off, taps removed)");
    assert!(
        failed.is_empty(),
        "{} of {} steps failed (a later one may fail for what an earlier one left):\n{}",
        failed.len(),
        STEPS.len(),
        failed.join("\n")
    );
}

/// The guard refuses a tuning that would bind the management NIC, and the agent reports the
/// node's hardware.
fn step_guard_and_facts(lab: &Lab, vm: &Vm) {
    step_management_guard(lab, vm);
    step_facts(lab, vm);
}

/// The agent in the guest reports the VM's hardware in its NodeTuning (which exists once a
/// tuning selects the node).
fn step_facts(lab: &Lab, vm: &Vm) {
    let facts = lab.wait_for_guest(NODE, "the guest agent's facts", CONVERGE, || {
        let facts = status(lab)["facts"].clone();
        facts["interfaces"].is_array().then_some(facts)
    });
    assert_eq!(facts["numaNodes"], serde_json::json!([0, 1]), "{facts:#}");
    assert_eq!(facts["cpuCount"], 2, "{facts:#}");
    assert_eq!(facts["vfioAvailable"], true, "{facts:#}");
    assert_eq!(facts["kernelRelease"], vm.kernel_release(), "{facts:#}");
    let iface = |name: &str| {
        facts["interfaces"]
            .as_array()
            .expect("interfaces")
            .iter()
            .find(|i| i["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {facts:#}"))
            .clone()
    };
    let data = iface(DATA_IF);
    assert_eq!(data["pciAddress"], DATA_PCI);
    assert_eq!(data["driver"], "virtio_net");
    assert_eq!(iface(MGMT_IF)["pciAddress"], MGMT_PCI);
    // Real MSI-X: one vector per queue of the data NIC, 4 rx and 4 tx.
    let irqs = queue_irqs(vm);
    assert_eq!(irqs.len(), 8, "{irqs:?}");
}

/// Binding the management NIC is refused with a reason naming the route, and nothing changes.
/// (This first tuning also makes the operator create the node's NodeTuning.)
fn step_management_guard(lab: &Lab, vm: &Vm) {
    let before = snapshot(vm);
    let driver_before = mgmt_driver(vm);
    apply(
        lab,
        "  interfaces:\n  - match:\n      name: eth0\n    dpdk:\n      driver: vfio-pci\n",
    );
    let (message, _) = await_rolled_back(lab);
    assert!(
        message.contains("refusing to bind eth0 (0000:00:02.0) to vfio-pci")
            && message.contains("it carries the default route")
            && message.contains("the route to the API server"),
        "{message}"
    );
    assert_eq!(mgmt_driver(vm), driver_before);
    assert_guest_unchanged(vm, &before, "the refused tuning changed the guest");
}

/// The management NIC's PCI driver line of its uevent.
fn mgmt_driver(vm: &Vm) -> String {
    read(
        vm,
        &format!("/sys/bus/pci/devices/{MGMT_PCI}/uevent | grep DRIVER"),
    )
}

/// `kubectl hoststack plan <file> -o json` of a tuning with `spec_body`: the VM node's answer.
fn plan(lab: &Lab, spec_body: &str) -> serde_json::Value {
    let yaml = format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: vm-tuning\n\
         spec:\n  nodeSelector:\n    matchLabels:\n      pool: vm\n{spec_body}"
    );
    let file = lab.dir().join("vm-plan.yaml");
    std::fs::write(&file, yaml).expect("writing the plan file");
    let out = std::process::Command::new(lab.plugin_binary())
        .arg("--kubeconfig")
        .arg(lab.kubeconfig())
        .args([
            "plan",
            &file.display().to_string(),
            "-o",
            "json",
            "--timeout",
            "3m",
        ])
        .output()
        .expect("the plugin runs");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "kubectl hoststack plan: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let node = plan["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["node"] == NODE)
        .unwrap_or_else(|| panic!("no answer of {NODE} in {plan:#}"))
        .clone();
    assert_eq!(node["answer"]["result"], "planned", "{plan:#}");
    node["answer"]["preview"].clone()
}

/// Plan mode (`kubectl hoststack plan`) lists every item with current and desired values and
/// changes nothing; the management-NIC override lifts the refusal there, and only there.
fn step_plan_changes_nothing(lab: &Lab, vm: &Vm) {
    // The agent answers plans through its NodeTuning, which the operator makes once a tuning
    // governs the node: one that touches nothing the snapshot covers.
    apply(lab, "  sysctls:\n    net.ipv4.tcp_sack: \"1\"\n");
    await_applied(lab);
    let before = snapshot(vm);
    let preview = plan(
        lab,
        "  hugepages:\n  - size: 2Mi\n    numaNode: 0\n    count: 16\n  \
         - size: 2Mi\n    numaNode: 1\n    count: 8\n  interfaces:\n  - match:\n      \
         name: eth1\n    mtu: 1400\n    channels:\n      combined: 1\n    \
         offloads:\n      gro: false\n    irqAffinity:\n      policy: Spread\n      \
         cpus: \"1\"\n    rps:\n      cpus: \"1\"\n    xps:\n      cpus: \"1\"\n",
    );
    eprintln!("plan on the VM node: {preview:#}");
    let items = items_of(&preview);
    assert!(
        items
            .values()
            .all(|i| i["state"] == "WouldChange" || i["state"] == "Unchanged"),
        "{items:#?}"
    );
    for (kind, target, actual, desired) in [
        ("channels", "eth1/combined", "2", "1"),
        ("hugepages", "node0/2Mi", "0", "16"),
        ("hugepages", "node1/2Mi", "0", "8"),
        ("mtu", DATA_IF, "1500", "1400"),
    ] {
        let i = item(&items, kind, target);
        assert_eq!(i["actual"], actual, "{i:#}");
        assert_eq!(i["desired"], desired, "{i:#}");
        assert_eq!(i["state"], "WouldChange", "{i:#}");
    }
    for kind in ["channels", "offload", "irqAffinity", "rpsCpus", "xpsCpus"] {
        assert!(
            items.keys().any(|(k, _)| k == kind),
            "no {kind} item in {items:#?}"
        );
    }
    assert_guest_unchanged(vm, &before, "Plan mode changed the guest");

    let driver_before = mgmt_driver(vm);
    let preview = plan(
        lab,
        "  interfaces:\n  - match:\n      name: eth0\n    dpdk:\n      \
         driver: vfio-pci\n      allowManagementInterface: true\n",
    );
    let items = items_of(&preview);
    let bind = items
        .values()
        .find(|i| i["kind"] == "pciDriver")
        .unwrap_or_else(|| panic!("no pciDriver item in {items:#?}"));
    assert_eq!(bind["state"], "WouldChange", "{bind:#}");
    assert!(
        bind["target"]
            .as_str()
            .unwrap_or_default()
            .starts_with(MGMT_PCI),
        "{bind:#}"
    );
    assert_eq!(
        bind["desired"], "driver=vfio-pci override=vfio-pci",
        "{bind:#}"
    );
    assert_eq!(mgmt_driver(vm), driver_before);
    assert_guest_unchanged(vm, &before, "the override's plan changed the guest");
    delete_and_await_revert(lab);
}

/// Counts per NUMA node land in nodeN's pool; an impossible count fails with "asked N, got M"
/// and changes nothing else.
fn step_hugepages(lab: &Lab, vm: &Vm) {
    apply(
        lab,
        "  hugepages:\n  - size: 2Mi\n    numaNode: 0\n    count: 64\n  \
         - size: 2Mi\n    numaNode: 1\n    count: 32\n",
    );
    await_applied(lab);
    assert_eq!(read(vm, HUGE_NODE0), "64");
    assert_eq!(read(vm, HUGE_NODE1), "32");
    assert_eq!(
        read(vm, "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
        "96"
    );
    delete_and_await_revert(lab);
    assert_eq!(read(vm, HUGE_NODE0), "0");
    assert_eq!(read(vm, HUGE_NODE1), "0");

    // 2 GiB of guest memory cannot hold 100000 pages of 2 MiB: the count fails, and neither
    // node 1's pages nor the MTU of the same revision stay changed.
    let before = snapshot(vm);
    apply(
        lab,
        "  hugepages:\n  - size: 2Mi\n    numaNode: 0\n    count: 100000\n  \
         - size: 2Mi\n    numaNode: 1\n    count: 16\n  interfaces:\n  - match:\n      \
         name: eth1\n    mtu: 1400\n",
    );
    let (message, failed) = await_rolled_back(lab);
    eprintln!("the impossible hugepage count: {message}");
    assert!(message.contains("asked 100000, got "), "{message}");
    // The failed transaction restored what it wrote before it reported; the rollback withdraws
    // the revision, and the node settles on that without trying the revision again.
    await_reverted(lab);
    assert_guest_unchanged(vm, &before, "a failed revision left changes behind");
    assert_failed_once(lab, &failed);
    delete_and_await_revert(lab);
    assert_guest_unchanged(vm, &before, "the failed revision was tried again");
    assert_failed_once(lab, &failed);
}

/// Channels 4 → 2 and back, rings, offloads and MTU over netlink; IRQ affinity of the data
/// NIC's MSI-X queue vectors; RPS and XPS; all read back in the guest, and all restored.
fn step_nic_irq_rps_xps(lab: &Lab, vm: &Vm) {
    // The original: 4 combined channels (the driver starts with one per vCPU, 2).
    vm.run(&format!("ethtool -L {DATA_IF} combined 4"));
    assert_eq!(combined_channels(vm), "4");
    let before = snapshot(vm);
    let irqs = queue_irqs(vm);
    apply(
        lab,
        "  interfaces:\n  - match:\n      name: eth1\n    mtu: 1400\n    channels:\n      \
         combined: 2\n    rings:\n      rx: 128\n      tx: 128\n    offloads:\n      \
         gro: false\n      tso: false\n    irqAffinity:\n      policy: Spread\n      \
         cpus: \"0-1\"\n    rps:\n      cpus: \"1\"\n    xps:\n      cpus: \"0-1\"\n",
    );
    let status = lab.wait_for_guest(NODE, "the NIC tuning to settle", CONVERGE, || {
        let s = status(lab);
        (s["state"] == "Applied" || s["state"] == "Failed").then_some(s)
    });
    let items = items_of(&status);
    eprintln!("NIC tuning on the VM node: {status:#}");
    // A ring size the driver refuses is reported, not hidden.
    let ring = item(&items, "ring", &format!("{DATA_IF}/rx"));
    if status["state"] == "Failed" {
        assert!(
            ring["state"] == "Failed",
            "only the ring sizes may fail on virtio-net: {status:#}"
        );
        eprintln!("virtio-net refused the ring size: {}", ring["message"]);
        assert_guest_unchanged(vm, &before, "a failed revision left changes behind");
        let refused = status["observedRevision"].as_str().unwrap_or_default();
        assert_failed_once(lab, refused);
        // Without the rings, the rest applies.
        apply(
            lab,
            "  interfaces:\n  - match:\n      name: eth1\n    mtu: 1400\n    channels:\n      \
             combined: 2\n    offloads:\n      gro: false\n      tso: false\n    \
             irqAffinity:\n      policy: Spread\n      cpus: \"0-1\"\n    rps:\n      \
             cpus: \"1\"\n    xps:\n      cpus: \"0-1\"\n",
        );
        await_applied(lab);
        // Rolled back and replaced, and never tried again.
        assert_failed_once(lab, refused);
    } else {
        assert_eq!(
            vm.run(&format!("ethtool -g {DATA_IF}"))
                .split("Current hardware settings:")
                .nth(1)
                .expect("current rings")
                .lines()
                .find(|l| l.starts_with("RX:"))
                .map(|l| l.split_whitespace().last().unwrap_or_default().to_string()),
            Some("128".to_string())
        );
    }
    // Channels through netlink (ethtool) and sysfs (the queue directories).
    assert_eq!(combined_channels(vm), "2");
    assert_eq!(
        vm.run(&format!("ls -d /sys/class/net/{DATA_IF}/queues/rx-*"))
            .lines()
            .count(),
        2
    );
    assert_eq!(read(vm, &format!("/sys/class/net/{DATA_IF}/mtu")), "1400");
    let features = vm.run(&format!("ethtool -k {DATA_IF}"));
    assert!(
        features.contains("generic-receive-offload: off"),
        "{features}"
    );
    assert!(
        features.contains("tcp-segmentation-offload: off"),
        "{features}"
    );
    // IRQ affinity: the queue vectors of the active queues, spread over CPUs 0 and 1 in
    // queue order (queue i on CPU i mod 2), as /proc/irq/N/smp_affinity_list shows.
    for (name, irq) in &irqs {
        let queue: u32 = name
            .rsplit('.')
            .next()
            .and_then(|q| q.parse().ok())
            .expect("queue number");
        if queue >= 2 {
            continue;
        }
        assert_eq!(
            read(vm, &format!("/proc/irq/{irq}/smp_affinity_list")),
            (queue % 2).to_string(),
            "{name} (IRQ {irq})"
        );
    }
    for q in 0..2 {
        assert_eq!(
            read(
                vm,
                &format!("/sys/class/net/{DATA_IF}/queues/rx-{q}/rps_cpus")
            ),
            "2"
        );
        assert_eq!(
            read(
                vm,
                &format!("/sys/class/net/{DATA_IF}/queues/tx-{q}/xps_cpus")
            ),
            (1 << q).to_string()
        );
    }
    delete_and_await_revert(lab);
    assert_eq!(combined_channels(vm), "4");
    assert_guest_unchanged(vm, &before, "the revert did not restore every original");
}

/// Whether `eth1` is administratively up (IFF_UP in its sysfs flags).
fn link_up(vm: &Vm) -> bool {
    let flags = read(vm, &format!("/sys/class/net/{DATA_IF}/flags"));
    let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16)
        .unwrap_or_else(|e| panic!("flags {flags:?}: {e}"));
    flags & 0x1 != 0
}

/// The data NIC bound to vfio-pci, a real dpdk-testpmd on it answering pings from a namespace
/// on the lab bridge, and the revert to virtio-pci with its name and MAC. The kernel gives
/// back a new netdev with the driver's defaults (link down, 2 channels, MTU 1500); the journal
/// carries the settings the old one had (link up, 4 channels, and an MTU set outside the
/// agent), and the revert puts them back.
fn step_dpdk_binding_and_testpmd(lab: &Lab, vm: &Vm) {
    let mac = read(vm, &format!("/sys/class/net/{DATA_IF}/address"));
    // 4 combined channels (the driver boots with one per vCPU, 2), which the rebind loses.
    vm.run(&format!("ethtool -L {DATA_IF} combined 4"));
    assert_eq!(combined_channels(vm), "4");
    assert!(link_up(vm), "the data NIC is up before the bind");
    // An MTU changed outside the agent, which the driver's default would lose.
    vm.run(&format!("ip link set {DATA_IF} mtu 1400"));
    apply(
        lab,
        "  hugepages:\n  - size: 2Mi\n    numaNode: 0\n    count: 64\n  \
         - size: 2Mi\n    numaNode: 1\n    count: 64\n  interfaces:\n  - match:\n      \
         name: eth1\n    dpdk:\n      driver: vfio-pci\n",
    );
    let status = await_applied(lab);
    let items = items_of(&status);
    let bind = items
        .values()
        .find(|i| i["kind"] == "pciDriver")
        .unwrap_or_else(|| panic!("no pciDriver item in {items:#?}"));
    eprintln!("DPDK binding item: {bind:#}");
    let group = vm
        .run(&format!(
            "readlink /sys/bus/pci/devices/{DATA_PCI}/iommu_group"
        ))
        .trim()
        .rsplit('/')
        .next()
        .expect("group")
        .to_string();
    assert_eq!(
        bind["target"],
        format!("{DATA_PCI}/{DATA_IF}/virtio_net"),
        "{bind:#}"
    );
    assert_eq!(
        bind["original"], "driver=virtio-pci up=on mtu=1400 combined=4",
        "{bind:#}"
    );
    assert_eq!(
        bind["actual"], "driver=vfio-pci override=vfio-pci",
        "{bind:#}"
    );
    let note = bind["message"].as_str().unwrap_or_default();
    assert!(
        note.contains(&format!("IOMMU group {group}; /dev/vfio/{group} present")),
        "{bind:#}"
    );
    assert!(
        read(vm, &format!("/sys/bus/pci/devices/{DATA_PCI}/uevent")).contains("DRIVER=vfio-pci")
    );
    vm.run(&format!("test -c /dev/vfio/{group}"));
    assert!(
        !vm.exec(&format!("test -e /sys/class/net/{DATA_IF}"))
            .success(),
        "the netdev is still there while bound to vfio-pci"
    );

    // A namespace on the lab bridge pings an address only testpmd (icmpecho) answers.
    let k = lab.index();
    let ns = format!("hs{k}-vm-ping");
    let veth = format!("hs{k}n250");
    let target = format!("198.18.{k}.250");
    let ip = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .expect("ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ip(&["netns", "add", &ns]);
    ip(&[
        "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
    ]);
    ip(&["link", "set", &veth, "master", &format!("hs{k}br"), "up"]);
    ip(&[
        "-n",
        &ns,
        "addr",
        "add",
        &format!("198.18.{k}.249/24"),
        "dev",
        "eth0",
    ]);
    ip(&["-n", &ns, "link", "set", "eth0", "up"]);
    let pmds = "/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0";
    vm.run(&format!(
        "timeout --preserve-status -s INT 150 dpdk-testpmd -l 0-1 -n 1 -m 64 -a {DATA_PCI} --huge-unlink \
         -d {pmds}/librte_net_virtio.so -d {pmds}/librte_mempool_ring.so -- \
         --total-num-mbufs=2048 --nb-cores=1 --no-lsc-interrupt --forward-mode=icmpecho \
         --stats-period=5 > /run/testpmd.log 2>&1 &"
    ));
    let ping = lab.wait_for_guest(
        NODE,
        "testpmd to answer pings through vfio-pci",
        CONVERGE,
        || {
            let out = std::process::Command::new("ip")
                .args([
                    "netns", "exec", &ns, "ping", "-c", "5", "-i", "0.5", "-W", "2", &target,
                ])
                .output()
                .expect("ping");
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        },
    );
    eprintln!("ping through the guest's DPDK port:\n{ping}");
    assert!(ping.contains("5 packets transmitted, 5 received"), "{ping}");
    let neighbour = std::process::Command::new("ip")
        .args(["-n", &ns, "neigh", "show", &target])
        .output()
        .expect("ip neigh");
    let neighbour = String::from_utf8_lossy(&neighbour.stdout).to_string();
    assert!(
        neighbour.contains(&mac),
        "{target} answered from {neighbour}, not {mac}"
    );
    vm.run("pkill -INT dpdk-testpmd; while pgrep dpdk-testpmd >/dev/null; do sleep 0.2; done");
    let log = vm.run("cat /run/testpmd.log");
    eprintln!("testpmd:\n{log}");
    assert!(
        log.contains(&format!("Port 0: {}", mac.to_uppercase())),
        "{log}"
    );
    // testpmd's own count of what it received and answered (ARP and ICMP) on the port.
    let forwarded = |what: &str| -> u64 {
        log.split("Forward statistics for port 0")
            .nth(1)
            .and_then(|stats| {
                let rest = stats.split(&format!("{what}-packets:")).nth(1)?;
                rest.split_whitespace().next()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no {what}-packets in testpmd's statistics:\n{log}"))
    };
    assert!(forwarded("RX") >= 5 && forwarded("TX") >= 5, "{log}");
    ip(&["netns", "delete", &ns]);

    delete_and_await_revert(lab);
    assert!(
        read(vm, &format!("/sys/bus/pci/devices/{DATA_PCI}/uevent")).contains("DRIVER=virtio-pci")
    );
    assert_eq!(read(vm, &format!("/sys/class/net/{DATA_IF}/address")), mac);
    // The driver makes a new netdev with its name and MAC and the driver's defaults; the
    // revert restores what the journal recorded of the old one: MTU, channels, link up.
    assert_eq!(read(vm, &format!("/sys/class/net/{DATA_IF}/mtu")), "1400");
    assert_eq!(combined_channels(vm), "4");
    assert!(link_up(vm), "the revert brings the data NIC back up");
    assert_eq!(read(vm, HUGE_NODE0), "0");
    assert_eq!(read(vm, HUGE_NODE1), "0");
    vm.run(&format!("ip link set {DATA_IF} mtu 1500"));
}

/// SIGKILL of the agent after the unbind and before the new bind: the restarted agent's
/// journal finishes or undoes the bind, and the device is never left without a driver.
fn step_kill_between_unbind_and_bind(lab: &Lab, vm: &Vm) {
    let driver = || vm.pci_driver(DATA_PCI);
    vm.kill_agent();
    vm.start_agent_with_env(&[("HOSTSTACK_DPDK_UNBIND_PAUSE", "600s")], &[]);
    apply(
        lab,
        "  interfaces:\n  - match:\n      name: eth1\n    dpdk:\n      driver: vfio-pci\n",
    );
    lab.wait_for_guest(NODE, "the agent to unbind the data NIC", CONVERGE, || {
        (driver() == "none").then_some(())
    });
    vm.kill_agent();
    assert_eq!(driver(), "none", "killed between unbind and bind");
    vm.start_agent(&[]);
    let status = await_applied(lab);
    eprintln!("after the restart: {}", status["message"]);
    assert_eq!(driver(), "vfio-pci");
    delete_and_await_revert(lab);
    assert_eq!(driver(), "virtio-pci");
    assert!(vm
        .exec(&format!("test -e /sys/class/net/{DATA_IF}"))
        .success());
}

/// The power of the VM node cut while it is on a revision, and the node booted again (issue
/// 18): the host comes back with boot-time values, the agent (started by the guest's init)
/// finds its journal, re-applies the revision as drift, and its journal still holds the
/// pre-tuning originals, so the delete afterwards restores exactly those.
fn step_power_cut(lab: &Lab, vm: &Vm) {
    // Pre-tuning values none of which the guest boots with (4 combined channels, not 2; 8 pages
    // on node 0, not 0; somaxconn 1000, not 4096), so that a journal which took the boot-time
    // values for originals would show at the delete.
    vm.run(&format!(
        "ethtool -L {DATA_IF} combined 4 && echo 8 > {HUGE_NODE0} && \
         sysctl -qw net.core.somaxconn=1000"
    ));
    let originals = snapshot(vm);
    apply(
        lab,
        "  hugepages:\n  - size: 2Mi\n    numaNode: 0\n    count: 64\n  \
         - size: 2Mi\n    numaNode: 1\n    count: 32\n  sysctls:\n    net.core.somaxconn: \"2048\"\n  \
         interfaces:\n  - match:\n      name: eth1\n    channels:\n      combined: 3\n",
    );
    let applied = await_applied(lab);
    let revision = applied["observedRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let tuned = managed_by_the_power_cut_revision(vm);
    assert_eq!(tuned, ["64", "32", "2048", "3"]);
    let journal = inject::journal(lab, NODE);
    assert_eq!(
        journal["applied"]["revision"],
        revision.as_str(),
        "{journal:#}"
    );
    let journaled = journal["originals"].clone();
    assert!(
        journaled.as_array().is_some_and(|o| o.len() >= 4),
        "the journal keeps the originals of the hugepages, the sysctl and the channels: {journal:#}"
    );

    lab.cut_vm_power(NODE);
    let booted = power_on_through_a_stuck_boot(lab, vm);
    eprintln!("{NODE} booted again in {booted:?} after its power was cut");
    // The new agent found the host off its revision: its drift counter (which starts at 0 with
    // the process) counts the transaction that set the revision's values again.
    lab.wait_for_guest(NODE, "the agent to re-apply its revision", CONVERGE, || {
        let metrics = scrape(lab.agent_metrics_address(NODE))?;
        let drifted = sample(&metrics, "hoststack_agent_drift_total")?;
        let state = status_state(lab);
        (drifted >= 1 && state == "Applied" && managed_by_the_power_cut_revision(vm) == tuned)
            .then_some(())
    });
    assert_eq!(status(lab)["observedRevision"], revision.as_str());
    let journal = inject::journal(lab, NODE);
    assert_eq!(
        journal["applied"]["revision"],
        revision.as_str(),
        "{journal:#}"
    );
    assert_eq!(
        journal["originals"], journaled,
        "the re-application changed the journal's originals"
    );

    delete_and_await_revert(lab);
    assert_guest_unchanged(
        vm,
        &originals,
        "the delete after the reboot did not restore the pre-tuning values",
    );
}

/// Powers the VM node on again through a boot that does not come up: its init blocks reading
/// its `config.env`, made a FIFO on the share (in the guest a pipe without a writer), until
/// the lab power-cycles the guest after its boot timeout; the file is put back then, and the
/// next boot comes up. The lab's log has the stuck boot with where its vCPUs were, each named
/// by the kernel's System.map.
fn power_on_through_a_stuck_boot(lab: &Lab, vm: &Vm) -> Duration {
    let config_env = vm.share().join("config.env");
    let config = std::fs::read(&config_env).expect("reading the share's config.env");
    std::fs::remove_file(&config_env).expect("removing config.env");
    let made = std::process::Command::new("mkfifo")
        .arg(&config_env)
        .status()
        .expect("running mkfifo");
    assert!(made.success(), "mkfifo {}: {made}", config_env.display());
    let lab_log = lab.log_path("lab");
    let power_cycled = || {
        std::fs::read_to_string(&lab_log)
            .unwrap_or_default()
            .contains("power-cycling it (boot 1 of")
    };
    let booted = std::thread::scope(|scope| {
        let power_on = scope.spawn(|| lab.power_on_vm(NODE));
        lab.wait_for(
            "the lab to power-cycle the stuck guest",
            3 * STUCK_BOOT_TIMEOUT,
            || (power_cycled() || power_on.is_finished()).then_some(()),
        );
        let staged = config_env.with_extension("env.new");
        std::fs::write(&staged, &config).expect("writing config.env back");
        std::fs::rename(&staged, &config_env).expect("putting config.env back");
        power_on.join().expect("powering on")
    });
    let log = std::fs::read_to_string(&lab_log).expect("the lab's log");
    let stuck = log
        .split("power-cycling it (boot 1 of")
        .next()
        .and_then(|before| before.rsplit("was not ready after").next())
        .expect("the stuck boot's note");
    eprintln!("the stuck boot, as the lab noted it:{stuck}");
    for cpu in 0..2 {
        let place = stuck
            .lines()
            .find(|l| l.starts_with(&format!("vCPU {cpu} at 0xffffffff")))
            .unwrap_or_else(|| panic!("no place of vCPU {cpu} in the stuck boot's note:\n{stuck}"));
        assert!(
            place.contains("+0x"),
            "vCPU {cpu}'s place is not named by the System.map: {place}"
        );
    }
    booted
}

/// What the power-cut step's revision sets: node 0's and node 1's 2 MiB pages, somaxconn and
/// the data NIC's combined channels.
fn managed_by_the_power_cut_revision(vm: &Vm) -> [String; 4] {
    [
        read(vm, HUGE_NODE0),
        read(vm, HUGE_NODE1),
        read(vm, "/proc/sys/net/core/somaxconn"),
        combined_channels(vm),
    ]
}

/// The NodeTuning's status state ("" before the agent reported).
fn status_state(lab: &Lab) -> String {
    status(lab)["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
