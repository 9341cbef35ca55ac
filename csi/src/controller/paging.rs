//! `ListVolumes` and `ListSnapshots` paging: the tokens this service issues
//! and the page a request's `max_entries` and `starting_token` select.

use crate::error::CsiError;

/// Prefix of the `ListVolumes` tokens this service issues.
const TOKEN_PREFIX: &str = "after.";

/// The `next_token` that continues after `volume_id`.
pub fn encode_token(volume_id: &str) -> String {
    let hex: String = volume_id.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{TOKEN_PREFIX}{hex}")
}

/// The volume id a token continues after; `ABORTED` for a token this
/// service did not issue.
pub fn decode_token(token: &str) -> Result<String, CsiError> {
    let bad = || {
        CsiError::Aborted(format!(
            "starting_token {token:?} was not issued by this plugin; list again without it"
        ))
    };
    let hex = token.strip_prefix(TOKEN_PREFIX).ok_or_else(bad)?;
    if hex.is_empty() || hex.len() % 2 != 0 {
        return Err(bad());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// A list request's paging: at most `max` entries, after the id the
/// starting token names.
pub(super) struct Paging {
    max: usize,
    after: Option<String>,
}

impl Paging {
    /// From `max_entries` (negative is `INVALID_ARGUMENT`, 0 no limit)
    /// and `starting_token` (`ABORTED` when not ours).
    pub(super) fn of(max_entries: i32, starting_token: &str) -> Result<Paging, CsiError> {
        if max_entries < 0 {
            return Err(CsiError::invalid(
                "max_entries",
                format!("{max_entries} is negative"),
            ));
        }
        let after = match starting_token {
            "" => None,
            token => Some(decode_token(token)?),
        };
        let max = match usize::try_from(max_entries) {
            Ok(0) | Err(_) => usize::MAX,
            Ok(n) => n,
        };
        Ok(Paging { max, after })
    }

    /// The page of `items` (sorted by `id` here) and the token of the
    /// next one (empty on the last).
    pub(super) fn page<T>(
        &self,
        mut items: Vec<T>,
        id: impl Fn(&T) -> &String,
    ) -> (Vec<T>, String) {
        items.sort_by(|a, b| id(a).cmp(id(b)));
        if let Some(after) = &self.after {
            items.retain(|i| id(i).as_str() > after.as_str());
        }
        let next_token = match items.get(self.max.saturating_sub(1)) {
            Some(last) if items.len() > self.max => encode_token(id(last)),
            _ => String::new(),
        };
        items.truncate(self.max);
        (items, next_token)
    }
}
