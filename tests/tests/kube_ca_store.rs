//! The issuer's CA objects with exactly the chart's rights, against a real
//! kube-apiserver and etcd: the chart makes the CA Secret (empty) and the
//! ConfigMap, and the controller's ServiceAccount may only get and update
//! them by name (`controlplane/src/identity/store.rs`).
//!
//! It proves:
//! - controllers racing on the chart's empty Secret end with one CA: one
//!   writes it by an update, the others lose with `Conflict` (seen) and
//!   use the winner's; the ConfigMap is published by update;
//! - a missing Secret or ConfigMap is an error naming it and saying the
//!   chart creates it (the account may not create one);
//! - what the controller wrote survives `helm upgrade` (three-way merge)
//!   and `helm uninstall` (`helm.sh/resource-policy: keep`);
//! - a `kubernetes.io/tls` Secret of the user's own CA, made before the
//!   install with Helm's ownership label and annotations, is adopted with
//!   its type and data, and its CA is the one used.
//!
//! Needs etcd, kube-apiserver and helm from `tests/tools/build.sh etcd kube
//! helm`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use carina_controlplane::identity::ca::ClusterCa;
use carina_controlplane::identity::store::{
    self, CA_CONFIGMAP_KEY, CaLocation, CaSource, GENERATED_CA_NAME, TLS_CRT, TLS_KEY,
};
use carina_tests::cluster::{as_chart_service_account, controller_service_account_kubeconfig};
use carina_tests::identity::CA;
use carina_tests::kube::{KubeCluster, client_from};
use carina_tests::manifests::{Chart, RELEASE, objects};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

const NAMESPACE: &str = "kube-system";
/// Controllers starting together.
const RACERS: usize = 4;
/// Rounds of the race at most until one racer is seen losing it.
const ROUNDS: usize = 20;

fn location() -> CaLocation {
    CaLocation {
        namespace: NAMESPACE.to_string(),
        secret: CA.to_string(),
        configmap: CA.to_string(),
    }
}

/// The certificate the Secret holds, if any.
async fn secret_cert(client: &kube::Client) -> Result<Option<String>> {
    let secret = Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .get(CA)
        .await?;
    Ok(secret
        .data
        .and_then(|d| d.get(TLS_CRT).cloned())
        .map(|v| String::from_utf8_lossy(&v.0).into_owned()))
}

/// The chart's RBAC and CA objects in a fresh cluster, and a client that
/// is the controller's ServiceAccount.
async fn chart_account(cluster: &KubeCluster, dir: &Path) -> Result<kube::Client> {
    let chart = Chart::new()?;
    let objs = objects(&chart.template(NAMESPACE, None)?)?;
    let kubeconfig = as_chart_service_account(cluster, &objs, dir).await?;
    client_from(&kubeconfig).await
}

#[tokio::test]
async fn controllers_racing_on_the_charts_empty_secret_end_with_one_ca() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    let dir = tempfile::tempdir()?;
    let account = chart_account(&cluster, dir.path()).await?;
    let admin = cluster.client();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let at = location();

    let mut lost_seen = 0;
    for round in 0..ROUNDS {
        let empty = secrets.get(CA).await?;
        ensure!(
            store::holds_no_ca(&empty),
            "round {round}: the Secret holds a CA before the race"
        );
        let racers = (0..RACERS).map(|_| store::load_or_make_ca(&account, &at));
        let results = futures::future::join_all(racers).await;
        let mut written = 0;
        let mut certs = Vec::new();
        for r in results {
            let (ca, source) = r.with_context(|| format!("round {round}"))?;
            match source {
                CaSource::Written => written += 1,
                CaSource::OtherWriter => lost_seen += 1,
                CaSource::Found => {}
                CaSource::Created => bail!("round {round}: the Secret was created, not updated"),
            }
            certs.push(ca.cert_pem().to_string());
        }
        assert_eq!(written, 1, "round {round}: one racer writes the CA");
        certs.dedup();
        assert_eq!(certs.len(), 1, "round {round}: the racers use one CA");
        assert_eq!(
            secret_cert(&admin).await?.as_deref(),
            Some(certs[0].as_str()),
            "round {round}: the Secret holds the CA in use"
        );
        if round == 0 {
            // The ConfigMap the chart made, published by update.
            let (ca, _) = store::load_or_make_ca(&account, &at).await?;
            assert!(store::publish_ca(&account, &at, &ca, None).await?);
            let cm = Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
                .get(CA)
                .await?;
            let published = cm.data.and_then(|d| d.get(CA_CONFIGMAP_KEY).cloned());
            assert!(
                published.is_some_and(|b| b.contains(ca.cert_pem().trim())),
                "the ConfigMap publishes the CA"
            );
        }
        if lost_seen > 0 {
            eprintln!("a racer lost with Conflict in round {round}");
            break;
        }
        // Back to the chart's empty Secret for the next round.
        let mut reset = secrets.get(CA).await?;
        reset.data = None;
        secrets.replace(CA, &PostParams::default(), &reset).await?;
    }
    assert!(
        lost_seen > 0,
        "no racer lost the race in {ROUNDS} rounds: the Conflict path never ran"
    );
    Ok(())
}

#[tokio::test]
async fn a_missing_ca_object_is_an_error_that_names_it_for_the_charts_account() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    let dir = tempfile::tempdir()?;
    let account = chart_account(&cluster, dir.path()).await?;
    let admin = cluster.client();
    let at = location();
    let ca = store::load_or_create_ca(&account, &at).await?;

    Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
        .delete(CA, &DeleteParams::default())
        .await?;
    let err = store::publish_ca(&account, &at, &ca, None)
        .await
        .expect_err("the account may not create the ConfigMap")
        .to_string();
    assert!(
        err.contains("ConfigMap kube-system/carina-ca does not exist") && err.contains("chart"),
        "{err}"
    );

    Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
        .delete(CA, &DeleteParams::default())
        .await?;
    let err = store::load_or_create_ca(&account, &at)
        .await
        .expect_err("the account may not create the Secret")
        .to_string();
    assert!(
        err.contains("Secret kube-system/carina-ca does not exist") && err.contains("chart"),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn the_ca_the_controller_wrote_survives_helm_upgrade_and_uninstall() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    let dir = tempfile::tempdir()?;
    let chart = Chart::new()?;
    let kubeconfig = cluster.kubeconfig_path().to_string_lossy().into_owned();
    let chart_dir = chart.dir().to_string_lossy().into_owned();
    let helm = |verb: &str, values: Option<&str>| -> Result<()> {
        let mut args = vec![verb, RELEASE];
        if verb != "uninstall" {
            args.push(&chart_dir);
        }
        args.extend(["--namespace", NAMESPACE, "--kubeconfig", &kubeconfig]);
        let out = chart.run(&args, values)?;
        ensure!(out.success, "helm {verb}: {}{}", out.stdout, out.stderr);
        Ok(())
    };
    helm("install", None)?;
    let account = client_from(&controller_service_account_kubeconfig(
        &cluster,
        dir.path(),
    )?)
    .await?;
    let admin = cluster.client();
    let at = location();
    let (ca, source) = store::load_or_make_ca(&account, &at).await?;
    assert_eq!(source, CaSource::Written, "the chart's Secret held no CA");
    assert!(store::publish_ca(&account, &at, &ca, None).await?);
    let before = (
        Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
            .get(CA)
            .await?
            .data,
        Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
            .get(CA)
            .await?
            .data,
    );
    let keys = before
        .0
        .as_ref()
        .map(|d| d.keys().cloned().collect::<Vec<_>>());
    assert_eq!(keys, Some(vec![TLS_CRT.to_string(), TLS_KEY.to_string()]));

    for (step, values) in [
        ("upgrade", Some("identity: {certTTL: 12h}\n")),
        ("upgrade", None),
        ("uninstall", None),
    ] {
        helm(step, values)?;
        let after = (
            Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
                .get(CA)
                .await
                .with_context(|| format!("the Secret after helm {step}"))?
                .data,
            Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
                .get(CA)
                .await
                .with_context(|| format!("the ConfigMap after helm {step}"))?
                .data,
        );
        assert!(after == before, "helm {step} changed the CA's objects");
    }
    assert_eq!(
        secret_cert(&admin).await?.as_deref(),
        Some(ca.cert_pem()),
        "the Secret still holds the CA"
    );
    Ok(())
}

#[tokio::test]
async fn the_users_own_ca_secret_is_adopted_by_the_chart_as_it_is() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    let dir = tempfile::tempdir()?;
    let admin = cluster.client();
    let own = ClusterCa::generate(GENERATED_CA_NAME)?;
    let data = BTreeMap::from([
        (
            TLS_CRT.to_string(),
            ByteString(own.cert_pem().as_bytes().to_vec()),
        ),
        (
            TLS_KEY.to_string(),
            ByteString(own.key_pem().as_bytes().to_vec()),
        ),
    ]);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CA.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "Helm".to_string(),
            )])),
            annotations: Some(BTreeMap::from([
                ("meta.helm.sh/release-name".to_string(), RELEASE.to_string()),
                (
                    "meta.helm.sh/release-namespace".to_string(),
                    NAMESPACE.to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(data.clone()),
        ..Secret::default()
    };
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    secrets.create(&PostParams::default(), &secret).await?;

    let chart = Chart::new()?;
    let kubeconfig = cluster.kubeconfig_path().to_string_lossy().into_owned();
    let chart_dir = chart.dir().to_string_lossy().into_owned();
    let out = chart.run(
        &[
            "install",
            RELEASE,
            &chart_dir,
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            &kubeconfig,
        ],
        None,
    )?;
    ensure!(out.success, "helm install: {}{}", out.stdout, out.stderr);
    let adopted = secrets.get(CA).await?;
    assert_eq!(adopted.type_.as_deref(), Some("kubernetes.io/tls"));
    assert!(
        adopted.data == Some(data),
        "helm install changed the user's CA"
    );
    assert_eq!(
        adopted
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helm.sh/resource-policy"))
            .map(String::as_str),
        Some("keep"),
        "the chart took the Secret over"
    );

    let account = client_from(&controller_service_account_kubeconfig(
        &cluster,
        dir.path(),
    )?)
    .await?;
    let (ca, source) = store::load_or_make_ca(&account, &location()).await?;
    assert_eq!(source, CaSource::Found);
    assert_eq!(ca.cert_pem(), own.cert_pem(), "the user's CA is used");
    Ok(())
}
