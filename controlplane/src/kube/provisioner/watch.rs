//! Waiting for the bridge: a watch on one `LogicVolume` (a field selector on
//! its name) until a judge sees an outcome or a deadline passes, and
//! [`Timeout`], what the deadline leaves to say in an error message. Never
//! sleep-and-get.

use std::pin::pin;
use std::time::Duration;

use carina_api::LogicVolume;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::watch_object;

use super::error::code_name;

/// The deadline passed while waiting for the bridge.
#[derive(Debug)]
pub(super) struct Timeout {
    /// The object as last seen (`None`: absent or never seen).
    pub(super) last: Option<LogicVolume>,
    /// The last error of the watch, if it had one.
    pub(super) watch_error: Option<String>,
}

impl Timeout {
    /// What the last seen status said, for an error message.
    pub(super) fn describe(&self) -> String {
        let mut out = match self.last.as_ref().and_then(|lv| lv.status.as_ref()) {
            Some(s) => match (&s.code, &s.message) {
                (Some(c), Some(m)) if *c != 0 => {
                    format!("last status: {} {m}", code_name(*c))
                }
                _ => "no outcome in its status yet".to_string(),
            },
            None => "no status yet".to_string(),
        };
        if let Some(e) = &self.watch_error {
            out.push_str(&format!("; last watch error: {e}"));
        }
        out
    }
}

/// Watches the `LogicVolume` `name` until `judge` returns an outcome (it
/// sees `None` while the object does not exist), at most `wait`. Watch
/// errors are retried with backoff.
pub(super) async fn watch_until<T>(
    lvs: &Api<LogicVolume>,
    name: &str,
    wait: Duration,
    mut judge: impl FnMut(Option<&LogicVolume>) -> Option<T>,
) -> Result<T, Timeout> {
    let mut last: Option<LogicVolume> = None;
    let mut watch_error: Option<String> = None;
    let watch = async {
        let mut events = pin!(watch_object(lvs.clone(), name).default_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(obj) => {
                    if let Some(outcome) = judge(obj.as_ref()) {
                        return Some(outcome);
                    }
                    last = obj;
                }
                Err(e) => {
                    tracing::warn!(carina.volume.name = %name, error = %e, "watching the LogicVolume failed; retrying");
                    watch_error = Some(e.to_string());
                }
            }
        }
        None
    };
    match tokio::time::timeout(wait, watch).await {
        Ok(Some(outcome)) => Ok(outcome),
        // The watcher's stream does not end; treat an end like the
        // deadline.
        Ok(None) | Err(_) => Err(Timeout { last, watch_error }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_api::{LogicVolumeSpec, LogicVolumeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use tonic::Code;

    #[test]
    fn a_timeout_says_what_the_last_status_said() {
        let mut lv = LogicVolume::new(
            "pvc-1",
            LogicVolumeSpec {
                source: None,
                node_name: "a".into(),
                size: Quantity("1Mi".into()),
                device_group: "ssd".into(),
                pvc: String::new(),
                name_space: String::new(),
                cache: None,
            },
        );
        let never = Timeout {
            last: None,
            watch_error: None,
        };
        assert_eq!(never.describe(), "no status yet");
        lv.status = Some(LogicVolumeStatus {
            code: Some(0),
            message: Some("ok".into()),
            ..LogicVolumeStatus::default()
        });
        let pending = Timeout {
            last: Some(lv.clone()),
            watch_error: Some("connection reset".into()),
        };
        assert_eq!(
            pending.describe(),
            "no outcome in its status yet; last watch error: connection reset"
        );
        lv.status = Some(LogicVolumeStatus {
            code: Some(Code::Unavailable as i32),
            message: Some("node down".into()),
            ..LogicVolumeStatus::default()
        });
        let failing = Timeout {
            last: Some(lv),
            watch_error: None,
        };
        let said = failing.describe();
        assert!(
            said.starts_with("last status: ") && said.ends_with(" node down"),
            "{said}"
        );
        assert!(said.contains(code_name(Code::Unavailable as i32)), "{said}");
    }
}
