//! The JSON-schema subset a constraint takes, translated to one regex over
//! compact JSON (no whitespace between tokens: `{"a":1,"b":[true]}`),
//! CONSTRAIN-5.
//!
//! The subset: `type` of `string` (with `minLength`/`maxLength`, `enum`,
//! `const`), `integer`, `number`, `boolean`, `null`, `array` (with `items`,
//! `minItems`, `maxItems`), `object` (with `properties` emitted in their
//! declared order, those not in `required` optional, no other keys);
//! `enum` and `const` of any JSON value; `anyOf` and `oneOf` (both as "any
//! of": a value valid under two branches of a `oneOf` is not refused).
//! An object without `properties` is free-form (OpenAI's `json_object`):
//! any object whose containers nest at most [`FREE_FORM_DEPTH`] levels (the
//! language must stay regular). Anything else (`$ref`, `pattern`, `format`,
//! `additionalProperties: true` beside `properties`, ...) is a typed error
//! naming its path, never silently dropped.

use serde_json::Value;

use crate::ConstraintError;

/// The most repetitions a bound (`maxLength`, `maxItems`) may ask for: past
/// it the DFA grows beyond use.
pub const MAX_BOUND: u64 = 256;

/// One JSON string character: anything but `"`, `\` and the control
/// characters, or an escape.
const STRING_CHAR: &str = r#"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})"#;
const INTEGER: &str = r"-?(?:0|[1-9][0-9]*)";
const NUMBER: &str = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?";

/// The regex of the compact JSON texts valid under `schema`.
pub fn to_regex(schema: &Value) -> Result<String, ConstraintError> {
    value(schema, "#")
}

fn err(path: &str, reason: impl Into<String>) -> ConstraintError {
    ConstraintError::Schema { path: path.to_string(), reason: reason.into() }
}

const KNOWN: &[&str] =
    &["type", "properties", "required", "items", "minItems", "maxItems", "minLength", "maxLength", "enum", "const", "anyOf", "oneOf", "additionalProperties", "title", "description", "$schema"];

fn value(schema: &Value, path: &str) -> Result<String, ConstraintError> {
    let Some(obj) = schema.as_object() else {
        return Err(err(path, "a schema must be an object"));
    };
    if let Some(key) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(err(path, format!("`{key}` is outside the supported subset")));
    }
    if let Some(c) = obj.get("const") {
        return Ok(literal(c));
    }
    if let Some(e) = obj.get("enum") {
        let items = e.as_array().filter(|a| !a.is_empty()).ok_or_else(|| err(path, "`enum` must be a non-empty array"))?;
        return Ok(format!("(?:{})", items.iter().map(literal).collect::<Vec<_>>().join("|")));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = obj.get(key) {
            let branches = branches.as_array().filter(|a| !a.is_empty()).ok_or_else(|| err(path, format!("`{key}` must be a non-empty array")))?;
            let parts = branches.iter().enumerate().map(|(i, b)| value(b, &format!("{path}/{key}/{i}"))).collect::<Result<Vec<_>, _>>()?;
            return Ok(format!("(?:{})", parts.join("|")));
        }
    }
    let ty = obj.get("type").ok_or_else(|| err(path, "no `type`, `enum`, `const`, `anyOf` or `oneOf`"))?;
    let ty = ty.as_str().ok_or_else(|| err(path, "`type` must be one string (a list of types is outside the subset)"))?;
    match ty {
        "string" => {
            let (lo, hi) = bounds(obj, "minLength", "maxLength", path)?;
            Ok(format!("\"{STRING_CHAR}{}\"", repeat(lo, hi)))
        }
        "integer" => Ok(INTEGER.into()),
        "number" => Ok(NUMBER.into()),
        "boolean" => Ok("(?:true|false)".into()),
        "null" => Ok("null".into()),
        "array" => {
            let items = obj.get("items").ok_or_else(|| err(path, "an array needs `items`"))?;
            let item = value(items, &format!("{path}/items"))?;
            let (lo, hi) = bounds(obj, "minItems", "maxItems", path)?;
            // Item, then (, item) for the rest; an empty array where allowed.
            let rest = format!("(?:,{item}){}", repeat(lo.saturating_sub(1), hi.map(|h| h.saturating_sub(1))));
            let some = format!("{item}{rest}");
            Ok(match (lo, hi) {
                (_, Some(0)) => r"\[\]".into(),
                (0, _) => format!(r"\[(?:{some})?\]"),
                _ => format!(r"\[{some}\]"),
            })
        }
        "object" => object(obj, path),
        other => Err(err(path, format!("type `{other}` is not a JSON type"))),
    }
}

fn object(obj: &serde_json::Map<String, Value>, path: &str) -> Result<String, ConstraintError> {
    let Some(props) = obj.get("properties") else {
        // A free-form object (OpenAI's `json_object`): any object, nested at
        // most FREE_FORM_DEPTH deep; `additionalProperties: false` would
        // leave only `{}`, which is surely a mistake.
        if obj.keys().any(|k| !matches!(k.as_str(), "type" | "title" | "description" | "$schema")) {
            return Err(err(path, "a free-form object (no `properties`) takes no other keyword"));
        }
        return Ok(any_object(FREE_FORM_DEPTH));
    };
    let props = props.as_object().ok_or_else(|| err(path, "`properties` must be an object"))?;
    if obj.get("additionalProperties").is_some_and(|a| a != &Value::Bool(false)) {
        return Err(err(path, "`additionalProperties` other than false is outside the subset"));
    }
    let required: Vec<&str> = match obj.get("required") {
        None => Vec::new(),
        Some(r) => r.as_array().and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>()).ok_or_else(|| err(path, "`required` must be an array of strings"))?,
    };
    if let Some(missing) = required.iter().find(|r| !props.contains_key(**r)) {
        return Err(err(path, format!("`required` names `{missing}`, which `properties` lacks")));
    }
    let members = props
        .iter()
        .map(|(name, schema)| Ok((format!("{}:{}", literal(&Value::String(name.clone())), value(schema, &format!("{path}/properties/{name}"))?), required.contains(&name.as_str()))))
        .collect::<Result<Vec<(String, bool)>, ConstraintError>>()?;
    Ok(format!(r"\{{{}\}}", members_regex(&members)))
}

/// How deep a free-form object nests at most: the object itself is level 1,
/// and a container at level `FREE_FORM_DEPTH` holds scalars only (OpenAI's
/// structured outputs allow 5 levels too). The language must be regular,
/// and its DFA grows with the depth (its states track the open containers).
pub const FREE_FORM_DEPTH: u32 = 5;

/// Any compact JSON object whose containers nest at most `depth` levels.
fn any_object(depth: u32) -> String {
    object_of(&any_value(depth - 1))
}

/// The object whose member values are `inner`'s.
fn object_of(inner: &str) -> String {
    let member = format!("\"{STRING_CHAR}*\":{inner}");
    format!(r"\{{(?:{member}(?:,{member})*)?\}}")
}

/// Any compact JSON value whose containers nest at most `depth` levels: the
/// values one level down are written once and used by both containers.
fn any_value(depth: u32) -> String {
    let scalars = format!("\"{STRING_CHAR}*\"|{NUMBER}|true|false|null");
    if depth == 0 {
        return format!("(?:{scalars})");
    }
    let inner = any_value(depth - 1);
    format!(r"(?:{scalars}|{}|\[(?:{inner}(?:,{inner})*)?\])", object_of(&inner))
}

/// The members in order, the optional ones possibly absent, comma-separated:
/// `first(i)` is the list from member `i` on with none written yet, and
/// after the first written one every later one carries its comma.
fn members_regex(members: &[(String, bool)]) -> String {
    fn after(members: &[(String, bool)]) -> String {
        members.iter().map(|(m, req)| if *req { format!(",{m}") } else { format!("(?:,{m})?") }).collect()
    }
    fn first(members: &[(String, bool)]) -> String {
        match members.split_first() {
            None => String::new(),
            Some(((m, true), rest)) => format!("{m}{}", after(rest)),
            Some(((m, false), rest)) => {
                let skipped = first(rest);
                if skipped.is_empty() { format!("(?:{m}{})?", after(rest)) } else { format!("(?:{m}{}|{skipped})", after(rest)) }
            }
        }
    }
    first(members)
}

fn bounds(obj: &serde_json::Map<String, Value>, min: &str, max: &str, path: &str) -> Result<(u64, Option<u64>), ConstraintError> {
    let get = |key: &str| -> Result<Option<u64>, ConstraintError> {
        match obj.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= MAX_BOUND => Ok(Some(n)),
                _ => Err(err(path, format!("`{key}` must be an integer in [0, {MAX_BOUND}]"))),
            },
        }
    };
    let (lo, hi) = (get(min)?.unwrap_or(0), get(max)?);
    if hi.is_some_and(|h| h < lo) {
        return Err(err(path, format!("`{max}` is below `{min}`")));
    }
    Ok((lo, hi))
}

fn repeat(lo: u64, hi: Option<u64>) -> String {
    match hi {
        Some(h) => format!("{{{lo},{h}}}"),
        None => format!("{{{lo},}}"),
    }
}

/// The regex of exactly `v`'s compact JSON text.
fn literal(v: &Value) -> String {
    regex_syntax::escape(&v.to_string())
}
