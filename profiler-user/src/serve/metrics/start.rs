//! `/metrics` for the daemon's start (see `crate::collect::start`).

use super::exposition::write_family;
use crate::collect::start::{Figures, Moment};

/// Seconds and CPU seconds from the process's start to the sampler attached and to the stack
/// walkers loaded (absent until each came).
pub fn render(out: &mut String, f: &Figures) {
    let at = |pick: fn(&Moment) -> f64| -> Vec<(String, f64)> {
        [("sampling", f.sampling), ("walkers", f.walkers)]
            .into_iter()
            .filter_map(|(until, m)| Some((format!("{{until=\"{until}\"}}"), pick(&m?))))
            .collect()
    };
    write_family(
        out,
        "profiler_start_seconds",
        "gauge",
        "Seconds from the daemon's start until the sampler was attached (until=\"sampling\") and until the stack walkers were loaded (until=\"walkers\").",
        at(|m| m.seconds),
    );
    write_family(
        out,
        "profiler_start_cpu_seconds",
        "gauge",
        "CPU seconds the daemon had used by those moments (mostly the kernel verifying its BPF programs).",
        at(|m| m.cpu_seconds),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_moment_that_came_is_a_series() {
        let mut out = String::new();
        let m = Moment { seconds: 0.25, cpu_seconds: 0.125 };
        render(&mut out, &Figures { sampling: Some(m), walkers: None });
        assert!(out.contains("profiler_start_seconds{until=\"sampling\"} 0.25"), "{out}");
        assert!(out.contains("profiler_start_cpu_seconds{until=\"sampling\"} 0.125"), "{out}");
        assert!(!out.contains("walkers\"}"), "{out}");
    }
}
