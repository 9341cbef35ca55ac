//! The harness's upstream control plane beyond the apiserver: the
//! controller-manager's controllers run (a new namespace gets its `default`
//! ServiceAccount) and kube-scheduler binds a Pod to a kubelet-less Node,
//! which stays untainted because the node-lifecycle controller is off.
//!
//! Needs etcd and the Kubernetes binaries from `tests/tools/build.sh etcd kube`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_tests::cluster::ready_node_status;
use carina_tests::kube::KubeCluster;
use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod, PodSpec, ServiceAccount};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                name.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

#[tokio::test]
async fn scheduler_and_controller_manager_run_against_the_cluster() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    let mut controllers = cluster.start_controller_manager(&[]).await?;
    let mut scheduler = cluster.start_scheduler(&[]).await?;
    let client = cluster.client();

    // The serviceaccount controller gives every namespace its `default`
    // ServiceAccount.
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("carina-e2e".into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "carina-e2e");
    tokio::time::timeout(
        WAIT,
        await_condition(sas, "default", |sa: Option<&ServiceAccount>| sa.is_some()),
    )
    .await
    .context("no default ServiceAccount: controller-manager not working")??;

    // A Node without a kubelet: its status is written through /status.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("node-a"))
        .await?;
    nodes
        .patch_status(
            "node-a",
            &PatchParams::apply("carina-tests").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1",
                "kind": "Node",
                "status": ready_node_status("4", "8Gi"),
            })),
        )
        .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "carina-e2e");
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("app".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("registry.k8s.io/pause:3.10".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    pods.create(&PostParams::default(), &pod).await?;
    let bound = tokio::time::timeout(
        WAIT,
        await_condition(pods, "app", |p: Option<&Pod>| {
            p.and_then(|p| p.spec.as_ref())
                .and_then(|s| s.node_name.as_ref())
                .is_some()
        }),
    )
    .await
    .context("pod not scheduled")??
    .context("pod deleted")?;
    assert_eq!(
        bound.spec.and_then(|s| s.node_name).as_deref(),
        Some("node-a")
    );

    // Still untainted: no node-lifecycle controller marks it unreachable.
    let node = Api::<Node>::all(client).get("node-a").await?;
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(taints.is_empty(), "{taints:?}");

    controllers.check_running()?;
    scheduler.check_running()?;
    Ok(())
}
