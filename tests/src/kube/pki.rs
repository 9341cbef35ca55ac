//! The cluster's certificates and kubeconfigs: a development CA, the
//! apiserver's serving certificate, client certificates (user in CN,
//! groups in O), the service-account key pair, and kubeconfig files that
//! refer to them.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use carina_proto::devcerts::{DevCa, Validity};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The cluster's certificate and key files.
pub(super) struct Pki {
    pub(super) ca: DevCa,
    pub(super) ca_cert: PathBuf,
    pub(super) serving_cert: PathBuf,
    pub(super) serving_key: PathBuf,
    pub(super) admin_cert: PathBuf,
    pub(super) admin_key: PathBuf,
    pub(super) sa_public: PathBuf,
    pub(super) sa_private: PathBuf,
}

impl Pki {
    /// Makes the CA, the apiserver's serving certificate, the admin client
    /// certificate and the service-account key pair, and writes them to
    /// `dir`.
    /// `host_ip`, when set, is one more address of the serving
    /// certificate.
    pub(super) fn write(dir: &Path, host_ip: Option<Ipv4Addr>) -> Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let validity = Validity::days(2);
        let ca = DevCa::new("carina-tests kubernetes CA", validity)?;
        let mut addresses = vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            // The first address of the Service range: the `kubernetes`
            // Service.
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        ];
        addresses.extend(host_ip.map(IpAddr::V4));
        let serving = ca.issue_server(
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
            .map(String::from),
            &addresses,
            validity,
        )?;
        let admin = client_cert(&ca, "carina-admin", "system:masters", validity)?;
        let sa = KeyPair::generate().context("generate service-account key")?;

        let pki = Pki {
            ca,
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_public: dir.join("sa.pub"),
            sa_private: dir.join("sa.key"),
        };
        std::fs::write(&pki.ca_cert, pki.ca.cert_pem())?;
        std::fs::write(&pki.serving_cert, &serving.cert_pem)?;
        std::fs::write(&pki.serving_key, &serving.key_pem)?;
        std::fs::write(&pki.admin_cert, &admin.0)?;
        std::fs::write(&pki.admin_key, &admin.1)?;
        std::fs::write(&pki.sa_public, sa.public_key_pem())?;
        std::fs::write(&pki.sa_private, sa.serialize_pem())?;
        Ok(pki)
    }
}

/// A client certificate for user `user` in group `group` (the apiserver
/// reads the user from CN and groups from O), as `(cert_pem, key_pem)`.
pub(super) fn client_cert(
    ca: &DevCa,
    user: &str,
    group: &str,
    validity: Validity,
) -> Result<(String, String)> {
    let ca_key = KeyPair::from_pem(ca.key_pem()).context("parse CA key")?;
    let issuer = Issuer::from_ca_cert_pem(ca.cert_pem(), ca_key).context("parse CA")?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, user);
    dn.push(DnType::OrganizationName, group);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    let key = KeyPair::generate().with_context(|| format!("generate {user}'s key"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .with_context(|| format!("sign {user}'s certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes a certificate and key as `<dir>/<file>.crt` and `.key`.
pub(super) fn write_pair(
    dir: &Path,
    file: &str,
    cert: &str,
    key: &str,
) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let paths = (
        dir.join(format!("{file}.crt")),
        dir.join(format!("{file}.key")),
    );
    std::fs::write(&paths.0, cert)?;
    std::fs::write(&paths.1, key)?;
    Ok(paths)
}

/// A kubeconfig that refers to the CA and client certificate files.
pub(super) fn kubeconfig_yaml(server: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    // JSON strings are YAML strings: quoting paths this way is exact.
    let q = |p: &Path| serde_json::Value::from(p.to_string_lossy()).to_string();
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: carina-test\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority: {ca}\n\
         users:\n\
         - name: carina-admin\n  \
           user:\n    \
             client-certificate: {cert}\n    \
             client-key: {key}\n\
         contexts:\n\
         - name: carina-test\n  \
           context:\n    \
             cluster: carina-test\n    \
             user: carina-admin\n\
         current-context: carina-test\n",
        ca = q(ca),
        cert = q(cert),
        key = q(key),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::config::Kubeconfig;

    #[test]
    fn kubeconfig_parses_and_points_at_the_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::write(dir.path(), None).expect("pki");
        let yaml = kubeconfig_yaml(
            "https://127.0.0.1:6443",
            &pki.ca_cert,
            &pki.admin_cert,
            &pki.admin_key,
        );
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, yaml).expect("write");
        let kc = Kubeconfig::read_from(&path).expect("parses");
        assert_eq!(kc.current_context.as_deref(), Some("carina-test"));
        let cluster = kc.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        let user = kc.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(
            user.client_key.as_deref(),
            Some(pki.admin_key.to_string_lossy().as_ref())
        );
    }
}
