//! The text of a node's configuration files: the CNI network list and the
//! KubeletConfiguration.

use std::net::Ipv4Addr;
use std::path::Path;

/// The CNI configuration: a bridge that is the pods' gateway, addresses
/// from `cidr` recorded under `ipam_dir`, no masquerading (the
/// host's firewall is not touched beyond kube-proxy's rules).
pub(super) fn cni_config(bridge: &str, cidr: &str, ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "carina-test",
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam_dir,
                "ranges": [[{"subnet": cidr}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    })
    .to_string()
}

/// The kubelet's settings that vary per cluster.
pub(super) struct KubeletConfig<'a> {
    pub(super) cgroup_root: &'a str,
    pub(super) runtime_socket: &'a Path,
    pub(super) pod_logs: &'a Path,
    pub(super) client_ca: &'a Path,
    pub(super) serving_cert: &'a Path,
    pub(super) serving_key: &'a Path,
    pub(super) address: Ipv4Addr,
    pub(super) port: u16,
    pub(super) healthz_port: u16,
}

/// The KubeletConfiguration (JSON is YAML).
pub(super) fn kubelet_config(c: &KubeletConfig<'_>) -> String {
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // Hosts with the cgroup v1 hierarchy are refused by default since
        // 1.35; this one has it.
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{}", c.cgroup_root),
        "cgroupsPerQOS": true,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": format!("unix://{}", c.runtime_socket.display()),
        "podLogsDir": c.pod_logs,
        "staticPodPath": "",
        "failSwapOn": false,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": false},
            "x509": {"clientCAFile": c.client_ca},
        },
        // Only the apiserver (with the cluster CA's client certificate)
        // reaches it.
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": c.serving_cert,
        "tlsPrivateKeyFile": c.serving_key,
        "address": c.address.to_string(),
        "port": c.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": c.healthz_port,
        "clusterDomain": "cluster.local",
        "resolvConf": "/etc/resolv.conf",
        // A test machine's disk and memory are whatever they are; evict
        // only at the very end.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": false,
        // No CAP_SYS_RESOURCE: the kubelet cannot lower its own score.
        "oomScoreAdj": 0,
        // Volume stats for kubelet_volume_stats_* sooner than every minute.
        "volumeStatsAggPeriod": "10s",
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::POD_CIDR;

    #[test]
    fn cni_config_names_the_bridge_and_range() {
        let v: serde_json::Value =
            serde_json::from_str(&cni_config("cbr1", POD_CIDR, Path::new("/x"))).expect("json");
        assert_eq!(v["plugins"][0]["bridge"], "cbr1");
        assert_eq!(v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], POD_CIDR);
    }
}
