//! The Prometheus gate: a PromQL query over the judged and the baseline nodes, evaluated once a
//! wave's window is over, against success and failure conditions.
//!
//! The query's `{{judged}}` and `{{baseline}}` become regexes of the node names (for a matcher
//! like `node=~"{{judged}}"`). Every series of the result is checked: the wave fails when any
//! meets the failure condition, passes when all meet the success condition, and is inconclusive
//! otherwise, or when the query fails or returns nothing.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use super::planner::Verdict;

/// How long a query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response read.
const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// The query with the node sets filled in.
pub fn render(query: &str, judged: &[String], baseline: &[String]) -> String {
    query
        .replace("{{judged}}", &node_regex(judged))
        .replace("{{baseline}}", &node_regex(baseline))
}

/// An alternation of node names, with the regex's dots escaped for a PromQL string.
fn node_regex(nodes: &[String]) -> String {
    nodes
        .iter()
        .map(|n| n.replace('.', "\\\\."))
        .collect::<Vec<_>>()
        .join("|")
}

/// A comparison of the query's value: `result OP number`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Condition {
    op: Op,
    bound: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Condition {
    /// Parses `result < 0.01` (operators <, <=, >, >=, ==, !=).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not `result <op> <number>` (op one of < <= > >= == !=)");
        let rest = text
            .trim()
            .strip_prefix("result")
            .ok_or_else(bad)?
            .trim_start();
        let (op, number) = [
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("==", Op::Eq),
            ("!=", Op::Ne),
            ("<", Op::Lt),
            (">", Op::Gt),
        ]
        .into_iter()
        .find_map(|(s, op)| rest.strip_prefix(s).map(|n| (op, n)))
        .ok_or_else(bad)?;
        let bound = number.trim().parse().map_err(|_| bad())?;
        Ok(Condition { op, bound })
    }

    /// Whether `value` meets the condition.
    pub fn holds(&self, value: f64) -> bool {
        let b = self.bound;
        match self.op {
            Op::Lt => value < b,
            Op::Le => value <= b,
            Op::Gt => value > b,
            Op::Ge => value >= b,
            Op::Eq => value == b,
            Op::Ne => value != b,
        }
    }
}

#[derive(Deserialize)]
struct Response {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct Series {
    value: (f64, String),
}

/// The values of an instant query's answer: one per series (a scalar is one value).
pub fn values(body: &[u8]) -> Result<Vec<f64>, String> {
    let r: Response =
        serde_json::from_slice(body).map_err(|e| format!("not a Prometheus answer: {e}"))?;
    if r.status != "success" {
        return Err(r.error.unwrap_or_else(|| format!("status {}", r.status)));
    }
    let data = r.data.ok_or("the answer has no data")?;
    let parse = |s: &str| {
        s.parse::<f64>()
            .map_err(|_| format!("{s:?} is not a number"))
    };
    match data.result_type.as_str() {
        "vector" => {
            let series: Vec<Series> = serde_json::from_value(data.result)
                .map_err(|e| format!("unexpected vector: {e}"))?;
            series.iter().map(|s| parse(&s.value.1)).collect()
        }
        "scalar" => {
            let (_, v): (f64, String) = serde_json::from_value(data.result)
                .map_err(|e| format!("unexpected scalar: {e}"))?;
            Ok(vec![parse(&v)?])
        }
        other => Err(format!(
            "a {other} result cannot be judged; use an instant vector"
        )),
    }
}

/// The verdict on a query's values.
pub fn judge(values: &[f64], success: &str, failure: Option<&str>) -> Verdict {
    let success = match Condition::parse(success) {
        Ok(c) => c,
        Err(e) => return Verdict::Inconclusive(format!("successCondition: {e}")),
    };
    let failure = match failure.map(Condition::parse).transpose() {
        Ok(c) => c,
        Err(e) => return Verdict::Inconclusive(format!("failureCondition: {e}")),
    };
    if values.is_empty() {
        return Verdict::Inconclusive("the query returned no data".into());
    }
    let shown = values
        .iter()
        .map(|v| super::analysis::decimal(*v))
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(f) = failure {
        if values.iter().any(|v| f.holds(*v)) {
            return Verdict::Fail(format!("query result {shown} meets the failure condition"));
        }
    }
    if values.iter().all(|v| success.holds(*v)) {
        Verdict::Pass
    } else {
        Verdict::Inconclusive(format!(
            "query result {shown} meets neither the success nor the failure condition"
        ))
    }
}

/// Runs an instant query against `address` (plain HTTP) and returns its values.
pub async fn query(address: &str, promql: &str) -> Result<Vec<f64>, String> {
    let url = format!(
        "{}/api/v1/query?query={}",
        address.trim_end_matches('/'),
        percent_encoding::utf8_percent_encode(promql, percent_encoding::NON_ALPHANUMERIC)
    );
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("bad Prometheus address {address:?}: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let fetch = async {
        let response = client
            .get(uri)
            .await
            .map_err(|e| format!("Prometheus at {address} unreachable: {e}"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading Prometheus' answer: {e}"))?
            .to_bytes();
        match values(&body) {
            Err(e) if !status.is_success() => Err(format!("Prometheus answered {status}: {e}")),
            other => other,
        }
    };
    tokio::time::timeout(QUERY_TIMEOUT, fetch)
        .await
        .map_err(|_| format!("Prometheus at {address} did not answer within {QUERY_TIMEOUT:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_node_regexes() {
        let q = render(
            r#"sum(x{node=~"{{judged}}"}) / sum(x{node=~"{{baseline}}"})"#,
            &["n.a".into()],
            &["b".into(), "c".into()],
        );
        assert_eq!(q, r#"sum(x{node=~"n\\.a"}) / sum(x{node=~"b|c"})"#);
    }

    #[test]
    fn conditions_parse_and_hold() {
        let table = [
            ("result < 0.01", 0.005, true),
            ("result<0.01", 0.01, false),
            ("result <= 0.01", 0.01, true),
            ("result > 2", 3.0, true),
            ("result >= 2", 1.0, false),
            ("result == 0", 0.0, true),
            ("result != 0", 0.0, false),
        ];
        for (text, v, want) in table {
            assert_eq!(Condition::parse(text).unwrap().holds(v), want, "{text} {v}");
        }
        for bad in ["x < 1", "result ~ 1", "result < one", ""] {
            assert!(Condition::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn answers_parse_into_values() {
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1.5,"0.25"]},{"metric":{"a":"b"},"value":[1.5,"NaN"]}]}}"#;
        let v = values(vector).unwrap();
        assert_eq!(v[0], 0.25);
        assert!(v[1].is_nan());
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}"#;
        assert_eq!(values(scalar).unwrap(), vec![3.0]);
        let error = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert_eq!(values(error).unwrap_err(), "parse error");
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(values(matrix).unwrap_err().contains("instant vector"));
        assert!(values(b"<html>").is_err());
    }

    #[test]
    fn verdicts_on_values() {
        let ok = "result < 0.01";
        let bad = Some("result > 0.05");
        assert_eq!(judge(&[0.001, 0.002], ok, bad), Verdict::Pass);
        assert!(matches!(judge(&[0.001, 0.1], ok, bad), Verdict::Fail(_)));
        assert!(matches!(judge(&[0.02], ok, bad), Verdict::Inconclusive(_)));
        assert!(matches!(judge(&[], ok, bad), Verdict::Inconclusive(_)));
        assert!(matches!(
            judge(&[f64::NAN], ok, bad),
            Verdict::Inconclusive(_)
        ));
        assert!(matches!(
            judge(&[0.0], "nonsense", None),
            Verdict::Inconclusive(_)
        ));
    }
}
