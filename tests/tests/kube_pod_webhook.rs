//! The pod webhook (Go Carina's, `--pod-webhook-configuration`) over a
//! real API server: the controller writes the CA into the configuration's
//! `caBundle`, and the API server, calling it for every Pod created in the
//! test's namespace (`failurePolicy: Fail`, so a webhook that does not
//! answer fails the creates), gets Pods with a Carina claim sent to the
//! extender's scheduler with the class's migration consent copied, and
//! every other Pod left as it was: no Carina claim, a claim that does not
//! exist yet, Go Carina's opt-out annotation, a scheduler of the Pod's own.
//! A generic ephemeral volume counts by its template's class.
//!
//! Needs root (or CI) and the kube binaries (tests/tools/build.sh etcd kube).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use carina_csi::params::POD_MIGRATION;
use carina_tests::cluster::{KubeControllerArgs, Pki, free_port};
use carina_tests::identity::{CA, NODE_SA, NodePods, published_ca};
use carina_tests::kube::KubeCluster;
use carina_tests::{have_root, unique};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const SCHEDULER: &str = "carina-scheduler";
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn pods_with_carina_claims_go_to_the_extenders_scheduler() -> Result<()> {
    if !have_root("kube_pod_webhook") {
        return Ok(());
    }
    let cluster = KubeCluster::start().await?;
    let client = cluster.client();
    let dir = tempfile::Builder::new()
        .prefix("carina-pod-webhook-")
        .tempdir()?;
    let pki = Pki::write(&dir.path().join("pki"))?;
    let pods = NodePods::create(&client, &unique("hook")).await?;
    let ns = pods.namespace.clone();

    // The configuration first, without a caBundle: the controller writes it.
    let port = free_port()?;
    let hook_name = unique("carina-pod-webhook");
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    hooks
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": hook_name},
                "webhooks": [{
                    "name": "pod-hook.carina.storage.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "clientConfig": {"url": format!("https://localhost:{port}/mutate-pods")},
                    "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                        "operations": ["CREATE"], "resources": ["pods"]}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                }],
            }))?,
        )
        .await
        .context("create the MutatingWebhookConfiguration")?;

    let mut args = KubeControllerArgs::new(
        "hook-controller",
        "carina-controller",
        cluster.kubeconfig_path(),
        &pki,
        dir.path(),
        &cluster.log_dir().join("hook-controller.log"),
    );
    args.extra = vec![
        format!("--namespace={ns}"),
        format!("--identity-listen=127.0.0.1:{port}"),
        "--identity-server-names=localhost".to_string(),
        format!("--pod-webhook-configuration={hook_name}"),
        format!("--pod-webhook-scheduler={SCHEDULER}"),
    ];
    let mut controller = args.start().await?;
    let ca = published_ca(&client, &ns, CA, WAIT).await?;
    let want = ByteString(ca.into_bytes());
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let config = hooks.get(&hook_name).await?;
        let bundle = config.webhooks.unwrap_or_default()[0]
            .client_config
            .ca_bundle
            .clone();
        if bundle.as_ref() == Some(&want) {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the controller never wrote the CA into {hook_name}'s caBundle: {bundle:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Classes: Carina's with and without the migration consent, another
    // driver's; a claim of each.
    let classes: Api<StorageClass> = Api::all(client.clone());
    let consent = unique("carina-consent");
    let plain = unique("carina-plain");
    let other = unique("other");
    for (name, provisioner, params) in [
        (
            &consent,
            "carina.storage.io",
            json!({ POD_MIGRATION: "true" }),
        ),
        (&plain, "carina.storage.io", json!({})),
        (&other, "other.example.com", json!({})),
    ] {
        let class = json!({"metadata": {"name": name}, "provisioner": provisioner,
            "parameters": params, "volumeBindingMode": "WaitForFirstConsumer"});
        classes
            .create(&PostParams::default(), &serde_json::from_value(class)?)
            .await
            .with_context(|| format!("create StorageClass {name}"))?;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    for (claim, class) in [
        ("c-consent", &consent),
        ("c-plain", &plain),
        ("c-other", &other),
    ] {
        let pvc = json!({"metadata": {"name": claim}, "spec": {"storageClassName": class,
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}});
        claims
            .create(&PostParams::default(), &serde_json::from_value(pvc)?)
            .await
            .with_context(|| format!("create claim {claim}"))?;
    }

    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let claim = |name: &str| json!({"name": "v", "persistentVolumeClaim": {"claimName": name}});
    let ephemeral = json!({"name": "v", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "storageClassName": consent, "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Mi"}}}}}});
    let case = |name: &'static str, volumes: Vec<serde_json::Value>, scheduler, migration| Case {
        name,
        meta: json!({}),
        spec: json!({}),
        volumes,
        scheduler,
        migration,
    };
    let mixed = vec![
        claim("c-other"),
        json!({"name": "w", "persistentVolumeClaim": {"claimName": "c-consent"}}),
    ];
    let default = "default-scheduler";
    let cases = [
        case("consent", vec![claim("c-consent")], SCHEDULER, Some("true")),
        case("plain", vec![claim("c-plain")], SCHEDULER, None),
        case("mixed", mixed, SCHEDULER, Some("true")),
        case("ephemeral", vec![ephemeral], SCHEDULER, Some("true")),
        case("other", vec![claim("c-other")], default, None),
        case("missing", vec![claim("c-missing")], default, None),
        case("none", vec![], default, None),
        Case {
            meta: json!({"annotations": {"carina.storage.io/custom-scheduler-plugin": ""}}),
            ..case("opted-out", vec![claim("c-consent")], default, None)
        },
        Case {
            meta: json!({"annotations": { POD_MIGRATION: "false" }}),
            ..case(
                "own-consent",
                vec![claim("c-consent")],
                SCHEDULER,
                Some("false"),
            )
        },
        Case {
            spec: json!({"schedulerName": "my-scheduler"}),
            ..case(
                "own-scheduler",
                vec![claim("c-consent")],
                "my-scheduler",
                Some("true"),
            )
        },
    ];
    for Case {
        name,
        meta,
        spec,
        volumes,
        scheduler,
        migration,
    } in cases
    {
        let mut pod = json!({"metadata": {"name": name}, "spec": {
            "serviceAccountName": NODE_SA,
            "containers": [{"name": "c", "image": "pause:test"}],
            "volumes": volumes,
        }});
        merge(&mut pod["metadata"], meta);
        merge(&mut pod["spec"], spec);
        let made = api
            .create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await
            .with_context(|| format!("create Pod {name}"))?;
        let got = made.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
        ensure!(
            got == Some(scheduler),
            "Pod {name}: scheduler {got:?}, not {scheduler}"
        );
        let annotations: BTreeMap<String, String> =
            made.metadata.annotations.clone().unwrap_or_default();
        ensure!(
            annotations.get(POD_MIGRATION).map(String::as_str) == migration,
            "Pod {name}: migration annotation {:?}, not {migration:?}",
            annotations.get(POD_MIGRATION)
        );
    }

    // The configuration is Fail: with the webhook gone, a Pod of the
    // namespace is refused, which shows the creates above went through it.
    controller.stop().await;
    let refused = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "after"}, "spec": {
                "serviceAccountName": NODE_SA,
                "containers": [{"name": "c", "image": "pause:test"}]}}))?,
        )
        .await;
    ensure!(refused.is_err(), "a Pod was created with the webhook down");
    hooks.delete(&hook_name, &DeleteParams::default()).await?;
    for name in [&consent, &plain, &other] {
        classes.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// A Pod to create: its name, metadata and spec besides the defaults, its
/// volumes; the scheduler and migration annotation it must end with.
struct Case {
    name: &'static str,
    meta: serde_json::Value,
    spec: serde_json::Value,
    volumes: Vec<serde_json::Value>,
    scheduler: &'static str,
    migration: Option<&'static str>,
}

/// Adds the keys of `extra` (an object) to `target` (an object).
fn merge(target: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(t), serde_json::Value::Object(e)) = (target.as_object_mut(), extra) {
        t.extend(e);
    }
}
