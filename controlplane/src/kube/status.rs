//! Helpers for the status the bridge side writes on Kubernetes objects
//! (`LogicVolume`, `NodeStorageResource`) and the Events it records:
//! timestamps as the API stores them, standard conditions that keep their
//! transition time, text cut to the API's limits.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Now, to the second (what the API stores).
pub(crate) fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// A condition of `type_`, keeping the transition time of the previous
/// one of that type when its status is the same.
pub(crate) fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(now, |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time,
        observed_generation,
    }
}

/// `previous` with `new` in place of the condition of its type (added
/// after the others when there is none); the other types kept.
pub(crate) fn with_condition(previous: &[Condition], new: Condition) -> Vec<Condition> {
    let mut out: Vec<Condition> = previous
        .iter()
        .filter(|c| c.type_ != new.type_)
        .cloned()
        .collect();
    let at = previous
        .iter()
        .position(|c| c.type_ == new.type_)
        .unwrap_or(out.len())
        .min(out.len());
    out.insert(at, new);
    out
}

/// `text` cut to at most `max` bytes on a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any text cut to any length is a prefix of it, at most that
        /// long and shorter only by what a split character needs.
        #[test]
        fn truncation_keeps_characters_whole(text in ".{0,40}", max in 0usize..50) {
            let cut = truncate(&text, max);
            proptest::prop_assert!(text.starts_with(&cut));
            proptest::prop_assert!(cut.len() <= max || cut == text);
            proptest::prop_assert!(cut.len() + 4 > max.min(text.len()));
        }
    }

    #[test]
    fn conditions_keep_their_transition_time() {
        let old = Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Provisioned".into(),
            message: "m".into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: Some(1),
        };
        let same = condition(
            std::slice::from_ref(&old),
            "Ready",
            true,
            "Provisioned",
            "n",
            Some(2),
        );
        assert_eq!(same.last_transition_time, old.last_transition_time);
        assert_eq!(same.observed_generation, Some(2));
        let flipped = condition(
            std::slice::from_ref(&old),
            "Ready",
            false,
            "UNAVAILABLE",
            "n",
            Some(2),
        );
        assert_ne!(flipped.last_transition_time, old.last_transition_time);
        assert_eq!(flipped.status, "False");
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abcdef", 3), "abc");
        assert_eq!(truncate("aé", 2), "a");
    }
}
