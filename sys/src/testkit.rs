//! Strategies for the property tests of Carina's parsers: besides wholly
//! arbitrary input, valid samples with a few edits, which get past a
//! parser's first checks and into the code behind them. Built for tests
//! only (`cfg(test)` here, the `testkit` feature elsewhere).

use proptest::prelude::*;
use proptest::sample::Index;

/// Up to this many single-place edits per mutated sample.
const MAX_EDITS: usize = 8;

/// Characters that matter to the formats we parse (JSON, mountinfo,
/// key=value lists, quantities), drawn as often as any other character.
const SIGNIFICANT: &[char] = &[
    '{', '}', '[', ']', '"', ',', ':', '=', '\\', ' ', '\n', '-', '+', '.', '0', '9', 'e', 'E',
    'i', 'K', 'M', 'G', 'T', 'P',
];

fn edit_char() -> impl Strategy<Value = char> {
    prop_oneof![any::<char>(), prop::sample::select(SIGNIFICANT)]
}

/// Replaces, inserts or removes one element of `v` at `at`.
fn apply<T: Clone>(v: &mut Vec<T>, kind: u8, at: Index, value: T) {
    if v.is_empty() {
        v.push(value);
        return;
    }
    let i = at.index(v.len());
    match kind % 3 {
        0 => v[i] = value,
        1 => v.insert(i, value),
        _ => {
            v.remove(i);
        }
    }
}

/// `sample` with up to eight characters replaced, inserted or removed
/// and, half the time, cut short.
pub fn mutated_text(sample: &'static str) -> impl Strategy<Value = String> {
    (
        prop::collection::vec((any::<u8>(), any::<Index>(), edit_char()), 0..=MAX_EDITS),
        any::<bool>(),
        any::<Index>(),
    )
        .prop_map(move |(edits, cut, at)| {
            let mut chars: Vec<char> = sample.chars().collect();
            for (kind, i, c) in edits {
                apply(&mut chars, kind, i, c);
            }
            if cut && !chars.is_empty() {
                let n = at.index(chars.len());
                chars.truncate(n);
            }
            chars.into_iter().collect()
        })
}

/// `sample` with up to eight bytes replaced, inserted or removed and,
/// half the time, cut short.
pub fn mutated_bytes(sample: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec((any::<u8>(), any::<Index>(), any::<u8>()), 0..=MAX_EDITS),
        any::<bool>(),
        any::<Index>(),
    )
        .prop_map(move |(edits, cut, at)| {
            let mut bytes = sample.to_vec();
            for (kind, i, b) in edits {
                apply(&mut bytes, kind, i, b);
            }
            if cut && !bytes.is_empty() {
                let n = at.index(bytes.len());
                bytes.truncate(n);
            }
            bytes
        })
}

/// Text made of the [`SIGNIFICANT`] characters and any others, mixed.
pub fn noisy_text() -> impl Strategy<Value = String> {
    prop::collection::vec(edit_char(), 0..200).prop_map(|c| c.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn mutations_stay_near_the_sample_and_sometimes_differ() {
        let mut runner = TestRunner::deterministic();
        let sample = "{\"name\": \"carina\", \"size\": 1024}";
        let strategy = mutated_text(sample);
        let mut differs = 0;
        for _ in 0..200 {
            let v = strategy.new_tree(&mut runner).expect("a value").current();
            assert!(v.chars().count() <= sample.chars().count() + MAX_EDITS);
            if v != sample {
                differs += 1;
            }
        }
        assert!(differs > 100, "{differs} of 200 differ");
    }
}
