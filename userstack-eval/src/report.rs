//! What one run of one row measured, and how userstack's figures compare with Linux's.

use hoststack_runner_api::{IdlePolicy, QueueDrops, RxWait};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use userstack_sim::median;

/// Counters by section and name, as /proc/net/snmp and /proc/net/netstat name them
/// (`Tcp` → `RetransSegs`, `TcpExt` → `TCPSackRecovery`); the runner's stats use the same.
pub type Counters = BTreeMap<String, BTreeMap<String, i64>>;

/// Which stack sends and which receives.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub enum Pairing {
    /// Linux's TCP on both ends: the reference.
    LinuxToLinux,
    /// userstack sends, Linux receives.
    UserstackToLinux,
    /// Linux sends, userstack receives.
    LinuxToUserstack,
}

impl Pairing {
    /// Every pairing, in the tables' order.
    pub const ALL: [Pairing; 3] = [
        Pairing::LinuxToLinux,
        Pairing::UserstackToLinux,
        Pairing::LinuxToUserstack,
    ];

    /// The pairing's name in tables and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Pairing::LinuxToLinux => "linux-linux",
            Pairing::UserstackToLinux => "userstack-linux",
            Pairing::LinuxToUserstack => "linux-userstack",
        }
    }

    /// The pairing named `name` ([`Pairing::as_str`]).
    pub fn parse(name: &str) -> Option<Pairing> {
        Pairing::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// The pairings `text` names, separated by commas.
    pub fn parse_list(text: &str) -> Result<Vec<Pairing>, String> {
        text.split(',')
            .map(|name| {
                Pairing::parse(name.trim()).ok_or_else(|| format!("no pairing is named {name:?}"))
            })
            .collect()
    }

    /// Whether userstack sends.
    pub fn userstack_sends(self) -> bool {
        self == Pairing::UserstackToLinux
    }

    /// Whether userstack receives.
    pub fn userstack_receives(self) -> bool {
        self == Pairing::LinuxToUserstack
    }
}

/// One run of one row with one pairing on the real link.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    /// The row's label ([`crate::rows::Row::label`]).
    pub row: String,
    /// Who sent and who received.
    pub pairing: Pairing,
    /// The core a spinning thread kept busy during the run, if any (`--spin-core`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spin_core: Option<u32>,
    /// The kernel's packet work was kept off the runner's core (RPS on every veth).
    #[serde(default)]
    pub steered: bool,
    /// How the runner's shard waited when idle, in the pairings with a runner (`park`, the
    /// runner's default, when absent).
    #[serde(default, skip_serializing_if = "IdlePolicy::is_park")]
    pub runner_idle: IdlePolicy,
    /// The measured window after the warm-up, in seconds.
    pub seconds: f64,
    /// Each flow's goodput over the window in Mbit/s: bytes the Linux receiver read, or, when
    /// userstack receives, bytes the Linux sender saw acknowledged (`tcpi_bytes_acked`).
    pub flow_mbps: Vec<f64>,
    /// How far the sending stack's counters moved over the window.
    pub sender: Counters,
    /// How far the receiving stack's counters moved over the window.
    pub receiver: Counters,
    /// Where the window's time went (absent from runs that predate it).
    #[serde(default)]
    pub load: Load,
}

/// Where a run's time went: the guest's CPUs, what held Linux's sender back, and how busy the
/// runner was and what its queue dropped — to tell a stack's own limit from the machine's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Load {
    /// Each guest CPU's share of the window busy (neither idle nor waiting for I/O), by CPU.
    pub cpu_busy: Vec<f64>,
    /// Each guest CPU's share of the window in softirq (veth, netem, tbf, XDP), by CPU.
    pub cpu_softirq: Vec<f64>,
    /// When Linux sends: the share of its connections' sending time that the receiver's
    /// window held it back (`tcpi_rwnd_limited` ÷ `tcpi_busy_time`, summed over flows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rwnd_limited: Option<f64>,
    /// When Linux sends: the share its send buffer held it back (`tcpi_sndbuf_limited`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sndbuf_limited: Option<f64>,
    /// When userstack is an end: the share of its loop's time in turns that did something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_busy: Option<f64>,
    /// When userstack is an end: what its AF_XDP queue dropped over the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_drops: Option<QueueDrops>,
    /// When userstack is an end: how long the frames it received over the window waited
    /// between the XDP program and its loop (the veth's batch publication, the loop's wake-up
    /// and current turn). Absent where the runner's frames carried no stamps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_rx_wait: Option<RxWait>,
    /// When userstack is an end and its XDP program ran without receive stamps: why (the
    /// runner's `rxStamps` reason), so the frames' wait is empty for a stated reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_rx_stamps_unavailable: Option<String>,
    /// Data packets the row's random loss dropped over the window (netem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_losses: Option<u64>,
    /// Data packets the bottleneck queue dropped over the window, full (tbf).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_drops: Option<u64>,
    /// When Linux sends: its connections' mean smoothed RTT over the window (`tcpi_rtt`,
    /// looked at every second), in milliseconds — the path's delay plus the queue's plus the
    /// receiver's ACK delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_rtt_ms: Option<f64>,
    /// The mean round trip of ICMP echoes from the sender's namespace to the receiver over the
    /// window (five a second), in milliseconds: the same path and queue with no TCP in it, so
    /// the smoothed RTT above it is the receiver's ACK delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ping_rtt_ms: Option<f64>,
}

impl Measurement {
    /// All flows' goodput.
    pub fn goodput_mbps(&self) -> f64 {
        self.flow_mbps.iter().sum()
    }

    /// Jain's fairness index over the flows.
    pub fn jain(&self) -> f64 {
        jain(&self.flow_mbps)
    }

    /// The sender's counter `section`.`name` (0 when absent).
    pub fn sent(&self, section: &str, name: &str) -> i64 {
        counter(&self.sender, section, name)
    }

    /// Segments retransmitted per segment sent by the sender (RetransSegs / OutSegs).
    pub fn retransmitted_per_sent(&self) -> f64 {
        self.sent("Tcp", "RetransSegs") as f64 / self.sent("Tcp", "OutSegs").max(1) as f64
    }

    /// Fast recoveries the sender entered (TCPSackRecovery + TCPRenoRecovery).
    pub fn recoveries(&self) -> i64 {
        self.sent("TcpExt", "TCPSackRecovery") + self.sent("TcpExt", "TCPRenoRecovery")
    }

    /// The sender's retransmission timeouts (TCPTimeouts).
    pub fn rtos(&self) -> i64 {
        self.sent("TcpExt", "TCPTimeouts")
    }

    /// Congestion responses the sender undid (TCPFullUndo + TCPLossUndo).
    pub fn undos(&self) -> i64 {
        self.sent("TcpExt", "TCPFullUndo") + self.sent("TcpExt", "TCPLossUndo")
    }
}

/// One row and pairing over its runs: the median of each figure, and the lowest goodput and
/// Jain (the worst run).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// How many runs.
    pub runs: usize,
    /// Median goodput, Mbit/s.
    pub goodput_mbps: f64,
    /// Lowest goodput, Mbit/s.
    pub lowest_goodput_mbps: f64,
    /// Median Jain's index.
    pub jain: f64,
    /// Lowest Jain's index.
    pub lowest_jain: f64,
    /// Median retransmitted/sent.
    pub retransmitted_per_sent: f64,
    /// Median fast recoveries.
    pub recoveries: f64,
    /// Median RTOs.
    pub rtos: f64,
    /// Median undos.
    pub undos: f64,
}

impl Summary {
    /// The summary of `runs`; `None` when there are none.
    pub fn of(runs: &[&Measurement]) -> Option<Summary> {
        if runs.is_empty() {
            return None;
        }
        let all = |f: &dyn Fn(&Measurement) -> f64| runs.iter().map(|m| f(m)).collect::<Vec<_>>();
        let lowest = |values: Vec<f64>| values.into_iter().fold(f64::INFINITY, f64::min);
        Some(Summary {
            runs: runs.len(),
            goodput_mbps: median(&all(&Measurement::goodput_mbps)),
            lowest_goodput_mbps: lowest(all(&Measurement::goodput_mbps)),
            jain: median(&all(&Measurement::jain)),
            lowest_jain: lowest(all(&Measurement::jain)),
            retransmitted_per_sent: median(&all(&Measurement::retransmitted_per_sent)),
            recoveries: median(&all(&|m| m.recoveries() as f64)),
            rtos: median(&all(&|m| m.rtos() as f64)),
            undos: median(&all(&|m| m.undos() as f64)),
        })
    }
}

/// `counters`' `section`.`name`, 0 when absent.
pub fn counter(counters: &Counters, section: &str, name: &str) -> i64 {
    counters
        .get(section)
        .and_then(|s| s.get(name))
        .copied()
        .unwrap_or(0)
}

/// How far each counter moved from `before` to `after` (counters absent before count from 0).
pub fn moved(before: &Counters, after: &Counters) -> Counters {
    after
        .iter()
        .map(|(section, names)| {
            let moved = names
                .iter()
                .map(|(name, value)| (name.clone(), value - counter(before, section, name)))
                .collect();
            (section.clone(), moved)
        })
        .collect()
}

/// Jain's fairness index: (Σx)² / (n Σx²); 1 when every value is equal, 1/n when one value
/// has everything; 0 for no values or all zero.
pub fn jain(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|v| v * v).sum();
    if squares == 0.0 {
        0.0
    } else {
        sum * sum / (values.len() as f64 * squares)
    }
}

/// How userstack's row compares with Linux's on the same path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Goodput more than 2 % above Linux's, and nothing worse.
    Better,
    /// Goodput and Jain within 2 % of Linux's (or above), retransmitted/sent no more than 0.2
    /// percentage points above.
    Equal,
    /// Goodput or Jain more than 2 % below Linux's, or retransmitted/sent more than 0.2
    /// percentage points above.
    Worse,
}

/// A figure by which a line falls short of Linux's (see [`Mark::Worse`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shortfall {
    /// Goodput more than 2 % below.
    Goodput,
    /// Jain's index more than 2 % below.
    Jain,
    /// Retransmitted/sent more than 0.2 percentage points above.
    Retransmissions,
}

impl Shortfall {
    /// Where `userstack` falls short of `linux` (medians over their runs).
    pub fn of(userstack: &Summary, linux: &Summary) -> Vec<Shortfall> {
        let below = |ours: f64, theirs: f64| ours < theirs * 0.98;
        [
            (
                below(userstack.goodput_mbps, linux.goodput_mbps),
                Shortfall::Goodput,
            ),
            (below(userstack.jain, linux.jain), Shortfall::Jain),
            (
                userstack.retransmitted_per_sent > linux.retransmitted_per_sent + 0.002,
                Shortfall::Retransmissions,
            ),
        ]
        .into_iter()
        .filter_map(|(short, what)| short.then_some(what))
        .collect()
    }

    /// The figure of one run that this shortfall is about.
    pub fn figure(self, run: &Measurement) -> f64 {
        match self {
            Shortfall::Goodput => run.goodput_mbps(),
            Shortfall::Jain => run.jain(),
            Shortfall::Retransmissions => run.retransmitted_per_sent(),
        }
    }

    /// The word in the tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Shortfall::Goodput => "goodput",
            Shortfall::Jain => "Jain",
            Shortfall::Retransmissions => "retransmitted/sent",
        }
    }
}

impl Mark {
    /// `userstack` against `linux` (medians over their runs): goodput and Jain within 2 %
    /// count as equal, and retransmitted/sent may exceed Linux's by 0.2 percentage points.
    pub fn of(userstack: &Summary, linux: &Summary) -> Mark {
        if !Shortfall::of(userstack, linux).is_empty() {
            Mark::Worse
        } else if userstack.goodput_mbps > linux.goodput_mbps * 1.02 {
            Mark::Better
        } else {
            Mark::Equal
        }
    }

    /// The word in the tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Mark::Better => "better",
            Mark::Equal => "equal",
            Mark::Worse => "worse",
        }
    }
}

/// A run of Linux → Linux with these flows and the sender's retransmitted and sent segments.
#[cfg(test)]
pub(crate) fn measured(flow_mbps: &[f64], retrans: i64, out: i64) -> Measurement {
    let mut tcp = BTreeMap::new();
    tcp.insert("RetransSegs".to_string(), retrans);
    tcp.insert("OutSegs".to_string(), out);
    Measurement {
        row: "r".into(),
        pairing: Pairing::LinuxToLinux,
        spin_core: None,
        steered: false,
        runner_idle: IdlePolicy::Park,
        seconds: 1.0,
        flow_mbps: flow_mbps.to_vec(),
        sender: [("Tcp".to_string(), tcp)].into(),
        receiver: Counters::new(),
        load: Load::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(flow_mbps: &[f64], retrans: i64, out: i64) -> Summary {
        Summary::of(&[&measured(flow_mbps, retrans, out)]).unwrap()
    }

    #[test]
    fn jain_is_one_when_fair_and_one_over_n_when_one_flow_has_all() {
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), 1.0);
        assert_eq!(jain(&[8.0, 0.0, 0.0, 0.0]), 0.25);
        assert_eq!(jain(&[]), 0.0);
    }

    #[test]
    fn marks_follow_the_two_percent_and_two_tenths_of_a_point_rules() {
        let linux = summary(&[50.0, 50.0], 10, 10_000); // 0.1 %
        assert_eq!(
            Mark::of(&summary(&[49.5, 49.5], 10, 10_000), &linux),
            Mark::Equal
        );
        assert_eq!(
            Mark::of(&summary(&[51.5, 51.5], 10, 10_000), &linux),
            Mark::Better
        );
        assert_eq!(
            Mark::of(&summary(&[48.0, 48.0], 10, 10_000), &linux),
            Mark::Worse
        );
        // Unfair: Jain 0.9 against 1.0.
        assert_eq!(
            Mark::of(&summary(&[75.0, 25.0], 10, 10_000), &linux),
            Mark::Worse
        );
        // 0.1 % + 0.25 points of retransmissions.
        assert_eq!(
            Mark::of(&summary(&[52.0, 52.0], 35, 10_000), &linux),
            Mark::Worse
        );
        assert_eq!(
            Mark::of(&summary(&[52.0, 52.0], 29, 10_000), &linux),
            Mark::Better
        );
        // What falls short is named, each figure on its own.
        let short =
            |flows: &[f64], retrans| Shortfall::of(&summary(flows, retrans, 10_000), &linux);
        assert_eq!(short(&[48.0, 48.0], 10), vec![Shortfall::Goodput]);
        assert_eq!(short(&[75.0, 25.0], 10), vec![Shortfall::Jain]);
        assert_eq!(short(&[52.0, 52.0], 35), vec![Shortfall::Retransmissions]);
        assert_eq!(
            short(&[60.0, 20.0], 35),
            vec![
                Shortfall::Goodput,
                Shortfall::Jain,
                Shortfall::Retransmissions
            ]
        );
        assert_eq!(short(&[49.5, 49.5], 10), vec![]);
    }

    #[test]
    fn a_summary_takes_medians_and_the_worst_run() {
        let runs = [
            measured(&[40.0, 40.0], 10, 1000),
            measured(&[45.0, 15.0], 30, 1000),
            measured(&[50.0, 50.0], 20, 1000),
        ];
        let s = Summary::of(&runs.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(
            (s.runs, s.goodput_mbps, s.lowest_goodput_mbps),
            (3, 80.0, 60.0)
        );
        assert_eq!((s.jain, s.lowest_jain), (1.0, 0.8));
        assert_eq!(s.retransmitted_per_sent, 0.02);
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn moved_counts_from_zero_for_counters_new_after() {
        let before: Counters = [("Tcp".into(), [("OutSegs".into(), 5)].into())].into();
        let after: Counters = [(
            "Tcp".into(),
            [("OutSegs".into(), 12), ("RetransSegs".into(), 2)].into(),
        )]
        .into();
        let d = moved(&before, &after);
        assert_eq!(counter(&d, "Tcp", "OutSegs"), 7);
        assert_eq!(counter(&d, "Tcp", "RetransSegs"), 2);
    }
}
