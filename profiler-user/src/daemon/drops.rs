//! What the reader could not queue: sample records counted per CPU and per second (from the
//! record's header alone: the reader does not parse stacks), event records counted apart (they
//! are not samples, and an event lost is a cgroup or exec the detectors miss, not a lost sample).

use std::collections::BTreeMap;

use profiler_common::{HEADER_LEN, SampleHeader};

use super::queue::{Batch, Source};

const NS_PER_SEC: i128 = 1_000_000_000;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drops {
    /// (unix second, CPU) → sample records dropped.
    pub samples: BTreeMap<(u64, u32), u64>,
    /// Event records dropped.
    pub events: u64,
    /// Records too short for a header (cannot be attributed; counted on CPU 0 at second 0 would
    /// lie, so they are only counted).
    pub unattributed: u64,
}

impl Drops {
    /// Counts a batch that did not fit. `boot_to_unix`: `CLOCK_REALTIME - CLOCK_BOOTTIME` in ns.
    pub fn count(&mut self, batch: &Batch, boot_to_unix: i128) {
        if batch.source == Source::Events {
            self.events += batch.len() as u64;
            return;
        }
        for record in batch.records() {
            match header(record) {
                Some(h) => {
                    let second = ((h.ts_ns as i128 + boot_to_unix).max(0) / NS_PER_SEC) as u64;
                    *self.samples.entry((second, h.cpu)).or_default() += 1;
                }
                None => self.unattributed += 1,
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty() && self.events == 0 && self.unattributed == 0
    }
}

fn header(record: &[u8]) -> Option<SampleHeader> {
    if record.len() < HEADER_LEN {
        return None;
    }
    // SAFETY: SampleHeader is plain old data and the length was checked.
    Some(unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) })
}

#[cfg(test)]
pub(crate) fn sample_record(ts_ns: u64, cpu: u32, pid: u32) -> Vec<u8> {
    let h = SampleHeader { ts_ns, cpu, pid, tid: pid, ..Default::default() };
    let mut b = vec![0u8; HEADER_LEN];
    // SAFETY: the buffer holds a header.
    unsafe { std::ptr::write_unaligned(b.as_mut_ptr().cast(), h) };
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_attributed_to_their_cpu_and_unix_second() {
        let mut b = Batch::new(Source::Samples);
        // Boot time 5.2 s and 5.9 s on CPU 1, 6.1 s on CPU 0; the offset moves them to unix 1000.x.
        for (ts, cpu) in [(5_200_000_000, 1), (5_900_000_000, 1), (6_100_000_000, 0)] {
            b.push(&sample_record(ts, cpu, 7));
        }
        b.push(&[1, 2, 3]);
        let mut d = Drops::default();
        d.count(&b, 995 * NS_PER_SEC);
        assert_eq!(d.samples, BTreeMap::from([((1000, 1), 2), ((1001, 0), 1)]));
        assert_eq!((d.events, d.unattributed), (0, 1));
        let mut e = Batch::new(Source::Events);
        e.push(&[0; 64]);
        d.count(&e, 0);
        assert_eq!(d.events, 1);
    }
}
