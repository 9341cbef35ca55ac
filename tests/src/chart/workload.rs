//! What a rendered workload (a Deployment, DaemonSet, ...) says of its
//! pods: a container by name, its arguments, a volume, a mount and an
//! environment variable taken from a pod field.

use anyhow::{Context, Result};
use serde_json::Value;

/// The container `name` of `workload`'s pod template.
pub fn container<'a>(workload: &'a Value, name: &str) -> Result<&'a Value> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .context("containers")?
        .iter()
        .find(|c| c["name"] == name)
        .with_context(|| format!("no container {name}"))
}

/// The arguments of `container`.
pub fn args(container: &Value) -> Vec<String> {
    strings(&container["args"])
}

/// Whether `args` holds `want` as one argument.
pub fn has(args: &[String], want: &str) -> bool {
    args.iter().any(|a| a == want)
}

/// The volume `name` of `workload`'s pod template.
pub fn volume<'a>(workload: &'a Value, name: &str) -> Result<&'a Value> {
    workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .context("volumes")?
        .iter()
        .find(|v| v["name"] == name)
        .with_context(|| format!("no volume {name}"))
}

/// The volume mount of `container` at `path`.
pub fn mount<'a>(container: &'a Value, path: &str) -> Result<&'a Value> {
    container["volumeMounts"]
        .as_array()
        .context("volumeMounts")?
        .iter()
        .find(|m| m["mountPath"] == path)
        .with_context(|| format!("nothing mounted at {path}"))
}

/// The pod field the env entry `name` of `container` is read from.
pub fn field_env<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["valueFrom"]["fieldRef"]["fieldPath"]
        .as_str()
}

/// The strings of a JSON array (none for anything else).
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}
