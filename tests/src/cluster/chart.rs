//! The chart's controller identity in a test cluster: the CA objects the
//! chart makes for the controller ([`create_chart_ca_objects`]) and a
//! kubeconfig with exactly the chart's controller permissions
//! ([`as_chart_service_account`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kube::api::{Api, PostParams};

use crate::chart::{bindings_of, role_of};
use crate::kube::KubeCluster;

/// Creates what the chart makes for the controller to use but not create
/// (it has no right to): the objects of `objs` (the chart rendered) kept
/// on uninstall, the issuer's empty CA Secret and its ConfigMap. One that
/// exists already (a test's own CA) is left as it is. Returns how many of
/// `objs` were such objects.
pub async fn create_chart_ca_objects(
    client: &kube::Client,
    objs: &[serde_json::Value],
) -> Result<usize> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let pp = PostParams::default();
    let mut made = 0;
    for o in objs {
        let kind = o["kind"].as_str().unwrap_or_default();
        let kept = o["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep";
        if !kept || (kind != "Secret" && kind != "ConfigMap") {
            continue;
        }
        let ns = o["metadata"]["namespace"].as_str().unwrap_or("kube-system");
        let what = format!("{kind} {ns}/{}", o["metadata"]["name"]);
        let created = if kind == "Secret" {
            Api::<Secret>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(o.clone())?)
                .await
                .map(|_| ())
        } else {
            Api::<ConfigMap>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(o.clone())?)
                .await
                .map(|_| ())
        };
        match created {
            Ok(()) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(anyhow::Error::new(e).context(what)),
        }
        made += 1;
    }
    Ok(made)
}

/// A kubeconfig that authenticates as the chart's controller
/// ServiceAccount (a client certificate of its user name and group), after
/// applying every binding of `objs` (the chart rendered into `kube-system`)
/// that names that ServiceAccount, with the ClusterRole or Role it refers
/// to, so what runs with it has the chart's permissions and no more; and
/// after creating the CA objects the chart makes
/// ([`create_chart_ca_objects`]), which those permissions cannot.
pub async fn as_chart_service_account(
    cluster: &KubeCluster,
    objs: &[serde_json::Value],
    dir: &Path,
) -> Result<PathBuf> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let client = cluster.client();
    let pp = PostParams::default();
    let mut applied = 0;
    for b in bindings_of(objs, Some("kube-system"), "carina-controller") {
        let kind = b["kind"].as_str().unwrap_or_default();
        let ns = b["metadata"]["namespace"].as_str().unwrap_or("kube-system");
        let role = role_of(objs, b).with_context(|| {
            format!(
                "{kind} {} refers to no rendered role",
                b["metadata"]["name"]
            )
        })?;
        if kind == "ClusterRoleBinding" {
            Api::<ClusterRole>::all(client.clone())
                .create(&pp, &serde_json::from_value(role.clone())?)
                .await?;
            Api::<ClusterRoleBinding>::all(client.clone())
                .create(&pp, &serde_json::from_value(b.clone())?)
                .await?;
        } else {
            Api::<Role>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(role.clone())?)
                .await?;
            Api::<RoleBinding>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(b.clone())?)
                .await?;
        }
        applied += 1;
    }
    anyhow::ensure!(applied > 0, "the chart binds nothing to carina-controller");
    create_chart_ca_objects(&client, objs).await?;
    controller_service_account_kubeconfig(cluster, dir)
}

/// A kubeconfig in `dir` that authenticates as the controller's
/// ServiceAccount in `kube-system` (a client certificate of its user name
/// and group); what it may do is whatever is bound to that account.
pub fn controller_service_account_kubeconfig(cluster: &KubeCluster, dir: &Path) -> Result<PathBuf> {
    let (cert, key) = cluster.write_client_cert(
        dir,
        "carina-controller-sa",
        "system:serviceaccount:kube-system:carina-controller",
        "system:serviceaccounts",
    )?;
    let path = dir.join("carina-controller-sa.kubeconfig");
    cluster.write_kubeconfig(&path, &cert, &key)?;
    Ok(path)
}
