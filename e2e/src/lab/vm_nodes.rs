//! The lab's VM nodes ([`crate::NodeKind::Vm`]), on top of [`crate::vm`]: for each, a
//! [`Vm`] prepared in its node's namespace (kernel, initramfs, wiring, the agent's launcher
//! with the flags of [`super::workloads`]), its qemu started as a lab process, and its guest
//! awaited; a guest's power can be cut and put back on (a reboot); at teardown each guest
//! stops its agent and powers off, then its taps go.

use super::network;
use super::nodes::Nodes;
use super::wait::LabLog;
use super::workloads::Workloads;
use crate::config::NodeKind;
use crate::process::{self, Managed, ProcessState, Spawner};
use crate::vm::{self, Vm};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a VM node's guest may take from starting qemu until it is ready (TCG).
const VM_BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// The VM nodes of one lab and their qemu processes.
#[derive(Default)]
pub(crate) struct VmNodes {
    /// (node, its VM), in configuration order.
    vms: Vec<(String, Vm)>,
    /// qemu by process name ([`Vm::process_name`]).
    qemu: Mutex<BTreeMap<String, Managed>>,
}

impl VmNodes {
    /// Prepares and starts every VM node's qemu (with the agent of `agents` inside, if given),
    /// then waits until each guest is ready.
    pub fn boot(
        &mut self,
        lab_dir: &Path,
        index: u8,
        nodes: &Nodes,
        agents: Option<&Workloads>,
        spawner: &Spawner,
        log: &LabLog,
    ) -> Result<()> {
        let mut launched = Vec::new();
        for (position, node) in nodes.iter().enumerate() {
            if node.spec.kind != NodeKind::Vm {
                continue;
            }
            let name = &node.spec.name;
            let agent = agents.map(|workloads| vm::AgentLaunch {
                program: workloads.agent_program().to_path_buf(),
                args: workloads.agent_flags(
                    node,
                    Path::new(vm::GUEST_STATE_DIR),
                    Path::new(vm::GUEST_BPFFS_ROOT),
                ),
                env: workloads.agent_env(name),
            });
            let place = vm::Placement {
                lab_dir,
                index,
                position,
                node: name,
                netns: &node.netns,
                ip: node.ip,
                gateway: network::bridge_ip(index),
            };
            let machine = Vm::prepare(&place, agent.as_ref())?;
            // The guest's agent log, where diagnostics look for every agent's log.
            let _ = std::os::unix::fs::symlink(
                machine.agent_log(),
                process::log_path(lab_dir, &format!("agent-{name}")),
            );
            let qemu = spawner.spawn(
                &machine.process_name(),
                Path::new("ip"),
                &machine.launch_args(),
                &[],
            )?;
            self.qemu().insert(machine.process_name(), qemu);
            log.note(&format!(
                "VM node {name}: kernel {} ready and initramfs built in {:.2}s",
                machine.kernel_release(),
                machine.prepared_in().as_secs_f64()
            ));
            self.vms.push((name.clone(), machine));
            launched.push((self.vms.len() - 1, Instant::now()));
        }
        for (i, started) in launched {
            let (name, machine) = &self.vms[i];
            let booted = self.await_boot(machine, started)?;
            log.note(&format!(
                "VM node {name}: guest ready {:.2}s after qemu started",
                booted.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// Cuts the power of VM node `node`: SIGKILL of its qemu, which stays listed (exited)
    /// until [`VmNodes::power_on`]; the guest's last boot is forgotten ([`Vm::forget_boot`]).
    pub fn cut_power(&self, node: &str) -> Result<()> {
        let machine = self.running(node)?;
        let mut qemu = self.qemu();
        let process = qemu
            .get_mut(&machine.process_name())
            .ok_or_else(|| Error::Setup(format!("{node} has no qemu")))?;
        process.kill().map_err(Error::Setup)?;
        machine.forget_boot()
    }

    /// Starts the qemu of VM node `node` again, after [`VmNodes::cut_power`]: the guest boots
    /// afresh, with its kernel's boot-time settings, and its init starts the agent on the state
    /// directory it had (see [`vm::GUEST_STATE_DIR`]). Returns how long the guest took to be
    /// ready.
    pub fn power_on(&self, node: &str, spawner: &Spawner, log: &LabLog) -> Result<Duration> {
        let machine = self.running(node)?;
        let process = machine.process_name();
        let qemu = {
            let mut qemu = self.qemu();
            let old = qemu
                .get_mut(&process)
                .ok_or_else(|| Error::Setup(format!("{node} has no qemu")))?;
            if old.exited().is_none() {
                return Err(Error::Setup(format!("{node}'s power is on")));
            }
            spawner.respawn(old)?
        };
        let started = Instant::now();
        self.qemu().insert(process, qemu);
        let booted = self.await_boot(machine, started)?;
        log.note(&format!(
            "VM node {node}: powered on again; guest ready {:.2}s after qemu started",
            booted.as_secs_f64()
        ));
        Ok(booted)
    }

    /// Waits until `machine`'s guest is ready ([`Vm::await_boot`]), its qemu started at
    /// `started`; fails early when that qemu exits.
    fn await_boot(&self, machine: &Vm, started: Instant) -> Result<Duration> {
        let process = machine.process_name();
        machine.await_boot(started, VM_BOOT_TIMEOUT, || {
            self.qemu()
                .get_mut(&process)
                .map_or(Some("gone".to_string()), |p| {
                    p.exited().map(|s| s.to_string())
                })
        })
    }

    /// The VM of `node`, or an error naming it.
    fn running(&self, node: &str) -> Result<&Vm> {
        self.get(node)
            .ok_or_else(|| Error::Setup(format!("{node} is not a running VM node")))
    }

    fn qemu(&self) -> MutexGuard<'_, BTreeMap<String, Managed>> {
        self.qemu.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The VM of node `node`, if it is a running VM node.
    pub fn get(&self, node: &str) -> Option<&Vm> {
        self.vms.iter().find(|(n, _)| n == node).map(|(_, vm)| vm)
    }

    /// The names of the running VM nodes, in configuration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vms.iter().map(|(n, _)| n.as_str())
    }

    /// The qemu processes as they are now.
    pub fn states(&self) -> Vec<ProcessState> {
        self.qemu().values_mut().map(Managed::state).collect()
    }

    /// Asks each guest to stop its agent and power off, waits for its qemu (killing it after a
    /// grace period) and deletes its taps; the failures.
    pub fn power_off(&mut self) -> Vec<String> {
        let qemu = self.qemu.get_mut().unwrap_or_else(PoisonError::into_inner);
        let mut errors = Vec::new();
        for (_, machine) in &self.vms {
            errors.extend(machine.power_off(qemu.remove(&machine.process_name())));
        }
        errors
    }
}
