//! `/prioritize`: scores from 0 to 10 by the `schedulerStrategy`.
//!
//! Each passing node has a basis: `Pinned` (bound claims tie the pod to
//! it), or `Free(f)`: the allocatable bytes left, after the volumes in
//! flight and the pod's own volumes, in the groups the pod's volumes go
//! to on that node. With `lo`/`hi` the smallest/largest `f` among the
//! candidates:
//!
//! ```text
//! spreadout(f) = round(10 × (f − lo) / (hi − lo))     the emptiest node gets 10
//! binpack(f)   = 10 − spreadout(f)                    the fullest node that fits gets 10
//! ```
//!
//! When `hi == lo` (one candidate, or all equal) every node gets 10: there
//! is nothing to prefer and no division by zero. A pinned node gets 10.
//! This is the order Carina's direct control plane uses (the least or the
//! most allocatable bytes first), scaled to the extender's range;
//! kube-scheduler multiplies it by the extender's `weight`.

use carina_csi::strategy::Strategy;

use crate::extender::{HostPriority, HostPriorityList, MAX_SCORE, MIN_SCORE};

/// What a passing node is scored on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The pod's bound claims are on this node.
    Pinned,
    /// Allocatable bytes left in the groups the pod's volumes go to.
    Free(u64),
}

/// The scores of `nodes` under `strategy`, in the same order.
pub fn prioritize<'a>(
    strategy: Strategy,
    nodes: impl IntoIterator<Item = (&'a str, Basis)> + Clone,
) -> HostPriorityList {
    let free = nodes.clone().into_iter().filter_map(|(_, b)| match b {
        Basis::Free(f) => Some(f),
        Basis::Pinned => None,
    });
    let (lo, hi) = free.fold((u64::MAX, 0), |(lo, hi), f| (lo.min(f), hi.max(f)));
    nodes
        .into_iter()
        .map(|(host, basis)| HostPriority {
            host: host.to_string(),
            score: match basis {
                Basis::Pinned => MAX_SCORE,
                Basis::Free(f) => score(strategy, f, lo, hi),
            },
        })
        .collect()
}

/// The formula of the module documentation, for `lo ≤ f ≤ hi`.
fn score(strategy: Strategy, f: u64, lo: u64, hi: u64) -> i64 {
    if hi <= lo {
        return MAX_SCORE;
    }
    let span = u128::from(hi - lo);
    let above = u128::from(f.clamp(lo, hi) - lo);
    let range = (MAX_SCORE - MIN_SCORE) as u128;
    // Rounded to the nearest integer; at most `range`, so it fits.
    let spread = ((above * range * 2 + span) / (span * 2)) as i64 + MIN_SCORE;
    match strategy {
        Strategy::Spreadout => spread,
        Strategy::Binpack => MAX_SCORE - (spread - MIN_SCORE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn scores(strategy: Strategy, nodes: &[(&'static str, Basis)]) -> Vec<i64> {
        prioritize(strategy, nodes.iter().copied())
            .into_iter()
            .map(|h| h.score)
            .collect()
    }

    #[test]
    fn strategies_order_by_free_bytes() {
        let nodes = [
            ("a", Basis::Free(90 * GIB)),
            ("b", Basis::Free(190 * GIB)),
            ("c", Basis::Free(290 * GIB)),
        ];
        assert_eq!(scores(Strategy::Spreadout, &nodes), [0, 5, 10]);
        assert_eq!(scores(Strategy::Binpack, &nodes), [10, 5, 0]);
        let hosts: Vec<_> = prioritize(Strategy::Binpack, nodes.iter().copied())
            .into_iter()
            .map(|h| h.host)
            .collect();
        assert_eq!(hosts, ["a", "b", "c"]);
    }

    #[test]
    fn rounding_stays_in_range() {
        let nodes = [
            ("a", Basis::Free(0)),
            ("b", Basis::Free(1)),
            ("c", Basis::Free(u64::MAX / 2)),
            ("d", Basis::Free(u64::MAX)),
        ];
        assert_eq!(scores(Strategy::Spreadout, &nodes), [0, 0, 5, 10]);
        assert_eq!(scores(Strategy::Binpack, &nodes), [10, 10, 5, 0]);
        for s in [Strategy::Spreadout, Strategy::Binpack] {
            for h in prioritize(s, nodes.iter().copied()) {
                assert!((MIN_SCORE..=MAX_SCORE).contains(&h.score), "{h:?}");
            }
        }
    }

    #[test]
    fn equal_nodes_and_single_nodes_get_the_maximum() {
        for s in [Strategy::Spreadout, Strategy::Binpack] {
            assert_eq!(scores(s, &[("a", Basis::Free(0))]), [10]);
            assert_eq!(
                scores(s, &[("a", Basis::Free(5)), ("b", Basis::Free(5))]),
                [10, 10]
            );
            assert_eq!(scores(s, &[]), Vec::<i64>::new());
        }
    }

    #[test]
    fn a_pinned_node_gets_the_maximum() {
        for s in [Strategy::Spreadout, Strategy::Binpack] {
            assert_eq!(scores(s, &[("a", Basis::Pinned)]), [10]);
        }
        assert_eq!(
            scores(
                Strategy::Binpack,
                &[("a", Basis::Pinned), ("b", Basis::Free(3))]
            ),
            [10, 10]
        );
    }
}
