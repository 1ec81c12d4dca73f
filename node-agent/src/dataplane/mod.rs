//! The dataplane supervisor: runs the embedded user-space TCP stack (`userspaceStack`) on the
//! cores a tuning dedicates to it.
//!
//! The stack is the last step of a revision. The transaction first takes the dedicated cores
//! out of every queue IRQ's affinity and every RPS/XPS mask ([`crate::expand::cores`], through
//! the IRQ and RPS/XPS appliers, journaled like every other setting); once it has applied, the
//! [`supervisor::Supervisor`] starts the runner, `hoststack-userstack`, with the config
//! translated from the spec ([`runner_config`]). A revert stops the runner first, then the
//! transaction gives the cores back from the journal.
//!
//! The runner is a separate process, not threads of the agent: a crash or a SIGKILL of the
//! data plane cannot take the agent and its journal with it, its XDP program is owned by its
//! file descriptors so the kernel detaches it when it dies, and an agent restart (an upgrade)
//! does not interrupt the traffic it serves. The supervisor restarts a runner that dies with
//! exponential [`backoff`], and reports its state, shards, services and counters
//! ([`stats`]) in `NodeTuning.status.userspaceStack`, with a warning when the cores are not
//! [`isolation`]-ed from the scheduler.

pub mod backoff;
pub mod isolation;
pub mod runner_config;
pub mod stats;
pub mod supervisor;

use std::path::Path;

use hoststack_crds::{InterfaceFacts, Mode, NodeState, StackBackend, UserspaceStack};

use crate::host::ethtool::{self, Rss};
use crate::intent::Intent;
use crate::netlink::errno;
pub use supervisor::{Supervisor, Wanted};

/// What the supervisor does about an intent.
#[derive(Clone, Debug, PartialEq)]
pub enum StackAction {
    /// Leave the stack as it is.
    Keep,
    /// Run this stack (keeping a runner that already runs it).
    Run(Box<UserspaceStack>),
    /// Stop the stack.
    Stop,
}

/// Before the transaction: an intent that runs no stack (a revert, a revision without
/// `userspaceStack`) stops it, so that the transaction gives back cores no runner polls.
pub fn before_transaction(intent: &Intent) -> StackAction {
    match intent {
        Intent::Absent | Intent::Withdrawn => StackAction::Stop,
        // Nothing of a refused revision is applied: the stack stays as the host has it.
        Intent::Refused { .. } => StackAction::Keep,
        Intent::Revision { config, mode, .. } => {
            if *mode == Mode::Apply && config.userspace_stack.is_none() {
                StackAction::Stop
            } else {
                StackAction::Keep
            }
        }
    }
}

/// After the transaction (or a report of a settled host): a revision with `userspaceStack`
/// that is applied runs its stack. Anything else leaves the stack as it is: a failed revision
/// leaves the host, runner included, on the revision before it.
pub fn after_transaction(intent: &Intent, state: NodeState) -> StackAction {
    match intent {
        Intent::Revision {
            config,
            mode: Mode::Apply,
            ..
        } if state == NodeState::Applied => match &config.userspace_stack {
            Some(stack) => StackAction::Run(Box::new(stack.clone())),
            None => StackAction::Keep,
        },
        _ => StackAction::Keep,
    }
}

/// What the supervisor should run for `stack`: its runner config, and whether its cores are
/// isolated (read under `sys_root`). `interfaces` gives a DPDK device's PCI address; with
/// backend Dpdk, `interface` may also be the PCI address itself (a device bound to vfio-pci
/// has no netdev any more, so after the binding no interface of that name is found). For
/// backend AfXdp the NIC's RSS key and table are read through ethtool netlink
/// ([`runner_config::runner_rss`]).
pub fn wanted(
    stack: &UserspaceStack,
    sys_root: &Path,
    interfaces: &[InterfaceFacts],
) -> Result<Wanted, String> {
    wanted_with(stack, sys_root, interfaces, ethtool::rss)
}

/// [`wanted`] with the NIC's RSS read by `read_rss` (asked only for backend AfXdp; a
/// missing device reads as no RSS, any other failure is an error).
pub fn wanted_with(
    stack: &UserspaceStack,
    sys_root: &Path,
    interfaces: &[InterfaceFacts],
    read_rss: impl FnOnce(&str) -> std::io::Result<Option<Rss>>,
) -> Result<Wanted, String> {
    let cores = crate::expand::cores::parse_cores(stack)?;
    let nic_rss = if stack.backend == StackBackend::AfXdp {
        match read_rss(&stack.interface) {
            Ok(rss) => rss,
            // The runner itself fails on a missing interface, with the reason in the status.
            Err(e) if errno(&e) == Some(libc::ENODEV) => None,
            Err(e) => return Err(e.to_string()),
        }
    } else {
        None
    };
    let rss = runner_config::runner_rss(stack.backend, nic_rss.as_ref());
    let pci = interfaces
        .iter()
        .find(|i| i.name == stack.interface)
        .and_then(|i| i.pci_address.as_deref())
        .or_else(|| {
            (stack.backend == StackBackend::Dpdk && crate::sysfs::is_pci_address(&stack.interface))
                .then_some(stack.interface.as_str())
        });
    let warning = isolation::Isolation::read(sys_root).warning(&cores);
    let config = runner_config::RunnerConfig {
        rss,
        ..runner_config::translate(stack, &cores, pci)
    };
    Ok(Wanted {
        config,
        cores: stack.cores.clone(),
        backend: stack.backend,
        isolated: warning.is_none(),
        warning,
    })
}

#[cfg(test)]
mod tests {
    use hoststack_crds::NodeConfig;

    use super::*;

    fn revision(stack: Option<UserspaceStack>, mode: Mode) -> Intent {
        Intent::Revision {
            tuning: "edge".into(),
            revision: "r1".into(),
            config: Box::new(NodeConfig {
                userspace_stack: stack,
                ..NodeConfig::default()
            }),
            mode,
        }
    }

    #[test]
    fn the_stack_stops_before_a_revert_and_runs_after_an_applied_revision() {
        let stack = UserspaceStack {
            cores: "1".into(),
            interface: "veth0".into(),
            ..UserspaceStack::default()
        };
        let with = revision(Some(stack.clone()), Mode::Apply);
        let without = revision(None, Mode::Apply);
        let plan = revision(None, Mode::Plan);
        assert_eq!(before_transaction(&Intent::Absent), StackAction::Stop);
        assert_eq!(before_transaction(&Intent::Withdrawn), StackAction::Stop);
        assert_eq!(before_transaction(&without), StackAction::Stop);
        assert_eq!(before_transaction(&with), StackAction::Keep);
        // A preview changes nothing, the stack included.
        assert_eq!(before_transaction(&plan), StackAction::Keep);

        assert_eq!(
            after_transaction(&with, NodeState::Applied),
            StackAction::Run(Box::new(stack))
        );
        assert_eq!(
            after_transaction(&with, NodeState::Failed),
            StackAction::Keep
        );
        assert_eq!(
            after_transaction(&without, NodeState::Applied),
            StackAction::Keep
        );
        assert_eq!(
            after_transaction(&plan, NodeState::Planned),
            StackAction::Keep
        );
        assert_eq!(
            after_transaction(&Intent::Withdrawn, NodeState::Reverted),
            StackAction::Keep
        );
    }

    #[test]
    fn wanted_reads_the_isolation_of_the_cores() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cpu = dir.path().join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).expect("mkdir");
        std::fs::write(cpu.join("isolated"), "1\n").expect("write");
        std::fs::write(cpu.join("nohz_full"), "1\n").expect("write");
        let stack = UserspaceStack {
            cores: "1".into(),
            interface: "veth0".into(),
            ..UserspaceStack::default()
        };
        let w = wanted_with(&stack, dir.path(), &[], |_| Ok(None)).expect("wanted");
        assert!(w.isolated && w.warning.is_none());
        assert_eq!(w.config.cores, [1]);
        let two = UserspaceStack {
            cores: "1-2".into(),
            ..stack
        };
        let w = wanted_with(&two, dir.path(), &[], |_| Ok(None)).expect("wanted");
        assert!(!w.isolated);
        assert!(w
            .warning
            .is_some_and(|m| m.contains("cores 2 are not isolated")));
    }

    #[test]
    fn a_dpdk_stack_finds_its_device_by_netdev_or_by_pci_address() {
        let dir = tempfile::tempdir().expect("tempdir");
        let eth1 = InterfaceFacts {
            name: "eth1".into(),
            pci_address: Some("0000:00:03.0".into()),
            ..InterfaceFacts::default()
        };
        let by_name = UserspaceStack {
            cores: "1".into(),
            interface: "eth1".into(),
            backend: hoststack_crds::StackBackend::Dpdk,
            ..UserspaceStack::default()
        };
        let pci = |w: Wanted| w.config.dpdk.expect("dpdk settings").pci_address;
        let w = wanted(&by_name, dir.path(), std::slice::from_ref(&eth1)).expect("wanted");
        assert_eq!(pci(w), "0000:00:03.0");
        // Bound to vfio-pci, the netdev is gone: the PCI address names the device.
        let by_address = UserspaceStack {
            interface: "0000:00:03.0".into(),
            ..by_name
        };
        let w = wanted(&by_address, dir.path(), &[]).expect("wanted");
        assert_eq!(pci(w), "0000:00:03.0");
    }

    #[test]
    fn an_af_xdp_stack_steers_by_the_nics_rss_or_says_why_it_cannot_read_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stack = UserspaceStack {
            cores: "1".into(),
            interface: "eth1".into(),
            ..UserspaceStack::default()
        };
        let nic = Rss {
            hash_function: crate::host::ethtool::RSS_HASH_TOEPLITZ,
            key: vec![0xab; 40],
            indirection: vec![0, 1],
        };
        let w = wanted_with(&stack, dir.path(), &[], |dev| {
            assert_eq!(dev, "eth1");
            Ok(Some(nic.clone()))
        })
        .expect("wanted");
        let rss = w.config.rss.expect("the NIC's RSS");
        assert_eq!(rss.key, "ab".repeat(40));
        assert_eq!(rss.indirection, [0, 1]);
        // No RSS on the device (veth): the runner's configured key.
        let w = wanted_with(&stack, dir.path(), &[], |_| Ok(None)).expect("wanted");
        assert_eq!(w.config.rss, None);
        // A missing interface is left to the runner, which reports it in the status.
        let w = wanted_with(&stack, dir.path(), &[], |_| {
            Err(std::io::Error::from_raw_os_error(libc::ENODEV))
        })
        .expect("wanted");
        assert_eq!(w.config.rss, None);
        // Any other failure is the stack's error.
        let error = wanted_with(&stack, dir.path(), &[], |_| {
            Err(std::io::Error::other(
                "reading the RSS key and table of eth1: EBUSY",
            ))
        })
        .unwrap_err();
        assert!(error.contains("RSS key and table of eth1"), "{error}");
        // DPDK and TAP do not ask the NIC.
        let tap = UserspaceStack {
            backend: StackBackend::Tap,
            ..stack
        };
        let w = wanted_with(&tap, dir.path(), &[], |_| panic!("asked")).expect("wanted");
        assert_eq!(w.config.rss, None);
    }
}
