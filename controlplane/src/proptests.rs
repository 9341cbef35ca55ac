//! Property tests of the control plane's validators of what nodes,
//! operators and the API server send: node names, certificate requests,
//! certificate lifetimes, the ServiceAccount flag, reviewed token users,
//! the direct mode's node list. Each takes arbitrary input and valid
//! samples with a few edits without panicking, and what it accepts keeps
//! the rule it states. (`config.json` pushes are tested in
//! `kube::config_push`.)

use std::collections::BTreeMap;
use std::sync::LazyLock;

use carina_csi::TOPOLOGY_KEY;
use carina_sys::testkit::{mutated_bytes, mutated_text, noisy_text};
use k8s_openapi::api::authentication::v1::UserInfo;
use proptest::prelude::*;

use crate::identity::review::{self, POD_NAME_EXTRA, POD_UID_EXTRA, ServiceAccountRef};
use crate::identity::{MIN_CERT_TTL, csr, parse_ttl, server};
use crate::nodes::spec::{NodeList, NodeSpec};

const NODE: &str = "node-a";

/// A CSR for `NODE`, as a node sends it, and its DER.
static CSR_PEM: LazyLock<String> = LazyLock::new(|| {
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::DnsName(
        NODE.to_string().try_into().expect("ia5"),
    )];
    let key = rcgen::KeyPair::generate().expect("key");
    params
        .serialize_request(&key)
        .expect("CSR")
        .pem()
        .expect("PEM")
});
static CSR_DER: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let (_, block) = x509_parser::pem::parse_x509_pem(CSR_PEM.as_bytes()).expect("PEM");
    block.contents
});

const NODES_YAML: &str = "nodes:
  - name: node-a
    endpoint: 10.0.0.11:7443
  - name: node-b.example
    endpoint: https://node-b.example:7443/
    topology:
      topology.kubernetes.io/zone: z1
";

/// `der` as a PEM block labelled `CERTIFICATE REQUEST`.
fn pem(der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                b64.push('=');
            }
        }
    }
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|l| std::str::from_utf8(l).expect("ASCII"))
        .collect();
    format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        lines.join("\n")
    )
}

/// A DNS subdomain as [`server::check_node_name`] states it.
fn dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn node_names() -> impl Strategy<Value = String> {
    prop_oneof![
        noisy_text(),
        mutated_text("node-b.example.com"),
        "[a-z0-9.-]{0,12}",
        "[a-z]{60,66}(\\.[a-z]{1,3})?",
        // Past 253 characters in labels that are each fine.
        "([a-z]{62}\\.){4}[a-z]{1,3}",
    ]
}

proptest! {
    /// A node name is accepted exactly when it is a DNS subdomain, by the
    /// issuer and by the direct mode's node list alike.
    #[test]
    fn node_names_are_dns_subdomains(name in node_names()) {
        let issuer = server::check_node_name(&name).is_ok();
        prop_assert_eq!(issuer, dns_subdomain(&name), "{:?}", name);
        let listed = NodeList::new(vec![NodeSpec {
            name: name.clone(),
            endpoint: "10.0.0.1:7443".into(),
            topology: Default::default(),
        }]);
        prop_assert_eq!(listed.is_ok(), issuer, "{:?}: {:?}", name, listed);
    }

    /// A node list of any text is refused or valid: names unique, each a
    /// DNS subdomain with an endpoint that has a port, its topology naming
    /// the node.
    #[test]
    fn node_lists_take_anything(text in prop_oneof![noisy_text(), mutated_text(NODES_YAML)]) {
        if let Ok(list) = NodeList::from_yaml(&text) {
            prop_assert!(!list.nodes.is_empty());
            let mut names: Vec<&str> = list.nodes.iter().map(|n| n.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            prop_assert_eq!(names.len(), list.nodes.len());
            for n in &list.nodes {
                prop_assert!(dns_subdomain(&n.name), "{:?}", n.name);
                prop_assert_eq!(n.topology.get(TOPOLOGY_KEY), Some(&n.name));
                let port = n.endpoint.trim_end_matches('/').rsplit_once(':').map(|(_, p)| p);
                prop_assert!(port.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0)), "{:?}", n.endpoint);
            }
        }
    }

    /// A damaged CSR (its PEM text or its DER) is refused, never a
    /// panic; one that is still accepted for the node is refused for
    /// another node.
    #[test]
    fn csrs_take_damaged_requests(
        pem_text in prop_oneof![
            noisy_text(),
            mutated_text(&CSR_PEM),
            mutated_bytes(&CSR_DER).prop_map(|der| pem(&der)),
        ],
    ) {
        if csr::check_csr(&pem_text, NODE).is_ok() {
            prop_assert!(csr::check_csr(&pem_text, "node-b").is_err());
        }
    }

    /// A certificate lifetime of any text is refused or at least the
    /// shortest one, and its seconds read back as the same lifetime.
    #[test]
    fn ttls_take_anything(text in prop_oneof![noisy_text(), "[0-9]{0,22}[smhdx]?", " ?[0-9]{1,3}[smhd] ?"]) {
        if let Ok(ttl) = parse_ttl(&text) {
            prop_assert!(ttl >= MIN_CERT_TTL);
            prop_assert_eq!(parse_ttl(&format!("{}s", ttl.as_secs())), Ok(ttl));
        }
    }

    /// `<namespace>:<name>` of any text: what is taken prints back as the
    /// text, and the user name of its tokens holds both parts.
    #[test]
    fn service_account_flags_take_anything(text in prop_oneof![noisy_text(), "[a-z:-]{0,12}"]) {
        if let Ok(sa) = ServiceAccountRef::parse(&text) {
            prop_assert!(!sa.namespace.is_empty() && !sa.name.is_empty() && !sa.name.contains(':'));
            prop_assert_eq!(sa.to_string(), text.clone());
            prop_assert_eq!(ServiceAccountRef::parse(&sa.to_string()), Ok(sa.clone()));
            prop_assert_eq!(sa.username(), format!("system:serviceaccount:{text}"));
        }
    }

    /// A reviewed user of any name and extras is bound to a pod only when
    /// it is the expected ServiceAccount and names exactly one pod and uid.
    #[test]
    fn reviewed_users_take_anything(
        username in prop_oneof![noisy_text(), Just("system:serviceaccount:carina:carina-node".to_string())],
        pod_names in prop::collection::vec(prop_oneof![noisy_text(), Just(String::new())], 0..3),
        pod_uids in prop::collection::vec(prop_oneof![noisy_text(), Just(String::new())], 0..3),
        with_extras in any::<bool>(),
    ) {
        let expected = ServiceAccountRef { namespace: "carina".into(), name: "carina-node".into() };
        let extra = with_extras.then(|| {
            BTreeMap::from([
                (POD_NAME_EXTRA.to_string(), pod_names.clone()),
                (POD_UID_EXTRA.to_string(), pod_uids.clone()),
            ])
        });
        let user = UserInfo { username: Some(username.clone()), extra, ..Default::default() };
        if let Ok(pod) = review::bound_pod(&user, &expected) {
            prop_assert_eq!(username, expected.username());
            prop_assert!(with_extras);
            prop_assert_eq!(&pod_names, &vec![pod.name.clone()]);
            prop_assert_eq!(&pod_uids, &vec![pod.uid.clone()]);
            prop_assert!(!pod.name.is_empty() && !pod.uid.is_empty());
            prop_assert_eq!(pod.namespace, expected.namespace);
        }
    }
}

#[test]
fn the_sample_csr_is_accepted_for_its_node_only() {
    assert!(csr::check_csr(&CSR_PEM, NODE).is_ok());
    assert!(
        csr::check_csr(&pem(&CSR_DER), NODE).is_ok(),
        "pem() re-encodes"
    );
    assert!(csr::check_csr(&CSR_PEM, "node-b").is_err());
}
