//! The soak: the campaign's script ([`super::campaign`]) over and over for a given time, under
//! the faults that leave the operator and the agents running ([`SOAK_KINDS`]: API server and
//! etcd restarts, an agent cut off, an unwritable state directory), so that each of them is one
//! process for the whole soak. After each schedule, once everything is quiet, it samples the
//! resident memory and open file descriptors of the operator and every agent (at most once per
//! sampling interval), and reports each one's slope.
//!
//! The first schedule is a warm-up: the first sample follows it, once the processes have made
//! their connections and filled their caches (a sample of processes just started says little:
//! 1.3 MiB and 5 descriptors for an agent that holds 30 MiB and 14 once it has worked).
//!
//! Every schedule is checked as in the campaign (its invariants, its settling, nothing left
//! behind after the delete: journal entries, the nftables table, BPF pins); on top, a process
//! whose open file descriptors at the last quiet sample exceed its first by more than
//! [`FD_SLACK`] leaks them.

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

/// One process's slopes over a soak, per minute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slopes {
    /// Resident memory, KiB per minute.
    pub rss: f64,
    /// Its anonymous part, KiB per minute.
    pub anon: f64,
    /// Open file descriptors per minute.
    pub fds: f64,
}

/// The operator's and every agent's usage at one quiet point.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
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
    /// anonymous part in KiB per minute, and open file descriptors per minute.
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
                        .filter_map(|s| Some((s.at.as_secs_f64() / 60.0, f(s.usage.get(&name)?))))
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

    /// Whether nothing was found wrong.
    pub fn passed(&self) -> bool {
        self.campaign.failed().is_empty() && self.fd_leaks().is_empty()
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
            "rss KiB/min",
            "anon KiB/min",
            "fds/min"
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
        Ok(())
    }
}

/// Runs schedules on `lab` (made from [`campaign::lab_config`]) from seed 1 on until `duration`
/// has passed, sampling after the first schedule and then after a schedule when `every` has
/// passed since the last sample.
pub fn run(lab: &Lab, duration: Duration, every: Duration) -> SoakReport {
    let begun = Instant::now();
    let mut report = SoakReport {
        campaign: Report::default(),
        samples: Vec::new(),
    };
    let mut seed = 0;
    while begun.elapsed() < duration || report.samples.is_empty() {
        seed += 1;
        let schedule = Schedule::from_seed(seed, SCRIPT, &SOAK_KINDS);
        let one = campaign::run(lab, std::slice::from_ref(&schedule));
        report.campaign.schedules.extend(one.schedules);
        let due = report
            .samples
            .last()
            .is_none_or(|s| begun.elapsed() >= s.at + every);
        if due || begun.elapsed() >= duration {
            report.samples.push(sample(lab, begun.elapsed()));
        }
    }
    report
}

/// The operator's and every agent's usage now.
fn sample(lab: &Lab, at: Duration) -> Sample {
    let usage = lab
        .processes()
        .into_iter()
        .filter(|(name, _)| name == "operator" || name.starts_with("agent "))
        .filter_map(|(name, pid)| Some((name, usage(pid)?)))
        .collect();
    Sample { at, usage }
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

    fn at(minutes: u64, fds: usize, rss_kib: u64) -> Sample {
        let usage = [(
            "operator".to_string(),
            Usage {
                rss_kib,
                anon_kib: rss_kib / 2,
                fds,
            },
        )]
        .into();
        Sample {
            at: Duration::from_secs(minutes * 60),
            usage,
        }
    }

    #[test]
    fn slopes_are_per_minute_and_leaks_are_past_the_slack() {
        assert_eq!(slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), 2.0);
        assert_eq!(slope(&[(1.0, 1.0)]), 0.0);
        let report = |samples| SoakReport {
            campaign: Report::default(),
            samples,
        };
        let steady = report(vec![at(0, 20, 1000), at(1, 22, 1100), at(2, 24, 1200)]);
        assert_eq!(
            steady.slopes()["operator"],
            Slopes {
                rss: 100.0,
                anon: 50.0,
                fds: 2.0
            }
        );
        assert!(steady.fd_leaks().is_empty() && steady.passed());
        let leaking = report(vec![at(0, 20, 1000), at(5, 25, 1000)]);
        assert_eq!(leaking.fd_leaks(), vec![("operator".to_string(), 20, 25)]);
        assert!(!leaking.passed());
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
