//! The NIC applier (channels, offloads, rings, MTU) through the reconciler against a fake
//! kernel that answers the netlink calls the way drivers do: it refuses counts above the
//! maximum, ring sizes on a device without rings (EOPNOTSUPP, as veth), changes of fixed
//! features and MTUs above the device's maximum (EINVAL).
//!
//! Laws: a refused value in the middle of a revision leaves every NIC exactly as it was; apply
//! then revert is the identity; and an agent killed before any single netlink call ends, after
//! recovery, fully applied or fully reverted.

mod common;

use common::{killed, Killed};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::panic;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hoststack_agent::failures::SpecGeneration;
use hoststack_agent::hooks::Hooks;
use hoststack_agent::host::ethtool::{ChannelCounts, ChannelInfo, Features, RingInfo, RingSizes};
use hoststack_agent::host::files::write_existing;
use hoststack_agent::host::{Ethtool, Files, Host, Roots, Rtnetlink};
use hoststack_agent::intent::Intent;
use hoststack_agent::journal::JournalStore;
use hoststack_agent::reconciler::{Next, Reconciler};
use hoststack_agent::transaction::{Outcome, Transactor};
use hoststack_crds::{
    Channels, InterfaceMatch, InterfaceTuning, ItemResult, ItemState, Mode, NodeConfig, NodeState,
    NodeTuning, NodeTuningSpec, Rings,
};

/// One fake NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Nic {
    channels: ChannelInfo,
    /// `None`: the driver has no ring parameters (veth).
    rings: Option<RingInfo>,
    features: Features,
    mtu: u32,
    max_mtu: u32,
    /// Administratively up.
    up: bool,
}

/// The NICs of the fake host, shared by every agent (kernel) that runs on it.
type Nics = Arc<Mutex<BTreeMap<String, Nic>>>;

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Fake files, ethtool and rtnetlink ports over the shared NICs; they "die" (SIGKILL) just
/// before the `kill_at`th netlink call (1-based; 0: never).
#[derive(Debug)]
struct FakeKernel {
    nics: Nics,
    kill_at: usize,
    calls: AtomicUsize,
}

impl FakeKernel {
    /// Counts a netlink call, dying before it when it is the fatal one; then runs `f` on the
    /// NIC `iface` (ENODEV when there is none).
    fn call<T>(&self, iface: &str, f: impl FnOnce(&mut Nic) -> io::Result<T>) -> io::Result<T> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.kill_at {
            panic::panic_any(Killed);
        }
        let mut nics = self.nics.lock().expect("nics");
        let nic = nics.get_mut(iface).ok_or_else(|| errno(libc::ENODEV))?;
        f(nic)
    }
}

/// Checks a count against the driver's maximum, as `ethnl_set_channels` does.
fn count(value: Option<u32>, max: u32, slot: &mut u32) -> io::Result<()> {
    match value {
        Some(v) if v > max => Err(errno(libc::EINVAL)),
        Some(v) => {
            *slot = v;
            Ok(())
        }
        None => Ok(()),
    }
}

impl Files for FakeKernel {
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        write_existing(path, bytes)
    }
}

impl Ethtool for FakeKernel {
    fn channels(&self, iface: &str) -> io::Result<ChannelInfo> {
        self.call(iface, |n| Ok(n.channels))
    }

    fn set_channels(&self, iface: &str, c: &ChannelCounts) -> io::Result<()> {
        self.call(iface, |n| {
            let mut next = n.channels;
            count(c.rx, next.rx_max, &mut next.rx)?;
            count(c.tx, next.tx_max, &mut next.tx)?;
            count(c.combined, next.combined_max, &mut next.combined)?;
            if next.rx + next.combined == 0 || next.tx + next.combined == 0 {
                return Err(errno(libc::EINVAL));
            }
            n.channels = next;
            Ok(())
        })
    }

    fn rings(&self, iface: &str) -> io::Result<RingInfo> {
        self.call(iface, |n| n.rings.ok_or_else(|| errno(libc::EOPNOTSUPP)))
    }

    fn set_rings(&self, iface: &str, s: &RingSizes) -> io::Result<()> {
        self.call(iface, |n| {
            let mut rings = n.rings.ok_or_else(|| errno(libc::EOPNOTSUPP))?;
            count(s.rx, rings.rx_max, &mut rings.rx)?;
            count(s.tx, rings.tx_max, &mut rings.tx)?;
            n.rings = Some(rings);
            Ok(())
        })
    }

    fn features(&self, iface: &str) -> io::Result<Features> {
        self.call(iface, |n| Ok(n.features.clone()))
    }

    fn set_features(&self, iface: &str, wanted: &BTreeMap<String, bool>) -> io::Result<()> {
        self.call(iface, |n| {
            let f = &mut n.features;
            for (name, on) in wanted {
                let fixed = !f.changeable.contains(name);
                if !f.known.contains(name) || (fixed && f.active.contains(name) != *on) {
                    return Err(errno(libc::EINVAL));
                }
            }
            for (name, on) in wanted {
                if *on {
                    f.active.insert(name.clone());
                } else {
                    f.active.remove(name);
                }
            }
            Ok(())
        })
    }
}

impl Rtnetlink for FakeKernel {
    fn mtu(&self, iface: &str) -> io::Result<u32> {
        self.call(iface, |n| Ok(n.mtu))
    }

    fn set_mtu(&self, iface: &str, mtu: u32) -> io::Result<()> {
        self.call(iface, |n| {
            if !(68..=n.max_mtu).contains(&mtu) {
                return Err(errno(libc::EINVAL));
            }
            n.mtu = mtu;
            Ok(())
        })
    }

    fn link_up(&self, iface: &str) -> io::Result<bool> {
        self.call(iface, |n| Ok(n.up))
    }

    fn set_link_up(&self, iface: &str, up: bool) -> io::Result<()> {
        self.call(iface, |n| {
            n.up = up;
            Ok(())
        })
    }
}

const KNOWN: &[&str] = &[
    "tx-scatter-gather",
    "tx-checksum-ipv4",
    "tx-checksum-ip-generic",
    "tx-tcp-segmentation",
    "tx-tcp-ecn-segmentation",
    "tx-tcp6-segmentation",
    "tx-generic-segmentation",
    "rx-gro",
    "rx-lro",
    "rx-checksum",
];

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// eth0: a NIC with 8 of 16 combined channels, 256/256 rings up to 4096, LRO changeable,
/// MTU up to 9216. veth0: a veth with 4+4 rx/tx channels, no rings, LRO and IPv4 checksum
/// fixed off, MTU up to 65535.
fn nics() -> BTreeMap<String, Nic> {
    let known: Vec<String> = KNOWN.iter().map(|s| s.to_string()).collect();
    let eth0 = Nic {
        channels: ChannelInfo {
            combined: 8,
            combined_max: 16,
            other: 1,
            other_max: 1,
            ..ChannelInfo::default()
        },
        rings: Some(RingInfo {
            rx: 256,
            tx: 256,
            rx_max: 4096,
            tx_max: 4096,
        }),
        features: Features {
            known: known.clone(),
            changeable: names(&KNOWN[..9]),
            active: names(&[
                "tx-scatter-gather",
                "tx-checksum-ip-generic",
                "tx-tcp-segmentation",
                "tx-tcp6-segmentation",
                "tx-generic-segmentation",
                "rx-gro",
                "rx-checksum",
            ]),
        },
        mtu: 1500,
        max_mtu: 9216,
        up: true,
    };
    let veth0 = Nic {
        channels: ChannelInfo {
            rx: 4,
            tx: 4,
            rx_max: 4,
            tx_max: 4,
            ..ChannelInfo::default()
        },
        rings: None,
        features: Features {
            changeable: known
                .iter()
                .filter(|n| *n != "rx-lro" && *n != "tx-checksum-ipv4")
                .cloned()
                .collect(),
            active: names(&[
                "tx-scatter-gather",
                "tx-checksum-ip-generic",
                "tx-tcp-segmentation",
                "tx-tcp-ecn-segmentation",
                "tx-tcp6-segmentation",
                "tx-generic-segmentation",
                "rx-checksum",
            ]),
            known,
        },
        mtu: 1500,
        max_mtu: 65535,
        up: true,
    };
    [("eth0".to_string(), eth0), ("veth0".to_string(), veth0)].into()
}

/// A fake node: its NICs, a sysfs listing them, and a state dir.
struct FakeNode {
    nics: Nics,
    dir: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl FakeNode {
    fn new() -> Self {
        let node = FakeNode {
            nics: Arc::new(Mutex::new(nics())),
            dir: tempfile::tempdir().expect("tempdir"),
            state: tempfile::tempdir().expect("tempdir"),
        };
        for name in ["eth0", "veth0"] {
            let net = node.sys().join("class/net").join(name);
            fs::create_dir_all(net.join("queues")).expect("mkdir");
            fs::write(net.join("mtu"), "1500\n").expect("write");
        }
        fs::create_dir_all(node.dir.path().join("proc")).expect("mkdir");
        node
    }

    fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    fn nic_state(&self) -> BTreeMap<String, Nic> {
        self.nics.lock().expect("nics").clone()
    }

    fn kernel(&self, kill_at: usize) -> Arc<FakeKernel> {
        Arc::new(FakeKernel {
            nics: self.nics.clone(),
            kill_at,
            calls: AtomicUsize::new(0),
        })
    }

    fn host(&self, kernel: Arc<FakeKernel>) -> Host {
        let roots = Roots::new(&self.dir.path().join("proc"), &self.sys());
        Host::at(roots)
            .with_files(kernel.clone())
            .with_ethtool(kernel.clone())
            .with_rtnetlink(kernel)
    }

    fn transactor_with(&self, kernel: Arc<FakeKernel>) -> Transactor {
        Transactor::new(self.host(kernel), JournalStore::new(self.state.path()))
    }

    fn reconciler(&self) -> Reconciler {
        Reconciler::new(self.transactor_with(self.kernel(0)), Hooks::default())
    }
}

fn entry(name: &str) -> InterfaceTuning {
    InterfaceTuning {
        match_: InterfaceMatch {
            name: Some(name.into()),
            ..InterfaceMatch::default()
        },
        ..InterfaceTuning::default()
    }
}

fn node_tuning(interfaces: Vec<InterfaceTuning>) -> NodeTuning {
    let config = NodeConfig {
        interfaces,
        ..NodeConfig::default()
    };
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

fn withdrawn() -> NodeTuning {
    NodeTuning::new("node-a", NodeTuningSpec::default())
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

/// Every NIC part on both devices.
fn first() -> NodeTuning {
    let mut eth0 = entry("eth0");
    eth0.channels = Some(Channels {
        combined: Some(4),
        rx: None,
        tx: None,
    });
    eth0.offloads = [("lro".to_string(), true), ("gro".to_string(), false)].into();
    eth0.rings = Some(Rings {
        rx: Some(1024),
        tx: Some(512),
    });
    eth0.mtu = Some(9000);
    let mut veth = entry("veth*");
    veth.channels = Some(Channels {
        combined: None,
        rx: Some(2),
        tx: Some(3),
    });
    veth.offloads = [("tso".to_string(), false), ("gro".to_string(), true)].into();
    veth.mtu = Some(4000);
    node_tuning(vec![eth0, veth])
}

/// A second revision: some values change, some parts go, one comes.
fn second() -> NodeTuning {
    let mut eth0 = entry("eth0");
    eth0.channels = Some(Channels {
        combined: Some(16),
        rx: None,
        tx: None,
    });
    eth0.offloads = [("tx-checksum-ip-generic".to_string(), false)].into();
    let mut veth = entry("veth0");
    veth.mtu = Some(1280);
    veth.offloads = [("sg".to_string(), false)].into();
    node_tuning(vec![eth0, veth])
}

#[test]
fn a_refused_value_in_the_middle_changes_nothing() {
    let node = FakeNode::new();
    let pristine = node.nic_state();
    let mut r = node.reconciler();
    let mut eth0 = entry("eth0");
    eth0.channels = Some(Channels {
        combined: Some(2),
        rx: None,
        tx: None,
    });
    eth0.offloads = [("gro".to_string(), false)].into();
    // Above the ring maximum: refused after channels and offloads were written.
    eth0.rings = Some(Rings {
        rx: Some(8192),
        tx: None,
    });
    eth0.mtu = Some(9000);
    let outcome = reconcile(&mut r, &node_tuning(vec![eth0]));
    assert_eq!(outcome.state, NodeState::Failed, "{outcome:#?}");
    let ring = item(&outcome, "ring", "eth0/rx");
    assert_eq!(ring.state, ItemState::Failed);
    assert!(
        ring.message
            .as_deref()
            .is_some_and(|m| m.contains("Invalid argument")),
        "{ring:?}"
    );
    assert_eq!(
        item(&outcome, "channels", "eth0/combined").state,
        ItemState::RolledBack
    );
    assert_eq!(
        item(&outcome, "offload", "eth0/rx-gro").state,
        ItemState::RolledBack
    );
    assert_eq!(node.nic_state(), pristine);
    assert!(JournalStore::new(node.state.path())
        .load()
        .expect("journal")
        .is_empty());

    // Rings on veth: the driver's EOPNOTSUPP fails the revision before any write.
    let mut veth = entry("veth0");
    veth.mtu = Some(9000);
    veth.rings = Some(Rings {
        rx: Some(512),
        tx: None,
    });
    let outcome = reconcile(&mut r, &node_tuning(vec![veth]));
    assert_eq!(outcome.state, NodeState::Failed, "{outcome:#?}");
    assert!(
        outcome
            .message
            .as_deref()
            .is_some_and(|m| m.contains("ring veth0/rx") && m.contains("Operation not supported")),
        "{outcome:?}"
    );
    assert_eq!(node.nic_state(), pristine);
}

#[test]
fn apply_then_revert_is_the_identity() {
    let node = FakeNode::new();
    let pristine = node.nic_state();
    let mut r = node.reconciler();
    let applied = reconcile(&mut r, &first());
    assert_eq!(applied.state, NodeState::Applied, "{applied:#?}");
    let now = node.nic_state();
    assert_eq!(now["eth0"].channels.combined, 4);
    assert_eq!(now["eth0"].rings.map(|r| (r.rx, r.tx)), Some((1024, 512)));
    assert_eq!(now["eth0"].mtu, 9000);
    assert!(now["eth0"].features.active.contains("rx-lro"));
    assert!(!now["eth0"].features.active.contains("rx-gro"));
    assert_eq!((now["veth0"].channels.rx, now["veth0"].channels.tx), (2, 3));
    assert!(!now["veth0"].features.active.contains("tx-tcp-segmentation"));
    assert!(now["veth0"].features.active.contains("rx-gro"));
    let mtu = item(&applied, "mtu", "veth0");
    assert_eq!(
        (
            mtu.original.as_deref(),
            mtu.desired.as_deref(),
            mtu.actual.as_deref()
        ),
        (Some("1500"), Some("4000"), Some("4000"))
    );

    let changed = reconcile(&mut r, &second());
    assert_eq!(changed.state, NodeState::Applied, "{changed:#?}");
    let now = node.nic_state();
    assert_eq!(now["eth0"].channels.combined, 16);
    assert_eq!(now["eth0"].mtu, 1500, "no longer managed: restored");
    assert!(!now["eth0"]
        .features
        .active
        .contains("tx-checksum-ip-generic"));
    assert_eq!(now["veth0"].mtu, 1280);
    assert_eq!(now["veth0"].channels.rx, 4, "no longer managed: restored");

    assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
    assert_eq!(node.nic_state(), pristine);
    assert!(JournalStore::new(node.state.path())
        .load()
        .expect("journal")
        .is_empty());
}

/// The netlink calls a transaction to `to`, from the host after `from`, makes.
fn calls_of(from: Option<&NodeTuning>, to: &NodeTuning) -> usize {
    let node = FakeNode::new();
    let mut r = node.reconciler();
    if let Some(from) = from {
        reconcile(&mut r, from);
    }
    let goal = r.expand(&Intent::of(Some(to))).expect("expand").goal;
    let kernel = node.kernel(0);
    node.transactor_with(kernel.clone())
        .execute(&goal, &mut |_| {})
        .expect("transaction");
    kernel.calls.load(Ordering::SeqCst)
}

#[test]
fn a_kill_before_any_netlink_call_ends_fully_applied_or_fully_reverted() {
    let cases: [(Option<NodeTuning>, NodeTuning); 3] = [
        (None, first()),
        (Some(first()), second()),
        (Some(second()), withdrawn()),
    ];
    for (from, to) in &cases {
        let calls = calls_of(from.as_ref(), to);
        assert!(calls > 10, "{calls} calls");
        for kill_at in 1..=calls {
            let node = FakeNode::new();
            let pristine = node.nic_state();
            let mut r = node.reconciler();
            if let Some(from) = from {
                assert_eq!(reconcile(&mut r, from).state, NodeState::Applied);
            }
            let before = node.nic_state();
            let journal_before = JournalStore::new(node.state.path())
                .load()
                .expect("journal");
            let goal = r.expand(&Intent::of(Some(to))).expect("expand").goal;
            let dying = node.transactor_with(node.kernel(kill_at));
            assert!(
                killed(|| {
                    let _ = dying.execute(&goal, &mut |_| {});
                }),
                "call {kill_at} of {calls} was made"
            );
            // The restarted agent recovers first.
            node.transactor_with(node.kernel(0))
                .recover(&mut |_| {})
                .expect("recover");
            let journal = JournalStore::new(node.state.path())
                .load()
                .expect("journal");
            assert!(journal.transaction.is_none());
            if journal == journal_before {
                assert_eq!(node.nic_state(), before, "kill at call {kill_at}");
            } else {
                let prepared = node
                    .transactor_with(node.kernel(0))
                    .prepare(&goal, &mut |_| {})
                    .expect("prepare");
                assert!(
                    prepared.is_settled(&goal),
                    "kill at call {kill_at}: {:?}",
                    prepared.plan
                );
            }
            assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
            assert_eq!(node.nic_state(), pristine, "kill at call {kill_at}");
        }
    }
}
