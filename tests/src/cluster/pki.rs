//! The development CA of a test cluster and the certificates it issues
//! to nodes and to the controller, as files.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use carina_proto::devcerts::{CertifiedKey, DevCa, Validity};
use carina_proto::tls::{ClientTls, DEFAULT_TRUST_DOMAIN, connect};

use crate::grpc;

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    fn write(dir: &Path, name: &str, issued: &CertifiedKey) -> Result<CertFiles> {
        let files = CertFiles {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&files.cert, &issued.cert_pem)?;
        std::fs::write(&files.key, &issued.key_pem)?;
        Ok(files)
    }
}

/// One development CA for a test's nodes and controllers, and the
/// controllers' client certificate (role `controller`), as files.
#[derive(Debug)]
pub struct Pki {
    ca: DevCa,
    dir: PathBuf,
    /// The CA certificate every party trusts.
    pub ca_pem: PathBuf,
    /// The client certificate of role `controller`.
    pub controller: CertFiles,
}

impl Pki {
    /// Makes the CA and the controller certificate in `dir`.
    pub fn write(dir: &Path) -> Result<Pki> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let ca = DevCa::new("carina test cluster CA", Validity::days(1))?;
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.cert_pem())?;
        let client = ca.issue_client(DEFAULT_TRUST_DOMAIN, "controller", Validity::days(1))?;
        let controller = CertFiles::write(dir, "controller", &client)?;
        Ok(Pki {
            ca,
            dir: dir.to_path_buf(),
            ca_pem,
            controller,
        })
    }

    /// A server certificate for node `name` (DNS SANs `name` and
    /// `localhost`, IP SAN 127.0.0.1).
    pub fn node(&self, name: &str) -> Result<CertFiles> {
        self.nodes(&[name])
    }

    /// One server certificate for every node of `names` (DNS SANs: the
    /// names and `localhost`, IP SAN 127.0.0.1), as one Secret would hold
    /// for a DaemonSet; named after the first.
    pub fn nodes(&self, names: &[&str]) -> Result<CertFiles> {
        let (first, others) = names.split_first().context("no node name")?;
        let mut sans: Vec<String> = others.iter().map(|n| n.to_string()).collect();
        sans.push("localhost".to_string());
        let server = self.ca.issue_server(
            first,
            &sans,
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            Validity::days(1),
        )?;
        CertFiles::write(&self.dir, first, &server)
    }

    /// The controller's credentials for node `name`.
    pub fn client_tls(&self, name: &str) -> Result<ClientTls> {
        Ok(ClientTls::from_files(
            &self.ca_pem,
            &self.controller.cert,
            &self.controller.key,
            name,
        )?)
    }

    /// A NodeStorage client of role `controller` for node `name` at
    /// `endpoint`.
    pub async fn node_client(&self, name: &str, endpoint: &str) -> Result<grpc::Client> {
        let channel = connect(endpoint, &self.client_tls(name)?)
            .await
            .with_context(|| format!("connect to node {name} at {endpoint}"))?;
        Ok(grpc::Client::new(channel))
    }
}
