//! When a node's outage counts: how long its `Ready` condition has not
//! been `True`, against the grace period.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

/// The `Ready` condition's `lastTransitionTime` of a node that has not
/// been Ready for at least `grace` at `now`; `None` while it is Ready, has
/// no such condition, or is within the grace period.
pub fn outage_start(node: &Node, now: Timestamp, grace: Duration) -> Option<Timestamp> {
    let since = not_ready_since(node)?;
    let due = since.checked_add(grace).ok()?;
    (now >= due).then_some(since)
}

/// When the node stopped being Ready, if it is not Ready now.
pub(super) fn not_ready_since(node: &Node) -> Option<Timestamp> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if ready.status == "True" {
        return None;
    }
    Some(ready.last_transition_time.as_ref()?.0)
}

/// The earlier of two optional times.
pub(super) fn earlier(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn node(status: &str, since: Timestamp) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: status.into(),
                    last_transition_time: Some(Time(since)),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("a time")
    }

    #[test]
    fn only_a_node_not_ready_past_the_grace_period_counts() {
        let grace = Duration::from_secs(60);
        let down = node("Unknown", at(0));
        assert_eq!(outage_start(&down, at(59), grace), None, "within grace");
        assert_eq!(outage_start(&down, at(60), grace), Some(at(0)));
        assert_eq!(
            outage_start(&node("False", at(0)), at(600), grace),
            Some(at(0))
        );
        assert_eq!(
            outage_start(&node("True", at(0)), at(600), grace),
            None,
            "never while Ready"
        );
        assert_eq!(outage_start(&Node::default(), at(600), grace), None);
    }
}
