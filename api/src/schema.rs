//! JSON Schema helpers for the CRD types: Kubernetes quantities, unsigned
//! integers as Kubernetes knows them, and condition lists that server-side
//! apply merges by `type`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::Value;

/// Schema of a `resource.Quantity` field: an integer or a string in
/// Kubernetes quantity syntax, like the Go original's CRD.
pub(crate) fn quantity_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        "x-kubernetes-int-or-string": true,
    })
}

/// Rewrites the JSON Schema formats schemars gives Rust's unsigned integers
/// (`uint32`, `uint64`) to what Kubernetes knows: `int64`, with
/// `minimum: 0`. Applied to each top-level spec and
/// status type; it walks the whole (inlined) schema.
pub(crate) fn kubernetes_integers(schema: &mut Schema) {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(format)) = map.get("format")
                    && format.starts_with("uint")
                {
                    map.insert("format".into(), "int64".into());
                    map.entry("minimum").or_insert_with(|| 0.into());
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    if let Some(map) = schema.as_object_mut() {
        map.values_mut().for_each(walk);
    }
}

/// Schema of a map from names to quantities.
pub(crate) fn quantity_map_schema(generator: &mut SchemaGenerator) -> Schema {
    let value = quantity_schema(generator);
    json_schema!({
        "type": "object",
        "additionalProperties": value,
    })
}

/// Schema of a standard condition list: a list-map keyed by `type`, so
/// server-side apply merges conditions of different writers.
pub(crate) fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = Vec::<Condition>::json_schema(generator);
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}
