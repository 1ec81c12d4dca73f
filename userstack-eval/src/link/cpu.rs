//! Where the guest's CPUs spent a window, from `/proc/stat`: to tell a stack's own limit from
//! the machine's (an emulated guest runs out of CPU before a 100 Mbit/s link is full).

/// One CPU's time so far, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// Neither idle nor waiting for I/O.
    pub busy: u64,
    /// In softirq: packet processing (veth, netem, tbf, XDP) mostly.
    pub softirq: u64,
    /// Everything (user, nice, system, idle, iowait, irq, softirq, steal).
    pub total: u64,
}

/// Every CPU's time so far, by CPU number.
pub fn read() -> std::io::Result<Vec<CpuTime>> {
    Ok(parse(&std::fs::read_to_string("/proc/stat")?))
}

/// The `cpuN` lines of `/proc/stat` (not the `cpu` total).
pub fn parse(text: &str) -> Vec<CpuTime> {
    text.lines()
        .filter(|line| {
            line.strip_prefix("cpu")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(|line| {
            let ticks: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .take(8)
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
            let total: u64 = ticks.iter().sum();
            CpuTime {
                busy: total - at(3) - at(4),
                softirq: at(6),
                total,
            }
        })
        .collect()
}

/// Each CPU's busy and softirq shares of the time between two readings.
pub fn shares(before: &[CpuTime], after: &[CpuTime]) -> (Vec<f64>, Vec<f64>) {
    before
        .iter()
        .zip(after)
        .map(|(a, b)| {
            let total = b.total.saturating_sub(a.total).max(1) as f64;
            (
                b.busy.saturating_sub(a.busy) as f64 / total,
                b.softirq.saturating_sub(a.softirq) as f64 / total,
            )
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_lines_become_busy_and_softirq_shares() {
        let before = parse(
            "cpu  10 0 10 80 0 0 0 0 0 0\n\
             cpu0 5 0 5 40 0 0 0 0 0 0\n\
             cpu1 5 0 5 40 0 0 0 0 0 0\n\
             intr 123\n",
        );
        let after = parse(
            "cpu  0 0 0 0 0 0 0 0 0 0\n\
             cpu0 25 0 25 60 10 0 30 0 0 0\n\
             cpu1 5 0 5 140 0 0 0 0 0 0\n",
        );
        assert_eq!(before.len(), 2);
        // cpu0: 100 ticks, of which 20 idle and 10 waiting: 70 % busy, 30 % softirq.
        let (busy, softirq) = shares(&before, &after);
        assert_eq!(busy, vec![0.7, 0.0]);
        assert_eq!(softirq, vec![0.3, 0.0]);
    }

    #[test]
    fn this_machine_has_per_cpu_lines() {
        let cpus = read().unwrap();
        assert!(!cpus.is_empty());
        assert!(cpus
            .iter()
            .all(|c| c.busy <= c.total && c.softirq <= c.busy));
    }
}
