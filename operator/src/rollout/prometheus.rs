//! The Prometheus gate: a PromQL query over the judged and the baseline nodes, evaluated once a
//! wave's window is over, against success and failure conditions.
//!
//! The query's `{{judged}}` and `{{baseline}}` become regexes of the node names (for a matcher
//! like `node=~"{{judged}}"`). Every series of the result is checked: the wave fails when any
//! meets the failure condition, passes when all meet the success condition, and is inconclusive
//! otherwise, or when the query fails or returns nothing.

use hoststack_promql::{Client, Data, Endpoint};

use super::planner::Verdict;

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

/// The values of an instant query's answer: one per series (a scalar is one value).
fn values(data: Data) -> Result<Vec<f64>, String> {
    match data {
        Data::Vector(samples) => Ok(samples.iter().map(|s| s.value).collect()),
        Data::Scalar { value, .. } => Ok(vec![value]),
        other => Err(format!(
            "a {} result cannot be judged; use an instant vector",
            other.kind()
        )),
    }
}

/// What a failed query says in the gate's verdict: Prometheus' own message when it refused
/// the query, else what went wrong on the way.
fn failure(error: hoststack_promql::Error) -> String {
    match error {
        hoststack_promql::Error::Refused { message, .. } => message,
        other => other.to_string(),
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

/// Runs an instant query against `address` (http, or https trusting the system's roots) and
/// returns its values.
pub async fn query(address: &str, promql: &str) -> Result<Vec<f64>, String> {
    let endpoint = Endpoint::parse(address).map_err(failure)?;
    let data = Client::new(endpoint)
        .query(promql, None)
        .await
        .map_err(failure)?;
    values(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_promql::decode;

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
        // An answer's body decoded as the client does, then read as the gate does.
        let read = |body: &[u8]| decode(body).map_err(failure).and_then(values);
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1.5,"0.25"]},{"metric":{"a":"b"},"value":[1.5,"NaN"]}]}}"#;
        let v = read(vector).unwrap();
        assert_eq!(v[0], 0.25);
        assert!(v[1].is_nan());
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}"#;
        assert_eq!(read(scalar).unwrap(), vec![3.0]);
        let error = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert_eq!(read(error).unwrap_err(), "parse error");
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(read(matrix).unwrap_err().contains("instant vector"));
        assert!(read(b"<html>").is_err());
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
