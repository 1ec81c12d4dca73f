//! Per-connection options; defaults are those of a current Linux kernel.

use core::time::Duration;

/// Which congestion controller a connection runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum CongestionAlgorithm {
    /// RFC 5681 with RFC 6582 recovery.
    NewReno,
    /// RFC 9438 (Linux's default `net.ipv4.tcp_congestion_control`).
    Cubic,
}

/// Every tunable of one connection. `Config::default()` mirrors Linux 6.x defaults so that an
/// A/B comparison is a single field change.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Config {
    /// Maximum segment size we announce and cap our segments at (Ethernet MTU 1500 minus 40).
    pub mss: u16,
    /// Offer and accept SACK (`net.ipv4.tcp_sack` = 1).
    pub sack: bool,
    /// Generate and use D-SACK (`net.ipv4.tcp_dsack` = 1).
    pub dsack: bool,
    /// Offer and accept timestamps (`net.ipv4.tcp_timestamps` = 1).
    pub timestamps: bool,
    /// Offer window scaling (`net.ipv4.tcp_window_scaling` = 1).
    pub window_scaling: bool,
    /// Receive buffer capacity in bytes; the advertised window is its free space. Linux
    /// autotunes up to `tcp_rmem[2]` = 6 MiB; we use a fixed size that grows its memory lazily.
    pub recv_buffer: usize,
    /// Send buffer capacity in bytes (Linux autotunes up to `tcp_wmem[2]` = 4 MiB).
    pub send_buffer: usize,
    /// Nagle's algorithm (on unless `TCP_NODELAY`).
    pub nagle: bool,
    /// Delayed-ACK timeout (Linux `TCP_DELACK_MIN` = 40 ms).
    pub delayed_ack: Duration,
    /// ACK at least every this many full-sized segments (RFC 5681 4.2: 2), counted in bytes
    /// against the peer's segment size as Linux counts (smaller segments: more of them).
    pub ack_every_segments: u32,
    /// Initial retransmission timeout (RFC 6298 2.1, Linux `TCP_TIMEOUT_INIT` = 1 s).
    pub initial_rto: Duration,
    /// Lower bound of the RTO's variance term, added to SRTT (Linux `TCP_RTO_MIN` = 200 ms).
    pub rto_min: Duration,
    /// Upper bound of the RTO (Linux `TCP_RTO_MAX` = 120 s).
    pub rto_max: Duration,
    /// Uniform random jitter added to the initial RTO (0 in Linux), against synchronized flows.
    pub initial_rto_jitter: Duration,
    /// SYN retransmissions before giving up (`net.ipv4.tcp_syn_retries` = 6).
    pub syn_retries: u32,
    /// SYN-ACK retransmissions before giving up (`net.ipv4.tcp_synack_retries` = 5).
    pub synack_retries: u32,
    /// Data retransmissions before the connection is aborted (`net.ipv4.tcp_retries2` = 15).
    pub retries: u32,
    /// Maximum segment lifetime; TIME-WAIT lasts 2·MSL (Linux `TCP_TIMEWAIT_LEN` = 60 s).
    pub msl: Duration,
    /// Send keepalive probes (`SO_KEEPALIVE`, off by default).
    pub keepalive: bool,
    /// Idle time before the first keepalive probe (`tcp_keepalive_time` = 7200 s).
    pub keepalive_time: Duration,
    /// Interval between keepalive probes (`tcp_keepalive_intvl` = 75 s).
    pub keepalive_interval: Duration,
    /// Unanswered probes before the connection is dropped (`tcp_keepalive_probes` = 9).
    pub keepalive_probes: u32,
    /// Congestion controller (`tcp_congestion_control` = cubic).
    pub congestion: CongestionAlgorithm,
    /// Initial congestion window in segments (RFC 6928, Linux `TCP_INIT_CWND` = 10).
    pub initial_window: u32,
    /// Duplicate ACKs (or SACKed segments above a hole) that signal loss (`tcp_reordering` = 3).
    pub dupthresh: u32,
    /// Undo the congestion response when D-SACKs prove every retransmission spurious, or an
    /// ACK's timestamp shows it was sent for an original transmission (Eifel, RFC 3522).
    pub undo_spurious: bool,
    /// Tail loss probes (RFC 8985 section 7; Linux `tcp_early_retrans` = 3 enables them):
    /// a lost tail is repaired after about two RTTs instead of a full RTO. SACK only.
    pub tail_loss_probe: bool,
    /// HyStart++ (RFC 9406) in the initial slow start (Linux CUBIC's `hystart` = 1 runs the
    /// older HyStart; this is its standardised successor).
    pub hystart: bool,
    /// Proportional rate reduction during SACK recovery (RFC 6937; Linux always uses it).
    pub prr: bool,
    /// Largest number of out-of-order ranges held in the receive buffer.
    pub max_ooo_ranges: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            mss: 1460,
            sack: true,
            dsack: true,
            timestamps: true,
            window_scaling: true,
            recv_buffer: 6 * 1024 * 1024,
            send_buffer: 4 * 1024 * 1024,
            nagle: true,
            delayed_ack: Duration::from_millis(40),
            ack_every_segments: 2,
            initial_rto: Duration::from_secs(1),
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(120),
            initial_rto_jitter: Duration::ZERO,
            syn_retries: 6,
            synack_retries: 5,
            retries: 15,
            msl: Duration::from_secs(30),
            keepalive: false,
            keepalive_time: Duration::from_secs(7200),
            keepalive_interval: Duration::from_secs(75),
            keepalive_probes: 9,
            congestion: CongestionAlgorithm::Cubic,
            initial_window: 10,
            dupthresh: 3,
            undo_spurious: true,
            tail_loss_probe: true,
            hystart: true,
            prr: true,
            max_ooo_ranges: 1024,
        }
    }
}

impl Config {
    /// The window scale shift we offer: the smallest shift that lets the 16-bit window field
    /// cover the receive buffer (Linux derives it from `tcp_rmem[2]` the same way).
    pub fn recv_window_shift(&self) -> u8 {
        if !self.window_scaling {
            return 0;
        }
        let mut shift = 0u8;
        while shift < 14 && (self.recv_buffer >> shift) > 0xffff {
            shift += 1;
        }
        shift
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_shift_covers_buffer() {
        let config = Config::default();
        assert_eq!(config.recv_window_shift(), 7);
        let small = Config {
            recv_buffer: 65535,
            ..Config::default()
        };
        assert_eq!(small.recv_window_shift(), 0);
        let off = Config {
            window_scaling: false,
            ..Config::default()
        };
        assert_eq!(off.recv_window_shift(), 0);
    }
}
