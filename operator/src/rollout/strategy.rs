//! A tuning's `spec.rollout` resolved into the planner's [`Strategy`] for a number of nodes.
//!
//! Without a `rollout` section a change still goes canary first: one canary node, then waves
//! of a quarter of the nodes (rounded up), no pauses and no analysis, like a DaemonSet's
//! rolling update but never all at once.

use std::time::Duration;

use hoststack_crds::{Analysis, Rollout};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::planner::{resolve_count, Strategy};

/// Waves after the canary take this share of the nodes when `maxUnavailable` is not given.
pub const DEFAULT_MAX_UNAVAILABLE: &str = "25%";
/// How long a health window lasts when `analysis.window` is not given.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

/// How a wave is judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Not judged: a wave is done once applied and paused.
    None,
    /// A person promotes each wave (annotation `hoststack.dev/promote`).
    Manual,
    /// The agents' health samples and/or a Prometheus query judge each wave.
    Analysis,
}

/// The planner's strategy, the gate, and the analysis window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// What the planner needs.
    pub strategy: Strategy,
    /// How waves are judged.
    pub gate: Gate,
    /// Length of one health window.
    pub window: Duration,
    /// How long the Prometheus gate's query may take (`analysis.prometheus.timeout`).
    pub query_timeout: Duration,
}

/// Resolves `rollout` for `nodes` matched nodes; the error names the bad field.
pub fn resolve(rollout: Option<&Rollout>, nodes: usize) -> Result<Resolved, String> {
    let default = Rollout::default();
    let r = rollout.unwrap_or(&default);
    let count = |field: &str, v: Option<&IntOrString>, fallback: Option<&str>| {
        let text = v.map(|v| match v {
            IntOrString::Int(i) => i.to_string(),
            IntOrString::String(s) => s.clone(),
        });
        let text = text.as_deref().or(fallback);
        resolve_count(text, nodes, 1).map_err(|e| format!("rollout.{field}: {e}"))
    };
    let max_unavailable = count(
        "maxUnavailable",
        r.max_unavailable.as_ref(),
        Some(DEFAULT_MAX_UNAVAILABLE),
    )?;
    let canary = count("canary", r.canary.as_ref(), None)?;
    let duration = |field: &str, v: Option<&String>| match v {
        None => Ok(Duration::ZERO),
        Some(v) => humantime::parse_duration(v).map_err(|e| format!("rollout.{field}: {v:?}: {e}")),
    };
    let analysis = r.analysis.as_ref();
    let gate = match analysis {
        Some(Analysis { manual: true, .. }) => Gate::Manual,
        Some(a) if !a.thresholds.is_empty() || a.prometheus.is_some() => Gate::Analysis,
        _ => Gate::None,
    };
    let window = match analysis.and_then(|a| a.window.as_ref()) {
        None => DEFAULT_WINDOW,
        Some(w) => duration("analysis.window", Some(w))?.max(Duration::from_secs(1)),
    };
    let query_timeout = match analysis
        .and_then(|a| a.prometheus.as_ref())
        .and_then(|p| p.timeout.as_ref())
    {
        None => hoststack_promql::DEFAULT_TIMEOUT,
        Some(t) => duration("analysis.prometheus.timeout", Some(t))?.max(Duration::from_millis(1)),
    };
    Ok(Resolved {
        strategy: Strategy {
            canary,
            max_unavailable,
            pause_after_canary: duration("pauseAfterCanary", r.pause_after_canary.as_ref())?,
            pause_between_waves: duration("pauseBetweenWaves", r.pause_between_waves.as_ref())?,
            auto_rollback: r.auto_rollback.unwrap_or(true),
            paused: r.paused,
            judged: gate != Gate::None,
        },
        gate,
        window,
        query_timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{HealthThreshold, PrometheusAnalysis};

    #[test]
    fn defaults_go_canary_first_then_quarters() {
        let r = resolve(None, 8).unwrap();
        assert_eq!((r.strategy.canary, r.strategy.max_unavailable), (1, 2));
        assert_eq!(r.gate, Gate::None);
        assert!(r.strategy.auto_rollback && !r.strategy.judged && !r.strategy.paused);
        assert_eq!(r.window, DEFAULT_WINDOW);
    }

    #[test]
    fn fields_resolve_and_bad_ones_are_named() {
        let rollout = Rollout {
            canary: Some(IntOrString::String("50%".into())),
            max_unavailable: Some(IntOrString::Int(3)),
            pause_after_canary: Some("1m".into()),
            pause_between_waves: Some("1500ms".into()),
            auto_rollback: Some(false),
            paused: true,
            analysis: Some(Analysis {
                window: Some("20s".into()),
                thresholds: vec![HealthThreshold::default()],
                ..Analysis::default()
            }),
        };
        let r = resolve(Some(&rollout), 4).unwrap();
        let s = &r.strategy;
        assert_eq!((s.canary, s.max_unavailable), (2, 3));
        assert_eq!(s.pause_after_canary, Duration::from_secs(60));
        assert_eq!(s.pause_between_waves, Duration::from_millis(1500));
        assert!(!s.auto_rollback && s.paused && s.judged);
        assert_eq!(
            (r.gate, r.window),
            (Gate::Analysis, Duration::from_secs(20))
        );

        let manual = Rollout {
            analysis: Some(Analysis {
                manual: true,
                prometheus: Some(PrometheusAnalysis::default()),
                ..Analysis::default()
            }),
            ..Rollout::default()
        };
        assert_eq!(resolve(Some(&manual), 4).unwrap().gate, Gate::Manual);

        let bad = Rollout {
            max_unavailable: Some(IntOrString::String("lots".into())),
            ..Rollout::default()
        };
        let e = resolve(Some(&bad), 4).unwrap_err();
        assert!(e.starts_with("rollout.maxUnavailable:"), "{e}");
        let bad = Rollout {
            canary: Some(IntOrString::String("150%".into())),
            ..Rollout::default()
        };
        assert!(resolve(Some(&bad), 4)
            .unwrap_err()
            .starts_with("rollout.canary:"));
    }
}
