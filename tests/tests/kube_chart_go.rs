//! The chart given what a Go Carina v0.14.0 install leaves: a values file
//! written for Go's chart renders with every key read or is refused naming
//! the keys it does not read, and `helm install` against a real
//! kube-apiserver holding Go's objects refuses, naming each, until they are
//! removed or handed to the release, and then takes over the ones it makes
//! (docs/migrate-from-go-carina.md).
//!
//! Needs helm, etcd and kube-apiserver from `tests/tools/build.sh helm etcd
//! kube`.

use anyhow::{Context, Result, bail};
use carina_tests::kube::KubeCluster;
use carina_tests::manifests::{Chart, RELEASE, find, objects};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};

/// A values file shaped as Go Carina v0.14.0's chart reads it: every key
/// of its values.yaml, with values of our own.
const GO_VALUES: &str = r#"
carina-scheduler:
  enabled: true
  image: {repository: example.org/go/carina-scheduler, pullPolicy: IfNotPresent, tag: v0.14.0}
image:
  baseRepo: example.org/go
  carina: {repository: /carina, tag: v0.14.0, pullPolicy: IfNotPresent}
  livenessProbe: {repository: /livenessprobe, tag: v2, pullPolicy: IfNotPresent}
  csiProvisioner: {repository: /csi-provisioner, tag: v2, pullPolicy: IfNotPresent}
  csiResizer: {repository: /csi-resizer, tag: v1, pullPolicy: IfNotPresent}
  nodeDriverRegistrar: {repository: /csi-node-driver-registrar, tag: v2, pullPolicy: IfNotPresent}
  nodeInitImage: {repository: /busybox, tag: "1", pullPolicy: IfNotPresent}
serviceAccount: {create: true, controller: go-controller, node: go-node}
driver: {name: carina.storage.io}
rbac: {create: true, name: go}
controller:
  name: go-controller
  replicas: 3
  metricsPort: 8080
  webhookPort: 8443
  livenessProbe: {healthPort: 29602}
  disableAvailabilitySetNodes: true
  provisionerWorkerThreads: 10
  logLevel: 4
  tolerations: [{key: example.org/storage, operator: Exists, effect: NoSchedule}]
  hostNetwork: false
  podLabels: {team: storage}
  resources:
    csiProvisioner: {requests: {cpu: 10m}}
    csiResizer: {requests: {cpu: 10m}}
    livenessProbe: {requests: {cpu: 10m}}
    carina: {requests: {cpu: 100m}}
node:
  name: go-node
  logLevel: 2
  kubelet: /var/lib/k0s/kubelet
  bcache: false
  initContainer: {modprobe: [dm_snapshot]}
  enablePerfOptimization: false
  tolerations: [{key: example.org/disks, operator: Exists, effect: NoSchedule}]
  hostNetwork: false
  maxUnavailable: 1
  podLabels: {team: storage}
  nodeAffinity: {}
  resources:
    livenessProbe: {requests: {cpu: 10m}}
    nodeDriverRegistrar: {requests: {cpu: 10m}}
    carina: {requests: {cpu: 10m}}
  metricsPort: 8080
  livenessProbe: {healthPort: 29602}
  logDir: /var/log/go-carina/
  configDir: /etc/go-carina/
imagePullSecrets: []
installCRDs: true
serviceMonitor: {enable: false}
webhook: {enabled: true}
config:
  schedulerStrategy: binpack
  diskScanInterval: 120
  diskSelector:
    - {name: carina-vg-ssd, re: ["^/dev/vdb$"], policy: LVM, nodeLabel: kubernetes.io/hostname}
    - {name: carina-raw-ssd, re: ["^/dev/vdc$"], policy: RAW, nodeLabel: kubernetes.io/hostname}
storage:
  create: true
  StorageClass:
    - {fstype: xfs, disktype: carina-vg-ssd, reclaimPolicy: Delete, volumeBindingMode: WaitForFirstConsumer}
"#;

/// Go's keys the chart does not read, by the path of the object holding
/// them (as the schema's refusal names it): each must be named.
const REFUSED: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "carina-scheduler",
            "serviceAccount",
            "driver",
            "rbac",
            "installCRDs",
            "serviceMonitor",
            "webhook",
            "storage",
        ],
    ),
    (
        "/image",
        &[
            "baseRepo",
            "carina",
            "livenessProbe",
            "csiProvisioner",
            "csiResizer",
            "nodeDriverRegistrar",
            "nodeInitImage",
        ],
    ),
    (
        "/controller",
        &[
            "name",
            "metricsPort",
            "webhookPort",
            "livenessProbe",
            "disableAvailabilitySetNodes",
            "provisionerWorkerThreads",
            "logLevel",
            "hostNetwork",
            "podLabels",
        ],
    ),
    (
        "/controller/resources",
        &["csiProvisioner", "csiResizer", "livenessProbe", "carina"],
    ),
    (
        "/node",
        &[
            "name",
            "logLevel",
            "bcache",
            "initContainer",
            "enablePerfOptimization",
            "hostNetwork",
            "maxUnavailable",
            "podLabels",
            "nodeAffinity",
            "metricsPort",
            "livenessProbe",
            "logDir",
            "configDir",
        ],
    ),
    (
        "/node/resources",
        &["livenessProbe", "nodeDriverRegistrar", "carina"],
    ),
];

#[test]
fn go_values_are_refused_naming_every_key_the_chart_does_not_read() -> Result<()> {
    let chart = Chart::new()?;
    let err = match chart.template("kube-system", Some(GO_VALUES)) {
        Ok(_) => bail!("helm rendered Go Carina's values"),
        Err(e) => format!("{e:#}"),
    };
    for (path, keys) in REFUSED {
        let at = format!("at '{path}': additional properties");
        let line = err
            .lines()
            .find(|l| l.contains(&at))
            .with_context(|| format!("no refusal at '{path}': {err}"))?;
        for key in *keys {
            assert!(
                line.contains(&format!("'{key}'")),
                "the refusal at '{path}' does not name {key}: {line}"
            );
        }
    }
    // Go's list of secret names is refused by the item's shape.
    let err = match chart.template("kube-system", Some("imagePullSecrets: [regcred]\n")) {
        Ok(_) => bail!("helm rendered Go's imagePullSecrets"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("/imagePullSecrets/0"), "{err}");
    Ok(())
}

#[test]
fn go_values_the_chart_reads_render_with_their_meaning() -> Result<()> {
    let chart = Chart::new()?;
    // The keys of GO_VALUES left once the refused ones are taken out.
    let values = r#"
controller:
  replicas: 3
  tolerations: [{key: example.org/storage, operator: Exists, effect: NoSchedule}]
node:
  kubelet: /var/lib/k0s/kubelet/
  tolerations: [{key: example.org/disks, operator: Exists, effect: NoSchedule}]
imagePullSecrets: [{name: regcred}]
config:
  schedulerStrategy: binpack
  diskScanInterval: 120
  diskSelector:
    - {name: carina-vg-ssd, re: ["^/dev/vdb$"], policy: LVM, nodeLabel: kubernetes.io/hostname}
"#;
    let objs = objects(&chart.template("kube-system", Some(values))?)?;

    let controller = find(&objs, "Deployment", "carina-controller")?;
    assert_eq!(controller["spec"]["replicas"], 3);
    let pod = &controller["spec"]["template"]["spec"];
    assert_eq!(pod["tolerations"][0]["key"], "example.org/storage");
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));

    let node = find(&objs, "DaemonSet", "carina-node")?;
    let pod = &node["spec"]["template"]["spec"];
    assert_eq!(pod["tolerations"][0]["key"], "example.org/disks");
    // node.kubelet is the kubelet directory: every host path under it.
    let paths: Vec<&str> = pod["volumes"]
        .as_array()
        .context("node volumes")?
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"/var/lib/k0s/kubelet"),
        "no volume of the kubelet directory: {paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.starts_with("/var/lib/kubelet")),
        "the default kubelet directory is still mounted: {paths:?}"
    );
    let text = serde_json::to_string(node)?;
    assert!(
        text.contains("/var/lib/k0s/kubelet/plugins/carina.storage.io/csi.sock"),
        "{text}"
    );

    // config is Go's config.json, unchanged.
    let cm = find(&objs, "ConfigMap", "carina-csi-config")?;
    let config: Value =
        serde_json::from_str(cm["data"]["config.json"].as_str().context("config.json")?)?;
    assert_eq!(config["schedulerStrategy"], "binpack");
    assert_eq!(config["diskScanInterval"], 120);
    assert_eq!(config["diskSelector"][0]["re"], json!(["^/dev/vdb$"]));

    // Both names of the kubelet directory, naming different ones.
    let err = match chart.template(
        "kube-system",
        Some("kubeletDir: /var/lib/a\nnode: {kubelet: /var/lib/b}\n"),
    ) {
        Ok(_) => bail!("helm rendered two kubelet directories"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("node.kubelet") && err.contains("kubeletDir"),
        "{err}"
    );
    Ok(())
}

/// What a Go Carina v0.14.0 install of the plain manifests into
/// kube-system leaves (names, and the fields that matter, as Go makes
/// them); the CRDs are added apart.
const GO_LEFTOVERS: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: csi-carina-node, namespace: kube-system}
spec:
  selector: {matchLabels: {app: csi-carina-node}}
  template:
    metadata: {labels: {app: csi-carina-node}}
    spec:
      containers:
        - {name: csi-carina-node, image: example.org/go/carina:v0.14.0, command: [carina-node]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: carina-hook}
webhooks:
  - name: pod-hook.carina.storage.io
    clientConfig: {service: {name: carina-controller, namespace: kube-system, path: /pod/mutate, port: 443}}
    failurePolicy: Ignore
    rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
    admissionReviewVersions: [v1]
    sideEffects: NoneOnDryRun
---
apiVersion: v1
kind: Service
metadata: {name: carina-controller, namespace: kube-system, labels: {app: csi-carina-provisioner}}
spec:
  selector: {app: csi-carina-provisioner}
  ports:
    - {name: webhook, port: 443, targetPort: 8443}
    - {name: metrics, port: 8080, targetPort: 8080}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: carina-csi-config, namespace: kube-system}
data:
  config.json: '{"diskSelector": [{"name": "carina-lvm", "re": ["loop2+"], "policy": "LVM"}]}'
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: carina.storage.io}
spec: {attachRequired: false, podInfoOnMount: true}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: csi-carina-raw}
provisioner: carina.storage.io
parameters: {csi.storage.k8s.io/fstype: ext4, carina.storage.io/disk-group-name: carina-raw}
reclaimPolicy: Retain
volumeBindingMode: WaitForFirstConsumer
"#;

/// Resolves an object's API from its apiVersion and kind.
fn api_for(
    client: &kube::Client,
    discovery: &Discovery,
    obj: &DynamicObject,
) -> Result<Api<DynamicObject>> {
    let types = obj.types.clone().context("no apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(&types)?;
    let (resource, caps) = discovery
        .resolve_gvk(&gvk)
        .with_context(|| format!("unknown kind {gvk:?}"))?;
    Ok(match caps.scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            obj.metadata.namespace.as_deref().unwrap_or("default"),
            &resource,
        ),
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    })
}

/// `helm install` of the chart into kube-system against the cluster (no
/// waiting: nothing runs pods); what helm printed, failed or not.
fn helm_install(chart: &Chart, cluster: &KubeCluster) -> Result<(bool, String)> {
    helm(chart, cluster, "install")
}

/// `helm <verb>` (install or upgrade) of the chart into kube-system; what
/// helm printed, failed or not.
fn helm(chart: &Chart, cluster: &KubeCluster, verb: &str) -> Result<(bool, String)> {
    let dir = chart.dir().to_string_lossy().into_owned();
    let kubeconfig = cluster.kubeconfig_path().to_string_lossy().into_owned();
    let out = chart.run(
        &[
            verb,
            RELEASE,
            &dir,
            "--namespace",
            "kube-system",
            "--kubeconfig",
            &kubeconfig,
        ],
        Some("metrics: {serviceMonitor: {enabled: false}, prometheusRule: {enabled: false}}\n"),
    )?;
    Ok((out.success, format!("{}{}", out.stderr, out.stdout)))
}

#[tokio::test]
async fn install_over_go_leftovers_refuses_until_they_are_removed_or_handed_over() -> Result<()> {
    let chart = Chart::new()?;
    let cluster = KubeCluster::start().await?;
    let client = cluster.client();
    // Go's CRDs have our names: the harness's stand in for them.
    cluster.install_crds().await?;
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut leftovers = Vec::new();
    for value in objects(GO_LEFTOVERS)? {
        let obj: DynamicObject = serde_json::from_value(value)?;
        let api = api_for(&client, &discovery, &obj)?;
        let name = obj.metadata.name.clone().context("unnamed")?;
        api.patch(
            &name,
            &PatchParams::apply("go-carina").force(),
            &Patch::Apply(&obj),
        )
        .await
        .with_context(|| format!("create {name}"))?;
        leftovers.push((api, name));
    }

    let (ok, out) = helm_install(&chart, &cluster)?;
    assert!(!ok, "helm installed over Go Carina's objects: {out}");
    for want in [
        "DaemonSet kube-system/csi-carina-node runs Go Carina's carina-node",
        "MutatingWebhookConfiguration carina-hook (webhook pod-hook.carina.storage.io)",
        "Service kube-system/carina-controller selects {\"app\":\"csi-carina-provisioner\"}: delete it",
        "ConfigMap kube-system/carina-csi-config exists and is not this release's",
        "CSIDriver carina.storage.io exists and is not this release's",
        "CustomResourceDefinition logicvolumes.carina.storage.io exists",
        "CustomResourceDefinition nodestorageresources.carina.storage.io exists",
        "StorageClass csi-carina-raw exists and is not this release's",
        "StorageClass csi-carina-raw has ",
        "CSIDriver carina.storage.io has ",
        "docs/migrate-from-go-carina.md",
    ] {
        assert!(out.contains(want), "the refusal lacks {want:?}:\n{out}");
    }

    // Go's programs, webhook, CSIDriver and the colliding StorageClass go;
    // the ConfigMap and CRDs are handed to the release, and so is the
    // Service, which is not enough: a takeover would keep Go's selector.
    let handover = json!({"metadata": {
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {
            "meta.helm.sh/release-name": RELEASE,
            "meta.helm.sh/release-namespace": "kube-system",
        },
    }});
    for (api, name) in &leftovers {
        let kind = api.resource_url().to_string();
        if kind.ends_with("/services") || kind.ends_with("/configmaps") {
            api.patch(name, &PatchParams::default(), &Patch::Merge(&handover))
                .await?;
        } else {
            api.delete(name, &DeleteParams::default()).await?;
        }
    }
    let crds = Api::<DynamicObject>::all_with(
        client.clone(),
        &discovery
            .resolve_gvk(&GroupVersionKind::gvk(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
            ))
            .context("CRD kind")?
            .0,
    );
    for crd in [
        "logicvolumes.carina.storage.io",
        "nodestorageresources.carina.storage.io",
    ] {
        crds.patch(crd, &PatchParams::default(), &Patch::Merge(&handover))
            .await?;
    }

    let (ok, out) = helm_install(&chart, &cluster)?;
    assert!(!ok, "helm took over Go's Service with its selector: {out}");
    let reasons: Vec<&str> = out.lines().filter(|l| l.starts_with("- ")).collect();
    assert_eq!(reasons.len(), 1, "{out}");
    assert!(
        reasons[0].contains("Service kube-system/carina-controller selects"),
        "{out}"
    );

    // The guide's last step: Go's Service goes too.
    let services = &leftovers
        .iter()
        .find(|(api, _)| api.resource_url().ends_with("/services"))
        .context("the Service")?
        .0;
    services
        .delete("carina-controller", &DeleteParams::default())
        .await?;
    let (ok, out) = helm_install(&chart, &cluster)?;
    assert!(ok, "helm install after the guide's steps failed: {out}");
    // The Service is the chart's now, not Go's; the ConfigMap holds the
    // chart's config.json.
    let svc = services.get("carina-controller").await?;
    let spec = &svc.data["spec"];
    assert_eq!(
        spec["selector"],
        json!({"app.kubernetes.io/name": "carina-controller"}),
        "{spec}"
    );
    let ports: Vec<i64> = spec["ports"]
        .as_array()
        .context("ports")?
        .iter()
        .filter_map(|p| p["port"].as_i64())
        .collect();
    assert_eq!(ports, [7444], "{spec}");

    // Any namespace user can make a Deployment whose container's command
    // is Go's program: it holds up an install, never an upgrade.
    let tenant = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "not-go", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "not-go"}},
            "template": {
                "metadata": {"labels": {"app": "not-go"}},
                "spec": {"containers": [{"name": "x", "image": "example.org/x", "command": ["carina-node"]}]},
            },
        },
    });
    let tenant: DynamicObject = serde_json::from_value(tenant)?;
    api_for(&client, &discovery, &tenant)?
        .patch(
            "not-go",
            &PatchParams::apply("tenant"),
            &Patch::Apply(&tenant),
        )
        .await?;
    let (ok, out) = helm(&chart, &cluster, "upgrade")?;
    assert!(
        ok,
        "a namespace user's Deployment held up helm upgrade: {out}"
    );
    let config_maps = &leftovers
        .iter()
        .find(|(api, _)| api.resource_url().ends_with("/configmaps"))
        .context("the ConfigMap")?
        .0;
    let cm = config_maps.get("carina-csi-config").await?;
    let config = cm.data["data"]["config.json"].as_str().unwrap_or_default();
    assert!(
        config.contains("carina-vg-ssd") && !config.contains("carina-lvm"),
        "{config}"
    );
    Ok(())
}
