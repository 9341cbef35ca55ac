//! csi-sanity's (ginkgo's) closing counts, read from its output: the host
//! `sanity` tier and the `vm` tier's guest judge a run by them.

/// The counts csi-sanity's summary lines report.
#[derive(Debug, Default, PartialEq)]
pub struct Summary {
    pub ran: u32,
    pub total: u32,
    pub passed: u32,
    pub failed: u32,
    pub skipped: u32,
}

/// Parses ginkgo's closing lines: `Ran 62 of 91 Specs in 30.1 seconds` and
/// `SUCCESS! -- 62 Passed | 0 Failed | 0 Pending | 29 Skipped` (or FAIL!).
pub fn parse_summary(log: &str) -> Option<Summary> {
    let mut s = Summary::default();
    let ran_line = log
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Ran "))?;
    let words: Vec<&str> = ran_line.split_whitespace().collect();
    s.ran = words.get(1)?.parse().ok()?;
    s.total = words.get(3)?.parse().ok()?;
    let counts = log.lines().rev().find(|l| l.contains(" Passed | "))?;
    for part in counts.split('|') {
        let mut it = part.split_whitespace().rev();
        let (Some(word), Some(n)) = (it.next(), it.next()) else {
            continue;
        };
        let n: u32 = n.parse().ok()?;
        match word {
            "Passed" => s.passed = n,
            "Failed" => s.failed = n,
            "Skipped" => s.skipped = n,
            _ => {}
        }
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ginkgo_summary_parses() {
        let log = "...\nRan 62 of 91 Specs in 30.120 seconds\nSUCCESS! -- 62 Passed | 0 Failed | 0 Pending | 29 Skipped\nPASS\n";
        assert_eq!(
            parse_summary(log),
            Some(Summary {
                ran: 62,
                total: 91,
                passed: 62,
                failed: 0,
                skipped: 29
            })
        );
        let log = "Ran 3 of 10 Specs in 1.0 seconds\nFAIL! -- 2 Passed | 1 Failed | 0 Pending | 7 Skipped\n";
        assert_eq!(parse_summary(log).map(|s| s.failed), Some(1));
        assert_eq!(parse_summary("no summary here"), None);
    }
}
