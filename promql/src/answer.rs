//! What a query's answer holds, decoded from Prometheus' JSON envelope
//! (`{"status": ..., "data": {"resultType": ..., "result": ...}}`) into typed values. Values
//! arrive as strings; `NaN` and `±Inf` decode as the floats they name.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// One series of an instant vector: its labels and its value at the query's time.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The series' labels (`__name__` included when the result keeps it).
    pub labels: BTreeMap<String, String>,
    /// The evaluation time, in Unix seconds.
    pub time: f64,
    /// The value (NaN and infinities included as Prometheus sent them).
    pub value: f64,
}

/// One series of a range query's matrix: its labels and its points in time order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// `(Unix seconds, value)` pairs.
    pub points: Vec<(f64, f64)>,
}

/// A query's result.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// An instant vector: one sample per series.
    Vector(Vec<Sample>),
    /// A scalar at a time.
    Scalar {
        /// The evaluation time, in Unix seconds.
        time: f64,
        /// The value.
        value: f64,
    },
    /// A range vector: points over time per series.
    Matrix(Vec<Series>),
    /// A string at a time.
    String {
        /// The evaluation time, in Unix seconds.
        time: f64,
        /// The string.
        value: String,
    },
}

impl Data {
    /// The result type as Prometheus names it (`vector`, `scalar`, `matrix`, `string`).
    pub fn kind(&self) -> &'static str {
        match self {
            Data::Vector(_) => "vector",
            Data::Scalar { .. } => "scalar",
            Data::Matrix(_) => "matrix",
            Data::String { .. } => "string",
        }
    }

    /// The series of a matrix; any other result is [`Error::Unexpected`].
    pub fn into_matrix(self) -> Result<Vec<Series>> {
        match self {
            Data::Matrix(series) => Ok(series),
            other => Err(Error::Unexpected(format!(
                "result type {} instead of matrix",
                other.kind()
            ))),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    status: String,
    #[serde(default)]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<RawData>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawData {
    result_type: String,
    result: Value,
}

#[derive(Deserialize)]
struct RawSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Deserialize)]
struct RawSeries {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

/// Decodes an API answer's body: its result, or Prometheus' own error as [`Error::Refused`].
pub fn decode(body: &[u8]) -> Result<Data> {
    let envelope: Envelope =
        serde_json::from_slice(body).map_err(|e| Error::NotPrometheus(e.to_string()))?;
    if envelope.status != "success" {
        return Err(Error::Refused {
            error_type: envelope.error_type.unwrap_or_else(|| "error".into()),
            message: envelope
                .error
                .unwrap_or_else(|| format!("status {}", envelope.status)),
        });
    }
    let data = envelope
        .data
        .ok_or_else(|| Error::NotPrometheus("the answer has no data".into()))?;
    let shape = |kind: &str, e: serde_json::Error| Error::NotPrometheus(format!("{kind}: {e}"));
    match data.result_type.as_str() {
        "vector" => {
            let raw: Vec<RawSample> =
                serde_json::from_value(data.result).map_err(|e| shape("unexpected vector", e))?;
            let samples = raw
                .into_iter()
                .map(|s| {
                    Ok(Sample {
                        labels: s.metric,
                        time: s.value.0,
                        value: number(&s.value.1)?,
                    })
                })
                .collect::<Result<_>>()?;
            Ok(Data::Vector(samples))
        }
        "scalar" => {
            let (time, value): (f64, String) =
                serde_json::from_value(data.result).map_err(|e| shape("unexpected scalar", e))?;
            Ok(Data::Scalar {
                time,
                value: number(&value)?,
            })
        }
        "matrix" => {
            let raw: Vec<RawSeries> =
                serde_json::from_value(data.result).map_err(|e| shape("unexpected matrix", e))?;
            let series = raw
                .into_iter()
                .map(|s| {
                    let points = s
                        .values
                        .iter()
                        .map(|(t, v)| Ok((*t, number(v)?)))
                        .collect::<Result<_>>()?;
                    Ok(Series {
                        labels: s.metric,
                        points,
                    })
                })
                .collect::<Result<_>>()?;
            Ok(Data::Matrix(series))
        }
        "string" => {
            let (time, value): (f64, String) =
                serde_json::from_value(data.result).map_err(|e| shape("unexpected string", e))?;
            Ok(Data::String { time, value })
        }
        other => Err(Error::NotPrometheus(format!(
            "unknown result type {other:?}"
        ))),
    }
}

/// A sample value as Prometheus writes it (`"0.25"`, `"NaN"`, `"+Inf"`).
fn number(text: &str) -> Result<f64> {
    text.parse()
        .map_err(|_| Error::NotPrometheus(format!("{text:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_and_scalars_decode_with_labels_and_special_values() {
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1.5,"0.25"]},{"metric":{"a":"b"},"value":[1.5,"NaN"]}]}}"#;
        let Data::Vector(v) = decode(vector).unwrap() else {
            panic!("not a vector")
        };
        assert_eq!((v[0].time, v[0].value), (1.5, 0.25));
        assert!(v[0].labels.is_empty());
        assert!(v[1].value.is_nan());
        assert_eq!(v[1].labels["a"], "b");
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}"#;
        assert_eq!(
            decode(scalar).unwrap(),
            Data::Scalar {
                time: 1.5,
                value: 3.0
            }
        );
        let string = br#"{"status":"success","data":{"resultType":"string","result":[2,"x"]}}"#;
        assert_eq!(decode(string).unwrap().kind(), "string");
    }

    #[test]
    fn matrices_decode_in_time_order_and_other_results_are_not_matrices() {
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"phase":"canary"},"values":[[10,"0.03"],[11,"+Inf"]]}]}}"#;
        let m = decode(matrix).unwrap().into_matrix().unwrap();
        assert_eq!(m[0].labels["phase"], "canary");
        assert_eq!(m[0].points, vec![(10.0, 0.03), (11.0, f64::INFINITY)]);
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let e = decode(vector).unwrap().into_matrix().unwrap_err();
        assert_eq!(e.to_string(), "result type vector instead of matrix");
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let error = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        let e = decode(error).unwrap_err();
        assert!(
            matches!(&e, Error::Refused { error_type, message } if error_type == "bad_data" && message == "parse error"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "bad_data: parse error");
        let e = decode(b"<html>").unwrap_err().to_string();
        assert!(e.starts_with("not a Prometheus answer: "), "{e}");
        let e = decode(br#"{"status":"success"}"#).unwrap_err().to_string();
        assert_eq!(e, "not a Prometheus answer: the answer has no data");
        let bad = br#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"x"]]}]}}"#;
        let e = decode(bad).unwrap_err().to_string();
        assert!(e.contains("\"x\" is not a number"), "{e}");
        let bad = br#"{"status":"success","data":{"resultType":"vector","result":{}}}"#;
        let e = decode(bad).unwrap_err().to_string();
        assert!(e.contains("unexpected vector"), "{e}");
    }
}
