//! The NIC applier against the real kernel, through the whole agent path (discovery, expansion
//! with offload aliases, the journaled transaction, netlink), on a veth pair in a fresh network
//! namespace.
//!
//! The test re-runs itself under `unshare --net --mount` and mounts a sysfs of the new namespace
//! on /sys (so discovery sees the namespace's interfaces): the veth pair, the mount and every
//! change vanish with the child process, even when it fails or is killed. Each value is checked
//! independently with `ip -d link`, `ethtool -k` and `ethtool -l`.

mod netns;

use std::path::Path;
use std::process::Command;

use hoststack_agent::failures::SpecGeneration;
use hoststack_agent::hooks::Hooks;
use hoststack_agent::host::Host;
use hoststack_agent::intent::Intent;
use hoststack_agent::journal::JournalStore;
use hoststack_agent::reconciler::{Next, Reconciler};
use hoststack_agent::transaction::{Outcome, Transactor};
use hoststack_crds::{
    Channels, InterfaceMatch, InterfaceTuning, ItemResult, ItemState, Mode, NodeConfig, NodeState,
    NodeTuning, NodeTuningSpec, Rings,
};

const TEST: &str = "nic_settings_on_a_real_veth_in_a_fresh_network_namespace";
const CHILD: &str = "HOSTSTACK_AGENT_NIC_TEST_IN_NETNS";
const DEV: &str = "hsnic0";
const PEER: &str = "hsnic1";

#[test]
fn nic_settings_on_a_real_veth_in_a_fresh_network_namespace() {
    if std::env::var_os(CHILD).is_some() {
        in_fresh_namespace();
        return;
    }
    let tools = [("ip", "-V"), ("ethtool", "--version")]
        .iter()
        .all(|(t, v)| {
            Command::new(t)
                .arg(v)
                .output()
                .is_ok_and(|o| o.status.success())
        });
    assert!(
        tools,
        "this test needs ip and ethtool (scripts/setup.sh installs ethtool)"
    );
    netns::rerun_under_unshare(TEST, &["--net", "--mount"], CHILD, "1");
}

/// Runs a command and returns its stdout; panics when it fails.
fn run(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The MTU as `ip -d link show` prints it.
fn mtu(dev: &str) -> u32 {
    let out = run(&["ip", "-d", "link", "show", "dev", dev]);
    let mut words = out.split_whitespace();
    words
        .by_ref()
        .find(|w| *w == "mtu")
        .expect("ip prints the mtu");
    words.next().expect("mtu value").parse().expect("a number")
}

/// A feature's state as `ethtool -k` prints it (`on`, `off`, `off [fixed]`), by its printed
/// name.
fn feature(dev: &str, name: &str) -> String {
    run(&["ethtool", "-k", dev])
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(&format!("{name}: "))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("ethtool -k {dev} has no {name}"))
}

/// The current rx and tx channel counts as `ethtool -l` prints them.
fn channels(dev: &str) -> (String, String) {
    let out = run(&["ethtool", "-l", dev]);
    let current = out
        .split("Current hardware settings:")
        .nth(1)
        .expect("current settings");
    let field = |name: &str| {
        current
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("{name}:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {name} in {current}"))
    };
    (field("RX"), field("TX"))
}

/// Everything `ip -d link`, `ethtool -k` and `ethtool -l` print about a device.
fn snapshot(dev: &str) -> String {
    [
        run(&["ip", "-d", "link", "show", "dev", dev]),
        run(&["ethtool", "-k", dev]),
        run(&["ethtool", "-l", dev]),
    ]
    .join("\n")
}

fn config(entry: InterfaceTuning) -> NodeConfig {
    NodeConfig {
        interfaces: vec![entry],
        ..NodeConfig::default()
    }
}

fn dev_entry() -> InterfaceTuning {
    InterfaceTuning {
        match_: InterfaceMatch {
            name: Some(DEV.into()),
            ..InterfaceMatch::default()
        },
        ..InterfaceTuning::default()
    }
}

fn node_tuning(config: NodeConfig) -> NodeTuning {
    NodeTuning::new(
        "node-a",
        NodeTuningSpec {
            tuning: Some("nic".into()),
            revision: Some(config.revision()),
            config: Some(config),
            mode: Some(Mode::Apply),
            ..NodeTuningSpec::default()
        },
    )
}

fn reconcile(r: &mut Reconciler, object: &NodeTuning) -> Outcome {
    let desired = Intent::of(Some(object));
    match r.next(&desired, &SpecGeneration::default()).expect("next") {
        Next::Report(outcome) => outcome,
        Next::Transaction { .. } => r.transact(&desired, &SpecGeneration::default()),
    }
}

fn item<'a>(outcome: &'a Outcome, kind: &str, target: &str) -> &'a ItemResult {
    outcome
        .items
        .iter()
        .find(|i| i.kind == kind && i.target == target)
        .unwrap_or_else(|| panic!("no item {kind} {target} in {:#?}", outcome.items))
}

fn in_fresh_namespace() {
    // A sysfs of this namespace, so that discovery lists its interfaces.
    run(&["mount", "-t", "sysfs", "sysfs", "/sys"]);
    run(&[
        "ip",
        "link",
        "add",
        DEV,
        "numrxqueues",
        "4",
        "numtxqueues",
        "4",
        "type",
        "veth",
        "peer",
        "name",
        PEER,
        "numrxqueues",
        "4",
        "numtxqueues",
        "4",
    ]);
    assert_eq!(channels(DEV), ("4".into(), "4".into()));
    assert_eq!(feature(DEV, "generic-receive-offload"), "off");
    assert_eq!(feature(DEV, "tx-tcp-segmentation"), "on");
    let pristine = snapshot(DEV);
    let peer = snapshot(PEER);

    let host = Host::new(Path::new("/proc"), Path::new("/sys"));
    let state = tempfile::tempdir().expect("tempdir");
    let mut r = Reconciler::new(
        Transactor::new(host, JournalStore::new(state.path())),
        Hooks::default(),
    );

    // Apply MTU, offloads by alias, and rx/tx channel counts.
    let mut e = dev_entry();
    e.mtu = Some(9000);
    e.offloads = [("tso".to_string(), false), ("gro".to_string(), true)].into();
    e.channels = Some(Channels {
        combined: None,
        rx: Some(2),
        tx: Some(3),
    });
    let applied = reconcile(&mut r, &node_tuning(config(e.clone())));
    assert_eq!(applied.state, NodeState::Applied, "{applied:#?}");
    assert_eq!(mtu(DEV), 9000);
    assert_eq!(feature(DEV, "generic-receive-offload"), "on");
    assert_eq!(feature(DEV, "tcp-segmentation-offload"), "off");
    for name in [
        "tx-tcp-segmentation",
        "tx-tcp6-segmentation",
        "tx-tcp-ecn-segmentation",
    ] {
        assert_eq!(feature(DEV, name), "off", "{name}");
    }
    assert_eq!(channels(DEV), ("2".into(), "3".into()));
    let m = item(&applied, "mtu", DEV);
    assert_eq!(
        (
            m.original.as_deref(),
            m.desired.as_deref(),
            m.actual.as_deref(),
            m.state
        ),
        (Some("1500"), Some("9000"), Some("9000"), ItemState::Applied)
    );
    let gro = item(&applied, "offload", &format!("{DEV}/rx-gro"));
    assert_eq!(
        (gro.original.as_deref(), gro.actual.as_deref()),
        (Some("off"), Some("on"))
    );
    let rx = item(&applied, "channels", &format!("{DEV}/rx"));
    assert_eq!(
        (rx.original.as_deref(), rx.actual.as_deref()),
        (Some("4"), Some("2"))
    );
    // The peer keeps its own MTU and everything else: veth MTUs are per end.
    assert_eq!(snapshot(PEER), peer);
    let after_apply = snapshot(DEV);

    // veth has no rings: the driver's answer fails the revision before any write.
    let mut rings = e.clone();
    rings.mtu = Some(4000);
    rings.rings = Some(Rings {
        rx: Some(512),
        tx: None,
    });
    let failed = reconcile(&mut r, &node_tuning(config(rings)));
    assert_eq!(failed.state, NodeState::Failed, "{failed:#?}");
    let ring = item(&failed, "ring", &format!("{DEV}/rx"));
    assert_eq!(ring.state, ItemState::Failed);
    let message = ring.message.as_deref().unwrap_or_default();
    assert!(message.contains("Operation not supported"), "{message}");
    assert_eq!(snapshot(DEV), after_apply, "nothing changed");

    // A value the kernel refuses after earlier writes took: those writes are undone.
    let mut refused = e.clone();
    refused.channels = Some(Channels {
        combined: None,
        rx: Some(3),
        tx: Some(1),
    });
    refused.offloads = [("gro".to_string(), false)].into();
    refused.mtu = Some(70000);
    let failed = reconcile(&mut r, &node_tuning(config(refused)));
    assert_eq!(failed.state, NodeState::Failed, "{failed:#?}");
    let m = item(&failed, "mtu", DEV);
    let message = m.message.as_deref().unwrap_or_default();
    assert!(message.contains("Invalid argument"), "{message}");
    assert_eq!(
        item(&failed, "channels", &format!("{DEV}/rx")).state,
        ItemState::RolledBack
    );
    assert_eq!(snapshot(DEV), after_apply, "every write was undone");

    // More channels than the device has: the kernel's extended ack names the reason.
    let mut too_many = e.clone();
    too_many.channels = Some(Channels {
        combined: None,
        rx: Some(5),
        tx: None,
    });
    let failed = reconcile(&mut r, &node_tuning(config(too_many)));
    assert_eq!(failed.state, NodeState::Failed, "{failed:#?}");
    let message = failed.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("requested channel count exceeds maximum"),
        "{message}"
    );
    assert_eq!(snapshot(DEV), after_apply);

    // An unknown feature name is refused before anything is read or written.
    let mut unknown = e.clone();
    unknown.offloads = [("turbo".to_string(), true)].into();
    let failed = reconcile(&mut r, &node_tuning(config(unknown)));
    assert_eq!(failed.state, NodeState::Failed, "{failed:#?}");
    assert_eq!(snapshot(DEV), after_apply);

    // Withdrawn: every value is back exactly, on both ends.
    let reverted = reconcile(
        &mut r,
        &NodeTuning::new("node-a", NodeTuningSpec::default()),
    );
    assert_eq!(reverted.state, NodeState::Reverted, "{reverted:#?}");
    assert_eq!(snapshot(DEV), pristine);
    assert_eq!(snapshot(PEER), peer);
    assert!(JournalStore::new(state.path())
        .load()
        .expect("journal")
        .is_empty());
}
