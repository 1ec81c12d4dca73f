//! Protocol counters named exactly as Linux names them in /proc/net/snmp and
//! /proc/net/netstat, so that an exporter can publish them beside the kernel's.

macro_rules! counters {
    ($( $variant:ident => ($proto:literal, $field:literal, $doc:literal) ),* $(,)?) => {
        /// One counter; the variant name is the kernel's field name.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
        pub enum Counter {
            $( #[doc = $doc] $variant, )*
        }

        impl Counter {
            /// Every counter, in export order.
            pub const ALL: &'static [Counter] = &[$(Counter::$variant,)*];

            /// The `(proto, field)` pair as in /proc/net/snmp or /proc/net/netstat.
            pub fn name(self) -> (&'static str, &'static str) {
                match self {
                    $( Counter::$variant => ($proto, $field), )*
                }
            }
        }
    };
}

counters! {
    IpInReceives => ("Ip", "InReceives", "IPv4 packets received."),
    IpInHdrErrors => ("Ip", "InHdrErrors", "IPv4 packets dropped for a bad header or checksum."),
    IpInAddrErrors => ("Ip", "InAddrErrors", "IPv4 packets not addressed to us."),
    IpInUnknownProtos => ("Ip", "InUnknownProtos", "IPv4 packets of a protocol we do not speak."),
    IpInDelivers => ("Ip", "InDelivers", "IPv4 packets handed to ICMP or TCP."),
    IpOutRequests => ("Ip", "OutRequests", "IPv4 packets sent."),
    IpOutNoRoutes => ("Ip", "OutNoRoutes", "IPv4 packets dropped for want of a neighbour."),
    IpReasmReqds => ("Ip", "ReasmReqds", "Fragments received (all are dropped)."),
    IpReasmFails => ("Ip", "ReasmFails", "Fragments dropped because we never reassemble."),
    IcmpInEchos => ("Icmp", "InEchos", "Echo requests received."),
    IcmpOutEchoReps => ("Icmp", "OutEchoReps", "Echo replies sent."),
    ActiveOpens => ("Tcp", "ActiveOpens", "Transitions CLOSED -> SYN-SENT."),
    PassiveOpens => ("Tcp", "PassiveOpens", "Transitions LISTEN -> SYN-RECEIVED."),
    AttemptFails => ("Tcp", "AttemptFails", "Handshakes that failed."),
    EstabResets => ("Tcp", "EstabResets", "Resets in ESTABLISHED or CLOSE-WAIT."),
    CurrEstab => ("Tcp", "CurrEstab", "Connections now in ESTABLISHED or CLOSE-WAIT (a gauge)."),
    InSegs => ("Tcp", "InSegs", "Segments received."),
    OutSegs => ("Tcp", "OutSegs", "Segments sent, retransmissions included (as Linux counts them)."),
    RetransSegs => ("Tcp", "RetransSegs", "Segments retransmitted."),
    InErrs => ("Tcp", "InErrs", "Segments dropped as malformed."),
    OutRsts => ("Tcp", "OutRsts", "Segments sent with RST."),
    InCsumErrors => ("Tcp", "InCsumErrors", "Segments dropped for a bad checksum."),
    PAWSEstab => ("TcpExt", "PAWSEstab", "Segments dropped by PAWS (RFC 7323 section 5)."),
    DelayedACKs => ("TcpExt", "DelayedACKs", "ACKs sent by the delayed-ACK timer."),
    ListenOverflows => ("TcpExt", "ListenOverflows", "SYNs dropped because the accept queue was full."),
    ListenDrops => ("TcpExt", "ListenDrops", "SYNs dropped by a listener for any reason."),
    TCPPureAcks => ("TcpExt", "TCPPureAcks", "ACKs received without data."),
    TCPRenoRecovery => ("TcpExt", "TCPRenoRecovery", "NewReno fast recoveries entered."),
    TCPSackRecovery => ("TcpExt", "TCPSackRecovery", "SACK (RFC 6675) recoveries entered."),
    TCPSACKReneging => ("TcpExt", "TCPSACKReneging", "Peers found discarding SACKed data."),
    TCPSACKReorder => ("TcpExt", "TCPSACKReorder", "Reordering detected: a segment never resent was (S)ACKed below one already SACKed."),
    TCPFullUndo => ("TcpExt", "TCPFullUndo", "Congestion responses fully undone."),
    TCPDSACKUndo => ("TcpExt", "TCPDSACKUndo", "Congestion responses undone by D-SACK."),
    TCPLossUndo => ("TcpExt", "TCPLossUndo", "RTO responses undone."),
    TCPPartialUndo => ("TcpExt", "TCPPartialUndo", "Recoveries undone on a partial ACK for a delayed original."),
    TCPFastRetrans => ("TcpExt", "TCPFastRetrans", "Retransmissions in fast recovery."),
    TCPLostRetransmit => ("TcpExt", "TCPLostRetransmit", "Retransmissions found lost again."),
    TCPSlowStartRetrans => ("TcpExt", "TCPSlowStartRetrans", "Retransmissions after an RTO."),
    TCPTimeouts => ("TcpExt", "TCPTimeouts", "Retransmission timer expirations."),
    TCPLossProbes => ("TcpExt", "TCPLossProbes", "Tail loss probes sent (RFC 8985 TLP)."),
    TCPDSACKOldSent => ("TcpExt", "TCPDSACKOldSent", "D-SACKs sent for data below RCV.NXT."),
    TCPDSACKOfoSent => ("TcpExt", "TCPDSACKOfoSent", "D-SACKs sent for duplicate out-of-order data."),
    TCPDSACKRecv => ("TcpExt", "TCPDSACKRecv", "D-SACKs received for data below SND.UNA."),
    TCPDSACKOfoRecv => ("TcpExt", "TCPDSACKOfoRecv", "D-SACKs received for data above SND.UNA."),
    TCPSACKDiscard => ("TcpExt", "TCPSACKDiscard", "SACK blocks ignored as invalid."),
    TCPSpuriousRTOs => ("TcpExt", "TCPSpuriousRTOs", "RTOs proven spurious."),
    TCPAbortOnData => ("TcpExt", "TCPAbortOnData", "Resets sent because data arrived after close."),
    TCPAbortOnClose => ("TcpExt", "TCPAbortOnClose", "Resets sent because close left unread data."),
    TCPAbortOnTimeout => ("TcpExt", "TCPAbortOnTimeout", "Connections aborted after too many retransmissions."),
    TCPOFOQueue => ("TcpExt", "TCPOFOQueue", "Segments queued out of order."),
    TCPOFODrop => ("TcpExt", "TCPOFODrop", "Out-of-order segments dropped for lack of room."),
    TCPChallengeACK => ("TcpExt", "TCPChallengeACK", "Challenge ACKs sent (RFC 5961)."),
    TCPSYNChallenge => ("TcpExt", "TCPSYNChallenge", "Challenge ACKs sent for an in-window SYN."),
    TCPWinProbe => ("TcpExt", "TCPWinProbe", "Zero-window probes sent."),
    TCPKeepAlive => ("TcpExt", "TCPKeepAlive", "Keepalive probes sent."),
    TCPSynRetrans => ("TcpExt", "TCPSynRetrans", "SYN and SYN-ACK retransmissions."),
    TCPOrigDataSent => ("TcpExt", "TCPOrigDataSent", "Segments sent with new data."),
    TCPToZeroWindowAdv => ("TcpExt", "TCPToZeroWindowAdv", "Window advertisements that closed the window."),
    TCPFromZeroWindowAdv => ("TcpExt", "TCPFromZeroWindowAdv", "Window advertisements that reopened it."),
    TCPDSACKRecvSegs => ("TcpExt", "TCPDSACKRecvSegs", "Segments covered by received D-SACKs."),
}

/// A set of counter values.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Counters([u64; Counter::ALL.len()]);

impl Default for Counters {
    fn default() -> Counters {
        Counters([0; Counter::ALL.len()])
    }
}

impl Counters {
    /// Adds one to `counter`.
    pub fn bump(&mut self, counter: Counter) {
        self.0[counter as usize] += 1;
    }

    /// Adds `n` to `counter`.
    pub fn add(&mut self, counter: Counter, n: u64) {
        self.0[counter as usize] += n;
    }

    /// Sets a gauge such as `CurrEstab`.
    pub fn set(&mut self, counter: Counter, value: u64) {
        self.0[counter as usize] = value;
    }

    /// The value of `counter`.
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }

    /// Adds every counter of `other` into `self`.
    pub fn merge(&mut self, other: &Counters) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            *mine += theirs;
        }
    }

    /// `(proto, field, value)` triples for an exporter.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
        Counter::ALL.iter().map(|&c| {
            let (proto, field) = c.name();
            (proto, field, self.get(c))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_kernel() {
        assert_eq!(
            Counter::TCPSackRecovery.name(),
            ("TcpExt", "TCPSackRecovery")
        );
        assert_eq!(
            Counter::TCPSACKReneging.name(),
            ("TcpExt", "TCPSACKReneging")
        );
        assert_eq!(Counter::RetransSegs.name(), ("Tcp", "RetransSegs"));
        let mut c = Counters::default();
        c.bump(Counter::InSegs);
        let mut d = Counters::default();
        d.merge(&c);
        d.merge(&c);
        assert_eq!(d.get(Counter::InSegs), 2);
        assert_eq!(d.fields().count(), Counter::ALL.len());
    }

    /// Every name must be one the running kernel exports (skipped where /proc is absent).
    #[test]
    fn names_exist_in_this_kernels_proc_files() {
        let mut headers: Vec<(String, Vec<String>)> = Vec::new();
        for path in ["/proc/net/snmp", "/proc/net/netstat"] {
            let Ok(text) = std::fs::read_to_string(path) else {
                return;
            };
            for line in text.lines().step_by(2) {
                let mut words = line.split_whitespace();
                let proto = words
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches(':')
                    .to_string();
                headers.push((proto, words.map(str::to_string).collect()));
            }
        }
        // Fields younger than the oldest kernels CI may run on (TCPDSACKRecvSegs: Linux 5.9).
        const RECENT: &[&str] = &["TCPDSACKRecvSegs"];
        for counter in Counter::ALL {
            let (proto, field) = counter.name();
            let known = headers
                .iter()
                .any(|(p, fields)| p == proto && fields.iter().any(|f| f == field));
            assert!(
                known || RECENT.contains(&field),
                "{proto} {field} is not in this kernel's /proc/net/snmp or netstat"
            );
        }
    }
}
