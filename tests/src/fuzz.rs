//! What the fuzz tests share: a small seeded generator, so a failure names
//! the seed and case that reproduce it, and byte-level mutation of valid
//! messages.

/// xorshift64*: small, seeded, enough to spread inputs.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value; zero is avoided).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (0 for `n` of 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Up to `max` random bytes.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// `bytes` with one to eight bytes replaced, inserted or removed.
    pub fn mutate(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        for _ in 0..=self.below(8) {
            let at = self.below(bytes.len() + 1);
            match self.below(3) {
                0 if at < bytes.len() => bytes[at] = self.next_u64() as u8,
                1 => bytes.insert(at, self.next_u64() as u8),
                _ if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => {}
            }
        }
        bytes
    }
}

/// The seed and the number of cases of a fuzz test: `CARINA_FUZZ_SEED`
/// and `CARINA_FUZZ_CASES`, else the defaults given.
pub fn settings(default_seed: u64, default_cases: usize) -> (u64, usize) {
    let env = |name: &str| std::env::var(name).ok();
    (
        env("CARINA_FUZZ_SEED")
            .and_then(|v| v.parse().ok())
            .unwrap_or(default_seed),
        env("CARINA_FUZZ_CASES")
            .and_then(|v| v.parse().ok())
            .unwrap_or(default_cases),
    )
}
