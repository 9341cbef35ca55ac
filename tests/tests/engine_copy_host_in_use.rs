//! A HOST copy of a volume its pod keeps writing: HOST sources are not
//! frozen, so the clone is not point-in-time, and this test checks what
//! the documented rule promises instead. A writer appends numbered 4 KiB
//! records (each synced) to a log in the source for the whole copy, beside
//! files nobody writes. The copy completes; the untouched files are
//! exact; the clone's log is whole records from the first, at least those
//! written before the copy started and no byte the writer did not write
//! (a file is copied as long as it was when the copy reached it).

use carina_tests::copy::data::{dir, sha256_bytes, write_file};
use carina_tests::copy::frozen::{RECORD, Writer, check_records};
use carina_tests::copy::{MIB, Node, copy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_copy_while_a_writer_appends_takes_each_file_as_the_copy_reached_it() {
    let test = "a_host_copy_while_a_writer_appends";
    let Some(n) = Node::new(test, None, Some(128 * MIB), None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.host("live-src", 48 * MIB).await;
    let tgt = n.host("live-tgt", 48 * MIB).await;
    let (s, t) = (dir(&src), dir(&tgt));
    // Enough untouched data that the copy runs while the writer writes.
    let still = [
        ("a.bin", write_file(&s.join("a.bin"), 1, 12 * MIB as usize)),
        ("b.bin", write_file(&s.join("b.bin"), 2, 12 * MIB as usize)),
        ("c.txt", write_file(&s.join("c.txt"), 3, 1000)),
    ];
    let writer = Writer::start(s, "log");
    writer.wait_for(32, "the writer's first records").await;

    let before = writer.written();
    let run = copy(e, "live-src", "live-tgt", false).await;
    let after = writer.written();
    let (copied, _) = run.copied();
    let total = writer.finish().await;
    println!("records: {before} before the copy, {after} when it ended, {total} in all");
    assert!(
        after > before,
        "the writer wrote during the copy ({before} records before it, {after} after)"
    );
    assert!(copied.copied);
    let record = e.copy_record("live-tgt").expect("a record");
    assert!(record.complete, "{record:?}");

    for (name, hash) in &still {
        let data = std::fs::read(t.join(name)).expect("a file nobody wrote");
        assert_eq!(&sha256_bytes(&data), hash, "{name} is copied exactly");
    }
    let log = std::fs::read(t.join("log")).expect("the clone's log");
    let records = check_records(&log, "the clone's log");
    assert!(
        records >= before && records <= total,
        "the clone holds {records} records; {before} were written before the copy, {total} in all"
    );
    let source_len = std::fs::metadata(s.join("log")).expect("the log").len();
    assert_eq!(source_len, total * RECORD as u64);
    println!("the clone's log: {records} records, the source's {total} once the writer stopped");
}
