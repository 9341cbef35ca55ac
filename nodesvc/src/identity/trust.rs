//! The CA bundle the node trusts, kept against rewrites of its file.
//!
//! With `--identity-issuer` the CA file (`--tls-ca`) is the mounted CA
//! ConfigMap, and more people may write a ConfigMap than the CA's Secret.
//! So the node does not trust whatever the file holds: [`TrustedCa`] keeps
//! the bundle it trusts (in memory and in a pin file under the state
//! directory, so a restart does not start over), and takes a changed file
//! only if every CA in it has a key the node trusts already, or is
//! endorsed by one: a cross-certificate in the `ca-endorsements.crt` file
//! beside it, signed by a trusted CA's key (`carina_proto::anchors`). The
//! controller makes those when its CA Secret is replaced while it holds
//! the old key; someone who can only write the ConfigMap cannot.
//!
//! The first bundle is taken as it is (trust on first use) when no pin
//! exists. A refused bundle is logged and the trusted one stays in force;
//! it is looked at again when the files change. To start over with an
//! unrelated CA (a reinstall whose CA Secret was deleted), remove the pin
//! file on each node.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use carina_proto::anchors::{self, AnchorError, ENDORSEMENTS_KEY};

/// The name of the pin file in the state directory.
pub const PIN_FILE: &str = "identity-trusted-ca.crt";

/// Why a bundle was not taken.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("write the pin {path}: {source}")]
    Pin {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA bundle in {path} is refused, the trusted one stays in force: {source}")]
    Refused {
        path: String,
        #[source]
        source: AnchorError,
    },
}

/// What [`TrustedCa::refresh`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The files did not change, or changed while being read.
    Unchanged,
    /// The bundle was taken; the subjects of the CAs it added (all of
    /// them on first use).
    Taken { added: Vec<String>, first: bool },
}

type Fingerprint = [Option<(SystemTime, u64)>; 2];

/// The trusted bundle and the files it follows.
#[derive(Debug)]
pub struct TrustedCa {
    file: PathBuf,
    endorsements: PathBuf,
    pin: Option<PathBuf>,
    pem: Option<String>,
    seen: Option<Fingerprint>,
}

fn stat(path: &Path) -> Option<(SystemTime, u64)> {
    std::fs::metadata(path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())))
}

impl TrustedCa {
    /// Follows `file` (and the endorsements beside it), starting from the
    /// bundle pinned in `pin` if there is one.
    pub fn open(file: &Path, pin: Option<PathBuf>) -> TrustedCa {
        let endorsements = file.with_file_name(ENDORSEMENTS_KEY);
        let pem = pin.as_deref().and_then(|p| match std::fs::read_to_string(p) {
            Ok(text) if anchors::certificates(&text, "pin").is_ok_and(|c| !c.is_empty()) => {
                tracing::info!(carina.tls.pin = %p.display(), "trusting the pinned CA bundle");
                Some(text)
            }
            Ok(_) => {
                tracing::warn!(carina.tls.pin = %p.display(), "the pinned CA bundle is unusable: ignored");
                None
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(carina.tls.pin = %p.display(), error = %e, "cannot read the pinned CA bundle: ignored");
                None
            }
        });
        TrustedCa {
            file: file.to_path_buf(),
            endorsements,
            pin,
            pem,
            seen: None,
        }
    }

    /// The trusted bundle (PEM), once there is one.
    pub fn pem(&self) -> Option<&str> {
        self.pem.as_deref()
    }

    fn fingerprint(&self) -> Fingerprint {
        [stat(&self.file), stat(&self.endorsements)]
    }

    /// Reads the files if they changed since last time and takes the
    /// bundle if it may replace the trusted one.
    pub fn refresh(&mut self) -> Result<Change, TrustError> {
        let before = self.fingerprint();
        if self.seen == Some(before) {
            return Ok(Change::Unchanged);
        }
        let path = self.file.display().to_string();
        let text = std::fs::read_to_string(&self.file).map_err(|source| TrustError::Read {
            path: path.clone(),
            source,
        })?;
        let endorsements = match std::fs::read_to_string(&self.endorsements) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(TrustError::Read {
                    path: self.endorsements.display().to_string(),
                    source,
                });
            }
        };
        if self.fingerprint() != before {
            // Replaced while read (a ConfigMap update): next time.
            return Ok(Change::Unchanged);
        }
        self.seen = Some(before);
        if self.pem.as_deref() == Some(text.as_str()) {
            return Ok(Change::Unchanged);
        }
        let refused = |source| TrustError::Refused {
            path: path.clone(),
            source,
        };
        let candidate = anchors::certificates(&text, "ca.crt").map_err(refused)?;
        let (added, first) = match &self.pem {
            None => {
                if candidate.is_empty() {
                    return Err(refused(AnchorError::Empty { what: "ca.crt" }));
                }
                let subjects = candidate.iter().map(|d| anchors::subject(d)).collect();
                (subjects, true)
            }
            Some(trusted) => {
                let trusted = anchors::certificates(trusted, "pin").map_err(refused)?;
                let endorsements =
                    anchors::certificates(&endorsements, ENDORSEMENTS_KEY).map_err(refused)?;
                (
                    anchors::check_replacement(&trusted, &candidate, &endorsements)
                        .map_err(refused)?,
                    false,
                )
            }
        };
        if let Some(pin) = &self.pin {
            write_pin(pin, &text).map_err(|source| TrustError::Pin {
                path: pin.display().to_string(),
                source,
            })?;
        }
        self.pem = Some(text);
        Ok(Change::Taken { added, first })
    }
}

/// Writes `text` to `pin` atomically ([`carina_sys::atomic_file`]), so a
/// crash leaves the old pin or the new one. It holds certificates only,
/// so it is readable by all.
fn write_pin(pin: &Path, text: &str) -> std::io::Result<()> {
    let dir = match pin.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = pin.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the pin path names no file",
        )
    })?;
    carina_sys::atomic_file::write(dir, name, text.as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use carina_proto::testkit::TestCa;

    use super::*;

    /// `new`'s key certified by `by`, as PEM.
    fn cross(new: &TestCa, by: &TestCa) -> String {
        new.certified_by(by).pem()
    }

    /// Writes the files with a new modification time each call.
    fn publish(dir: &Path, bundle: &str, endorsements: &str) {
        for (name, text) in [("ca.crt", bundle), (ENDORSEMENTS_KEY, endorsements)] {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write");
            let later = SystemTime::now() + std::time::Duration::from_secs(1);
            let file = std::fs::File::options()
                .write(true)
                .open(&path)
                .expect("open");
            file.set_modified(later).expect("mtime");
        }
    }

    #[test]
    fn a_rewritten_bundle_is_refused_and_an_endorsed_one_taken() {
        let dir = tempfile::tempdir().expect("dir");
        let (file, pin) = (
            dir.path().join("ca.crt"),
            dir.path().join("state").join(PIN_FILE),
        );
        let (old, new, evil) = (TestCa::new("old"), TestCa::new("new"), TestCa::new("evil"));
        publish(dir.path(), &old.pem, "");
        let mut trust = TrustedCa::open(&file, Some(pin.clone()));
        assert_eq!(trust.pem(), None);
        assert_eq!(
            trust.refresh().expect("first use"),
            Change::Taken {
                added: vec!["CN=old".into()],
                first: true
            }
        );
        assert_eq!(std::fs::read_to_string(&pin).expect("pinned"), old.pem);
        assert_eq!(trust.refresh().expect("same"), Change::Unchanged);

        // Rewritten without the old key: alone, beside the old one, or with
        // an endorsement it made itself.
        for (bundle, endorsements) in [
            (evil.pem.clone(), String::new()),
            (format!("{}{}", old.pem, evil.pem), String::new()),
            (evil.pem.clone(), cross(&evil, &evil)),
        ] {
            publish(dir.path(), &bundle, &endorsements);
            let err = trust.refresh().expect_err("refused");
            assert!(matches!(err, TrustError::Refused { .. }), "{err}");
            assert!(err.to_string().contains("CN=evil"), "{err}");
            assert_eq!(trust.pem(), Some(old.pem.as_str()), "the old one stays");
            assert_eq!(trust.refresh().expect("not again"), Change::Unchanged);
        }
        assert_eq!(std::fs::read_to_string(&pin).expect("pin"), old.pem);

        // A restart reads the pin, not the rewritten file.
        let mut restarted = TrustedCa::open(&file, Some(pin.clone()));
        assert_eq!(restarted.pem(), Some(old.pem.as_str()));
        assert!(restarted.refresh().is_err());

        // The rotation the controller makes: both, the new one endorsed;
        // then the new one alone.
        let both = format!("{}{}", old.pem, new.pem);
        publish(dir.path(), &both, &cross(&new, &old));
        assert_eq!(
            trust.refresh().expect("endorsed"),
            Change::Taken {
                added: vec!["CN=new".into()],
                first: false
            }
        );
        publish(dir.path(), &new.pem, &cross(&new, &old));
        assert_eq!(
            trust.refresh().expect("the old one dropped"),
            Change::Taken {
                added: vec![],
                first: false
            }
        );
        assert_eq!(std::fs::read_to_string(&pin).expect("pin"), new.pem);
        // The old CA does not come back on its own word.
        publish(dir.path(), &old.pem, "");
        assert!(trust.refresh().is_err());
        // A node that was down meanwhile follows from the pin.
        let down = dir.path().join("down.crt");
        std::fs::write(&down, &old.pem).expect("pin");
        publish(dir.path(), &new.pem, &cross(&new, &old));
        let mut returning = TrustedCa::open(&file, Some(down));
        assert!(matches!(
            returning.refresh().expect("follows"),
            Change::Taken { first: false, .. }
        ));
    }

    /// The pin is never written through a link at the temporary name it
    /// used to take (`<pin>.tmp`).
    #[test]
    fn a_link_at_a_temporary_name_is_not_written_through() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "mine").expect("write");
        let pin = tmp.path().join("state/ca.pin");
        std::fs::create_dir(tmp.path().join("state")).expect("mkdir");
        std::os::unix::fs::symlink(&victim, pin.with_extension("tmp")).expect("symlink");
        write_pin(&pin, "PEM").expect("written");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "mine");
        assert_eq!(std::fs::read_to_string(&pin).expect("read"), "PEM");
    }
}
