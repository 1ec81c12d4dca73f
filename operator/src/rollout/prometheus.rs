//! The Prometheus gate: a PromQL query over the judged and the baseline nodes, evaluated once a
//! wave's window is over, against success and failure conditions.
//!
//! The query's `{{judged}}` and `{{baseline}}` become regexes of the node names (for a matcher
//! like `node=~"{{judged}}"`). Every series of the result is checked: the wave fails when any
//! meets the failure condition, passes when all meet the success condition, and is inconclusive
//! otherwise, or when the query fails or returns nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use hoststack_crds::HttpHeader;
use hoststack_promql::{Access, Client, Credentials, Data, Endpoint, Error};

use super::planner::Verdict;

/// The outcome word of a query that answered with values.
pub const ANSWERED: &str = "Answered";
/// The outcome word of a query that answered with nothing to judge.
pub const NO_DATA: &str = "NoData";
/// The outcome word when the Secret named in `secretName` could not be read or used.
pub const SECRET_UNREADABLE: &str = "SecretUnreadable";

/// Why a query gave nothing to judge: a word for the `PrometheusAnswered` condition's reason
/// and the message that says what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// `TLSFailed`, `Unauthorized`, `Forbidden`, `ServerError`, `HTTPError`, `Timeout`,
    /// `Unreachable`, `QueryRefused`, `BadAnswer`, `BadSettings`, [`SECRET_UNREADABLE`], or
    /// a refusal of the address ([`super::prometheus_endpoints`]).
    pub reason: &'static str,
    /// What went wrong, in words.
    pub message: String,
}

/// The access settings from the named Secret's data (`token`, or `username` and `password`,
/// and `ca.crt`) and the spec's headers; the error names the Secret's problem.
pub fn access(
    secret: Option<(&str, &BTreeMap<String, Vec<u8>>)>,
    headers: &[HttpHeader],
) -> Result<Access, Failure> {
    let mut access = Access {
        headers: headers
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
        ..Access::default()
    };
    let Some((name, data)) = secret else {
        return Ok(access);
    };
    let bad = |why: String| Failure {
        reason: SECRET_UNREADABLE,
        message: format!("Secret {name}: {why}"),
    };
    let text = |key: &str| -> Result<Option<String>, Failure> {
        data.get(key)
            .map(|v| {
                String::from_utf8(v.clone()).map_err(|_| bad(format!("{key} is not UTF-8 text")))
            })
            .transpose()
    };
    access.credentials = match (text("token")?, text("username")?, text("password")?) {
        (Some(_), Some(_), _) => {
            return Err(bad(
                "holds both token and username: keep the one the server asks for".into(),
            ))
        }
        (Some(token), None, None) => Some(Credentials::Bearer(token.trim().to_string())),
        (None, Some(username), Some(password)) => Some(Credentials::Basic { username, password }),
        (None, Some(_), None) => return Err(bad("has username but no password".into())),
        (_, None, Some(_)) => return Err(bad("has password but no username".into())),
        (None, None, None) => None,
    };
    access.ca_pem = data.get("ca.crt").cloned();
    if access.credentials.is_none() && access.ca_pem.is_none() {
        return Err(bad(
            "holds none of token, username and password, ca.crt".into()
        ));
    }
    Ok(access)
}

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

/// What a failed query says in the gate's verdict: the stage that failed as a reason word,
/// and Prometheus' own message when it refused the query, else what went wrong on the way.
fn failure(error: Error) -> Failure {
    let reason = match &error {
        Error::Tls { .. } => "TLSFailed",
        Error::Status { status, .. } if status.as_u16() == 401 => "Unauthorized",
        Error::Status { status, .. } if status.as_u16() == 403 => "Forbidden",
        Error::Status { status, .. } if status.is_server_error() => "ServerError",
        Error::Status { .. } => "HTTPError",
        Error::Timeout { .. } => "Timeout",
        Error::Unreachable { .. } => "Unreachable",
        Error::Refused { .. } => "QueryRefused",
        Error::Address { .. } | Error::Access(_) => "BadSettings",
        Error::Read(_) | Error::NotPrometheus(_) | Error::Unexpected(_) => "BadAnswer",
    };
    let message = match error {
        Error::Refused { message, .. } => message,
        other => other.to_string(),
    };
    Failure { reason, message }
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

/// Runs an instant query against `endpoint` (http, or https trusting `access`'s CA bundle or
/// the system's roots), presenting `access`'s credentials and headers, within `timeout`, and
/// returns its values. The endpoint is one the installer allowed
/// ([`super::prometheus_endpoints::PrometheusEndpoints::choose`]).
pub async fn query(
    endpoint: Endpoint,
    promql: &str,
    access: &Access,
    timeout: Duration,
) -> Result<Vec<f64>, Failure> {
    let data = Client::with_access(endpoint, access)
        .map_err(failure)?
        .with_timeout(timeout)
        .query(promql, None)
        .await
        .map_err(failure)?;
    values(data).map_err(|message| Failure {
        reason: "BadAnswer",
        message,
    })
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
        let read = |body: &[u8]| {
            decode(body)
                .map_err(|e| failure(e).message)
                .and_then(values)
        };
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
    fn the_secret_gives_credentials_and_a_ca_bundle_and_its_mistakes_are_named() {
        let data = |pairs: &[(&str, &str)]| -> BTreeMap<String, Vec<u8>> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        let tenant = [HttpHeader {
            name: "X-Scope-OrgID".into(),
            value: "team-a".into(),
        }];
        let none = access(None, &tenant).unwrap();
        assert_eq!(
            none.headers,
            vec![("X-Scope-OrgID".into(), "team-a".into())]
        );
        assert_eq!((none.credentials, none.ca_pem), (None, None));
        let basic = data(&[
            ("username", "alice"),
            ("password", "s3cret"),
            ("ca.crt", "PEM"),
        ]);
        let a = access(Some(("prom", &basic)), &[]).unwrap();
        assert_eq!(
            a.credentials,
            Some(Credentials::Basic {
                username: "alice".into(),
                password: "s3cret".into()
            })
        );
        assert_eq!(a.ca_pem.as_deref(), Some(&b"PEM"[..]));
        let bearer = data(&[("token", "tok\n")]);
        assert_eq!(
            access(Some(("prom", &bearer)), &[]).unwrap().credentials,
            Some(Credentials::Bearer("tok".into()))
        );
        for (pairs, says) in [
            (
                &[("username", "alice")][..],
                "Secret prom: has username but no password",
            ),
            (
                &[("password", "x")][..],
                "Secret prom: has password but no username",
            ),
            (
                &[("token", "t"), ("username", "u")][..],
                "holds both token and username",
            ),
            (&[("tls.crt", "x")][..], "holds none of token"),
        ] {
            let failure = access(Some(("prom", &data(pairs))), &[]).unwrap_err();
            assert_eq!(failure.reason, SECRET_UNREADABLE);
            assert!(
                failure.message.contains(says),
                "{pairs:?}: {}",
                failure.message
            );
            assert!(!failure.message.contains("s3cret"));
        }
    }

    #[test]
    fn each_failure_is_named_by_its_stage() {
        let status = |code: u16| Error::Status {
            status: http::StatusCode::from_u16(code).unwrap(),
            source: Box::new(Error::NotPrometheus("html".into())),
        };
        let url = || "https://prom:9090".to_string();
        for (error, reason) in [
            (status(401), "Unauthorized"),
            (status(403), "Forbidden"),
            (status(502), "ServerError"),
            (status(404), "HTTPError"),
            (
                Error::Tls {
                    url: url(),
                    reason: "UnknownIssuer".into(),
                },
                "TLSFailed",
            ),
            (
                Error::Timeout {
                    url: url(),
                    after: Duration::from_secs(1),
                },
                "Timeout",
            ),
            (
                Error::Unreachable {
                    url: url(),
                    reason: "refused".into(),
                },
                "Unreachable",
            ),
            (Error::Access("bad".into()), "BadSettings"),
            (Error::NotPrometheus("x".into()), "BadAnswer"),
        ] {
            let text = error.to_string();
            let f = failure(error);
            assert_eq!(f.reason, reason, "{text}");
            assert_eq!(f.message, text);
        }
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
