//! Who may do what in the chart's rendering: the bindings that name a
//! ServiceAccount and the roles they refer to, the table of every
//! ServiceAccount's rights (`deploy/rbac.txt`), and the rules bound to the
//! controller.

use anyhow::{Context, Result};
use serde_json::Value;

use super::strings;
use crate::manifests::find;

/// The checked-in table of what each ServiceAccount may do.
pub const RBAC_TABLE: &str = "deploy/rbac.txt";

/// The ClusterRoleBindings and RoleBindings of `objs` whose subjects name
/// the ServiceAccount `name`, of namespace `ns` (of any when `None`).
pub fn bindings_of<'a>(
    objs: &'a [Value],
    ns: Option<&'a str>,
    name: &'a str,
) -> impl Iterator<Item = &'a Value> + 'a {
    objs.iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
        .filter(move |b| {
            b["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == name
                    && ns.is_none_or(|ns| s["namespace"] == ns)
            })
        })
}

/// The ClusterRole or Role of `objs` that `binding` refers to, if the
/// chart renders it (not one built into Kubernetes).
pub fn role_of<'a>(objs: &'a [Value], binding: &Value) -> Option<&'a Value> {
    objs.iter().find(|o| {
        o["kind"] == binding["roleRef"]["kind"]
            && o["metadata"]["name"] == binding["roleRef"]["name"]
    })
}

/// One line per rule a ServiceAccount gets through a binding, sorted;
/// `none` for a ServiceAccount bound to nothing.
pub fn rbac_table(objs: &[Value]) -> Result<String> {
    let words = |v: &Value| -> String {
        let mut w: Vec<&str> = v
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        w.sort_unstable();
        w.join(",")
    };
    let mut lines = Vec::new();
    for sa in objs.iter().filter(|o| o["kind"] == "ServiceAccount") {
        let (ns, name) = (
            sa["metadata"]["namespace"].as_str().unwrap_or_default(),
            sa["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let who = format!("{ns}/{name}");
        let mut bound = false;
        for b in bindings_of(objs, Some(ns), name) {
            bound = true;
            let scope = if b["kind"] == "RoleBinding" {
                format!("in {}", b["metadata"]["namespace"].as_str().unwrap_or(ns))
            } else {
                "cluster-wide".to_string()
            };
            let (kind, role) = (
                b["roleRef"]["kind"].as_str().unwrap_or_default(),
                b["roleRef"]["name"].as_str().unwrap_or_default(),
            );
            let Some(r) = role_of(objs, b) else {
                lines.push(format!("{who} {scope} {kind}/{role}: built in"));
                continue;
            };
            for rule in r["rules"].as_array().into_iter().flatten() {
                lines.push(format!(
                    "{who} {scope} {kind}/{role}: groups [{}] resources [{}] names [{}] verbs [{}]",
                    words(&rule["apiGroups"]),
                    words(&rule["resources"]),
                    words(&rule["resourceNames"]),
                    words(&rule["verbs"]),
                ));
            }
        }
        if !bound {
            lines.push(format!("{who} none"));
        }
    }
    lines.sort();
    Ok(lines.join("\n") + "\n")
}

/// The rules bound to the controller's ServiceAccount in `objs`: (scope,
/// rule), scope `cluster` for a ClusterRoleBinding, else the namespace of
/// the RoleBinding.
pub fn controller_rules(objs: &[Value]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for b in bindings_of(objs, None, "carina-controller") {
        let scope = match b["kind"].as_str() {
            Some("RoleBinding") => b["metadata"]["namespace"].as_str().unwrap_or_default(),
            _ => "cluster",
        };
        for rule in role_of(objs, b)
            .and_then(|r| r["rules"].as_array())
            .into_iter()
            .flatten()
        {
            out.push((scope.to_string(), rule.clone()));
        }
    }
    out
}

/// The snapshot rules of the controller's ClusterRole: (resource, verbs).
pub fn snapshot_rules(objs: &[Value]) -> Result<Vec<(String, Vec<String>)>> {
    let role = find(objs, "ClusterRole", "carina-controller")?;
    Ok(role["rules"]
        .as_array()
        .context("rules")?
        .iter()
        .filter(|r| {
            strings(&r["apiGroups"])
                .iter()
                .any(|g| g.contains("snapshot"))
        })
        .flat_map(|r| {
            let verbs = strings(&r["verbs"]);
            strings(&r["resources"])
                .into_iter()
                .map(move |res| (res, verbs.clone()))
        })
        .collect())
}
