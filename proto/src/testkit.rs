//! Certificate authorities for the unit tests of trust anchors and their
//! endorsements: a self-signed CA whose parameters and key stay at hand
//! (to re-issue or cross-sign with them), and the cross-certificate that
//! certifies one CA's key by another. Built for tests only (`cfg(test)`
//! here, the `testkit` feature elsewhere); it panics where a test would.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, IsCa, Issuer, KeyPair,
    SubjectPublicKeyInfo,
};

use crate::anchors::public_key;

/// A self-signed CA made with rcgen, its certificate as PEM and DER.
#[derive(Debug)]
pub struct TestCa {
    pub params: CertificateParams,
    pub key: KeyPair,
    pub pem: String,
    pub der: Vec<u8>,
}

impl TestCa {
    /// A new CA whose subject is `CN=<name>`.
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("generate a CA key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("self-sign a CA");
        TestCa {
            pem: cert.pem(),
            der: cert.der().to_vec(),
            params,
            key,
        }
    }

    /// The key of this CA certified by `by`: a cross-certificate with this
    /// CA's parameters (subject, CA constraint) signed by `by`'s key.
    pub fn certified_by(&self, by: &TestCa) -> Certificate {
        self.certified_with(&self.params, by)
    }

    /// The key of this CA certified by `by` with `params` (e.g. this CA's
    /// parameters made a leaf) in place of its own.
    pub fn certified_with(&self, params: &CertificateParams, by: &TestCa) -> Certificate {
        let key = public_key(&self.der).expect("the CA's public key");
        let spki = SubjectPublicKeyInfo::from_der(&key).expect("a subject public key info");
        params
            .signed_by(&spki, &Issuer::new(by.params.clone(), &by.key))
            .expect("sign a cross-certificate")
    }
}
