//! Clock offsets and the daemon's own resource use.

use std::time::Duration;

/// `CLOCK_REALTIME - clock` in ns. BPF stamps samples with boot time (monotonic, counts
/// suspend) and the kernel log with monotonic time; the store keeps wall-clock time. Re-read on
/// every flush so NTP steps are followed.
pub fn unix_offset(clock: libc::clockid_t) -> i128 {
    let read = |clock| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: valid clock id and pointer.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
    };
    let from = read(clock);
    read(libc::CLOCK_REALTIME) - from
}

pub fn boot_to_unix_offset() -> i128 {
    unix_offset(libc::CLOCK_BOOTTIME)
}

/// Resident set size and CPU time of this process.
pub fn self_usage() -> (u64, Duration) {
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096);
    // SAFETY: an all-zero rusage is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (rss, tv(usage.ru_utime) + tv(usage.ru_stime))
}
