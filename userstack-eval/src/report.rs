//! What one run of one row measured, and how userstack's figures compare with Linux's.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// The measured window after the warm-up, in seconds.
    pub seconds: f64,
    /// Each flow's goodput over the window in Mbit/s: bytes the Linux receiver read, or, when
    /// userstack receives, bytes the Linux sender saw acknowledged (`tcpi_bytes_acked`).
    pub flow_mbps: Vec<f64>,
    /// How far the sending stack's counters moved over the window.
    pub sender: Counters,
    /// How far the receiving stack's counters moved over the window.
    pub receiver: Counters,
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

impl Mark {
    /// `userstack` against `linux`: goodput and Jain within 2 % count as equal, and
    /// retransmitted/sent may exceed Linux's by 0.2 percentage points.
    pub fn of(userstack: &Measurement, linux: &Measurement) -> Mark {
        let below = |ours: f64, theirs: f64| ours < theirs * 0.98;
        let worse = below(userstack.goodput_mbps(), linux.goodput_mbps())
            || below(userstack.jain(), linux.jain())
            || userstack.retransmitted_per_sent() > linux.retransmitted_per_sent() + 0.002;
        if worse {
            Mark::Worse
        } else if userstack.goodput_mbps() > linux.goodput_mbps() * 1.02 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(flow_mbps: &[f64], retrans: i64, out: i64) -> Measurement {
        let mut tcp = BTreeMap::new();
        tcp.insert("RetransSegs".to_string(), retrans);
        tcp.insert("OutSegs".to_string(), out);
        Measurement {
            row: "r".into(),
            pairing: Pairing::LinuxToLinux,
            spin_core: None,
            seconds: 1.0,
            flow_mbps: flow_mbps.to_vec(),
            sender: [("Tcp".to_string(), tcp)].into(),
            receiver: Counters::new(),
        }
    }

    #[test]
    fn jain_is_one_when_fair_and_one_over_n_when_one_flow_has_all() {
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), 1.0);
        assert_eq!(jain(&[8.0, 0.0, 0.0, 0.0]), 0.25);
        assert_eq!(jain(&[]), 0.0);
    }

    #[test]
    fn marks_follow_the_two_percent_and_two_tenths_of_a_point_rules() {
        let linux = measured(&[50.0, 50.0], 10, 10_000); // 0.1 %
        assert_eq!(
            Mark::of(&measured(&[49.5, 49.5], 10, 10_000), &linux),
            Mark::Equal
        );
        assert_eq!(
            Mark::of(&measured(&[51.5, 51.5], 10, 10_000), &linux),
            Mark::Better
        );
        assert_eq!(
            Mark::of(&measured(&[48.0, 48.0], 10, 10_000), &linux),
            Mark::Worse
        );
        // Unfair: Jain 0.9 against 1.0.
        assert_eq!(
            Mark::of(&measured(&[75.0, 25.0], 10, 10_000), &linux),
            Mark::Worse
        );
        // 0.1 % + 0.25 points of retransmissions.
        assert_eq!(
            Mark::of(&measured(&[52.0, 52.0], 35, 10_000), &linux),
            Mark::Worse
        );
        assert_eq!(
            Mark::of(&measured(&[52.0, 52.0], 29, 10_000), &linux),
            Mark::Better
        );
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
