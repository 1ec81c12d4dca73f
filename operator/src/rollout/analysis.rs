//! The built-in analysis: judges a wave from the health samples the agents of the judged nodes
//! and of the baseline nodes (matched, still on the stable revision) reported over the same
//! window. Pure: samples and thresholds in, a verdict and the measured values out.
//!
//! Rates are computed over the sums of the nodes' counter deltas, so a node that sent more
//! weighs more: the retransmit ratio is ΣRetransSegs / ΣOutSegs, SACK recoveries and D-SACKs are
//! per thousand segments sent, RTO timeouts and listen drops per node-second. A measurement with
//! nothing in it (no sample in time, no segment sent) is inconclusive, never a pass.

use hoststack_crds::{HealthMetric, HealthSample, HealthThreshold, MetricResult};

use super::planner::Verdict;

/// A node's sample, when it reported one that answers the request.
pub type NodeSample<'a> = (&'a str, Option<&'a HealthSample>);

/// What is judged.
pub struct Measurement<'a> {
    /// The judged nodes and their samples.
    pub judged: &'a [NodeSample<'a>],
    /// The baseline nodes and their samples.
    pub baseline: &'a [NodeSample<'a>],
    /// The time for samples to arrive is over: a missing one makes the verdict inconclusive
    /// rather than pending.
    pub overdue: bool,
}

/// The verdict and each threshold's measured values.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// Pass, Fail, Inconclusive or Pending.
    pub verdict: Verdict,
    /// One entry per threshold that could be measured.
    pub metrics: Vec<MetricResult>,
}

/// The counters of a set of nodes, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Totals {
    seconds: f64,
    out_segs: u64,
    retrans_segs: u64,
    sack_recoveries: u64,
    dsacks: u64,
    rto_timeouts: u64,
    listen_drops: u64,
}

impl Totals {
    fn of<'a>(samples: impl Iterator<Item = &'a HealthSample>) -> Self {
        samples.fold(Totals::default(), |t, s| Totals {
            seconds: t.seconds + s.duration_ms as f64 / 1000.0,
            out_segs: t.out_segs + s.out_segs,
            retrans_segs: t.retrans_segs + s.retrans_segs,
            sack_recoveries: t.sack_recoveries + s.sack_recoveries,
            dsacks: t.dsacks + s.dsacks,
            rto_timeouts: t.rto_timeouts + s.rto_timeouts,
            listen_drops: t.listen_drops + s.listen_drops,
        })
    }

    /// The metric's value, or why it has none.
    fn value(&self, metric: HealthMetric) -> Result<f64, String> {
        let per_segment = |n: u64, scale: f64| {
            if self.out_segs == 0 {
                Err("no segment was sent in the window".to_string())
            } else {
                Ok(n as f64 * scale / self.out_segs as f64)
            }
        };
        let per_second = |n: u64| {
            if self.seconds <= 0.0 {
                Err("the window was empty".to_string())
            } else {
                Ok(n as f64 / self.seconds)
            }
        };
        match metric {
            HealthMetric::RetransmitRatio => per_segment(self.retrans_segs, 1.0),
            HealthMetric::SackRecoveriesPerKiloSegment => per_segment(self.sack_recoveries, 1e3),
            HealthMetric::DsacksPerKiloSegment => per_segment(self.dsacks, 1e3),
            HealthMetric::RtoTimeouts => per_second(self.rto_timeouts),
            HealthMetric::ListenDrops => per_second(self.listen_drops),
        }
    }
}

/// The metric's name as the API spells it.
pub fn metric_name(metric: HealthMetric) -> &'static str {
    match metric {
        HealthMetric::RetransmitRatio => "RetransmitRatio",
        HealthMetric::SackRecoveriesPerKiloSegment => "SackRecoveriesPerKiloSegment",
        HealthMetric::DsacksPerKiloSegment => "DsacksPerKiloSegment",
        HealthMetric::RtoTimeouts => "RtoTimeouts",
        HealthMetric::ListenDrops => "ListenDrops",
    }
}

/// A decimal for the status: six significant decimals, no float noise.
pub fn decimal(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() {
        "0".into()
    } else {
        s.into()
    }
}

/// Judges a wave against `thresholds`.
pub fn judge(thresholds: &[HealthThreshold], m: &Measurement) -> Judgement {
    let relative = thresholds
        .iter()
        .any(|t| t.max_relative_to_baseline.is_some());
    let missing: Vec<&str> = m
        .judged
        .iter()
        .chain(if relative { m.baseline } else { &[] })
        .filter(|(_, s)| s.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        let verdict = if m.overdue {
            Verdict::Inconclusive(format!(
                "no health sample from {} in time",
                missing.join(", ")
            ))
        } else {
            Verdict::Pending
        };
        return Judgement {
            verdict,
            metrics: Vec::new(),
        };
    }
    if m.judged.is_empty() {
        return Judgement {
            verdict: Verdict::Inconclusive("no judged node to measure".into()),
            metrics: Vec::new(),
        };
    }
    let judged = Totals::of(m.judged.iter().filter_map(|(_, s)| *s));
    let baseline = Totals::of(m.baseline.iter().filter_map(|(_, s)| *s));
    let mut metrics = Vec::new();
    let mut failures = Vec::new();
    let mut unknown = Vec::new();
    for t in thresholds {
        let name = metric_name(t.metric);
        let value = match judged.value(t.metric) {
            Ok(v) => v,
            Err(why) => {
                unknown.push(format!("{name}: {why}"));
                continue;
            }
        };
        let mut check = |limit: f64, baseline: Option<f64>| {
            let passed = value <= limit;
            if !passed {
                let against = baseline
                    .map(|b| format!(" (baseline {})", decimal(b)))
                    .unwrap_or_default();
                failures.push(format!(
                    "{name} {} over {}{against}",
                    decimal(value),
                    decimal(limit)
                ));
            }
            metrics.push(MetricResult {
                metric: name.into(),
                judged: Some(decimal(value)),
                baseline: baseline.map(decimal),
                limit: Some(decimal(limit)),
                passed,
            });
        };
        if let Some(max) = t.max.as_deref().and_then(|v| v.parse::<f64>().ok()) {
            check(max, None);
        }
        if let Some(factor) = t
            .max_relative_to_baseline
            .as_deref()
            .and_then(|v| v.parse::<f64>().ok())
        {
            if m.baseline.is_empty() {
                // The last wave has no unchanged node left to compare with.
                continue;
            }
            match baseline.value(t.metric) {
                Ok(b) => check(b * factor, Some(b)),
                Err(why) => unknown.push(format!("{name} baseline: {why}")),
            }
        }
    }
    let verdict = if !failures.is_empty() {
        Verdict::Fail(failures.join("; "))
    } else if !unknown.is_empty() {
        Verdict::Inconclusive(unknown.join("; "))
    } else {
        Verdict::Pass
    };
    Judgement { verdict, metrics }
}

/// Two gates' verdicts as one: a failure wins, then an inconclusive one, then a pending one.
pub fn combine(a: Verdict, b: Verdict) -> Verdict {
    fn rank(v: &Verdict) -> u8 {
        match v {
            Verdict::Fail(_) => 3,
            Verdict::Inconclusive(_) => 2,
            Verdict::Pending => 1,
            Verdict::Pass => 0,
        }
    }
    if rank(&b) > rank(&a) {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(out: u64, retrans: u64, sack: u64) -> HealthSample {
        HealthSample {
            request_id: "r".into(),
            duration_ms: 10_000,
            out_segs: out,
            retrans_segs: retrans,
            sack_recoveries: sack,
            dsacks: 1,
            rto_timeouts: 2,
            ..HealthSample::default()
        }
    }

    fn threshold(metric: HealthMetric, max: Option<&str>, rel: Option<&str>) -> HealthThreshold {
        HealthThreshold {
            metric,
            max: max.map(Into::into),
            max_relative_to_baseline: rel.map(Into::into),
        }
    }

    #[test]
    fn absolute_and_relative_bounds() {
        let lossy = sample(10_000, 300, 40);
        let clean = sample(20_000, 20, 2);
        let judged = [("a", Some(&lossy))];
        let baseline = [("b", Some(&clean)), ("c", Some(&clean))];
        let m = Measurement {
            judged: &judged,
            baseline: &baseline,
            overdue: false,
        };
        let table = [
            (
                threshold(HealthMetric::RetransmitRatio, Some("0.05"), None),
                true,
            ),
            (
                threshold(HealthMetric::RetransmitRatio, Some("0.01"), None),
                false,
            ),
            (
                threshold(HealthMetric::RetransmitRatio, None, Some("2")),
                false,
            ),
            (
                threshold(HealthMetric::RetransmitRatio, None, Some("100")),
                true,
            ),
            (
                threshold(HealthMetric::SackRecoveriesPerKiloSegment, Some("5"), None),
                true,
            ),
            (
                threshold(HealthMetric::RtoTimeouts, Some("0.1"), None),
                false,
            ),
        ];
        for (t, pass) in table {
            let j = judge(std::slice::from_ref(&t), &m);
            assert_eq!(j.verdict == Verdict::Pass, pass, "{t:?}: {j:?}");
        }
        let j = judge(
            &[threshold(HealthMetric::RetransmitRatio, None, Some("2"))],
            &m,
        );
        assert_eq!(
            j.metrics,
            vec![MetricResult {
                metric: "RetransmitRatio".into(),
                judged: Some("0.03".into()),
                baseline: Some("0.001".into()),
                limit: Some("0.002".into()),
                passed: false,
            }]
        );
        assert_eq!(
            j.verdict,
            Verdict::Fail("RetransmitRatio 0.03 over 0.002 (baseline 0.001)".into())
        );
    }

    #[test]
    fn missing_or_empty_measurements_never_pass() {
        let idle = sample(0, 0, 0);
        let t = [threshold(
            HealthMetric::RetransmitRatio,
            Some("0.01"),
            Some("2"),
        )];
        let judged = [("a", None)];
        let waiting = Measurement {
            judged: &judged,
            baseline: &[],
            overdue: false,
        };
        assert_eq!(judge(&t, &waiting).verdict, Verdict::Pending);
        let late = Measurement {
            overdue: true,
            ..waiting
        };
        assert_eq!(
            judge(&t, &late).verdict,
            Verdict::Inconclusive("no health sample from a in time".into())
        );
        let judged = [("a", Some(&idle))];
        let silent = Measurement {
            judged: &judged,
            baseline: &[],
            overdue: false,
        };
        assert!(matches!(
            judge(&t, &silent).verdict,
            Verdict::Inconclusive(_)
        ));
        let none = Measurement {
            judged: &[],
            baseline: &[],
            overdue: false,
        };
        assert!(matches!(judge(&t, &none).verdict, Verdict::Inconclusive(_)));
        // Without a baseline (the last wave) only absolute bounds apply.
        let fine = sample(1000, 1, 0);
        let judged = [("a", Some(&fine))];
        let last = Measurement {
            judged: &judged,
            baseline: &[],
            overdue: false,
        };
        assert_eq!(judge(&t, &last).verdict, Verdict::Pass);
    }

    #[test]
    fn verdicts_combine_worst_first() {
        let f = || Verdict::Fail("x".into());
        let i = || Verdict::Inconclusive("y".into());
        assert_eq!(combine(Verdict::Pass, f()), f());
        assert_eq!(combine(i(), Verdict::Pending), i());
        assert_eq!(combine(Verdict::Pending, Verdict::Pass), Verdict::Pending);
        assert_eq!(combine(f(), i()), f());
        assert_eq!(decimal(0.5), "0.5");
        assert_eq!(decimal(0.0), "0");
        assert_eq!(decimal(2.0), "2");
    }
}
