//! A Warning Event on the claim whose StorageClass has parameters without
//! effect: unknown `carina.storage.io/*` keys, and keys Go Carina did not
//! read in their combination ([`carina_csi::params::compat`]). The class
//! is accepted as Go Carina accepted it; the Event tells whoever reads the
//! claim what was not read. The claim is named by the parameters
//! external-provisioner adds (`--extra-create-metadata`); without them,
//! or when the Event cannot be written, the controller's log line stands
//! alone and the create goes on.

use carina_csi::VolumeRequest;
use carina_csi::params::Parameters;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};

use super::object::{PVC_NAME_PARAMETER, PVC_NAMESPACE_PARAMETER};

/// The Events' reporting controller.
pub const REPORTER: &str = "carina-provisioner";
/// The Events' reason.
pub const REASON: &str = "StorageClassParametersIgnored";

/// Writes the Warning Events.
#[derive(Clone)]
pub(super) struct Notices {
    client: Client,
    recorder: Recorder,
}

impl Notices {
    pub(super) fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: REPORTER.to_string(),
            instance: None,
        };
        Notices {
            recorder: Recorder::new(client.clone(), reporter),
            client,
        }
    }

    /// A Warning Event on the claim of `req` when its parameters have keys
    /// without effect. Never fails: what goes wrong is logged.
    #[tracing::instrument(name = "kube.notice", skip_all, fields(carina.volume.name = %req.name))]
    pub(super) async fn parameters_ignored(&self, req: &VolumeRequest) {
        let Some(note) = note(&req.parameters) else {
            return;
        };
        let other = &req.parameters.other;
        let (Some(name), Some(namespace)) = (
            other.get(PVC_NAME_PARAMETER),
            other.get(PVC_NAMESPACE_PARAMETER),
        ) else {
            return;
        };
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        // The claim's uid ties the Event to it (`kubectl describe` looks
        // Events up by it).
        let claim = match claims.get_opt(name).await {
            Ok(Some(claim)) => claim,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "reading the claim for its Event failed");
                return;
            }
        };
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: REASON.to_string(),
            note: Some(note),
            action: "Provision".to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &claim.object_ref(&())).await {
            tracing::warn!(error = %e, "publishing an Event failed");
        }
    }
}

/// The Event's note for `p`, `None` when every key has its effect. Kept
/// under the API's 1 KiB: keys past it are counted, not named.
pub(super) fn note(p: &Parameters) -> Option<String> {
    let mut parts: Vec<String> = p.unknown.iter().map(|k| format!("{k} (unknown)")).collect();
    parts.extend(p.ignored.iter().map(|(k, why)| format!("{k} ({why})")));
    if parts.is_empty() {
        return None;
    }
    let mut note = String::from("StorageClass parameters without effect: ");
    let total = parts.len();
    for (i, part) in parts.iter().enumerate() {
        if note.len() + part.len() > 900 {
            note.push_str(&format!("and {} more", total - i));
            break;
        }
        note.push_str(part);
        if i + 1 < total {
            note.push_str("; ");
        }
    }
    Some(note)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn note_names_each_key_without_effect() {
        let parse = |pairs: &[(&str, &str)]| {
            let raw: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Parameters::parse(&raw).expect("accepted")
        };
        assert_eq!(
            note(&parse(&[("carina.storage.io/disk-group-name", "g")])),
            None
        );
        let n = note(&parse(&[
            ("carina.storage.io/volume-type", "lvm"),
            ("carina.storage.io/backend-disk-group-name", "hdd"),
        ]))
        .expect("a note");
        assert!(n.contains("carina.storage.io/volume-type (unknown)"), "{n}");
        assert!(
            n.contains("backend-disk-group-name (cache-disk-ratio is missing"),
            "{n}"
        );
        let many: Vec<(String, String)> = (0..200)
            .map(|i| (format!("carina.storage.io/key-{i:03}"), "x".to_string()))
            .collect();
        let pairs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let n = note(&parse(&pairs)).expect("a note");
        assert!(n.len() <= 1024, "{}", n.len());
        assert!(n.ends_with("more"), "{n}");
    }
}
