use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::{
    model::{Sample, Stack},
    store::{StoreWriter, format::NS_PER_SEC, segments_dir, writer::WriterLimits},
};

const T0: u64 = 1_795_000_000 * NS_PER_SEC;

fn arb_sample() -> impl Strategy<Value = Sample> {
    let frame = prop::sample::select(vec!["main", "spin", "a;b", "read", "vfs_read", "x y", "é"]);
    (
        0u64..150_000_000, // µs within 150 s: three segments
        0u32..4,
        1u32..5,
        prop::sample::select(vec!["app", "db", "semi;colon"]),
        prop::collection::vec(frame, 0..6),
        0usize..6,
    )
        .prop_map(|(us, cpu, pid, comm, frames, user)| Sample {
            ts_ns: T0 + us * 1000,
            cpu,
            pid,
            tid: pid * 10 + cpu,
            cgroup_id: u64::from(pid),
            workload: Default::default(),
            comm: Arc::from(comm),
            stack: Arc::new(Stack::new(frames.iter().map(|f| Arc::from(*f)).collect(), user.min(frames.len()))),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any samples, written in any flush pattern with any dictionary cap, then any window
    /// and filter: the store's answer equals a naive count over the same samples.
    #[test]
    fn store_answers_like_a_naive_count(
        samples in prop::collection::vec(arb_sample(), 1..300),
        flush_every in 1usize..100,
        dict_cap in 1usize..50,
        from_us in 0u64..160_000_000,
        len_us in 1u64..160_000_000,
        cpus in prop::collection::vec(0u32..4, 0..3),
        pid in prop::option::of(1u32..5),
        comm in prop::option::of(prop::sample::select(vec!["app", "db", "semi;colon"])),
        function in prop::option::of(prop::sample::select(vec!["main", "a;b", "vfs_read", "absent"])),
    ) {
        let dir = tempfile::tempdir().unwrap();
        crate::store::create_and_lock(dir.path()).unwrap();
        let mut w = StoreWriter::with_limits(&segments_dir(dir.path()), WriterLimits { dict_cap, max_pending: 1 << 20 });
        for (i, s) in samples.iter().enumerate() {
            w.push(s);
            if i % flush_every == 0 {
                w.flush(s.ts_ns).unwrap();
            }
        }
        w.flush(T0).unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let window = Window::new(T0 + from_us * 1000, T0 + (from_us + len_us) * 1000).unwrap();
        let filter = Filter {
            cpus,
            pid,
            comm: comm.map(String::from),
            function: function.map(String::from),
            ..Default::default()
        };
        let want = super::tests::naive(&samples, window, &filter);
        match fold(&mut store, window, &filter) {
            Ok(got) => prop_assert_eq!(got.stacks, want),
            Err(e) => prop_assert!(want.is_empty(), "{}", e),
        }
        prop_assert!(store.take_warnings().is_empty());
    }
}
