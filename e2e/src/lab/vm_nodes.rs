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
use crate::vm::{self, BootFailure, Vm};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Boots tried before a VM node counts as not coming up. The guest's kernel under TCG has been
/// seen to stop for good during boot on a busy host (after enumerating PCI, before init), once
/// in many boots; as a node's BMC power-cycles a node that does not come up, the lab cuts the
/// power of such a guest and boots it again, and notes it with where its vCPUs were.
const VM_BOOT_ATTEMPTS: u32 = 3;

/// The VM nodes of one lab and their qemu processes.
pub(crate) struct VmNodes {
    /// How long one boot may take before the guest is power-cycled
    /// ([`crate::LabConfig::vm_boot_timeout`]).
    boot_timeout: Duration,
    /// (node, its VM), in configuration order.
    vms: Vec<(String, Vm)>,
    /// qemu by process name ([`Vm::process_name`]).
    qemu: Mutex<BTreeMap<String, Managed>>,
}

impl VmNodes {
    /// No VM nodes yet; each boot of one may take `boot_timeout`.
    pub fn new(boot_timeout: Duration) -> VmNodes {
        VmNodes {
            boot_timeout,
            vms: Vec::new(),
            qemu: Mutex::default(),
        }
    }

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
            let booted = self.await_boot(machine, started, spawner, log)?;
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
        let started = self.relaunch(machine, spawner)?;
        let booted = self.await_boot(machine, started, spawner, log)?;
        log.note(&format!(
            "VM node {node}: powered on again; guest ready {:.2}s after qemu started",
            booted.as_secs_f64()
        ));
        Ok(booted)
    }

    /// Starts `machine`'s qemu again, its power off; returns when.
    fn relaunch(&self, machine: &Vm, spawner: &Spawner) -> Result<Instant> {
        let process = machine.process_name();
        let qemu = {
            let mut qemu = self.qemu();
            let old = qemu
                .get_mut(&process)
                .ok_or_else(|| Error::Setup(format!("{} has no qemu", machine.node())))?;
            if old.exited().is_none() {
                return Err(Error::Setup(format!("{}'s power is on", machine.node())));
            }
            spawner.respawn(old)?
        };
        let started = Instant::now();
        self.qemu().insert(process, qemu);
        Ok(started)
    }

    /// Waits until `machine`'s guest is ready ([`Vm::await_boot`]), its qemu started at
    /// `started`; fails early when that qemu exits. A guest not ready after
    /// its boot timeout is power-cycled, up to [`VM_BOOT_ATTEMPTS`] boots in all; returns
    /// how long the boot that came up took.
    fn await_boot(
        &self,
        machine: &Vm,
        mut started: Instant,
        spawner: &Spawner,
        log: &LabLog,
    ) -> Result<Duration> {
        let process = machine.process_name();
        let mut boot = 1;
        loop {
            let exited = || {
                self.qemu()
                    .get_mut(&process)
                    .map_or(Some("gone".to_string()), |p| {
                        p.exited().map(|s| s.to_string())
                    })
            };
            match machine.await_boot(started, self.boot_timeout, exited) {
                Err(BootFailure::NotReady(why)) if boot < VM_BOOT_ATTEMPTS => {
                    log.note(&format!(
                        "{why}\nVM node {}: power-cycling it (boot {boot} of \
                         {VM_BOOT_ATTEMPTS} did not come up)",
                        machine.node()
                    ));
                    self.cut_power(machine.node())?;
                    started = self.relaunch(machine, spawner)?;
                    boot += 1;
                }
                Ok(took) => {
                    if let Err(e) = machine.keep_kallsyms() {
                        log.note(&format!("VM node {}: {e}", machine.node()));
                    }
                    return Ok(took);
                }
                Err(failure) => return Err(failure.into()),
            }
        }
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
