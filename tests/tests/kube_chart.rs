//! The Helm chart `deploy/helm/carina`: `helm lint` passes, `helm
//! template` renders what each of three value sets asks for, every
//! rendered object passes a server-side dry run against a real
//! kube-apiserver, bad values are refused, and the plain manifests in
//! `deploy/` are what the chart renders (`hack/render-manifests.sh
//! --check`).
//!
//! Needs helm, etcd, kube-apiserver, csi-provisioner and csi-snapshotter
//! from `tests/tools/build.sh helm etcd kube csi-provisioner csi-snapshotter`.

use std::process::Command;

use anyhow::{Context, Result, bail};
use carina_tests::chart::{
    DEFAULTS, KUBELET_DIR_NAMESPACE, MANUAL_SCHEDULER_CLASSES, RBAC_SET, SETS, args, container,
    field_env, has, mount, render, snapshot_rules, volume,
};
use carina_tests::kube::KubeCluster;
use carina_tests::local::carina::tool_path;
use carina_tests::manifests::{Chart, dry_run, find, objects, repo_root};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::Value;

/// The workspace version (`[workspace.package] version` of Cargo.toml),
/// the tag `make images` gives the images.
fn workspace_version() -> Result<String> {
    let cargo = std::fs::read_to_string(repo_root().join("Cargo.toml"))?;
    let mut in_package = false;
    for line in cargo.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "version"
        {
            return Ok(value.trim().trim_matches('"').to_string());
        }
    }
    bail!("Cargo.toml has no [workspace.package] version")
}

#[test]
fn helm_lint_passes_for_every_value_set() -> Result<()> {
    let chart = Chart::new()?;
    for set in SETS {
        let report = chart
            .lint(set.namespace, set.values)
            .with_context(|| set.name)?;
        assert!(
            report.contains("0 chart(s) failed"),
            "{}: {report}",
            set.name
        );
    }
    Ok(())
}

#[test]
fn default_values_issue_identities_and_register_with_kubelet() -> Result<()> {
    let chart = Chart::new()?;
    let objs = render(&chart, &DEFAULTS)?;
    let version = workspace_version()?;

    // Every namespaced object is in the release namespace.
    for o in &objs {
        let kind = o["kind"].as_str().unwrap_or_default();
        let cluster_scoped = matches!(
            kind,
            "CustomResourceDefinition"
                | "CSIDriver"
                | "StorageClass"
                | "ClusterRole"
                | "ClusterRoleBinding"
        );
        if !cluster_scoped {
            assert_eq!(
                o["metadata"]["namespace"], "kube-system",
                "{kind} {}",
                o["metadata"]["name"]
            );
        }
    }

    // CRDs survive an uninstall.
    for crd in [
        "logicvolumes.carina.storage.io",
        "nodestorageresources.carina.storage.io",
    ] {
        let crd = find(&objs, "CustomResourceDefinition", crd)?;
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
    }
    find(&objs, "CSIDriver", "carina.storage.io")?;

    let controller = find(&objs, "Deployment", "carina-controller")?;
    assert_eq!(controller["spec"]["replicas"], 2);
    let c = container(controller, "carina-controller")?;
    assert_eq!(
        c["image"],
        format!("ghcr.io/carina-rs/carina-controller:{version}")
    );
    let a = args(c);
    for want in [
        "--mode=kube",
        "--leader-election-namespace=kube-system",
        "--identity-listen=0.0.0.0:7444",
        "--identity-ca-secret=carina-ca",
        "--identity-ca-configmap=carina-ca",
        "--identity-audience=carina.storage.io/node-identity",
        "--identity-node-service-account=kube-system:carina-node",
        "--identity-cert-ttl=24h",
    ] {
        assert!(has(&a, want), "controller args {a:?} lack {want}");
    }
    assert!(!a.iter().any(|a| a.starts_with("--tls-")), "{a:?}");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    for sidecar in ["csi-provisioner", "csi-resizer", "csi-snapshotter"] {
        let s = container(controller, sidecar)?;
        assert!(has(&args(s), "--leader-election"), "{sidecar}");
    }
    let service = find(&objs, "Service", "carina-controller")?;
    assert_eq!(service["spec"]["ports"][0]["port"], 7444);
    assert_eq!(service["spec"]["ports"][0]["name"], "identity");
    find(&objs, "PodDisruptionBudget", "carina-controller")?;
    let role = find(&objs, "Role", "carina-controller-identity")?;
    assert_eq!(role["rules"][0]["resources"][0], "secrets");
    let cluster_role = find(&objs, "ClusterRole", "carina-controller")?;
    assert!(
        cluster_role["rules"]
            .as_array()
            .context("rules")?
            .iter()
            .any(|r| r["resources"][0] == "tokenreviews" && r["verbs"][0] == "create"),
        "the controller may not create TokenReviews"
    );

    let node = find(&objs, "DaemonSet", "carina-node")?;
    let spec = &node["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(spec["serviceAccountName"], "carina-node");
    assert_eq!(spec["automountServiceAccountToken"], false);
    let containers = spec["containers"].as_array().context("containers")?;
    assert_eq!(containers.len(), 1, "no registrar sidecar: {containers:?}");
    let n = &containers[0];
    assert_eq!(
        n["image"],
        format!("ghcr.io/carina-rs/carina-node:{version}")
    );
    assert_eq!(n["securityContext"]["privileged"], true);
    let a = args(n);
    for want in [
        "--listen=0.0.0.0:7443",
        "--csi-endpoint=unix:///var/lib/kubelet/plugins/carina.storage.io/csi.sock",
        "--plugin-registration-dir=/var/lib/kubelet/plugins_registry",
        "--identity-issuer=https://carina-controller.kube-system.svc:7444",
        "--identity-token-file=/var/run/secrets/carina.storage.io/token",
        "--tls-ca=/etc/carina/ca/ca.crt",
    ] {
        assert!(has(&a, want), "node args {a:?} lack {want}");
    }
    assert!(!a.iter().any(|a| a.starts_with("--tls-cert")), "{a:?}");
    assert_eq!(
        mount(n, "/var/lib/kubelet")?["mountPropagation"],
        "Bidirectional"
    );
    for path in [
        "/dev",
        "/etc/lvm/backup",
        "/etc/lvm/archive",
        "/run/lock/lvm",
    ] {
        mount(n, path)?;
    }
    let token = &volume(node, "identity-token")?["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(token["audience"], "carina.storage.io/node-identity");
    assert_eq!(volume(node, "ca")?["configMap"]["name"], "carina-ca");

    // The node's ServiceAccount is bound to nothing.
    for o in &objs {
        if matches!(
            o["kind"].as_str(),
            Some("RoleBinding" | "ClusterRoleBinding")
        ) {
            for s in o["subjects"].as_array().into_iter().flatten() {
                assert_ne!(
                    s["name"], "carina-node",
                    "{} binds carina-node",
                    o["metadata"]["name"]
                );
            }
        }
    }

    // config.json is Carina's, and the default StorageClasses use it.
    let config = find(&objs, "ConfigMap", "carina-csi-config")?;
    let json: Value = serde_json::from_str(
        config["data"]["config.json"]
            .as_str()
            .context("config.json")?,
    )?;
    assert_eq!(json["diskSelector"][0]["name"], "carina-vg-ssd");
    assert_eq!(json["schedulerStrategy"], "spreadout");
    // A fresh install takes no disk: no default group names one.
    for (i, group) in json["diskSelector"]
        .as_array()
        .context("diskSelector")?
        .iter()
        .enumerate()
    {
        assert_eq!(group["re"], serde_json::json!([]), "diskSelector[{i}]");
    }
    // The node pods tolerate no taint unless told to.
    let node = find(&objs, "DaemonSet", "carina-node")?;
    assert!(
        node["spec"]["template"]["spec"]["tolerations"].is_null(),
        "{}",
        node["spec"]["template"]["spec"]["tolerations"]
    );
    let lvm = find(&objs, "StorageClass", "csi-carina-lvm")?;
    assert_eq!(lvm["provisioner"], "carina.storage.io");
    assert_eq!(
        lvm["parameters"]["carina.storage.io/disk-group-name"],
        "carina-vg-ssd"
    );
    assert_eq!(lvm["volumeBindingMode"], "WaitForFirstConsumer");

    let policy = find(&objs, "NetworkPolicy", "carina-node")?;
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 7443);
    assert!(
        !objs
            .iter()
            .any(|o| o["metadata"]["name"] == "carina-scheduler"),
        "the scheduler is off by default"
    );
    Ok(())
}

/// Every Carina container names its trace resource by the semantic
/// conventions' `k8s.*` attributes, each from the downward API, and a
/// user's `OTEL_RESOURCE_ATTRIBUTES` comes after it (the last one wins).
#[test]
fn carina_containers_name_their_trace_resource() -> Result<()> {
    let chart = Chart::new()?;
    let values = r#"
scheduler: {enabled: true}
node: {env: [{name: OTEL_RESOURCE_ATTRIBUTES, value: "deployment.environment.name=lab"}]}
"#;
    let objs = objects(&chart.template("kube-system", Some(values))?)?;
    let workload = |kind: &str, name: &str| {
        objs.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .with_context(|| format!("{kind} {name}"))
    };
    for (kind, name, container_name) in [
        ("DaemonSet", "carina-node", "carina-node"),
        ("Deployment", "carina-controller", "carina-controller"),
        ("Deployment", "carina-scheduler", "extender"),
    ] {
        let c = container(workload(kind, name)?, container_name)?;
        let env = c["env"].as_array().context("env")?;
        let field = |var: &str| {
            env.iter()
                .find(|e| e["name"] == var)
                .map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].clone())
        };
        assert_eq!(
            field("K8S_POD_NAME"),
            Some("metadata.name".into()),
            "{name}"
        );
        assert_eq!(
            field("K8S_NAMESPACE_NAME"),
            Some("metadata.namespace".into())
        );
        assert_eq!(field("K8S_NODE_NAME"), Some("spec.nodeName".into()));
        let resource: Vec<&Value> = env
            .iter()
            .filter(|e| e["name"] == "OTEL_RESOURCE_ATTRIBUTES")
            .map(|e| &e["value"])
            .collect();
        assert_eq!(
            resource.first().and_then(|v| v.as_str()),
            Some(
                "k8s.pod.name=$(K8S_POD_NAME),k8s.namespace.name=$(K8S_NAMESPACE_NAME),k8s.node.name=$(K8S_NODE_NAME)"
            ),
            "{name}"
        );
        if name == "carina-node" {
            assert_eq!(
                resource.last().and_then(|v| v.as_str()),
                Some("deployment.environment.name=lab"),
                "the user's value comes last"
            );
        }
    }
    Ok(())
}

#[test]
fn manual_identity_mounts_the_secrets_and_serves_no_issuer() -> Result<()> {
    let chart = Chart::new()?;
    let objs = render(&chart, &MANUAL_SCHEDULER_CLASSES)?;

    let controller = find(&objs, "Deployment", "carina-controller")?;
    let c = container(controller, "carina-controller")?;
    let a = args(c);
    for want in [
        "--tls-ca=/etc/carina/tls/ca.crt",
        "--tls-cert=/etc/carina/tls/tls.crt",
        "--tls-key=/etc/carina/tls/tls.key",
        "--strategy=binpack",
    ] {
        assert!(has(&a, want), "controller args {a:?} lack {want}");
    }
    assert!(!a.iter().any(|a| a.starts_with("--identity-")), "{a:?}");
    assert_eq!(
        volume(controller, "tls")?["secret"]["secretName"],
        "site-controller-tls"
    );
    assert!(find(&objs, "Service", "carina-controller").is_err());
    assert!(find(&objs, "Role", "carina-controller-identity").is_err());
    let controller_policy = find(&objs, "NetworkPolicy", "carina-controller")?;
    // No issuer: only /metrics is reachable.
    assert_eq!(
        controller_policy["spec"]["ingress"],
        serde_json::json!([{"ports": [{"port": 9766, "protocol": "TCP"}]}])
    );

    let node = find(&objs, "DaemonSet", "carina-node")?;
    let n = container(node, "carina-node")?;
    let a = args(n);
    assert!(has(&a, "--tls-cert=/etc/carina/tls/tls.crt"), "{a:?}");
    assert!(!a.iter().any(|a| a.starts_with("--identity-")), "{a:?}");
    assert_eq!(
        volume(node, "tls")?["secret"]["secretName"],
        "site-node-tls"
    );
    assert!(volume(node, "identity-token").is_err());
    // The HOST group's directory is mounted at its own path.
    mount(n, "/srv/carina")?;

    let config = find(&objs, "ConfigMap", "carina-csi-config")?;
    let json: Value = serde_json::from_str(
        config["data"]["config.json"]
            .as_str()
            .context("config.json")?,
    )?;
    assert_eq!(json["diskSelector"][2]["policy"], "HOST");
    assert_eq!(json["diskScanInterval"], 60);

    let fast = find(&objs, "StorageClass", "fast-ext4")?;
    assert_eq!(fast["reclaimPolicy"], "Retain");
    assert_eq!(fast["volumeBindingMode"], "Immediate");
    assert_eq!(fast["mountOptions"][0], "noatime");
    assert_eq!(
        fast["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"],
        "true"
    );
    let whole = find(&objs, "StorageClass", "whole-disk")?;
    assert_eq!(
        whole["parameters"]["carina.storage.io/exclusively-raw-disk"],
        "true"
    );
    assert_eq!(whole["allowVolumeExpansion"], false);
    assert!(find(&objs, "StorageClass", "csi-carina-lvm").is_err());

    let scheduler = find(&objs, "Deployment", "carina-scheduler")?;
    let extender = container(scheduler, "extender")?;
    assert!(has(&args(extender), "--strategy=binpack"));
    let config = find(&objs, "ConfigMap", "carina-scheduler-config")?;
    let inner: Value = serde_yaml::from_str(
        config["data"]["scheduler-config.yaml"]
            .as_str()
            .context("scheduler-config.yaml")?,
    )?;
    assert_eq!(inner["profiles"][0]["schedulerName"], "carina-local");
    assert_eq!(inner["leaderElection"]["resourceName"], "carina-local");
    Ok(())
}

#[test]
fn another_kubelet_dir_and_namespace_reach_every_path_and_name() -> Result<()> {
    let chart = Chart::new()?;
    let objs = render(&chart, &KUBELET_DIR_NAMESPACE)?;

    let node = find(&objs, "DaemonSet", "carina-node")?;
    let n = container(node, "carina-node")?;
    assert_eq!(n["image"], "registry.example.com/storage/carina-node:1.2.3");
    assert_eq!(n["imagePullPolicy"], "Always");
    let a = args(n);
    for want in [
        "--listen=0.0.0.0:17443",
        "--csi-endpoint=unix:///var/lib/k0s/kubelet/plugins/carina.storage.io/csi.sock",
        "--plugin-registration-dir=/var/lib/k0s/kubelet/plugins_registry",
        "--identity-issuer=https://carina-controller.carina-storage.svc:17444",
    ] {
        assert!(has(&a, want), "node args {a:?} lack {want}");
    }
    let kubelet = mount(n, "/var/lib/k0s/kubelet")?;
    assert_eq!(kubelet["mountPropagation"], "Bidirectional");
    assert_eq!(
        volume(node, "kubelet-dir")?["hostPath"]["path"],
        "/var/lib/k0s/kubelet"
    );
    mount(n, "/mnt/carina-dirs")?;
    assert_eq!(
        node["spec"]["template"]["spec"]["nodeSelector"]["example.com/storage"],
        "yes"
    );

    let controller = find(&objs, "Deployment", "carina-controller")?;
    assert_eq!(controller["metadata"]["namespace"], "carina-storage");
    assert_eq!(controller["spec"]["replicas"], 3);
    let c = container(controller, "carina-controller")?;
    assert_eq!(
        c["image"],
        "registry.example.com/storage/carina-controller:1.2.3"
    );
    let a = args(c);
    for want in [
        "--leader-election-namespace=carina-storage",
        "--identity-node-service-account=carina-storage:carina-node",
        "--identity-listen=0.0.0.0:17444",
        "--identity-cert-ttl=12h",
        "--node-port=17443",
        "--lease-duration-secs=30",
    ] {
        assert!(has(&a, want), "controller args {a:?} lack {want}");
    }
    for sidecar in ["csi-provisioner", "csi-resizer", "csi-snapshotter"] {
        let s = container(controller, sidecar)?;
        assert!(
            has(&args(s), "--leader-election-namespace=carina-storage"),
            "{sidecar}"
        );
    }
    let binding = find(&objs, "ClusterRoleBinding", "carina-controller")?;
    assert_eq!(binding["subjects"][0]["namespace"], "carina-storage");
    let policy = find(&objs, "NetworkPolicy", "carina-controller")?;
    assert_eq!(
        policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"],
        "10.20.0.0/16"
    );
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 17444);
    let node_policy = find(&objs, "NetworkPolicy", "carina-node")?;
    assert_eq!(
        node_policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "carina-storage"
    );
    Ok(())
}

#[test]
fn capacity_tracking_is_on_by_default_and_can_be_turned_off() -> Result<()> {
    let chart = Chart::new()?;
    let objs = render(&chart, &DEFAULTS)?;
    let driver = find(&objs, "CSIDriver", "carina.storage.io")?;
    assert_eq!(driver["spec"]["storageCapacity"], true);
    let controller = find(&objs, "Deployment", "carina-controller")?;
    let provisioner = container(controller, "csi-provisioner")?;
    let a = args(provisioner);
    for want in [
        "--enable-capacity",
        "--capacity-ownerref-level=2",
        "--capacity-poll-interval=1m",
    ] {
        assert!(has(&a, want), "csi-provisioner args {a:?} lack {want}");
    }
    // Where the objects go and who owns them: the pod's namespace and name.
    assert_eq!(
        field_env(provisioner, "NAMESPACE"),
        Some("metadata.namespace")
    );
    assert_eq!(field_env(provisioner, "POD_NAME"), Some("metadata.name"));
    let role = find(&objs, "Role", "carina-controller-capacity")?;
    assert_eq!(role["rules"][0]["resources"][0], "csistoragecapacities");
    let binding = find(&objs, "RoleBinding", "carina-controller-capacity")?;
    assert_eq!(binding["subjects"][0]["name"], "carina-controller");

    let off = chart.template(
        "kube-system",
        Some("controller: {provisioner: {capacity: {enabled: false}}}\n"),
    )?;
    let objs = objects(&off)?;
    let driver = find(&objs, "CSIDriver", "carina.storage.io")?;
    assert_eq!(driver["spec"]["storageCapacity"], false);
    let controller = find(&objs, "Deployment", "carina-controller")?;
    let provisioner = container(controller, "csi-provisioner")?;
    let a = args(provisioner);
    assert!(
        !a.iter()
            .any(|a| a.starts_with("--enable-capacity") || a.starts_with("--capacity-")),
        "{a:?}"
    );
    assert_eq!(field_env(provisioner, "POD_NAME"), None);
    assert!(find(&objs, "Role", "carina-controller-capacity").is_err());
    Ok(())
}

/// external-snapshotter's sidecar runs beside the controller by default,
/// on its CSI socket, with the rights upstream's RBAC gives it (none for
/// volume group snapshots, which it runs without); turned off, neither the
/// container nor the rules are rendered.
#[test]
fn the_snapshotter_sidecar_is_on_by_default_and_can_be_turned_off() -> Result<()> {
    let chart = Chart::new()?;
    let objs = render(&chart, &DEFAULTS)?;
    let controller = find(&objs, "Deployment", "carina-controller")?;
    let s = container(controller, "csi-snapshotter")?;
    assert_eq!(
        s["image"],
        "registry.k8s.io/sig-storage/csi-snapshotter:v8.7.0"
    );
    let a = args(s);
    for want in [
        "--csi-address=/csi/csi-controller.sock",
        "--leader-election",
        "--leader-election-namespace=kube-system",
        "--timeout=120s",
        "--feature-gates=CSIVolumeGroupSnapshot=false",
    ] {
        assert!(has(&a, want), "csi-snapshotter args {a:?} lack {want}");
    }
    mount(s, "/csi")?;
    assert_eq!(s["securityContext"]["readOnlyRootFilesystem"], true);
    let rules = snapshot_rules(&objs)?;
    let verbs = |resource: &str| -> Vec<String> {
        let mut v: Vec<String> = rules
            .iter()
            .filter(|(r, _)| r == resource)
            .flat_map(|(_, v)| v.clone())
            .collect();
        v.sort();
        v
    };
    assert_eq!(verbs("volumesnapshotclasses"), ["get", "list", "watch"]);
    assert_eq!(
        verbs("volumesnapshotcontents"),
        ["get", "list", "patch", "update", "watch"]
    );
    assert_eq!(verbs("volumesnapshotcontents/status"), ["patch", "update"]);
    // external-provisioner restores from a VolumeSnapshot.
    assert_eq!(verbs("volumesnapshots"), ["get", "list", "update", "watch"]);
    assert!(
        !rules
            .iter()
            .any(|(r, _)| r.starts_with("volumegroupsnapshot")),
        "{rules:?}"
    );

    let off = objects(&chart.template(
        "kube-system",
        Some("controller: {snapshotter: {enabled: false}}\n"),
    )?)?;
    let controller = find(&off, "Deployment", "carina-controller")?;
    assert!(container(controller, "csi-snapshotter").is_err());
    assert_eq!(snapshot_rules(&off)?, []);
    Ok(())
}

#[test]
fn bad_values_are_refused_by_name() -> Result<()> {
    let chart = Chart::new()?;
    for (values, field) in [
        ("identity: {mode: automatic}\n", "mode"),
        ("kubeletDir: var/lib/kubelet\n", "kubeletDir"),
        (
            "config: {diskSelector: [{name: a, re: [x], policy: ZFS}]}\n",
            "policy",
        ),
        (
            "config: {schedulerStrategy: random, diskSelector: []}\n",
            "schedulerStrategy",
        ),
        (
            "storageClasses: [{name: x, reclaimPolicy: Recycle}]\n",
            "reclaimPolicy",
        ),
        (
            "controller: {provisioner: {capacity: {enabled: true, pollInterval: often}}}\n",
            "pollInterval",
        ),
        (
            "controller: {snapshotter: {enabled: true, timeout: soon}}\n",
            "timeout",
        ),
        (
            "controller: {snapshotter: {enabled: sometimes}}\n",
            "enabled",
        ),
    ] {
        let err = match chart.template("kube-system", Some(values)) {
            Ok(_) => bail!("helm rendered bad values: {values}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            err.contains(field),
            "{values}: the refusal does not name {field}: {err}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn every_rendered_object_passes_a_server_side_dry_run() -> Result<()> {
    let chart = Chart::new()?;
    let cluster = KubeCluster::start().await?;
    let client = cluster.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(KUBELET_DIR_NAMESPACE.namespace.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces.create(&PostParams::default(), &ns).await?;

    for set in SETS {
        let yaml = chart.template(set.namespace, set.values)?;
        let count = objects(&yaml)?.len();
        let report = dry_run(&client, &yaml, set.name).await?;
        report.ok()?;
        assert_eq!(
            report.applied + report.skipped.len(),
            count,
            "{}: not every object was tried",
            set.name
        );
        assert!(
            report.applied >= 15,
            "{}: only {} objects",
            set.name,
            report.applied
        );
    }

    // The dry run catches what the chart's schema lets through: a
    // disruption budget that is neither a count nor a percentage.
    let yaml = chart.template(
        "kube-system",
        Some("controller: {podDisruptionBudget: {maxUnavailable: most}}\n"),
    )?;
    let report = dry_run(&client, &yaml, "bad budget").await?;
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.contains("PodDisruptionBudget/carina-controller")
                && f.contains("spec.maxUnavailable")),
        "the API server accepted a broken PodDisruptionBudget: {:?}",
        report.failures
    );
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    Ok(())
}

#[test]
fn checked_in_manifests_are_a_fresh_render_of_the_chart() -> Result<()> {
    let chart = Chart::new()?;
    let out = Command::new(repo_root().join("hack/render-manifests.sh"))
        .arg("--check")
        .env("HELM", chart.helm())
        .output()?;
    assert!(
        out.status.success(),
        "deploy/ differs from the chart (run `make manifests`):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Every container that runs one of our programs, external-provisioner or
/// external-snapshotter's sidecar, passes arguments that program takes: each rendering's argument list, run through the built
/// binary with `--version` added, gets past its argument parser (an
/// unknown flag or a value that does not parse is refused before the
/// version is printed).
#[test]
fn every_rendered_argument_list_is_accepted_by_its_program() -> Result<()> {
    let chart = Chart::new()?;
    let mut checked = 0;
    for set in SETS {
        for object in render(&chart, set)? {
            let containers = object["spec"]["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for c in containers {
                let image = c["image"].as_str().unwrap_or_default();
                let Some(program) = [
                    "carina-node",
                    "carina-controller",
                    "carina-scheduler",
                    "csi-provisioner",
                    "csi-snapshotter",
                ]
                .into_iter()
                .find(|p| image.contains(&format!("/{p}:"))) else {
                    continue;
                };
                let binary = match program {
                    // The sidecar's flags (capacity tracking and the rest)
                    // through the upstream program itself.
                    "csi-provisioner" | "csi-snapshotter" => tool_path(program)?.join(program),
                    _ => carina_tests::process::workspace_binary(program)?,
                };
                let mut argv = args(&c);
                argv.push("--version".into());
                let out = Command::new(&binary)
                    .args(&argv)
                    .output()
                    .with_context(|| format!("run {}", binary.display()))?;
                assert!(
                    out.status.success(),
                    "{}: {program} refuses {argv:?}: {}",
                    set.name,
                    String::from_utf8_lossy(&out.stderr)
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 12, "only {checked} containers rendered");
    Ok(())
}

/// Every container of every rendering runs with the least privilege it
/// needs. The controller's and the scheduler's pods (every container, the
/// sidecars too): non-root with a non-zero user, a read-only root file
/// system, no privilege escalation, every capability dropped, the
/// RuntimeDefault seccomp profile, no host namespace. carina-node is the
/// one privileged container, shares only the host's network, and its
/// template says why on the lines above its `privileged: true`.
#[test]
fn every_container_runs_with_the_least_privilege_it_needs() -> Result<()> {
    let chart = Chart::new()?;
    let mut restricted = 0;
    let mut privileged = 0;
    for set in SETS.into_iter().chain([&RBAC_SET]) {
        for o in render(&chart, set)? {
            if !matches!(
                o["kind"].as_str(),
                Some("Deployment" | "DaemonSet" | "StatefulSet" | "Job" | "CronJob")
            ) {
                continue;
            }
            let workload = format!("{}: {} {}", set.name, o["kind"], o["metadata"]["name"]);
            let pod = &o["spec"]["template"]["spec"];
            for host in ["hostPID", "hostIPC"] {
                assert_ne!(pod[host], true, "{workload}: {host}");
            }
            let containers: Vec<&Value> = ["initContainers", "containers"]
                .iter()
                .flat_map(|k| pod[*k].as_array().into_iter().flatten())
                .collect();
            assert!(!containers.is_empty(), "{workload}");
            if o["metadata"]["name"] == "carina-node" {
                assert_eq!(pod["hostNetwork"], true, "{workload}");
                assert_eq!(containers.len(), 1, "{workload}: only carina-node");
                let sc = &containers[0]["securityContext"];
                assert_eq!(sc["privileged"], true, "{workload}");
                assert!(sc["capabilities"]["add"].is_null(), "{workload}: {sc}");
                privileged += 1;
                continue;
            }
            assert_ne!(pod["hostNetwork"], true, "{workload}: hostNetwork");
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{workload}");
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                "{workload}"
            );
            for c in containers {
                let what = format!("{workload} container {}", c["name"]);
                let sc = &c["securityContext"];
                assert_eq!(sc["runAsNonRoot"], true, "{what}");
                assert!(sc["runAsUser"].as_u64().is_some_and(|u| u > 0), "{what}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
                assert_eq!(
                    sc["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{what}"
                );
                assert!(sc["capabilities"]["add"].is_null(), "{what}: {sc}");
                assert_ne!(sc["privileged"], true, "{what}");
                restricted += 1;
            }
        }
    }
    // The controller's four containers in each rendering, the
    // scheduler's two in the two with the scheduler on.
    assert_eq!(restricted, 4 * 4 + 2 * 2);
    assert_eq!(privileged, SETS.len() + 1);

    // Each reason for the node's privileges is written above it.
    let node = std::fs::read_to_string(repo_root().join("deploy/kubernetes/node.yaml"))?;
    let lines: Vec<&str> = node.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim() == "privileged: true")
        .context("the node is not privileged")?;
    let comment: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .skip_while(|l| l.trim() == "securityContext:")
        .take_while(|l| l.trim_start().starts_with('#'))
        .copied()
        .collect();
    let comment = comment.join("\n");
    for reason in ["/dev", "Bidirectional", "cgroup"] {
        assert!(
            comment.contains(reason),
            "the node's privileges lack their reason {reason:?}:\n{comment}"
        );
    }
    Ok(())
}
