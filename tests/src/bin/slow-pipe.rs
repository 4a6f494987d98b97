//! A reader blocked on a slow pipe for a known time: a writer thread writes one byte every
//! PERIOD_MS; the main thread reads them one at a time in `offcpu_slow_reader`, timing each
//! `read` (the time it was blocked, as the reader itself measured it): first WARMUP bytes, from
//! the same place as the measured reads (a thread's first long wait has no stack, its next
//! blocking switch-out from a new place is walked within a per-CPU budget that a loaded machine
//! spends early each second, and the daemon reads the process's unwind tables once it waits),
//! then, after a pause of PAUSE_MS outside that function (its waits fall in seconds before the
//! measured ones), READS bytes. Prints `blocked_ns=N from_ns=A to_ns=B` for the measured reads
//! (unix ns).
//!
//! usage: slow-pipe WARMUP READS PERIOD_MS [PAUSE_MS]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn read_byte(fd: i32) {
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a live buffer.
    let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
    assert_eq!(n, 1, "read from the pipe");
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
    let (warmup, reads, period_ms, pause_ms) = match args[..] {
        [w, r, p] => (w, r, p, 2500),
        [w, r, p, q] => (w, r, p, q),
        _ => {
            eprintln!("usage: slow-pipe WARMUP READS PERIOD_MS [PAUSE_MS]");
            std::process::exit(2);
        }
    };
    let mut fds = [0i32; 2];
    // SAFETY: a fresh pipe into a two-element array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    let (r, w) = (fds[0], fds[1]);
    let (go, measured) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let write = || {
            std::thread::sleep(Duration::from_millis(period_ms));
            // SAFETY: writing one byte from a live buffer.
            let _ = unsafe { libc::write(w, b"x".as_ptr().cast(), 1) };
        };
        (0..warmup).for_each(|_| write());
        // No byte waits in the pipe through the pause: the measured reads block from the first.
        if measured.recv().is_ok() {
            (0..reads).for_each(|_| write());
        }
    });
    // Called from one call site, so the warm-up blocks from the measured reads' place.
    let mut blocked = 0;
    let (mut from, mut to) = (0, 0);
    for phase in 0..2 {
        if phase == 1 {
            std::thread::sleep(Duration::from_millis(pause_ms));
            go.send(()).expect("the writer is there");
            from = unix_ns();
        }
        blocked = offcpu_slow_reader(r, if phase == 0 { warmup } else { reads } as u32);
        to = unix_ns();
    }
    println!("blocked_ns={blocked} from_ns={from} to_ns={to}");
}
