//! What each ServiceAccount of the chart may do. As rendered: every rule
//! each ServiceAccount gets through a binding is the reviewed table
//! `deploy/rbac.txt` (defaults, scheduler on), and the controller reaches
//! Secrets, ConfigMaps and Leases only by name in every rendering. As a
//! real kube-apiserver answers it: the chart's ServiceAccounts,
//! ClusterRoles, Roles and bindings (defaults, scheduler on) are created
//! in the test cluster, and for each ServiceAccount the API server is
//! asked, as that account (impersonation), for every rule it grants
//! (`SelfSubjectRulesReview`) in the release namespace and in another one.
//! What any authenticated user gets (discovery, self reviews) is left out;
//! the rest must equal the reviewed table `deploy/rbac-effective.txt`,
//! built-in roles (kube-scheduler's own) expanded to their rules: the API
//! server grants what `deploy/rbac.txt` says and nothing more, through
//! every binding, aggregation and built-in role. Each rule's reason is in
//! `docs/security.md`, which a test here holds to `deploy/rbac.txt`.
//!
//! Needs etcd, kube-apiserver and helm from `tests/tools/build.sh etcd kube
//! helm`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use carina_tests::chart::{
    RBAC_SET, RBAC_TABLE, SETS, ValueSet, controller_rules, rbac_table, render, strings,
};
use carina_tests::kube::KubeCluster;
use carina_tests::manifests::{Chart, repo_root};
use k8s_openapi::api::authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

/// The release namespace, and one where the chart binds nothing.
const NAMESPACE: &str = "kube-system";
const OTHER_NAMESPACE: &str = "default";

/// The checked-in table of what the API server grants each ServiceAccount.
const TABLE: &str = "deploy/rbac-effective.txt";

/// Where each rule of [`RBAC_TABLE`] is justified.
const WHY: &str = "docs/security.md";

/// A user no binding names: what every authenticated user may do.
const NOBODY: &str = "system:serviceaccount:kube-system:carina-rbac-baseline";

/// One grantable thing: a resource rule's (group, resource, name), or a
/// non-resource URL as `("url", url, "")`.
type Atom = (String, String, String);

/// Creates the chart's ServiceAccounts and RBAC objects.
async fn install_rbac(client: &kube::Client, objs: &[Value]) -> Result<usize> {
    let mut created = 0;
    for o in objs {
        let ns = o["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
        let what = format!("{} {}", o["kind"], o["metadata"]["name"]);
        let pp = PostParams::default();
        match o["kind"].as_str() {
            Some("ServiceAccount") => {
                Api::<ServiceAccount>::namespaced(client.clone(), ns)
                    .create(&pp, &serde_json::from_value(o.clone())?)
                    .await
                    .with_context(|| what.clone())?;
            }
            Some("ClusterRole") => {
                Api::<ClusterRole>::all(client.clone())
                    .create(&pp, &serde_json::from_value(o.clone())?)
                    .await
                    .with_context(|| what.clone())?;
            }
            Some("ClusterRoleBinding") => {
                Api::<ClusterRoleBinding>::all(client.clone())
                    .create(&pp, &serde_json::from_value(o.clone())?)
                    .await
                    .with_context(|| what.clone())?;
            }
            Some("Role") => {
                Api::<Role>::namespaced(client.clone(), ns)
                    .create(&pp, &serde_json::from_value(o.clone())?)
                    .await
                    .with_context(|| what.clone())?;
            }
            Some("RoleBinding") => {
                Api::<RoleBinding>::namespaced(client.clone(), ns)
                    .create(&pp, &serde_json::from_value(o.clone())?)
                    .await
                    .with_context(|| what.clone())?;
            }
            _ => continue,
        }
        created += 1;
    }
    Ok(created)
}

/// A client of the cluster acting as `user` in the groups a
/// ServiceAccount token gives.
async fn impersonating(cluster: &KubeCluster, user: &str) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(cluster.kubeconfig_path())?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let ns = user.split(':').nth(2).unwrap_or_default();
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".to_string(),
    ]);
    Ok(kube::Client::try_from(config)?)
}

/// Everything `user` may do in `namespace` (cluster-wide rules included),
/// as atoms with their verbs.
async fn rules_in(
    cluster: &KubeCluster,
    user: &str,
    namespace: &str,
) -> Result<BTreeMap<Atom, BTreeSet<String>>> {
    let client = impersonating(cluster, user).await?;
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.to_string()),
        },
        ..Default::default()
    };
    let status = Api::<SelfSubjectRulesReview>::all(client)
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("SelfSubjectRulesReview as {user} in {namespace}"))?
        .status
        .context("a review without status")?;
    assert!(
        !status.incomplete,
        "{user}: the API server could not list every rule: {:?}",
        status.evaluation_error
    );
    let mut atoms: BTreeMap<Atom, BTreeSet<String>> = BTreeMap::new();
    for r in status.resource_rules {
        let groups = r.api_groups.unwrap_or_default();
        let resources = r.resources.unwrap_or_default();
        let names = r.resource_names.filter(|n| !n.is_empty());
        let names = names.unwrap_or_else(|| vec![String::new()]);
        for g in &groups {
            for res in &resources {
                for n in &names {
                    atoms
                        .entry((g.clone(), res.clone(), n.clone()))
                        .or_default()
                        .extend(r.verbs.iter().cloned());
                }
            }
        }
    }
    for r in status.non_resource_rules {
        for url in r.non_resource_urls.unwrap_or_default() {
            atoms
                .entry(("url".to_string(), url, String::new()))
                .or_default()
                .extend(r.verbs.iter().cloned());
        }
    }
    Ok(atoms)
}

/// `have` without what `baseline` grants too.
fn minus(
    mut have: BTreeMap<Atom, BTreeSet<String>>,
    baseline: &BTreeMap<Atom, BTreeSet<String>>,
) -> BTreeMap<Atom, BTreeSet<String>> {
    for (atom, verbs) in have.iter_mut() {
        if let Some(base) = baseline.get(atom) {
            verbs.retain(|v| !base.contains(v));
        }
    }
    have.retain(|_, v| !v.is_empty());
    have
}

fn line(who: &str, scope: &str, atom: &Atom, verbs: &BTreeSet<String>) -> String {
    let (group, resource, name) = atom;
    let verbs: Vec<&str> = verbs.iter().map(String::as_str).collect();
    if group == "url" {
        return format!("{who} {scope}: url {resource} verbs [{}]", verbs.join(","));
    }
    format!(
        "{who} {scope}: group [{group}] resource [{resource}] name [{name}] verbs [{}]",
        verbs.join(",")
    )
}

/// What the API server grants each ServiceAccount of `objs`, one line per
/// atom: `cluster-wide` when the other namespace has it too, else `in
/// <namespace>` for the verbs only the release namespace adds.
async fn effective_table(cluster: &KubeCluster, objs: &[Value]) -> Result<String> {
    let base_here = rules_in(cluster, NOBODY, NAMESPACE).await?;
    let base_there = rules_in(cluster, NOBODY, OTHER_NAMESPACE).await?;
    let mut lines = Vec::new();
    for sa in objs.iter().filter(|o| o["kind"] == "ServiceAccount") {
        let ns = sa["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
        let name = sa["metadata"]["name"].as_str().unwrap_or_default();
        let who = format!("{ns}/{name}");
        let user = format!("system:serviceaccount:{ns}:{name}");
        let here = minus(rules_in(cluster, &user, NAMESPACE).await?, &base_here);
        let there = minus(
            rules_in(cluster, &user, OTHER_NAMESPACE).await?,
            &base_there,
        );
        let before = lines.len();
        for (atom, verbs) in &there {
            lines.push(line(&who, "cluster-wide", atom, verbs));
        }
        for (atom, verbs) in minus(here, &there) {
            lines.push(line(&who, &format!("in {NAMESPACE}"), &atom, &verbs));
        }
        if lines.len() == before {
            lines.push(format!("{who} none"));
        }
    }
    lines.sort();
    Ok(lines.join("\n") + "\n")
}

/// For each ServiceAccount of the chart, the rights the API server grants
/// it are the reviewed table (`CARINA_UPDATE_RBAC=1` rewrites it; the
/// diff is then reviewed like code).
#[tokio::test]
async fn the_api_server_grants_each_service_account_exactly_the_reviewed_rights() -> Result<()> {
    let objs = render(&Chart::new()?, &RBAC_SET)?;
    let cluster = KubeCluster::start().await?;
    let created = install_rbac(&cluster.client(), &objs).await?;
    assert!(created >= 14, "only {created} RBAC objects rendered");
    let table = effective_table(&cluster, &objs).await?;

    // The node's token proves identity and grants nothing.
    assert!(
        table.contains("kube-system/carina-node none\n"),
        "the node's ServiceAccount may do more than any user:\n{table}"
    );
    // No Carina account touches Secrets outside its namespace; the issuing
    // controller reads and updates only the CA's Secret in its own, and
    // creates none (the chart makes it).
    for l in table.lines().filter(|l| l.contains("resource [secrets]")) {
        assert!(
            l.starts_with("kube-system/carina-controller in kube-system:"),
            "{l}"
        );
        assert!(l.ends_with("name [carina-ca] verbs [get,update]"), "{l}");
    }
    // The controller reads or changes a ConfigMap only by name, and holds
    // only its own Leases: none cluster-wide, none of kube-system's others
    // (a Lease's create, which cannot name one, excepted).
    for l in table
        .lines()
        .filter(|l| l.starts_with("kube-system/carina-controller "))
    {
        if l.contains("resource [configmaps]") {
            assert!(l.contains(" in kube-system:"), "{l}");
            assert!(!l.contains("name []"), "{l}");
        }
        if l.contains("resource [leases]") {
            assert!(l.contains(" in kube-system:"), "{l}");
            assert!(
                !l.contains("name []") || l.ends_with("verbs [create]"),
                "{l}"
            );
        }
    }

    let path = repo_root().join(TABLE);
    if std::env::var_os("CARINA_UPDATE_RBAC").is_some() {
        std::fs::write(&path, &table)?;
    }
    let reviewed = std::fs::read_to_string(&path).with_context(|| TABLE)?;
    assert_eq!(
        table, reviewed,
        "the API server grants other rights than {TABLE} (review, then CARINA_UPDATE_RBAC=1)"
    );
    Ok(())
}

/// Every rule of `deploy/rbac.txt` has its reason in `docs/security.md`: a
/// table row `| <Role> | <group> | <resources> | <verbs> | <why> |` with
/// the role, API group (`core` for the empty one), resources and verbs as
/// the RBAC table spells them (a built-in role: a row with the group and
/// verbs empty and `built in` as its resources). A row for a rule the chart no longer has fails too.
#[test]
fn every_rule_is_justified_in_the_security_doc() -> Result<()> {
    let rules =
        std::fs::read_to_string(repo_root().join(RBAC_TABLE)).with_context(|| RBAC_TABLE)?;
    let doc = std::fs::read_to_string(repo_root().join(WHY)).with_context(|| WHY)?;
    let bracket = |l: &str, key: &str| -> String {
        l.split(&format!("{key} ["))
            .nth(1)
            .and_then(|s| s.split(']').next())
            .unwrap_or_default()
            .to_string()
    };
    let mut want = BTreeSet::new();
    for l in rules.lines().filter(|l| !l.ends_with(" none")) {
        let role = l
            .split(' ')
            .find(|w| w.contains('/') && w.ends_with(':'))
            .with_context(|| format!("no role in {l}"))?
            .trim_end_matches(':');
        let key = if l.ends_with("built in") {
            (
                role.to_string(),
                String::new(),
                "built in".to_string(),
                String::new(),
            )
        } else {
            let group = match bracket(l, "groups") {
                g if g.is_empty() => "core".to_string(),
                g => g,
            };
            let mut resources = bracket(l, "resources");
            let names = bracket(l, "names");
            if !names.is_empty() {
                resources = format!("{resources} named {names}");
            }
            (role.to_string(), group, resources, bracket(l, "verbs"))
        };
        want.insert(key);
    }
    let mut rows = BTreeSet::new();
    for l in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<String> = l
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`').to_string())
            .collect();
        if let [role, group, resources, verbs, why, ..] = cells.as_slice() {
            assert!(!why.is_empty(), "{WHY}: no reason in {l}");
            rows.insert((
                role.clone(),
                group.clone(),
                resources.clone(),
                verbs.clone(),
            ));
        }
    }
    let missing: Vec<_> = want.difference(&rows).collect();
    let stale: Vec<_> = rows.difference(&want).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "{WHY} must give one reason per rule of {RBAC_TABLE}\nmissing: {missing:#?}\nno longer in the chart: {stale:#?}"
    );
    Ok(())
}

/// What each ServiceAccount of the chart may do is the reviewed table in
/// `deploy/rbac.txt`: a change of any rule, binding or ServiceAccount
/// fails here until the table is changed with it (`CARINA_UPDATE_RBAC=1`
/// rewrites it; the diff is then reviewed like code).
#[test]
fn each_service_account_has_exactly_the_reviewed_rights() -> Result<()> {
    let chart = Chart::new()?;
    let table = rbac_table(&render(&chart, &RBAC_SET)?)?;
    assert!(
        table.contains("kube-system/carina-node none"),
        "the node's ServiceAccount is bound to nothing:\n{table}"
    );
    let path = repo_root().join(RBAC_TABLE);
    if std::env::var_os("CARINA_UPDATE_RBAC").is_some() {
        std::fs::write(&path, &table)?;
    }
    let reviewed = std::fs::read_to_string(&path).with_context(|| RBAC_TABLE)?;
    assert_eq!(
        table, reviewed,
        "the chart's RBAC differs from {RBAC_TABLE} (review, then CARINA_UPDATE_RBAC=1)"
    );
    Ok(())
}

/// The controller reaches Secrets and ConfigMaps only by name (the chart
/// makes the CA's, so not even `create` is granted without a name),
/// Leases only in its namespace and by name (but `create`, which cannot
/// name an object that does not exist yet), and deletes pods and claims
/// only with pod migration on. Checked on every rendering, migration off
/// included; in issued identity mode the chart renders the CA's Secret
/// and ConfigMap, kept on uninstall and with no data of their own.
#[test]
fn the_controller_reaches_secrets_configmaps_and_leases_only_by_name() -> Result<()> {
    let chart = Chart::new()?;
    let migration_off = ValueSet {
        name: "migration off",
        namespace: "kube-system",
        values: Some("controller: {podMigrationGraceSecs: 0}\n"),
    };
    for set in SETS.into_iter().chain([&RBAC_SET, &migration_off]) {
        let objs = render(&chart, set)?;
        let rules = controller_rules(&objs);
        assert!(rules.len() >= 10, "{}: {rules:?}", set.name);
        let migration = set
            .values
            .is_none_or(|v| !v.contains("podMigrationGraceSecs: 0"));
        let issued = !set.values.is_some_and(|v| v.contains("mode: manual"));
        for kind in ["Secret", "ConfigMap"] {
            let ca = objs
                .iter()
                .find(|o| o["kind"] == kind && o["metadata"]["name"] == "carina-ca");
            assert_eq!(ca.is_some(), issued, "{}: the CA's {kind}", set.name);
            if let Some(ca) = ca {
                assert_eq!(ca["metadata"]["namespace"], set.namespace, "{ca}");
                assert_eq!(
                    ca["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
                    "{ca}"
                );
                // What the controller writes survives a helm upgrade only
                // if the manifest sets none of it.
                for field in ["data", "stringData", "type", "immutable"] {
                    assert!(ca.get(field).is_none(), "{}: {field} in {ca}", set.name);
                }
            }
        }
        let mut deletes = BTreeSet::new();
        for (scope, rule) in &rules {
            let what = format!("{}: {scope} {rule}", set.name);
            let resources = strings(&rule["resources"]);
            let verbs = strings(&rule["verbs"]);
            let named = !strings(&rule["resourceNames"]).is_empty();
            assert!(
                !resources.iter().any(|r| r.contains('*')) && !verbs.iter().any(|v| v == "*"),
                "{what}"
            );
            let touches = |r: &str| resources.iter().any(|x| x == r);
            assert!(
                named || !(touches("secrets") || touches("configmaps")),
                "a Secret or ConfigMap rule without names: {what}"
            );
            if touches("leases") {
                assert_eq!(
                    scope, set.namespace,
                    "a Lease rule outside the namespace: {what}"
                );
                assert!(named || verbs == ["create"], "{what}");
            }
            for r in ["pods", "persistentvolumeclaims"] {
                if touches(r) && verbs.iter().any(|v| v == "delete") {
                    deletes.insert(r);
                }
            }
        }
        let want: BTreeSet<&str> = if migration {
            ["pods", "persistentvolumeclaims"].into()
        } else {
            BTreeSet::new()
        };
        assert_eq!(deletes, want, "{}: delete of pods and claims", set.name);
    }
    Ok(())
}
