//! The conformance case file format (`spec/CASES.md`, CASE-1 .. CASE-6):
//! the types of a case file and the tensor encoding. Loading and checking a
//! file against the op table is `case.rs`; the op table is `ops.rs`.
//!
//! Files are plain JSON so that vendors in any language can read and write
//! them. Tensors are nested arrays (shape inferred) or `{"shape", "data"}`
//! objects (needed for empty dimensions); non-finite floats are the strings
//! `"nan"`, `"inf"` and `"-inf"`. A malformed case is reported with its id
//! and field and never stops the other cases of a run.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use specdec_backend::HostTensor;

/// The format tag every case file starts with (CASE-1).
pub const FORMAT: &str = "specdec-cases/1";

/// Who computed a case's expected outputs (CASE-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedBy {
    /// Worked out by hand from a seed or the spec; the bless command never
    /// rewrites it, and the reference must reproduce it.
    Hand,
    /// Computed by the reference and written by `specdec bless`; CI fails on drift.
    Reference,
}

/// One case (CASE-2). Unknown fields are an error (CASE-9): a misspelt
/// `"comparater"` must never silently fall back to a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub id: String,
    pub op: String,
    /// What the case shows, for readers (optional).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Spec rule IDs the case checks.
    #[serde(default)]
    pub rules: Vec<String>,
    /// Where the case comes from (a seed section, an erratum, a bug class).
    #[serde(default)]
    pub source: String,
    pub expected_by: ExpectedBy,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub params: Map<String, Value>,
    pub inputs: Map<String, Value>,
    pub expect: Map<String, Value>,
}

/// A case file (CASE-1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseFile {
    pub format: String,
    pub title: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub cases: Vec<Case>,
}

/// A defect in a case file, naming the case and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {message}")]
pub struct CaseError {
    pub location: String,
    pub message: String,
    /// The id of the case at fault, when the defect is inside one case.
    pub case: Option<String>,
}

impl CaseError {
    pub fn new(location: impl Into<String>, message: impl Into<String>) -> Self {
        CaseError { location: location.into(), message: message.into(), case: None }
    }
}

/// A loaded case file: the cases that parsed, and an error for each that did not.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    pub title: String,
    pub cases: Vec<Case>,
    pub errors: Vec<CaseError>,
}

/// The `ErrorKind` names, for messages.
pub const ERROR_KINDS: [&str; 21] = [
    "ShapeMismatch",
    "DataLength",
    "NonFinite",
    "NegativeProbability",
    "NotNormalized",
    "ZeroMass",
    "TokenOutOfRange",
    "PaddingMismatch",
    "LengthOutOfRange",
    "EmptyDraft",
    "EmptyBatch",
    "EmptyVocab",
    "EmptyContext",
    "ContextTooLong",
    "UniformOutOfRange",
    "InvalidNoise",
    "AllMasked",
    "InvalidParameter",
    "TrimBeyondLength",
    "CapacityExceeded",
    "InvalidBlock",
];

impl Case {
    fn field<'a>(&self, section: &str, map: &'a Map<String, Value>, name: &str) -> Result<&'a Value, CaseError> {
        map.get(name).ok_or_else(|| self.error(section, name, "is missing"))
    }

    /// A case error located at `section.name` of this case.
    pub fn error(&self, section: &str, name: &str, message: impl std::fmt::Display) -> CaseError {
        CaseError::new(format!("case {} field {section}.{name}", self.id), message.to_string())
    }

    pub fn input_f(&self, name: &str) -> Result<HostTensor<f64>, CaseError> {
        decode_f64(self.field("inputs", &self.inputs, name)?).map_err(|m| self.error("inputs", name, m))
    }

    pub fn input_i(&self, name: &str) -> Result<HostTensor<i64>, CaseError> {
        decode_i64(self.field("inputs", &self.inputs, name)?).map_err(|m| self.error("inputs", name, m))
    }

    pub fn opt_input_f(&self, name: &str) -> Result<Option<HostTensor<f64>>, CaseError> {
        match self.inputs.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => decode_f64(v).map(Some).map_err(|m| self.error("inputs", name, m)),
        }
    }

    /// A typed parameter; `default` when absent.
    pub fn param<T: serde::de::DeserializeOwned>(&self, name: &str, default: Option<T>) -> Result<T, CaseError> {
        match self.params.get(name) {
            None => default.ok_or_else(|| self.error("params", name, "is missing")),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| self.error("params", name, e)),
        }
    }
}

fn float_of(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a float")),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "nan" => Ok(f64::NAN),
            "inf" | "+inf" | "infinity" => Ok(f64::INFINITY),
            "-inf" | "-infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(format!("\"{s}\" is not a number (only \"nan\", \"inf\", \"-inf\" are allowed as strings)")),
        },
        other => Err(format!("{other} is not a number")),
    }
}

fn int_of(v: &Value) -> Result<i64, String> {
    v.as_i64().ok_or_else(|| format!("{v} is not an integer"))
}

fn decode<T>(v: &Value, scalar: fn(&Value) -> Result<T, String>) -> Result<HostTensor<T>, String> {
    if let Value::Object(obj) = v {
        if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "shape" | "data")) {
            return Err(format!("unknown field `{k}` in an object tensor (it has `shape` and `data`)"));
        }
        let shape: Vec<usize> = obj
            .get("shape")
            .and_then(Value::as_array)
            .ok_or("an object tensor needs a `shape` array")?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize).ok_or(format!("shape entry {d} is not a size")))
            .collect::<Result<_, _>>()?;
        let data = obj.get("data").and_then(Value::as_array).ok_or("an object tensor needs a `data` array")?;
        let data = data.iter().map(scalar).collect::<Result<Vec<_>, _>>()?;
        return HostTensor::new(shape, data).map_err(|e| e.to_string());
    }
    // Nested arrays: infer the shape from the first element at each depth.
    let mut shape = Vec::new();
    let mut probe = v;
    while let Value::Array(items) = probe {
        shape.push(items.len());
        match items.first() {
            Some(first) => probe = first,
            None => break,
        }
    }
    let mut data = Vec::new();
    flatten(v, &shape, 0, scalar, &mut data)?;
    HostTensor::new(shape, data).map_err(|e| e.to_string())
}

fn flatten<T>(v: &Value, shape: &[usize], depth: usize, scalar: fn(&Value) -> Result<T, String>, out: &mut Vec<T>) -> Result<(), String> {
    if depth == shape.len() {
        out.push(scalar(v)?);
        return Ok(());
    }
    let items = v.as_array().ok_or_else(|| format!("ragged tensor: expected an array at depth {depth}, found {v}"))?;
    if items.len() != shape[depth] {
        return Err(format!("ragged tensor: {} items at depth {depth}, expected {}", items.len(), shape[depth]));
    }
    items.iter().try_for_each(|x| flatten(x, shape, depth + 1, scalar, out))
}

pub fn decode_f64(v: &Value) -> Result<HostTensor<f64>, String> {
    decode(v, float_of)
}

pub fn decode_i64(v: &Value) -> Result<HostTensor<i64>, String> {
    decode(v, int_of)
}

fn float_value(x: f64) -> Value {
    if x.is_nan() {
        Value::from("nan")
    } else if x.is_infinite() {
        Value::from(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        Value::from(x)
    }
}

fn encode<T: Copy>(t: &HostTensor<T>, scalar: fn(T) -> Value) -> Value {
    if t.shape().contains(&0) || t.shape().is_empty() {
        let data = t.data().iter().map(|&x| scalar(x)).collect();
        return serde_json::json!({ "shape": t.shape(), "data": Value::Array(data) });
    }
    fn nest<T: Copy>(data: &[T], shape: &[usize], scalar: fn(T) -> Value) -> Value {
        match shape {
            [] => scalar(data[0]),
            [_] => Value::Array(data.iter().map(|&x| scalar(x)).collect()),
            [n, rest @ ..] => {
                let step = data.len() / n;
                Value::Array(data.chunks(step).map(|c| nest(c, rest, scalar)).collect())
            }
        }
    }
    nest(t.data(), t.shape(), scalar)
}

pub fn encode_f64(t: &HostTensor<f64>) -> Value {
    encode(t, float_value)
}

pub fn encode_i64(t: &HostTensor<i64>) -> Value {
    encode(t, Value::from)
}

/// Pretty JSON that keeps arrays of scalars on one line, so tensors stay
/// readable in review diffs.
pub fn to_pretty_json(v: &Value) -> String {
    fn inline(v: &Value) -> bool {
        match v {
            Value::Array(items) => items.iter().all(|x| !x.is_array() && !x.is_object()) || items.iter().all(inline_nested),
            Value::Object(_) => false,
            _ => true,
        }
    }
    // Small matrices of scalars ([[..], [..]]) also stay on one line.
    fn inline_nested(v: &Value) -> bool {
        matches!(v, Value::Array(items) if items.len() <= 16 && items.iter().all(|x| !x.is_array() && !x.is_object()))
    }
    fn go(v: &Value, indent: usize, out: &mut String) {
        let pad = "  ".repeat(indent + 1);
        match v {
            Value::Object(map) if !map.is_empty() => {
                out.push_str("{\n");
                for (i, (k, x)) in map.iter().enumerate() {
                    let _ = write!(out, "{pad}{}: ", Value::from(k.as_str()));
                    go(x, indent + 1, out);
                    out.push_str(if i + 1 < map.len() { ",\n" } else { "\n" });
                }
                let _ = write!(out, "{}}}", "  ".repeat(indent));
            }
            Value::Array(items) if !items.is_empty() && !inline(v) => {
                out.push_str("[\n");
                for (i, x) in items.iter().enumerate() {
                    out.push_str(&pad);
                    go(x, indent + 1, out);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                let _ = write!(out, "{}]", "  ".repeat(indent));
            }
            Value::Array(items) => {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    go(x, indent, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    go(v, 0, &mut out);
    out.push('\n');
    out
}
