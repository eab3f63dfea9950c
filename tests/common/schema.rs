//! A validator for the subset of JSON Schema (draft 2020-12) that docs/schemas/ uses:
//! `type` (a name or a list of names), `const`, `enum`, `properties`, `required`,
//! `additionalProperties` (a boolean or a schema) and `items`. Any other keyword is an
//! error, so a schema cannot quietly rely on one this validator ignores.

use serde_json::Value;

/// Every way `v` breaks `docs/schemas/<name>.schema.json`.
pub fn validate_against(name: &str, v: &Value) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("docs/schemas/{name}.schema.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    validate(&serde_json::from_str(&text).unwrap(), v)
}

/// Every way `v` breaks `schema`, each as `path: what`; empty when it conforms.
pub fn validate(schema: &Value, v: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(schema, v, "$", &mut errors);
    errors
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(schema) = schema.as_object() else {
        errors.push(format!("{path}: the schema is not an object: {schema}"));
        return;
    };
    for key in schema.keys() {
        let known = [
            "$schema",
            "$id",
            "title",
            "description",
            "type",
            "const",
            "enum",
            "properties",
            "required",
            "additionalProperties",
            "items",
        ];
        if !known.contains(&key.as_str()) {
            errors.push(format!(
                "{path}: the schema uses `{key}`, which this validator does not know"
            ));
        }
    }
    if let Some(t) = schema.get("type") {
        let names: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let got = type_of(v);
        let ok = names
            .iter()
            .any(|n| *n == got || (*n == "number" && got == "integer"));
        if !ok {
            errors.push(format!("{path}: is {got} ({v}), the schema says {t}"));
            return;
        }
    }
    if let Some(c) = schema.get("const") {
        if c != v {
            errors.push(format!("{path}: is {v}, the schema says const {c}"));
        }
    }
    if let Some(Value::Array(options)) = schema.get("enum") {
        if !options.contains(v) {
            errors.push(format!("{path}: is {v}, not one of {options:?}"));
        }
    }
    if let Value::Object(m) = v {
        let props = schema.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(req)) = schema.get("required") {
            for k in req.iter().filter_map(Value::as_str) {
                if !m.contains_key(k) {
                    errors.push(format!("{path}: lacks the required `{k}`"));
                }
            }
        }
        for (k, x) in m {
            let here = format!("{path}.{k}");
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(s, x, &here, errors),
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        errors.push(format!("{here}: is not in the schema, which is closed"))
                    }
                    Some(s @ Value::Object(_)) => check(s, x, &here, errors),
                    _ => {}
                },
            }
        }
    }
    if let (Value::Array(a), Some(items)) = (v, schema.get("items")) {
        for (i, x) in a.iter().enumerate() {
            check(items, x, &format!("{path}[{i}]"), errors);
        }
    }
}
