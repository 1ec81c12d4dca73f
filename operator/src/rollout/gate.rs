//! The gate of the wave in flight: promotion by hand, the agents' health samples, and the
//! Prometheus query, combined into one verdict with what was measured. The Prometheus query is
//! the only I/O; everything else is read from the caches the reconcile already has.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hoststack_crds::{
    wave_id, Analysis, AnalysisStatus, MetricResult, NodeTuning, PrometheusAnalysis,
    ABORT_ANNOTATION, PROMOTE_ANNOTATION,
};
use hoststack_promql::Access;

use super::analysis::{self, combine, Measurement, NodeSample};
use super::nodes::baseline_sample;
use super::planner::{Progress, State, Verdict};
use super::prometheus;
use super::prometheus_endpoints::PrometheusEndpoints;
use super::strategy::{Gate, Resolved};

/// Extra time, beyond two windows, for samples to arrive before a missing one is inconclusive.
const SAMPLE_GRACE: Duration = Duration::from_secs(30);

/// What the gate looks at.
pub struct Input<'a> {
    /// The tuning's name.
    pub name: &'a str,
    /// The tuning's resolved rollout settings.
    pub resolved: &'a Resolved,
    /// `spec.rollout.analysis`.
    pub analysis: Option<&'a Analysis>,
    /// The rollout as it stood before this reconcile.
    pub progress: &'a Progress,
    /// The governed nodes, available or not.
    pub governed: &'a [String],
    /// Every NodeTuning, by node.
    pub node_tunings: &'a BTreeMap<String, Arc<NodeTuning>>,
    /// The value of the promote annotation, if set.
    pub promote: Option<&'a str>,
    /// Now, in seconds since the epoch.
    pub now: u64,
    /// The Prometheus endpoints the installer lets the gate ask.
    pub prometheus_endpoints: &'a PrometheusEndpoints,
    /// The data of the Secret the Prometheus gate names (`secretName`), as the caller read it,
    /// or why it could not; `None` when not read.
    pub prometheus_secret: Option<Result<BTreeMap<String, Vec<u8>>, String>>,
}

/// The verdict on the wave in flight, and the analysis to show in its status.
pub async fn evaluate(input: &Input<'_>) -> (Verdict, Option<AnalysisStatus>) {
    let p = input.progress;
    let Some(applied_at) = p.waves.last().and_then(|w| w.applied_at) else {
        return (Verdict::Pending, None);
    };
    let index = p.waves.len() - 1;
    let id = wave_id(&p.revision, p.wave_index(index));
    if input.promote == Some(id.as_str()) {
        let message = format!("promoted by hand ({PROMOTE_ANNOTATION}={id})");
        return (
            Verdict::Pass,
            Some(status(&Verdict::Pass, Some(message), None, vec![])),
        );
    }
    match input.resolved.gate {
        Gate::None => (Verdict::Pass, None),
        Gate::Manual => {
            let message = format!(
                "waiting to be promoted: kubectl annotate networktuning {} {PROMOTE_ANNOTATION}={id} --overwrite",
                input.name
            );
            (
                Verdict::Pending,
                Some(status(&Verdict::Pending, Some(message), None, vec![])),
            )
        }
        Gate::Analysis => analyse(input, applied_at, index).await,
    }
}

/// The rollout rolled back by hand: `progress` as RolledBack when the abort annotation names
/// its revision and it is still live (progressing or paused); `None` otherwise.
pub fn aborted(progress: &Progress, abort: Option<&str>) -> Option<Progress> {
    let live = matches!(progress.state, State::Progressing | State::Paused(_));
    (live && abort == Some(progress.revision.as_str())).then(|| Progress {
        state: State::RolledBack(format!(
            "aborted by hand ({ABORT_ANNOTATION}={})",
            progress.revision
        )),
        ..progress.clone()
    })
}

/// The health thresholds and the Prometheus query, combined.
async fn analyse(
    input: &Input<'_>,
    applied_at: u64,
    index: usize,
) -> (Verdict, Option<AnalysisStatus>) {
    let p = input.progress;
    let window = input.resolved.window;
    let updated = p.updated();
    let judged: Vec<String> = p.waves[index].nodes.clone();
    // The sample of the baseline the planner asked to measure (nodes::plan_nodes).
    let baseline: Vec<String> = baseline_sample(
        input
            .governed
            .iter()
            .map(String::as_str)
            .filter(|n| !updated.contains(n)),
    )
    .into_iter()
    .map(String::from)
    .collect();
    let thresholds = input
        .analysis
        .map(|a| a.thresholds.as_slice())
        .unwrap_or(&[]);
    let mut verdict = Verdict::Pass;
    let mut metrics = Vec::new();
    let mut request = None;
    let mut outcome = None;
    if !thresholds.is_empty() {
        let id = wave_id(&p.revision, p.wave_index(index));
        let judged_samples: Vec<NodeSample> = judged
            .iter()
            .map(|n| sample(input.node_tunings, n, &id, Some(p.revision.as_str())))
            .collect();
        // A baseline node counts on what it runs: the stable revision, or whatever it ran when
        // this tuning took it over.
        let baseline_samples: Vec<NodeSample> = baseline
            .iter()
            .map(|n| {
                let held = input
                    .node_tunings
                    .get(n)
                    .and_then(|nt| nt.spec.revision.as_deref());
                sample(input.node_tunings, n, &id, held)
            })
            .collect();
        let overdue_at = applied_at + (2 * window + SAMPLE_GRACE).as_secs();
        let judgement = analysis::judge(
            thresholds,
            &Measurement {
                judged: &judged_samples,
                baseline: &baseline_samples,
                overdue: input.now >= overdue_at,
            },
        );
        verdict = judgement.verdict;
        metrics = judgement.metrics;
        request = Some(id);
    }
    if let Some(prom) = input.analysis.and_then(|a| a.prometheus.as_ref()) {
        let s = &input.resolved.strategy;
        let pause = if index == 0 {
            s.pause_after_canary
        } else {
            s.pause_between_waves
        };
        let ready_at = applied_at + window.max(pause).as_secs();
        let prom_verdict = if input.now < ready_at {
            Verdict::Pending
        } else {
            let query = prometheus::render(&prom.query, &judged, &baseline);
            // Where to ask is the installer's to say; a refused address is never contacted.
            let reach = input
                .prometheus_endpoints
                .choose(prom.address.as_deref())
                .and_then(|endpoint| {
                    prometheus_access(prom, input.prometheus_secret.as_ref())
                        .map(|access| (endpoint, access))
                });
            let answer = match reach {
                Ok((endpoint, access)) => {
                    prometheus::query(endpoint, &query, &access, input.resolved.query_timeout).await
                }
                Err(failure) => Err(failure),
            };
            match answer {
                Ok(values) => {
                    let v = prometheus::judge(
                        &values,
                        &prom.success_condition,
                        prom.failure_condition.as_deref(),
                    );
                    outcome = Some(if values.is_empty() {
                        prometheus::NO_DATA
                    } else {
                        prometheus::ANSWERED
                    });
                    metrics.push(MetricResult {
                        metric: "prometheus".into(),
                        judged: Some(
                            values
                                .iter()
                                .map(|v| analysis::decimal(*v))
                                .collect::<Vec<_>>()
                                .join(", "),
                        ),
                        baseline: None,
                        limit: Some(prom.success_condition.clone()),
                        passed: v == Verdict::Pass,
                    });
                    v
                }
                Err(failure) => {
                    outcome = Some(failure.reason);
                    Verdict::Inconclusive(failure.message)
                }
            }
        };
        verdict = combine(verdict, prom_verdict);
    }
    let message = match &verdict {
        Verdict::Fail(m) | Verdict::Inconclusive(m) => Some(m.clone()),
        Verdict::Pending => Some(format!(
            "measuring {} against the baseline {}",
            judged.join(", "),
            if baseline.is_empty() {
                "(none left)".to_string()
            } else {
                baseline.join(", ")
            }
        )),
        Verdict::Pass => None,
    };
    let mut shown = status(&verdict, message, request, metrics);
    shown.prometheus_outcome = outcome.map(String::from);
    (verdict, Some(shown))
}

/// How to reach the gate's Prometheus: the spec's headers and, when it names a Secret, the
/// credentials and CA bundle the caller read from it.
fn prometheus_access(
    prom: &PrometheusAnalysis,
    secret: Option<&Result<BTreeMap<String, Vec<u8>>, String>>,
) -> Result<Access, prometheus::Failure> {
    let Some(name) = prom.secret_name.as_deref() else {
        return prometheus::access(None, &prom.headers);
    };
    match secret {
        Some(Ok(data)) => prometheus::access(Some((name, data)), &prom.headers),
        Some(Err(why)) => Err(prometheus::Failure {
            reason: prometheus::SECRET_UNREADABLE,
            message: format!("Secret {name}: {why}"),
        }),
        None => Err(prometheus::Failure {
            reason: prometheus::SECRET_UNREADABLE,
            message: format!("Secret {name} was not read"),
        }),
    }
}

/// A node's health sample, when it answers request `id`, was taken on `revision` and is steady
/// (no transaction ran and no counter was reset during its window).
fn sample<'a>(
    node_tunings: &'a BTreeMap<String, Arc<NodeTuning>>,
    node: &'a str,
    id: &str,
    revision: Option<&str>,
) -> NodeSample<'a> {
    let health = node_tunings
        .get(node)
        .and_then(|nt| nt.status.as_ref())
        .and_then(|s| s.health.as_ref())
        .filter(|h| h.steady && h.request_id == id && h.revision.as_deref() == revision);
    (node, health)
}

/// The analysis status of a verdict.
fn status(
    verdict: &Verdict,
    message: Option<String>,
    request_id: Option<String>,
    metrics: Vec<MetricResult>,
) -> AnalysisStatus {
    let verdict = match verdict {
        Verdict::Pending => "Pending",
        Verdict::Pass => "Pass",
        Verdict::Fail(_) => "Fail",
        Verdict::Inconclusive(_) => "Inconclusive",
    };
    AnalysisStatus {
        verdict: verdict.into(),
        message,
        request_id,
        metrics,
        prometheus_outcome: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::planner::Wave;
    use crate::rollout::strategy::resolve;
    use hoststack_crds::{
        HealthMetric, HealthSample, HealthThreshold, NodeTuningSpec, NodeTuningStatus, Rollout,
    };

    fn progress() -> Progress {
        let mut p = Progress::start("r2", Some("r1"));
        p.waves.push(Wave {
            applied_at: Some(100),
            ..Wave::of(vec!["a".into()])
        });
        p
    }

    /// A node whose spec holds r1, with a sample taken on `revision`.
    fn with_sample(revision: &str, out: u64, retrans: u64) -> NodeTuning {
        let spec = NodeTuningSpec {
            revision: Some("r1".into()),
            ..NodeTuningSpec::default()
        };
        let mut nt = NodeTuning::new("x", spec);
        nt.status = Some(NodeTuningStatus {
            health: Some(HealthSample {
                request_id: "r2-wave0".into(),
                revision: Some(revision.into()),
                duration_ms: 5000,
                steady: true,
                out_segs: out,
                retrans_segs: retrans,
                ..HealthSample::default()
            }),
            ..NodeTuningStatus::default()
        });
        nt
    }

    /// A listener on 127.0.0.1 that records the head of every request it gets, then hangs up.
    struct Listener {
        url: String,
        heads: Arc<std::sync::Mutex<Vec<String>>>,
        stop: Arc<std::sync::atomic::AtomicBool>,
        thread: std::thread::JoinHandle<()>,
    }

    impl Listener {
        fn start() -> Listener {
            use std::io::Read;
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let thread = std::thread::spawn({
                let (heads, stop) = (heads.clone(), stop.clone());
                move || {
                    for stream in listener.incoming() {
                        if stop.load(std::sync::atomic::Ordering::SeqCst) {
                            return;
                        }
                        let mut stream = stream.unwrap();
                        stream
                            .set_read_timeout(Some(Duration::from_secs(5)))
                            .unwrap();
                        let mut head = Vec::new();
                        let mut buf = [0; 4096];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        heads
                            .lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&head).into_owned());
                    }
                }
            });
            Listener {
                url,
                heads,
                stop,
                thread,
            }
        }

        /// Stops listening; the heads of the requests that arrived.
        fn stop(self) -> Vec<String> {
            self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = std::net::TcpStream::connect(self.url.trim_start_matches("http://"));
            self.thread.join().unwrap();
            let heads = self.heads.lock().unwrap().clone();
            heads
        }
    }

    #[tokio::test]
    async fn the_secret_goes_only_to_the_prometheus_the_installer_configured() {
        let configured = Listener::start();
        let tunings_own = Listener::start();
        let endpoints = PrometheusEndpoints::new(
            Some(hoststack_promql::Endpoint::parse(&configured.url).unwrap()),
            vec![],
            true,
        );
        let analysis = |address: Option<&str>| Analysis {
            prometheus: Some(PrometheusAnalysis {
                address: address.map(String::from),
                query: "vector(0)".into(),
                success_condition: "result < 1".into(),
                secret_name: Some("prom".into()),
                ..PrometheusAnalysis::default()
            }),
            ..Analysis::default()
        };
        let rollout = Rollout {
            analysis: Some(analysis(None)),
            ..Rollout::default()
        };
        let resolved = resolve(Some(&rollout), 2).unwrap();
        let p = progress();
        let governed = ["a".to_string(), "b".to_string()];
        let nts = BTreeMap::new();
        let token = BTreeMap::from([("token".to_string(), b"tok".to_vec())]);
        let judge = |analysis: Analysis| {
            let (resolved, p, governed, nts, token) = (&resolved, &p, &governed, &nts, &token);
            let endpoints = &endpoints;
            async move {
                let input = Input {
                    name: "edge",
                    resolved,
                    analysis: Some(&analysis),
                    progress: p,
                    governed,
                    node_tunings: nts,
                    promote: None,
                    now: 200,
                    prometheus_endpoints: endpoints,
                    prometheus_secret: Some(Ok(token.clone())),
                };
                let (verdict, shown) = evaluate(&input).await;
                (verdict, shown.unwrap().prometheus_outcome)
            }
        };

        // The tuning names an address of its own: refused, and nothing is sent there.
        let (verdict, outcome) = judge(analysis(Some(&tunings_own.url))).await;
        assert!(matches!(verdict, Verdict::Inconclusive(_)), "{verdict:?}");
        assert_eq!(outcome.as_deref(), Some("AddressNotAllowed"));
        // The tuning names none: the installer's Prometheus gets the query and the token (it
        // hangs up, so the analysis is inconclusive all the same).
        let (verdict, _) = judge(analysis(None)).await;
        assert!(matches!(verdict, Verdict::Inconclusive(_)), "{verdict:?}");
        let heads = tunings_own.stop();
        assert!(
            heads.is_empty(),
            "a request reached the address the tuning chose: {heads:?}"
        );
        let heads = configured.stop();
        assert_eq!(heads.len(), 1, "{heads:?}");
        assert!(
            heads[0].contains("authorization: Bearer tok\r\n"),
            "{heads:?}"
        );
    }

    #[tokio::test]
    async fn manual_waits_for_the_annotation_of_the_wave_in_flight() {
        let analysis = Analysis {
            manual: true,
            ..Analysis::default()
        };
        let rollout = Rollout {
            analysis: Some(analysis.clone()),
            ..Rollout::default()
        };
        let resolved = resolve(Some(&rollout), 3).unwrap();
        let p = progress();
        let governed = ["a".to_string(), "b".to_string()];
        let nts = BTreeMap::new();
        let endpoints = PrometheusEndpoints::default();
        let mut input = Input {
            name: "edge",
            resolved: &resolved,
            analysis: Some(&analysis),
            progress: &p,
            governed: &governed,
            node_tunings: &nts,
            promote: None,
            now: 200,
            prometheus_endpoints: &endpoints,
            prometheus_secret: None,
        };
        let (v, s) = evaluate(&input).await;
        assert_eq!(v, Verdict::Pending);
        assert!(s
            .unwrap()
            .message
            .unwrap()
            .contains("kubectl annotate networktuning edge hoststack.dev/promote=r2-wave0"));
        // Another wave's or another revision's promotion does not count; a bare index neither.
        for stale in ["r2-wave1", "r1-wave0", "0"] {
            input.promote = Some(stale);
            assert_eq!(evaluate(&input).await.0, Verdict::Pending, "{stale}");
        }
        input.promote = Some("r2-wave0");
        assert_eq!(evaluate(&input).await.0, Verdict::Pass);
    }

    #[test]
    fn abort_rolls_back_only_the_live_rollout_of_the_named_revision() {
        let p = progress();
        let back = aborted(&p, Some("r2")).expect("aborted");
        assert_eq!(
            back.state,
            State::RolledBack("aborted by hand (hoststack.dev/abort=r2)".into())
        );
        assert_eq!(
            (back.waves, back.stable),
            (p.waves.clone(), p.stable.clone())
        );
        // A stale annotation (another revision), none, or a rollout that already ended.
        assert_eq!(aborted(&p, Some("r1")), None);
        assert_eq!(aborted(&p, None), None);
        let paused = Progress {
            state: State::Paused("rollout.paused is set".into()),
            ..progress()
        };
        assert!(aborted(&paused, Some("r2")).is_some());
        let done = Progress {
            state: State::Complete,
            ..progress()
        };
        assert_eq!(aborted(&done, Some("r2")), None);
    }

    #[tokio::test]
    async fn health_samples_of_the_request_judge_against_the_baseline() {
        let analysis = Analysis {
            window: Some("5s".into()),
            thresholds: vec![HealthThreshold {
                metric: HealthMetric::RetransmitRatio,
                max: None,
                max_relative_to_baseline: Some("2".into()),
            }],
            ..Analysis::default()
        };
        let rollout = Rollout {
            analysis: Some(analysis.clone()),
            ..Rollout::default()
        };
        let resolved = resolve(Some(&rollout), 2).unwrap();
        let p = progress();
        let governed = ["a".to_string(), "b".to_string()];
        let nodes = |b: Option<NodeTuning>| {
            let mut nts =
                BTreeMap::from([("a".to_string(), Arc::new(with_sample("r2", 1000, 50)))]);
            nts.extend(b.map(|b| ("b".to_string(), Arc::new(b))));
            nts
        };
        let taken_over = {
            let mut nt = with_sample("w1", 1000, 1);
            nt.spec.tuning = Some("core".into());
            nt.spec.revision = Some("w1".into());
            nt
        };
        let (alone, wrong, clean, noisy, other) = (
            nodes(None),
            nodes(Some(with_sample("r2", 1000, 1))),
            nodes(Some(with_sample("r1", 1000, 1))),
            nodes(Some(with_sample("r1", 1000, 40))),
            nodes(Some(taken_over)),
        );
        let endpoints = PrometheusEndpoints::default();
        let input = |nts, now| Input {
            name: "edge",
            resolved: &resolved,
            analysis: Some(&analysis),
            progress: &p,
            governed: &governed,
            node_tunings: nts,
            promote: None,
            now,
            prometheus_endpoints: &endpoints,
            prometheus_secret: None,
        };
        // The baseline has not answered: pending, then inconclusive once overdue.
        assert_eq!(evaluate(&input(&alone, 110)).await.0, Verdict::Pending);
        assert!(matches!(
            evaluate(&input(&alone, 141)).await.0,
            Verdict::Inconclusive(_)
        ));
        // A baseline sample of the wrong revision does not count.
        assert_eq!(evaluate(&input(&wrong, 110)).await.0, Verdict::Pending);
        let (v, s) = evaluate(&input(&clean, 110)).await;
        assert!(matches!(v, Verdict::Fail(_)), "{v:?}");
        let s = s.unwrap();
        assert_eq!(
            (s.verdict.as_str(), s.request_id.as_deref()),
            ("Fail", Some("r2-wave0"))
        );
        assert_eq!(evaluate(&input(&noisy, 110)).await.0, Verdict::Pass);
        // A baseline node still on another tuning's revision counts on that revision.
        assert!(matches!(
            evaluate(&input(&other, 110)).await.0,
            Verdict::Fail(_)
        ));
    }
}
