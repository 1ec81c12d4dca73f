//! Seeded fault schedules: a schedule is a seed. The same seed over the same rollout script
//! gives the same faults at the same points, so a failing campaign is replayed from the seed
//! it prints and kept as a regression case by committing that seed.

use std::fmt;

/// A fault the harness can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL of the leading operator replica.
    OperatorKill,
    /// SIGKILL of an agent while it applies a transaction.
    AgentKillInTransaction,
    /// SIGKILL of an agent while it reverts one.
    AgentKillInRevert,
    /// SIGKILL of an agent between its transaction and its confirmation (the dead-man window).
    AgentKillInWindow,
    /// A kube-apiserver restart.
    ApiserverRestart,
    /// etcd killed and started again on the same data.
    EtcdRestart,
    /// An agent cut off from the API server for longer than the heartbeat timeout, then healed.
    AgentCutOff,
    /// An agent cut off from the API server between its transaction and its confirmation, for
    /// longer than `confirmTimeout`, then healed.
    AgentCutOffInWindow,
    /// An agent's state directory made unwritable.
    StateDirUnwritable,
    /// A reboot of the VM node.
    VmReboot,
}

impl FaultKind {
    /// Every kind, in a fixed order.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::OperatorKill,
        FaultKind::AgentKillInTransaction,
        FaultKind::AgentKillInRevert,
        FaultKind::AgentKillInWindow,
        FaultKind::ApiserverRestart,
        FaultKind::EtcdRestart,
        FaultKind::AgentCutOff,
        FaultKind::AgentCutOffInWindow,
        FaultKind::StateDirUnwritable,
        FaultKind::VmReboot,
    ];

    /// Whether the fault hits one node (which [`Fault::node`] names).
    pub fn targets_a_node(self) -> bool {
        !matches!(
            self,
            FaultKind::OperatorKill | FaultKind::ApiserverRestart | FaultKind::EtcdRestart
        )
    }
}

/// One fault of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// In which step of the rollout script it fires (0-based).
    pub step: usize,
    /// How long into that step, in milliseconds.
    pub delay_ms: u64,
    /// Which node, by index, for a fault that hits one.
    pub node: usize,
}

/// The shape of the rollout script a schedule is drawn for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Script {
    /// Steps (tuning applied, waves, rollback, delete, ...).
    pub steps: usize,
    /// Nodes in the lab.
    pub nodes: usize,
    /// Faults per schedule.
    pub faults: usize,
    /// A fault fires at most this long into its step, in milliseconds.
    pub max_delay_ms: u64,
}

/// The faults one seed chooses, in firing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The seed that replays it.
    pub seed: u64,
    /// The faults, ordered by step and delay.
    pub faults: Vec<Fault>,
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {}:", self.seed)?;
        for fault in &self.faults {
            write!(f, " {:?}@{}+{}ms", fault.kind, fault.step, fault.delay_ms)?;
            if fault.kind.targets_a_node() {
                write!(f, "/node{}", fault.node)?;
            }
        }
        Ok(())
    }
}

/// SplitMix64: small, fast and the same on every platform, which is all a schedule needs.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next() % bound
        }
    }
}

impl Schedule {
    /// The schedule `seed` chooses for `script` among `kinds`.
    pub fn from_seed(seed: u64, script: Script, kinds: &[FaultKind]) -> Schedule {
        let mut rng = SplitMix(seed);
        let mut faults: Vec<Fault> = (0..script.faults)
            .filter(|_| !kinds.is_empty())
            .map(|_| Fault {
                kind: kinds[rng.below(kinds.len() as u64) as usize],
                step: rng.below(script.steps as u64) as usize,
                delay_ms: rng.below(script.max_delay_ms + 1),
                node: rng.below(script.nodes as u64) as usize,
            })
            .collect();
        faults.sort_by_key(|f| (f.step, f.delay_ms));
        Schedule { seed, faults }
    }
}

/// Schedules from seeds 1, 2, ... until every kind has been drawn at least `times` times:
/// what CI runs so that each fault is exercised, more than once.
pub fn covering(script: Script, kinds: &[FaultKind], times: usize) -> Vec<Schedule> {
    let mut schedules = Vec::new();
    let mut seed = 0;
    let covered = |schedules: &[Schedule]| {
        kinds.iter().all(|kind| {
            schedules
                .iter()
                .flat_map(|s| &s.faults)
                .filter(|f| f.kind == *kind)
                .count()
                >= times
        })
    };
    while script.faults > 0 && !kinds.is_empty() && !covered(&schedules) {
        seed += 1;
        schedules.push(Schedule::from_seed(seed, script, kinds));
    }
    schedules
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: Script = Script {
        steps: 6,
        nodes: 5,
        faults: 2,
        max_delay_ms: 3000,
    };

    #[test]
    fn a_seed_replays_its_schedule() {
        let a = Schedule::from_seed(42, SCRIPT, &FaultKind::ALL);
        assert_eq!(a, Schedule::from_seed(42, SCRIPT, &FaultKind::ALL));
        assert_ne!(a, Schedule::from_seed(43, SCRIPT, &FaultKind::ALL));
        assert_eq!(a.faults.len(), 2);
        assert!(a
            .faults
            .windows(2)
            .all(|w| (w[0].step, w[0].delay_ms) <= (w[1].step, w[1].delay_ms)));
        assert!(a
            .faults
            .iter()
            .all(|f| f.step < 6 && f.delay_ms <= 3000 && f.node < 5));
        assert!(a.to_string().starts_with("seed 42: "));
    }

    #[test]
    fn covering_draws_every_kind_at_least_twice() {
        let schedules = covering(SCRIPT, &FaultKind::ALL, 2);
        for kind in FaultKind::ALL {
            let n = schedules
                .iter()
                .flat_map(|s| &s.faults)
                .filter(|f| f.kind == kind)
                .count();
            assert!(n >= 2, "{kind:?} drawn {n} times");
        }
        // The seeds are consecutive from 1, so the same list comes back every time.
        assert_eq!(
            schedules.iter().map(|s| s.seed).collect::<Vec<_>>(),
            (1..=schedules.len() as u64).collect::<Vec<_>>()
        );
        assert!(covering(SCRIPT, &[], 2).is_empty());
    }
}
