//! The value sets the chart tests render the chart with: the defaults,
//! hand-made certificates with the scheduler and StorageClasses of every
//! kind, another kubelet directory and namespace, and the defaults with
//! the scheduler on ([`RBAC_SET`]); and the rendering of one ([`render`]).

use anyhow::{Context, Result};
use serde_json::Value;

use crate::manifests::{Chart, objects};

/// A value set: its name, the release namespace, and the values file.
#[derive(Debug, Clone, Copy)]
pub struct ValueSet {
    pub name: &'static str,
    pub namespace: &'static str,
    pub values: Option<&'static str>,
}

/// The chart's defaults, as `deploy/kubernetes/` is rendered.
pub const DEFAULTS: ValueSet = ValueSet {
    name: "default values",
    namespace: "kube-system",
    values: None,
};

/// Hand-made certificates, the scheduler, a HOST group and StorageClasses
/// of every kind.
pub const MANUAL_SCHEDULER_CLASSES: ValueSet = ValueSet {
    name: "manual identity, scheduler, custom StorageClasses",
    namespace: "kube-system",
    values: Some(
        r#"
identity:
  mode: manual
  manual:
    nodeSecret: site-node-tls
    controllerSecret: site-controller-tls
scheduler:
  enabled: true
  name: carina-local
config:
  diskSelector:
    - {name: fast, re: ["^nvme[0-9]n1$"], policy: LVM}
    - {name: whole, re: ["^sd[b-z]$"], policy: RAW, nodeLabel: example.com/raw}
    - {name: shared, re: ["/srv/carina"], policy: HOST}
  diskScanInterval: 60
  schedulerStrategy: binpack
storageClasses:
  - name: fast-ext4
    annotations: {storageclass.kubernetes.io/is-default-class: "true"}
    parameters:
      carina.storage.io/disk-group-name: fast
      csi.storage.k8s.io/fstype: ext4
    reclaimPolicy: Retain
    volumeBindingMode: Immediate
    mountOptions: [noatime]
  - name: whole-disk
    parameters:
      carina.storage.io/disk-group-name: whole
      carina.storage.io/exclusively-raw-disk: true
    allowVolumeExpansion: false
  - name: shared-dirs
    parameters:
      carina.storage.io/disk-group-name: shared
"#,
    ),
};

/// Another kubelet directory (k0s), another namespace, images from a
/// private registry, a narrowed issuer policy, extra host paths and the
/// Go Carina preset (the pod webhook).
pub const KUBELET_DIR_NAMESPACE: ValueSet = ValueSet {
    name: "other kubelet dir and namespace",
    namespace: "carina-storage",
    values: Some(
        r#"
kubeletDir: /var/lib/k0s/kubelet/
image:
  repository: registry.example.com/storage
  tag: "1.2.3"
  pullPolicy: Always
imagePullSecrets: [{name: registry-login}]
controller:
  replicas: 3
  extraArgs: [--lease-duration-secs=30]
  env: [{name: RUST_LOG, value: debug}]
node:
  port: 17443
  extraHostPaths: [/mnt/carina-dirs]
  nodeSelector: {example.com/storage: "yes"}
identity:
  port: 17444
  certTTL: 12h
networkPolicy:
  identityFrom:
    - ipBlock: {cidr: 10.20.0.0/16}
goCarinaCompat: true
"#,
    ),
};

/// The value sets every rendering test goes through.
pub const SETS: [&ValueSet; 3] = [&DEFAULTS, &MANUAL_SCHEDULER_CLASSES, &KUBELET_DIR_NAMESPACE];

/// The objects the chart renders with `set`.
pub fn render(chart: &Chart, set: &ValueSet) -> Result<Vec<Value>> {
    let yaml = chart
        .template(set.namespace, set.values)
        .with_context(|| set.name)?;
    objects(&yaml).with_context(|| set.name)
}

/// The defaults with the scheduler and the pod webhook on: every
/// ServiceAccount and role the chart can make, with the issuing
/// controller's rights.
pub const RBAC_SET: ValueSet = ValueSet {
    name: "default values, scheduler and pod webhook on",
    namespace: "kube-system",
    values: Some("scheduler:\n  enabled: true\npodWebhook:\n  enabled: true\n"),
};
