//! The wire format of `specdec-exec/1` (PROTO-1 .. PROTO-8, `spec/PROTOCOL.md`):
//! tensors as `{shape, dtype, data}`, the handshake, and reply errors.
//!
//! Everything an adapter writes is untrusted: every decoder here returns a
//! typed [`ExecError::Malformed`] naming the offending field (a JSON path
//! such as `outputs.tokens.data[3]`) and never panics.

use serde_json::{Map, Value, json};
use specdec_backend::{ErrorKind, HostTensor, Precision, RefTensor, SpecError};

/// The protocol name and version both sides state in the handshake (PROTO-2).
pub const PROTOCOL: &str = "specdec-exec/1";

/// Tensors up to this many elements (all finite) travel as plain JSON
/// arrays, larger ones as base64 (PROTO-4): readable small cases, compact
/// statistical batches.
pub const INLINE_MAX: usize = 64;

/// Why a call to an adapter produced no usable reply.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    #[error("cannot start adapter `{command}`: {message}")]
    Spawn { command: String, message: String },
    #[error("adapter timed out after {seconds:.1} s on `{op}` and was killed (it is restarted for the next call){}", tail(.stderr))]
    Timeout { op: String, seconds: f64, stderr: String },
    #[error("adapter exited ({status}) during `{op}` (it is restarted for the next call){}", tail(.stderr))]
    Crashed { op: String, status: String, stderr: String },
    #[error("malformed reply to `{op}`: field `{field}`: {reason}")]
    Malformed { op: String, field: String, reason: String },
    #[error("adapter lied: its handshake lists `{op}`, but it answered NotSupported")]
    ClaimedButUnsupported { op: String },
    #[error("cannot talk to the adapter during `{op}`: {message}{}", tail(.stderr))]
    Io { op: String, message: String, stderr: String },
}

fn tail(stderr: &str) -> String {
    if stderr.trim().is_empty() { String::new() } else { format!("; stderr tail:\n{}", stderr.trim_end()) }
}

/// A decoding defect at `field`, before the op is known.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError { field: field.into(), reason: reason.into() }
    }

    pub fn in_op(self, op: &str) -> ExecError {
        ExecError::Malformed { op: op.to_string(), field: self.field, reason: self.reason }
    }
}

type FieldResult<T> = Result<T, FieldError>;

// ---------------------------------------------------------------- base64

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (RFC 4648), as Python's `base64.b64encode`.
pub fn b64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard padded base64; `Err` says what is wrong.
pub fn b64_decode(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return Err(format!("base64 length {} is not a multiple of 4", bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (c, chunk) in bytes.chunks(4).enumerate() {
        let last = c + 1 == bytes.len() / 4;
        let mut n = 0u32;
        let mut pad = 0;
        for (i, &ch) in chunk.iter().enumerate() {
            let v = match ch {
                b'A'..=b'Z' => ch - b'A',
                b'a'..=b'z' => ch - b'a' + 26,
                b'0'..=b'9' => ch - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                b'=' if last && i >= 2 => {
                    pad += 1;
                    0
                }
                _ => return Err(format!("invalid base64 character {:?} at {}", ch as char, c * 4 + i)),
            };
            if pad > 0 && ch != b'=' {
                return Err("base64 padding in the middle of a group".into());
            }
            n = n << 6 | v as u32;
        }
        let b = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&b[..3 - pad]);
    }
    Ok(out)
}

// ---------------------------------------------------------------- tensors

/// Encodes a host tensor for a request (PROTO-4): a plain array when small
/// and finite, else base64 of the little-endian values.
pub fn encode_tensor(t: &RefTensor) -> Value {
    match t {
        RefTensor::F64(t) => {
            let data = if t.len() <= INLINE_MAX && t.data().iter().all(|x| x.is_finite()) {
                json!(t.data())
            } else {
                Value::String(b64_encode(&t.data().iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()))
            };
            json!({"shape": t.shape(), "dtype": "f64", "data": data})
        }
        RefTensor::I64(t) => {
            let data = if t.len() <= INLINE_MAX { json!(t.data()) } else { Value::String(b64_encode(&t.data().iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())) };
            json!({"shape": t.shape(), "dtype": "i64", "data": data})
        }
    }
}

/// What an output must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Float,
    Int,
}

fn shape_of(v: &Value, field: &str) -> FieldResult<Vec<usize>> {
    let arr = v.as_array().ok_or_else(|| FieldError::new(format!("{field}.shape"), "must be an array of non-negative integers"))?;
    arr.iter()
        .enumerate()
        .map(|(i, d)| d.as_u64().and_then(|d| usize::try_from(d).ok()).ok_or_else(|| FieldError::new(format!("{field}.shape[{i}]"), format!("{d} is not a non-negative integer"))))
        .collect()
}

fn plain_float(v: &Value, field: &str, i: usize) -> FieldResult<f64> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| FieldError::new(format!("{field}.data[{i}]"), "not a float")),
        Value::String(s) => match s.as_str() {
            "nan" | "NaN" => Ok(f64::NAN),
            "inf" | "Infinity" => Ok(f64::INFINITY),
            "-inf" | "-Infinity" => Ok(f64::NEG_INFINITY),
            other => Err(FieldError::new(format!("{field}.data[{i}]"), format!("{other:?} is not a number"))),
        },
        other => Err(FieldError::new(format!("{field}.data[{i}]"), format!("{other} is not a number"))),
    }
}

fn plain_int(v: &Value, field: &str, i: usize) -> FieldResult<i64> {
    v.as_i64().ok_or_else(|| FieldError::new(format!("{field}.data[{i}]"), format!("{v} is not a 64-bit integer")))
}

/// Decodes a `{shape, dtype, data}` object at JSON path `field` (PROTO-4).
/// Floats may come as `f64` or `f32`; ids must be integers (`i64` or `i32`).
pub fn decode_tensor(v: &Value, field: &str, want: Want) -> FieldResult<RefTensor> {
    let obj = v.as_object().ok_or_else(|| FieldError::new(field, "must be an object {shape, dtype, data}"))?;
    let shape = shape_of(obj.get("shape").ok_or_else(|| FieldError::new(format!("{field}.shape"), "is missing"))?, field)?;
    let dtype = obj.get("dtype").ok_or_else(|| FieldError::new(format!("{field}.dtype"), "is missing"))?.as_str().ok_or_else(|| FieldError::new(format!("{field}.dtype"), "must be a string"))?;
    let width = match (want, dtype) {
        (Want::Float, "f64") | (Want::Int, "i64") => 8,
        (Want::Float, "f32") | (Want::Int, "i32") => 4,
        (Want::Float, other) => return Err(FieldError::new(format!("{field}.dtype"), format!("{other:?}: a float tensor (f64 or f32) is required"))),
        (Want::Int, other) => return Err(FieldError::new(format!("{field}.dtype"), format!("{other:?}: an id tensor (i64 or i32) is required"))),
    };
    let n = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| FieldError::new(format!("{field}.shape"), "the element count overflows"))?;
    let data = obj.get("data").ok_or_else(|| FieldError::new(format!("{field}.data"), "is missing"))?;
    let count_error = |len: usize| FieldError::new(format!("{field}.data"), format!("{len} values cannot fill shape {shape:?}"));
    let out = match data {
        Value::Array(items) => {
            if items.len() != n {
                return Err(count_error(items.len()));
            }
            match want {
                Want::Float => {
                    RefTensor::F64(HostTensor::new(shape.clone(), items.iter().enumerate().map(|(i, x)| plain_float(x, field, i)).collect::<FieldResult<_>>()?).map_err(|_| count_error(n))?)
                }
                Want::Int => RefTensor::I64(HostTensor::new(shape.clone(), items.iter().enumerate().map(|(i, x)| plain_int(x, field, i)).collect::<FieldResult<_>>()?).map_err(|_| count_error(n))?),
            }
        }
        Value::String(text) => {
            let bytes = b64_decode(text).map_err(|e| FieldError::new(format!("{field}.data"), e))?;
            if bytes.len() != n.saturating_mul(width) {
                return Err(FieldError::new(format!("{field}.data"), format!("{} bytes of {dtype} cannot fill shape {shape:?}", bytes.len())));
            }
            let words = bytes.chunks_exact(width);
            match (want, width) {
                (Want::Float, 8) => RefTensor::F64(HostTensor::new(shape.clone(), words.map(|w| f64::from_le_bytes(w.try_into().expect("8 bytes"))).collect()).map_err(|_| count_error(n))?),
                (Want::Float, _) => RefTensor::F64(HostTensor::new(shape.clone(), words.map(|w| f32::from_le_bytes(w.try_into().expect("4 bytes")) as f64).collect()).map_err(|_| count_error(n))?),
                (Want::Int, 8) => RefTensor::I64(HostTensor::new(shape.clone(), words.map(|w| i64::from_le_bytes(w.try_into().expect("8 bytes"))).collect()).map_err(|_| count_error(n))?),
                (Want::Int, _) => RefTensor::I64(HostTensor::new(shape.clone(), words.map(|w| i32::from_le_bytes(w.try_into().expect("4 bytes")) as i64).collect()).map_err(|_| count_error(n))?),
            }
        }
        _ => return Err(FieldError::new(format!("{field}.data"), "must be an array or a base64 string")),
    };
    Ok(out)
}

// ---------------------------------------------------------------- handshake

/// What an adapter says about itself (PROTO-2, PROTO-3).
#[derive(Debug, Clone, PartialEq)]
pub struct Handshake {
    pub name: String,
    pub device: String,
    /// Operation names (`greedy_verify`, ..., `kv_cache`) it implements.
    pub ops: Vec<String>,
    pub float_dtype: String,
    pub accumulate_dtype: String,
    pub margin_epsilon: f64,
    pub value_tolerance: f64,
}

fn field_str(obj: &Map<String, Value>, key: &str, path: &str) -> FieldResult<String> {
    obj.get(key).ok_or_else(|| FieldError::new(format!("{path}{key}"), "is missing"))?.as_str().map(str::to_string).ok_or_else(|| FieldError::new(format!("{path}{key}"), "must be a string"))
}

fn field_tolerance(obj: &Map<String, Value>, key: &str) -> FieldResult<f64> {
    let v = obj.get(key).ok_or_else(|| FieldError::new(format!("precision.{key}"), "is missing"))?.as_f64().ok_or_else(|| FieldError::new(format!("precision.{key}"), "must be a number"))?;
    if v.is_finite() && v >= 0.0 { Ok(v) } else { Err(FieldError::new(format!("precision.{key}"), format!("{v} must be finite and >= 0"))) }
}

/// The handshake entry (PROTO-5) of an adapter whose `process_logits` takes
/// the processor inputs of LOGITS-7 .. LOGITS-10. An adapter that does not
/// list it is never sent them (it could ignore them and answer another law):
/// such a call is `NotSupported`.
pub const LOGITS_PROCESSORS: &str = "logits_processors";

/// Reads the handshake reply (PROTO-2): protocol, name, device, ops, precision.
pub fn parse_handshake(reply: &Map<String, Value>) -> FieldResult<Handshake> {
    let protocol = field_str(reply, "protocol", "")?;
    if protocol != PROTOCOL {
        return Err(FieldError::new("protocol", format!("{protocol:?}; this host speaks {PROTOCOL:?}")));
    }
    let ops = reply.get("ops").ok_or_else(|| FieldError::new("ops", "is missing"))?.as_array().ok_or_else(|| FieldError::new("ops", "must be an array of operation names"))?;
    let mut names = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let name = op.as_str().ok_or_else(|| FieldError::new(format!("ops[{i}]"), "must be a string"))?;
        if specdec_backend::Op::from_name(name).is_none() && name != LOGITS_PROCESSORS {
            return Err(FieldError::new(format!("ops[{i}]"), format!("unknown operation {name:?}")));
        }
        names.push(name.to_string());
    }
    let p = reply.get("precision").ok_or_else(|| FieldError::new("precision", "is missing"))?.as_object().ok_or_else(|| FieldError::new("precision", "must be an object"))?;
    Ok(Handshake {
        name: field_str(reply, "name", "")?,
        device: field_str(reply, "device", "")?,
        ops: names,
        float_dtype: field_str(p, "float_dtype", "precision.")?,
        accumulate_dtype: field_str(p, "accumulate_dtype", "precision.")?,
        margin_epsilon: field_tolerance(p, "margin_epsilon")?,
        value_tolerance: field_tolerance(p, "value_tolerance")?,
    })
}

/// A `&'static str` for a dtype or argument name the adapter sent: the
/// contract's types hold static names, and an adapter names only a handful,
/// so each distinct one is leaked once (bounded: beyond the cap, one marker).
pub fn intern(s: &str) -> &'static str {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static NAMES: Mutex<BTreeMap<String, &'static str>> = Mutex::new(BTreeMap::new());
    const CAP: usize = 4096;
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = names.get(s) {
        return s;
    }
    if names.len() >= CAP {
        return "<too many distinct names>";
    }
    let leaked: &'static str = Box::leak(s.to_string().into_boxed_str());
    names.insert(s.to_string(), leaked);
    leaked
}

impl Handshake {
    pub fn precision(&self) -> Precision {
        Precision { float_dtype: intern(&self.float_dtype), accumulate_dtype: intern(&self.accumulate_dtype), margin_epsilon: self.margin_epsilon, value_tolerance: self.value_tolerance }
    }
}

// ---------------------------------------------------------------- errors

/// An `error` object of a reply, decoded (PROTO-6).
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyError {
    /// One of the spec's kinds, with the reference's argument name.
    Spec(SpecError),
    NotSupported,
    /// The adapter's own failure (library, device), with its message.
    Device(String),
}

fn usize_field(obj: &Map<String, Value>, key: &str) -> FieldResult<usize> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v.as_u64().and_then(|v| usize::try_from(v).ok()).ok_or_else(|| FieldError::new(format!("error.{key}"), format!("{v} is not a non-negative integer"))),
    }
}

fn i64_field(obj: &Map<String, Value>, key: &str) -> FieldResult<i64> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v.as_i64().ok_or_else(|| FieldError::new(format!("error.{key}"), format!("{v} is not an integer"))),
    }
}

fn f64_field(obj: &Map<String, Value>, key: &str) -> FieldResult<f64> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(f64::NAN),
        Some(v) => plain_float(v, "error", 0).map_err(|_| FieldError::new(format!("error.{key}"), format!("{v} is not a number"))),
    }
}

fn index_field(obj: &Map<String, Value>) -> FieldResult<Vec<usize>> {
    match obj.get("index") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => {
            let arr = v.as_array().ok_or_else(|| FieldError::new("error.index", "must be an array of non-negative integers"))?;
            arr.iter()
                .enumerate()
                .map(|(i, x)| x.as_u64().and_then(|x| usize::try_from(x).ok()).ok_or_else(|| FieldError::new(format!("error.index[{i}]"), format!("{x} is not a non-negative integer"))))
                .collect()
        }
    }
}

/// Decodes `{"kind", "arg", "message", ...}`. The detail fields (`index`,
/// `value`, `seq`, ...) are optional: the judge compares kind and argument
/// (BACKEND-2), the details only make the report readable.
pub fn parse_error(v: &Value) -> FieldResult<ReplyError> {
    let obj = v.as_object().ok_or_else(|| FieldError::new("error", "must be an object {kind, arg, message}"))?;
    let kind = field_str(obj, "kind", "error.")?;
    let message = obj.get("message").and_then(Value::as_str).unwrap_or("").to_string();
    match kind.as_str() {
        "NotSupported" => return Ok(ReplyError::NotSupported),
        "Device" => return Ok(ReplyError::Device(message)),
        _ => {}
    }
    let kind: ErrorKind = serde_json::from_value(Value::String(kind.clone())).map_err(|_| FieldError::new("error.kind", format!("{kind:?} is not a spec error kind, NotSupported or Device")))?;
    let arg = || -> FieldResult<&'static str> { Ok(intern(&field_str(obj, "arg", "error.")?)) };
    let index = index_field(obj)?;
    use SpecError as E;
    let e = match kind {
        ErrorKind::ShapeMismatch => E::ShapeMismatch { arg: arg()?, expected: message, actual: shape_or_empty(obj, "actual")? },
        ErrorKind::DataLength => E::DataLength { arg: arg()?, shape: shape_or_empty(obj, "shape")?, len: usize_field(obj, "len")? },
        ErrorKind::NonFinite => E::NonFinite { arg: arg()?, index, value: f64_field(obj, "value")? },
        ErrorKind::NegativeProbability => E::NegativeProbability { arg: arg()?, index, value: f64_field(obj, "value")? },
        ErrorKind::NotNormalized => E::NotNormalized { arg: arg()?, row: index, sum: f64_field(obj, "value")?, tolerance: specdec_reference::SUM_TOLERANCE },
        ErrorKind::ZeroMass => E::ZeroMass { arg: arg()?, row: index },
        ErrorKind::TokenOutOfRange => E::TokenOutOfRange { arg: arg()?, index, token: i64_field(obj, "value")?, vocab: usize_field(obj, "vocab")? },
        ErrorKind::PaddingMismatch => E::PaddingMismatch { arg: arg()?, index, token: i64_field(obj, "value")?, expected: "PAD (-1)" },
        ErrorKind::LengthOutOfRange => E::LengthOutOfRange { arg: arg()?, seq: usize_field(obj, "seq")?, len: i64_field(obj, "value")?, max: usize_field(obj, "max")? },
        ErrorKind::EmptyDraft => E::EmptyDraft { arg: arg()? },
        ErrorKind::EmptyBatch => E::EmptyBatch { arg: arg()? },
        ErrorKind::EmptyVocab => E::EmptyVocab { arg: arg()? },
        ErrorKind::EmptyContext => E::EmptyContext { arg: arg()?, seq: usize_field(obj, "seq")? },
        ErrorKind::ContextTooLong => E::ContextTooLong { arg: arg()?, seq: usize_field(obj, "seq")?, len: usize_field(obj, "len")?, max_model_len: usize_field(obj, "max")? },
        ErrorKind::UniformOutOfRange => E::UniformOutOfRange { arg: arg()?, index, value: f64_field(obj, "value")? },
        ErrorKind::InvalidNoise => E::InvalidNoise { arg: arg()?, index, value: f64_field(obj, "value")? },
        ErrorKind::AllMasked => E::AllMasked { arg: arg()?, index },
        ErrorKind::InvalidParameter => E::InvalidParameter { name: arg()?, value: obj.get("value").map(|v| v.to_string()).unwrap_or_default(), reason: intern(&message) },
        ErrorKind::TrimBeyondLength => E::TrimBeyondLength { seq: usize_field(obj, "seq")?, len: usize_field(obj, "len")?, trim: i64_field(obj, "value")? },
        ErrorKind::CapacityExceeded => E::CapacityExceeded { seq: usize_field(obj, "seq")?, len: usize_field(obj, "len")?, add: i64_field(obj, "value")?, capacity: usize_field(obj, "max")? },
        ErrorKind::InvalidBlock => E::InvalidBlock { seq: usize_field(obj, "seq")?, slot: usize_field(obj, "slot")?, block: i64_field(obj, "value")?, num_pages: usize_field(obj, "max")? },
    };
    Ok(ReplyError::Spec(e))
}

fn shape_or_empty(obj: &Map<String, Value>, key: &str) -> FieldResult<Vec<usize>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => shape_of(v, &format!("error.{key}")).map_err(|e| FieldError::new(format!("error.{key}"), e.reason)),
    }
}
