//! The chart's Grafana dashboards as the tests read them: every panel's queries, with Grafana's
//! variables filled in as a dashboard would for one tuning and node, evaluated by a real
//! Prometheus.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::prometheus::{Prometheus, Sample};

/// The rate window substituted for Grafana's `$__rate_interval` (five scrape intervals).
pub const RATE_INTERVAL: &str = "5s";

/// charts/hoststack/dashboards.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/hoststack/dashboards")
}

/// Every dashboard, `(file name, JSON)`, by file name.
pub fn all() -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(dir())
        .expect("charts/hoststack/dashboards")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("a dashboard");
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), json)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The dashboard of file `name`.
pub fn named(name: &str) -> Value {
    all()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no dashboard {name}"))
        .1
}

/// One query of a panel.
#[derive(Clone, Debug)]
pub struct Query {
    /// The panel's title.
    pub panel: String,
    /// The query's refId.
    pub ref_id: String,
    /// The PromQL, with Grafana's variables in it.
    pub expr: String,
}

/// Every query of every panel of `dashboard`.
pub fn queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            out.push(Query {
                panel: panel["title"].as_str().expect("a title").to_string(),
                ref_id: target["refId"].as_str().expect("a refId").to_string(),
                expr: target["expr"].as_str().expect("an expr").to_string(),
            });
        }
    }
    out
}

/// `expr` as Grafana sends it for `tuning` and `node`.
pub fn substitute(expr: &str, tuning: &str, node: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__range", "10m")
        .replace("$tuning", tuning)
        .replace("$node", node)
}

/// Every query of `dashboard` for `tuning` and `node`, evaluated by `prometheus` at `at` (Unix
/// seconds; now when `None`): each query with its answer, or what went wrong.
pub fn evaluate(
    prometheus: &Prometheus<'_>,
    dashboard: &Value,
    tuning: &str,
    node: &str,
    at: Option<f64>,
) -> Vec<(Query, Result<Vec<Sample>, String>)> {
    queries(dashboard)
        .into_iter()
        .map(|q| {
            let answer = prometheus.query(&substitute(&q.expr, tuning, node), at);
            (q, answer)
        })
        .collect()
}
