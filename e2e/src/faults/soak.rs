//! The soak: the campaign's script ([`super::campaign`]) over and over for a given time, under
//! the faults that leave the operator and the agents running ([`SOAK_KINDS`]: API server and
//! etcd restarts, an agent cut off, an unwritable state directory), so that each of them is one
//! process for the whole soak. After each schedule, once everything is quiet, it samples the
//! resident memory and open file descriptors of the operator and every agent (at most once per
//! sampling interval), and fits each one's slope per schedule run: a schedule (the script's four
//! rollouts under three faults) is the unit of work a leak grows with, so the slopes do not
//! depend on how fast the machine runs.
//!
//! The first schedule is a warm-up: the first sample follows it, once the processes have made
//! their connections and filled their caches (a sample of processes just started says little:
//! 1.3 MiB and 5 descriptors for an agent that holds 30 MiB and 14 once it has worked).
//!
//! Every schedule is checked as in the campaign (its invariants, its settling, nothing left
//! behind after the delete: journal entries, the nftables table, BPF pins); on top, a process
//! whose open file descriptors at the last quiet sample exceed its first by more than
//! [`FD_SLACK`] leaks them, and a process whose resident memory or descriptors grow faster than
//! its [`Bound`] per schedule leaks.

use super::campaign::{self, Report, SCRIPT};
use super::schedule::{FaultKind, Schedule};
use crate::Lab;
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// The faults of a soak: none of them restarts the operator or an agent.
pub const SOAK_KINDS: [FaultKind; 4] = [
    FaultKind::ApiserverRestart,
    FaultKind::EtcdRestart,
    FaultKind::AgentCutOff,
    FaultKind::StateDirUnwritable,
];

/// How many more open file descriptors than at the first sample a process may hold at the last
/// (a client's connection pool may hold one or two more at one quiet point than at another).
pub const FD_SLACK: usize = 4;

/// One process's use of memory and descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Resident set size, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Its anonymous part, KiB (`RssAnon`: the heap and stacks; the rest is the binary's pages
    /// and other files, which grow as code paths are first run).
    pub anon_kib: u64,
    /// Open file descriptors.
    pub fds: usize,
}

/// One process's slopes over a soak, per schedule run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slopes {
    /// Resident memory, KiB per schedule.
    pub rss: f64,
    /// Its anonymous part, KiB per schedule.
    pub anon: f64,
    /// Open file descriptors per schedule.
    pub fds: f64,
}

/// How fast a process's resident memory and descriptors may grow per schedule.
///
/// Measured (docs/lab.md, The fault campaign): an agent's RSS climbs while glibc's malloc keeps
/// freed memory in its arenas, in steps, to a plateau about 18 MiB above its start, reached in
/// 15 to 50 minutes; on the way it grew up to 1.1 MiB per schedule (the five-minute soak: +9 MB
/// over 8 schedules), and over an hour at most 0.31 MiB per schedule. The operator grew 0.09
/// MiB per schedule in five minutes and 7 KiB over an hour; descriptors stayed flat (a quiet
/// point may hold one or two more than another). The bounds are about twice the steepest growth
/// measured: a leak of more than 2 MiB per schedule in an agent (0.5 MiB per rollout: the 79 MiB
/// between a plateaued agent's 49 MB and its 128 MiB limit gone in 40 schedules), of 0.5 MiB in
/// the operator, or of one descriptor every other schedule fails the soak; slower leaks show in
/// the hour-long soak's table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    /// Resident memory, KiB per schedule.
    pub rss_kib: f64,
    /// Open file descriptors per schedule.
    pub fds: f64,
}

/// The bound of an agent's growth ([`Bound`]).
pub const AGENT_BOUND: Bound = Bound {
    rss_kib: 2048.0,
    fds: 0.5,
};

/// The bound of the operator's growth ([`Bound`]).
pub const OPERATOR_BOUND: Bound = Bound {
    rss_kib: 512.0,
    fds: 0.5,
};

/// The bound of the process named `name` ("operator" or "agent <node>").
pub fn bound_of(name: &str) -> Bound {
    if name == "operator" {
        OPERATOR_BOUND
    } else {
        AGENT_BOUND
    }
}

/// The operator's and every agent's usage at one quiet point.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// How many schedules had run.
    pub schedules: usize,
    /// Since the soak began.
    pub at: Duration,
    /// By process name ("operator", "agent node-a", ...).
    pub usage: BTreeMap<String, Usage>,
}

/// What a soak did and found.
#[derive(Debug)]
pub struct SoakReport {
    /// The schedules run, as a campaign reports them.
    pub campaign: Report,
    /// The samples, in time order.
    pub samples: Vec<Sample>,
}

impl SoakReport {
    /// Each process's slopes over the samples (least squares): resident memory and its
    /// anonymous part in KiB per schedule, and open file descriptors per schedule.
    pub fn slopes(&self) -> BTreeMap<String, Slopes> {
        let names = self
            .samples
            .first()
            .map(|s| s.usage.keys().cloned().collect::<Vec<_>>());
        names
            .unwrap_or_default()
            .into_iter()
            .map(|name| {
                let points = |f: &dyn Fn(&Usage) -> f64| -> Vec<(f64, f64)> {
                    self.samples
                        .iter()
                        .filter_map(|s| Some((s.schedules as f64, f(s.usage.get(&name)?))))
                        .collect()
                };
                let slopes = Slopes {
                    rss: slope(&points(&|u| u.rss_kib as f64)),
                    anon: slope(&points(&|u| u.anon_kib as f64)),
                    fds: slope(&points(&|u| u.fds as f64)),
                };
                (name, slopes)
            })
            .collect()
    }

    /// Processes whose descriptors at the last sample exceed the first by more than
    /// [`FD_SLACK`], with both counts.
    pub fn fd_leaks(&self) -> Vec<(String, usize, usize)> {
        let (Some(first), Some(last)) = (self.samples.first(), self.samples.last()) else {
            return Vec::new();
        };
        first
            .usage
            .iter()
            .filter_map(|(name, before)| {
                let after = last.usage.get(name)?;
                (after.fds > before.fds + FD_SLACK).then(|| (name.clone(), before.fds, after.fds))
            })
            .collect()
    }

    /// The processes whose resident memory or descriptors grew faster than their [`Bound`]
    /// per schedule, each with what grew.
    pub fn growth(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (name, slopes) in self.slopes() {
            let bound = bound_of(&name);
            if slopes.rss > bound.rss_kib {
                found.push(format!(
                    "{name}: RSS grew {:.0} KiB per schedule (bound {:.0})",
                    slopes.rss, bound.rss_kib
                ));
            }
            if slopes.fds > bound.fds {
                found.push(format!(
                    "{name}: descriptors grew {:.2} per schedule (bound {:.2})",
                    slopes.fds, bound.fds
                ));
            }
        }
        found
    }

    /// Whether nothing was found wrong.
    pub fn passed(&self) -> bool {
        self.campaign.failed().is_empty() && self.fd_leaks().is_empty() && self.growth().is_empty()
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.campaign)?;
        writeln!(f, "{} samples at quiet points", self.samples.len())?;
        writeln!(
            f,
            "{:<16} {:>10} {:>10} {:>11} {:>10} {:>7} {:>6} {:>12} {:>13} {:>8}",
            "process",
            "rss first",
            "rss last",
            "anon first",
            "anon last",
            "fds 1st",
            "last",
            "rss KiB/sch",
            "anon KiB/sch",
            "fds/sch"
        )?;
        let slopes = self.slopes();
        let (first, last) = match (self.samples.first(), self.samples.last()) {
            (Some(first), Some(last)) => (first, last),
            _ => return Ok(()),
        };
        for (name, per_minute) in &slopes {
            let (Some(a), Some(b)) = (first.usage.get(name), last.usage.get(name)) else {
                continue;
            };
            writeln!(
                f,
                "{name:<16} {:>10} {:>10} {:>11} {:>10} {:>7} {:>6} {:>12.1} {:>13.1} {:>8.2}",
                a.rss_kib,
                b.rss_kib,
                a.anon_kib,
                b.anon_kib,
                a.fds,
                b.fds,
                per_minute.rss,
                per_minute.anon,
                per_minute.fds
            )?;
        }
        for (name, before, after) in self.fd_leaks() {
            writeln!(f, "LEAK: {name} held {before} descriptors, then {after}")?;
        }
        for growth in self.growth() {
            writeln!(f, "LEAK: {growth}")?;
        }
        Ok(())
    }
}

/// Runs schedules on `lab` (made from [`campaign::lab_config`]) from seed 1 on until `duration`
/// has passed and at least `schedules` have run, sampling after the first schedule and then
/// after a schedule when `every` has passed since the last sample (after every schedule for a
/// zero `every`). A soak's length in schedules, not minutes, makes its slopes as sure on a busy
/// machine as on a quiet one.
pub fn run(lab: &Lab, duration: Duration, schedules: usize, every: Duration) -> SoakReport {
    let begun = Instant::now();
    let mut report = SoakReport {
        campaign: Report::default(),
        samples: Vec::new(),
    };
    let mut seed = 0;
    let done = |report: &SoakReport| {
        begun.elapsed() >= duration && report.campaign.schedules.len() >= schedules
    };
    while !done(&report) || report.samples.is_empty() {
        seed += 1;
        let schedule = Schedule::from_seed(seed, SCRIPT, &SOAK_KINDS);
        let one = campaign::run(lab, std::slice::from_ref(&schedule));
        report.campaign.schedules.extend(one.schedules);
        let due = report
            .samples
            .last()
            .is_none_or(|s| begun.elapsed() >= s.at + every);
        if due || done(&report) {
            let run = report.campaign.schedules.len();
            report.samples.push(sample(lab, run, begun.elapsed()));
        }
    }
    report
}

/// The operator's and every agent's usage now, after `schedules` schedules.
fn sample(lab: &Lab, schedules: usize, at: Duration) -> Sample {
    let usage = lab
        .processes()
        .into_iter()
        .filter(|(name, _)| name == "operator" || name.starts_with("agent "))
        .filter_map(|(name, pid)| Some((name, usage(pid)?)))
        .collect();
    Sample {
        schedules,
        at,
        usage,
    }
}

/// A process's usage, from /proc (`None` once it has exited).
fn usage(pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |field: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Usage {
        rss_kib: kib("VmRSS:")?,
        anon_kib: kib("RssAnon:")?,
        fds,
    })
}

/// The least-squares slope of `points` (x, y); 0 for fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if sxx > 0.0 {
        sxy / sxx
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A soak's samples of one process, `name`, after schedules 1, 2, ...: (RSS KiB, fds).
    fn series(name: &str, points: &[(u64, usize)]) -> SoakReport {
        let samples = points
            .iter()
            .enumerate()
            .map(|(i, &(rss_kib, fds))| Sample {
                schedules: i + 1,
                at: Duration::from_secs(30 * i as u64),
                usage: [(
                    name.to_string(),
                    Usage {
                        rss_kib,
                        anon_kib: rss_kib / 2,
                        fds,
                    },
                )]
                .into(),
            })
            .collect();
        SoakReport {
            campaign: Report::default(),
            samples,
        }
    }

    #[test]
    fn slopes_are_per_schedule_and_fd_leaks_are_past_the_slack() {
        assert_eq!(slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), 2.0);
        assert_eq!(slope(&[(1.0, 1.0)]), 0.0);
        let steady = series("operator", &[(1000, 20), (1100, 20), (1200, 20)]);
        assert_eq!(
            steady.slopes()["operator"],
            Slopes {
                rss: 100.0,
                anon: 50.0,
                fds: 0.0
            }
        );
        assert!(steady.fd_leaks().is_empty() && steady.passed());
        let leaking = series("operator", &[(1000, 20), (1000, 25)]);
        assert_eq!(leaking.fd_leaks(), vec![("operator".to_string(), 20, 25)]);
        assert!(!leaking.passed());
    }

    #[test]
    fn a_flat_noisy_series_and_the_measured_arena_climb_pass_their_bounds() {
        // An agent wandering by a few MiB between quiet points, with no trend.
        let noisy = [
            31_000, 34_000, 30_500, 33_500, 31_500, 34_500, 30_000, 33_000, 32_000,
        ];
        let fds = [14, 15, 14, 16, 14, 15, 14, 16, 14];
        let points: Vec<(u64, usize)> = noisy.into_iter().zip(fds).collect();
        let flat = series("agent node-a", &points);
        assert!(flat.growth().is_empty(), "{:?}", flat.growth());
        // The steepest climb to the allocator's plateau measured in a five-minute soak.
        let climb = series(
            "agent node-a",
            &[
                (31_088, 14),
                (31_200, 14),
                (35_400, 14),
                (35_500, 14),
                (39_700, 14),
                (39_800, 14),
                (40_000, 14),
                (40_100, 14),
            ],
        );
        assert!(climb.growth().is_empty(), "{:?}", climb.growth());
        assert!(climb.passed());
    }

    #[test]
    fn a_leaking_series_fails_its_bound() {
        // An agent that keeps 2.5 MiB more after every schedule, under the same noise.
        let noise = [0, 3_000, -500, 2_500, 500, 3_500, -1_000, 2_000];
        let points: Vec<(u64, usize)> = noise
            .iter()
            .enumerate()
            .map(|(i, n)| ((31_000 + 2_560 * i as i64 + n) as u64, 14))
            .collect();
        let leaking = series("agent node-a", &points);
        let growth = leaking.growth();
        assert_eq!(growth.len(), 1, "{growth:?}");
        assert!(
            growth[0].starts_with("agent node-a: RSS grew "),
            "{growth:?}"
        );
        assert!(!leaking.passed());
        // The operator's bound is tighter: 0.75 MiB per schedule is a leak there.
        let operator: Vec<(u64, usize)> = (0..8).map(|i| (30_000 + 768 * i, 17)).collect();
        assert_eq!(series("operator", &operator).growth().len(), 1);
        // A descriptor kept every schedule, within FD_SLACK of the first sample at the last
        // (too short a soak for the count to show it), is a leak by its slope.
        let fds = series(
            "operator",
            &[(30_000, 17), (30_000, 18), (30_000, 19), (30_000, 20)],
        );
        assert!(fds.fd_leaks().is_empty());
        assert_eq!(
            fds.growth(),
            vec!["operator: descriptors grew 1.00 per schedule (bound 0.50)".to_string()]
        );
    }

    #[test]
    fn no_soak_fault_restarts_the_operator_or_an_agent() {
        for kind in SOAK_KINDS {
            assert!(!matches!(
                kind,
                FaultKind::OperatorKill
                    | FaultKind::AgentKillInTransaction
                    | FaultKind::AgentKillInRevert
            ));
        }
    }
}
