//! A reader blocked on a slow pipe for a known time: a writer thread writes one byte every
//! PERIOD_MS; the main thread reads them one at a time, first WARMUP bytes in `offcpu_warmup`
//! (a thread's first long wait has no stack, and the daemon reads the process's unwind tables
//! once it waits), then READS bytes in `offcpu_slow_reader`, timing each `read` (the time it
//! was blocked, as the reader itself measured it). Prints `blocked_ns=N from_ns=A to_ns=B` for
//! the measured reads (unix ns).
//!
//! usage: slow-pipe WARMUP READS PERIOD_MS

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn read_byte(fd: i32) {
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a live buffer.
    let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
    assert_eq!(n, 1, "read from the pipe");
}

#[unsafe(no_mangle)]
#[inline(never)]
pub fn offcpu_warmup(fd: i32, n: u32) {
    for _ in 0..n {
        read_byte(std::hint::black_box(fd));
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
pub fn offcpu_slow_reader(fd: i32, n: u32) -> u64 {
    let mut blocked = 0u64;
    for _ in 0..n {
        let t = Instant::now();
        read_byte(std::hint::black_box(fd));
        blocked += t.elapsed().as_nanos() as u64;
    }
    blocked
}

fn unix_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let [warmup, reads, period_ms] = args[..] else {
        eprintln!("usage: slow-pipe WARMUP READS PERIOD_MS");
        std::process::exit(2);
    };
    let mut fds = [0i32; 2];
    // SAFETY: a fresh pipe into a two-element array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    let (r, w) = (fds[0], fds[1]);
    let total = warmup + reads;
    std::thread::spawn(move || {
        for _ in 0..total {
            std::thread::sleep(Duration::from_millis(period_ms));
            // SAFETY: writing one byte from a live buffer.
            let _ = unsafe { libc::write(w, b"x".as_ptr().cast(), 1) };
        }
    });
    offcpu_warmup(r, warmup as u32);
    let from = unix_ns();
    let blocked = offcpu_slow_reader(r, reads as u32);
    let to = unix_ns();
    println!("blocked_ns={blocked} from_ns={from} to_ns={to}");
}
