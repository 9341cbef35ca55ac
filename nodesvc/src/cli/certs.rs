//! `carinactl certs`: a development CA and the certificates a node and its
//! clients need, written as PEM files.
//!
//! Layout of a directory (`--dir`):
//!
//! | file | what | mode |
//! | --- | --- | --- |
//! | `ca.pem`, `ca-key.pem` | the CA (`certs init`) | 0644, 0600 |
//! | `trust-domain` | the trust domain given to `certs init` | 0644 |
//! | `node-<NAME>.pem`, `node-<NAME>-key.pem` | a node's server certificate | 0644, 0600 |
//! | `<ROLE>.pem`, `<ROLE>-key.pem` | a client certificate for a role | 0644, 0600 |
//!
//! Every file is written to a temporary name and renamed into place, so a
//! node that hot-reloads its certificates never reads half a file.

use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use carina_proto::devcerts::{CertifiedKey, DevCa, Validity};
use carina_proto::tls::DEFAULT_TRUST_DOMAIN;

use super::CliError;

pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const TRUST_DOMAIN_FILE: &str = "trust-domain";

const KEY_MODE: u32 = 0o600;
const CERT_MODE: u32 = 0o644;

/// The files one command wrote, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    pub files: Vec<PathBuf>,
}

/// `certs init`: a new CA in `dir`. Refuses to replace an existing CA key
/// unless `force`.
pub fn init(dir: &Path, trust_domain: &str, days: u32, force: bool) -> Result<Written, CliError> {
    check_trust_domain(trust_domain)?;
    let key_path = dir.join(CA_KEY);
    if !force && key_path.exists() {
        return Err(CliError::Local(format!(
            "{} exists; pass --force to replace the CA",
            key_path.display()
        )));
    }
    let ca = DevCa::new(
        &format!("Carina development CA ({trust_domain})"),
        Validity::days(days),
    )
    .map_err(|e| CliError::Local(format!("create CA: {e}")))?;
    create_dir(dir)?;
    let mut written = Written::default();
    written.write(dir, CA_KEY, ca.key_pem(), KEY_MODE)?;
    written.write(dir, CA_CERT, ca.cert_pem(), CERT_MODE)?;
    written.write(
        dir,
        TRUST_DOMAIN_FILE,
        &format!("{trust_domain}\n"),
        CERT_MODE,
    )?;
    Ok(written)
}

/// `certs issue server`: `node-<node>.pem` and its key in `dir`.
pub fn issue_server(
    ca_dir: &Path,
    dir: &Path,
    node: &str,
    dns: &[String],
    ips: &[IpAddr],
    days: u32,
) -> Result<Written, CliError> {
    check_file_stem("--node", node)?;
    let ca = load_ca(ca_dir)?;
    let issued = ca
        .issue_server(node, dns, ips, Validity::days(days))
        .map_err(|e| CliError::Local(format!("issue server certificate for {node:?}: {e}")))?;
    write_pair(dir, &format!("node-{node}"), &issued)
}

/// `certs issue client`: `<role>.pem` and its key in `dir`. The trust
/// domain is `trust_domain`, else the one `certs init` recorded next to
/// the CA, else the default.
pub fn issue_client(
    ca_dir: &Path,
    dir: &Path,
    role: &str,
    trust_domain: Option<&str>,
    days: u32,
) -> Result<(Written, String), CliError> {
    check_file_stem("--role", role)?;
    let trust_domain = match trust_domain {
        Some(td) => td.to_string(),
        None => recorded_trust_domain(ca_dir)?,
    };
    check_trust_domain(&trust_domain)?;
    let ca = load_ca(ca_dir)?;
    let issued = ca
        .issue_client(&trust_domain, role, Validity::days(days))
        .map_err(|e| CliError::Local(format!("issue client certificate for {role:?}: {e}")))?;
    Ok((write_pair(dir, role, &issued)?, trust_domain))
}

fn recorded_trust_domain(ca_dir: &Path) -> Result<String, CliError> {
    let path = ca_dir.join(TRUST_DOMAIN_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(text.trim().to_string()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(DEFAULT_TRUST_DOMAIN.to_string()),
        Err(e) => Err(io_err("read", &path, e)),
    }
}

fn load_ca(ca_dir: &Path) -> Result<DevCa, CliError> {
    let read = |name: &str| {
        let path = ca_dir.join(name);
        fs::read_to_string(&path).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::NotFound {
                " (run `carinactl certs init` first, or pass --ca-dir)"
            } else {
                ""
            };
            CliError::Local(format!("read {}: {e}{hint}", path.display()))
        })
    };
    let cert = read(CA_CERT)?;
    let key = read(CA_KEY)?;
    DevCa::from_pem(&cert, &key)
        .map_err(|e| CliError::Local(format!("load the CA from {}: {e}", ca_dir.display())))
}

fn write_pair(dir: &Path, stem: &str, issued: &CertifiedKey) -> Result<Written, CliError> {
    create_dir(dir)?;
    let mut written = Written::default();
    written.write(dir, &format!("{stem}-key.pem"), &issued.key_pem, KEY_MODE)?;
    written.write(dir, &format!("{stem}.pem"), &issued.cert_pem, CERT_MODE)?;
    Ok(written)
}

impl Written {
    /// Writes `text` to `dir/name` with `mode`, atomically.
    fn write(&mut self, dir: &Path, name: &str, text: &str, mode: u32) -> Result<(), CliError> {
        let path = dir.join(name);
        carina_sys::atomic_file::write(dir, name.as_ref(), text.as_bytes(), mode)
            .map_err(|e| io_err("write", &path, e))?;
        self.files.push(path);
        Ok(())
    }
}

fn create_dir(dir: &Path) -> Result<(), CliError> {
    fs::create_dir_all(dir).map_err(|e| io_err("create directory", dir, e))
}

fn io_err(what: &str, path: &Path, e: io::Error) -> CliError {
    CliError::Local(format!("{what} {}: {e}", path.display()))
}

/// Node and role names become file names: keep them to DNS-label
/// characters.
fn check_file_stem(flag: &str, value: &str) -> Result<(), CliError> {
    check_label(flag, value, true)
}

fn check_trust_domain(td: &str) -> Result<(), CliError> {
    check_label("trust domain", td, false)
}

/// `value` is not empty and has only letters, digits, '-', '.' and '_',
/// and with `stem` neither '.' nor '-' first; `what` names it in the error.
fn check_label(what: &str, value: &str, stem: bool) -> Result<(), CliError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
    let ok = match value.as_bytes().first() {
        None => false,
        Some(b'.' | b'-') if stem => false,
        Some(_) => value.bytes().all(allowed),
    };
    if ok {
        return Ok(());
    }
    let first = if stem { " (not first)" } else { "" };
    Err(CliError::Usage(format!(
        "{what} {value:?}: use letters, digits, '-', '.', '_'{first}"
    )))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use carina_proto::tls::ClientTls;
    use carina_sys::testkit::noisy_text;
    use proptest::prelude::*;

    proptest! {
        /// Node, role and trust-domain names of any text: what is taken
        /// is a non-empty name of the allowed bytes, a file stem not
        /// starting with '.' or '-' (so never `..`).
        #[test]
        fn labels_of_any_text(value in prop_oneof![noisy_text(), "[a-zA-Z0-9._/-]{0,12}"]) {
            let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._".contains(&b);
            let well_formed = !value.is_empty() && value.bytes().all(allowed);
            prop_assert_eq!(check_trust_domain(&value).is_ok(), well_formed);
            prop_assert_eq!(
                check_file_stem("--node", &value).is_ok(),
                well_formed && !value.starts_with(['.', '-'])
            );
        }
    }

    /// The certificate, its key and the CA load into a client TLS config
    /// (a key that does not match its certificate is refused there).
    fn loads(ca_dir: &Path, w: &Written) {
        ClientTls::from_files(&ca_dir.join(CA_CERT), &w.files[1], &w.files[0], "node-a")
            .expect("files read")
            .client_config()
            .expect("a usable client config");
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn names_and_trust_domains_keep_to_label_characters() {
        let usage = |r: Result<(), CliError>| match r {
            Err(CliError::Usage(m)) => m,
            other => panic!("a usage error, got {other:?}"),
        };
        for ok in ["node-a", "a.b_c", "0"] {
            check_file_stem("--node", ok).expect(ok);
            check_trust_domain(ok).expect(ok);
        }
        for bad in ["", "a/b", "a b", "ü"] {
            usage(check_file_stem("--node", bad));
            usage(check_trust_domain(bad));
        }
        // Only file names refuse a leading dot or dash.
        for lead in [".a", "-a"] {
            let m = usage(check_file_stem("--role", lead));
            assert_eq!(
                m,
                format!("--role {lead:?}: use letters, digits, '-', '.', '_' (not first)")
            );
            check_trust_domain(lead).expect(lead);
        }
        assert_eq!(
            usage(check_trust_domain("a b")),
            r#"trust domain "a b": use letters, digits, '-', '.', '_'"#
        );
    }

    #[test]
    fn init_then_issue() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let w = init(d, "example.org", 30, false).expect("init");
        assert_eq!(
            w.files,
            vec![d.join(CA_KEY), d.join(CA_CERT), d.join(TRUST_DOMAIN_FILE)]
        );
        assert_eq!(mode(&d.join(CA_KEY)), 0o600);
        assert_eq!(mode(&d.join(CA_CERT)), 0o644);
        let again = init(d, "example.org", 30, false).expect_err("keeps the CA");
        assert!(again.to_string().contains("--force"), "{again}");
        assert_eq!(again.exit_code(), 3);

        let out = d.join("issued");
        let w = issue_server(
            d,
            &out,
            "node-a",
            &["localhost".to_string()],
            &[IpAddr::from([127, 0, 0, 1])],
            30,
        )
        .expect("server");
        assert_eq!(
            w.files,
            vec![out.join("node-node-a-key.pem"), out.join("node-node-a.pem")]
        );
        assert_eq!(mode(&out.join("node-node-a-key.pem")), 0o600);

        let (w, td) = issue_client(d, &out, "reader", None, 30).expect("client");
        assert_eq!(td, "example.org", "the recorded trust domain is used");
        loads(d, &w);
        let pem = fs::read_to_string(&w.files[1]).expect("read");
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");

        let (w, td) =
            issue_client(d, &out, "controller", Some("other.example"), 30).expect("client");
        assert_eq!(td, "other.example");
        loads(d, &w);
        // No temporary files left behind.
        let names: Vec<String> = fs::read_dir(&out)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    }

    #[test]
    fn refusals() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let no_ca = issue_client(d, d, "reader", None, 1).expect_err("no CA yet");
        assert!(no_ca.to_string().contains("certs init"), "{no_ca}");
        let bad = issue_server(d, d, "../etc", &[], &[], 1).expect_err("path in a name");
        assert_eq!(bad.exit_code(), 2);
        let bad_td = init(d, "a/b", 1, false).expect_err("bad trust domain");
        assert_eq!(bad_td.exit_code(), 2);
    }

    /// The key is never written through a link someone planted in the
    /// directory at the temporary name (the process id made it guessable).
    #[test]
    fn a_link_at_a_temporary_name_does_not_receive_the_key() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("ca");
        fs::create_dir(&dir).expect("mkdir");
        let victim = tmp.path().join("readable");
        fs::write(&victim, "mine").expect("write");
        let planted = format!(".k.pem.tmp-{}", std::process::id());
        std::os::unix::fs::symlink(&victim, dir.join(planted)).expect("symlink");
        let mut written = Written::default();
        written
            .write(&dir, "k.pem", "SECRET KEY", KEY_MODE)
            .expect("written");
        assert_eq!(fs::read_to_string(&victim).expect("read"), "mine");
        assert_eq!(
            fs::read_to_string(dir.join("k.pem")).expect("read"),
            "SECRET KEY"
        );
        assert_eq!(mode(&dir.join("k.pem")), KEY_MODE);
    }
}
