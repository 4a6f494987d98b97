//! A process whose names are hostile, as any local user can make them: its threads rename
//! themselves (prctl PR_SET_NAME) to names with ESC, BEL, CR, LF, tab, `;`, a trailing number
//! and a fake kernel mark, and spin in functions whose symbols hold the same characters. The
//! hostile-names test checks that every output of the profiler stays well-formed.
//!
//! usage: hostile-names CPU SECONDS

use std::time::{Duration, Instant};

/// Thread names (comm: at most 15 bytes), the first for the main thread.
pub const COMMS: [&str; 5] = ["\x1b[31mE\x07\r\n;x 12", "t\tab;c 5", "\x07x_[k]", "a\nb 7", "\x1b]0;pwn\x07"];

/// Spins until `deadline` under a name that holds `;` and ends like a kernel frame.
#[unsafe(export_name = "evil;name_[k]")]
#[inline(never)]
pub extern "C" fn evil_semicolon_kernel_mark(deadline: &Instant) -> u64 {
    spin(deadline)
}

/// Spins under a name with an escape sequence, a newline and a trailing number.
#[unsafe(export_name = "spin\x1b[2J\nfake 12")]
#[inline(never)]
pub extern "C" fn evil_escape_newline_number(deadline: &Instant) -> u64 {
    spin(deadline)
}

/// Spins under a name that is only a fake kernel mark.
#[unsafe(export_name = "x_[k]")]
#[inline(never)]
pub extern "C" fn evil_fake_kernel(deadline: &Instant) -> u64 {
    spin(deadline)
}

#[inline(never)]
fn spin(deadline: &Instant) -> u64 {
    let mut x = 0u64;
    while Instant::now() < *deadline {
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

fn rename(name: &str) {
    let mut buf = [0u8; 16];
    buf[..name.len().min(15)].copy_from_slice(&name.as_bytes()[..name.len().min(15)]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr()) };
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(cpu), Some(secs)) =
        (args.get(1).and_then(|a| a.parse::<usize>().ok()), args.get(2).and_then(|a| a.parse::<f64>().ok()))
    else {
        eprintln!("usage: hostile-names CPU SECONDS");
        std::process::exit(2);
    };
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let spinners: [extern "C" fn(&Instant) -> u64; 3] =
        [evil_semicolon_kernel_mark, evil_escape_newline_number, evil_fake_kernel];
    let threads: Vec<_> = COMMS[1..]
        .iter()
        .enumerate()
        .map(|(i, &name)| {
            let f = spinners[i % spinners.len()];
            std::thread::spawn(move || {
                rename(name);
                integration_tests::pin_to_cpu(cpu).expect("pin");
                f(&deadline)
            })
        })
        .collect();
    rename(COMMS[0]);
    integration_tests::pin_to_cpu(cpu).unwrap_or_else(|e| {
        eprintln!("hostile-names: cannot pin to CPU {cpu}: {e}");
        std::process::exit(1);
    });
    let mut x = evil_escape_newline_number(&deadline);
    for t in threads {
        x ^= t.join().unwrap_or(0);
    }
    println!("{x}");
}
