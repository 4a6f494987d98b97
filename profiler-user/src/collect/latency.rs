//! The BPF programs' latency histograms (`profiler_common::latency_bucket`: NET_RX waits,
//! run-queue waits, reclaim stalls), kept cumulative in the kernel: the growth between two
//! reads, the sum of several reads, and quantiles. One place, so that every histogram is
//! differenced, added and read the same way.

/// What each bucket gained from `prev` to `now`. A bucket that went back (the programs were
/// reloaded) gains nothing; one `prev` lacks counts from zero.
pub fn growth(now: &[u64], prev: &[u64]) -> Vec<u64> {
    now.iter().enumerate().map(|(i, &v)| v.saturating_sub(prev.get(i).copied().unwrap_or(0))).collect()
}

/// Adds `other`'s buckets into `into`, growing it to `other`'s length.
pub fn add(into: &mut Vec<u64>, other: &[u64]) {
    if into.len() < other.len() {
        into.resize(other.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(other) {
        *a += b;
    }
}

/// The upper bound (ns) of the histogram bucket holding the `q` quantile (at most 12.5 % over
/// the true value: `profiler_common::latency_bucket`).
pub fn quantile_ns(histogram: &[u64], q: f64) -> Option<u64> {
    let total: u64 = histogram.iter().sum();
    if total == 0 {
        return None;
    }
    let target = (total as f64 * q).ceil() as u64;
    let mut seen = 0;
    for (i, &n) in histogram.iter().enumerate() {
        seen += n;
        if seen >= target {
            return Some(profiler_common::latency_bucket_end(i as u32));
        }
    }
    None
}

/// The histogram the kernel side would hold after `n` waits of `ns` for each `(ns, n)`: what
/// tests of every reader of these histograms start from.
#[cfg(test)]
pub fn histogram(waits_ns: &[(u64, u64)]) -> Vec<u64> {
    let mut h = vec![0u64; profiler_common::LATENCY_BUCKETS as usize];
    for &(ns, n) in waits_ns {
        h[profiler_common::latency_bucket(ns) as usize] += n;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_overstate_by_at_most_an_eighth() {
        let h = histogram(&[(1_000, 98), (8_000_000, 2)]);
        assert_eq!(quantile_ns(&h, 0.5), Some(1_024));
        assert_eq!(quantile_ns(&h, 0.99), Some(8_388_608));
        assert_eq!(quantile_ns(&[0; 4], 0.99), None);
        // Below 8 ns buckets are whole powers of two (no wait is that short).
        for ns in [8, 9, 15, 1_000, 4_190_000, 4_999_999, 123_456_789] {
            let end = profiler_common::latency_bucket_end(profiler_common::latency_bucket(ns));
            assert!(end > ns && end as f64 <= ns as f64 * 1.125 + 1.0, "{ns} ns reads as up to {end}");
        }
    }

    #[test]
    fn growth_and_sums() {
        assert_eq!(growth(&[5, 7, 9], &[2, 7]), vec![3, 0, 9], "a bucket the previous read lacked");
        assert_eq!(growth(&[1, 1], &[4, 0]), vec![0, 1], "a counter that went back gains nothing");
        let mut sum = vec![1];
        add(&mut sum, &[2, 3]);
        add(&mut sum, &[]);
        assert_eq!(sum, vec![3, 3]);
    }
}
