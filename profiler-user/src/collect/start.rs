//! How long the start took, and how much CPU: from the process's start to the sampler attached
//! (samples are taken from then on) and to every stack walker loaded (full stacks from then on),
//! for the log and `/metrics`. Most of the start is the kernel verifying BPF programs, CPU time
//! the daemon's own threads are charged for.

use std::sync::Mutex;

/// Wall-clock and CPU seconds since the process started, at one moment of the start.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moment {
    pub seconds: f64,
    pub cpu_seconds: f64,
}

impl Moment {
    /// Now: this process's age (from `/proc/self/stat`'s start time against the boot clock)
    /// and its CPU time (all its threads, user and system).
    pub fn now() -> Self {
        Self { seconds: age().unwrap_or(0.0), cpu_seconds: cpu() }
    }
}

/// The start's figures; `None` until that moment came.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    /// The sampler attached to every CPU.
    pub sampling: Option<Moment>,
    /// The stack walkers (tables, scan, Python frames) loaded.
    pub walkers: Option<Moment>,
}

static FIGURES: Mutex<Figures> = Mutex::new(Figures { sampling: None, walkers: None });

pub fn figures() -> Figures {
    *FIGURES.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn record(set: impl FnOnce(&mut Figures)) {
    set(&mut FIGURES.lock().unwrap_or_else(|p| p.into_inner()));
}

fn cpu() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage for the call to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Seconds since this process started (10 ms resolution: the start time is in clock ticks).
fn age() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let start_ticks: f64 = started_ticks(&stat)?;
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 || hz <= 0.0 {
        return None;
    }
    let now = ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9;
    Some((now - start_ticks / hz).max(0.0))
}

/// Field 22 of `/proc/PID/stat` (`starttime`), counted after the command's closing parenthesis
/// (a command may hold spaces and parentheses).
fn started_ticks(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_past_a_command_with_spaces_and_parentheses() {
        let stat = "4242 (a) b (c)) R 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 0 0";
        assert_eq!(started_ticks(stat), Some(987654.0));
        assert_eq!(started_ticks("garbage"), None);
    }

    #[test]
    fn this_process_is_younger_than_the_machine_and_has_used_some_cpu() {
        let m = Moment::now();
        assert!(m.seconds > 0.0 && m.seconds < 1e7, "{m:?}");
        assert!(m.cpu_seconds > 0.0, "{m:?}");
    }
}
