//! `/metrics` for the off-CPU counts (`offcpu`): the settings that bound them and what was
//! recorded, sampled out, dropped, walked and not, since the daemon started.

use super::exposition::write_family;
use crate::offcpu::Status;

pub fn render(s: &Status, out: &mut String) {
    let mut family =
        |name: &str, kind: &str, help: &str, values: Vec<(String, f64)>| write_family(out, name, kind, help, values);
    let one = |v: f64| vec![(String::new(), v)];
    family(
        "profiler_offcpu_threshold_seconds",
        "gauge",
        "Off-CPU waits shorter than this are not recorded.",
        one(s.threshold_ns as f64 / 1e9),
    );
    family(
        "profiler_offcpu_rate_limit_waits_per_second",
        "gauge",
        "Off-CPU waits recorded a second on one CPU before one in profiler_offcpu_sample_weight is kept.",
        one(s.rate_limit as f64),
    );
    family(
        "profiler_offcpu_sample_weight",
        "gauge",
        "Above the rate limit, one off-CPU wait in this many is kept, its time multiplied by it.",
        one(s.sample_every as f64),
    );
    family(
        "profiler_offcpu_switches_total",
        "counter",
        "Context switches the off-CPU program saw (a thread leaving its CPU).",
        one(s.kernel.switches as f64),
    );
    family(
        "profiler_offcpu_long_waits_total",
        "counter",
        "Off-CPU waits at least the threshold long, before the rate limit.",
        one(s.kernel.long_waits as f64),
    );
    family(
        "profiler_offcpu_recorded_waits_total",
        "counter",
        "Off-CPU waits recorded (weighted: a kept wait above the rate limit counts its weight).",
        one(s.recorded_waits as f64),
    );
    family(
        "profiler_offcpu_recorded_seconds_total",
        "counter",
        "Time off CPU recorded, weighted, summed over threads.",
        one(s.recorded_us as f64 / 1e6),
    );
    family(
        "profiler_offcpu_sampled_out_waits_total",
        "counter",
        "Off-CPU waits above the rate limit left out by the sampling (their time is in the kept ones').",
        one(s.kernel.sampled_out as f64),
    );
    family(
        "profiler_offcpu_dropped_waits_total",
        "counter",
        "Off-CPU waits lost: the kernel's count map was full.",
        one(s.kernel.dropped as f64),
    );
    family(
        "profiler_offcpu_stacks_total",
        "counter",
        "Stacks of off-CPU waits by how they were taken: walked, reused (the thread's last walk, same place), \
         skipped (the per-CPU walk budget was spent).",
        vec![
            ("{outcome=\"walked\"}".into(), s.kernel.walked as f64),
            ("{outcome=\"reused\"}".into(), s.kernel.reused as f64),
            ("{outcome=\"skipped\"}".into(), s.kernel.walks_skipped as f64),
        ],
    );
    family(
        "profiler_offcpu_stackless_counts_total",
        "counter",
        "Off-CPU counts stored without their stack (a thread's first long wait, or a stack the kernel's map had \
         no room for).",
        one(s.without_stack as f64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::offcpu::Totals;

    #[test]
    fn the_counts_are_counters_in_base_units() {
        let s = Status {
            threshold_ns: 1_000_000,
            rate_limit: 1000,
            sample_every: 8,
            recorded_us: 1_500_000,
            recorded_waits: 30,
            kernel: Totals { sampled_out: 4, walked: 9, walks_skipped: 2, ..Default::default() },
            ..Default::default()
        };
        let mut out = String::new();
        render(&s, &mut out);
        for line in [
            "profiler_offcpu_threshold_seconds 0.001\n",
            "profiler_offcpu_rate_limit_waits_per_second 1000\n",
            "profiler_offcpu_sample_weight 8\n",
            "# TYPE profiler_offcpu_recorded_waits_total counter\n",
            "profiler_offcpu_recorded_waits_total 30\n",
            "profiler_offcpu_recorded_seconds_total 1.5\n",
            "profiler_offcpu_sampled_out_waits_total 4\n",
            "profiler_offcpu_stacks_total{outcome=\"walked\"} 9\n",
            "profiler_offcpu_stacks_total{outcome=\"skipped\"} 2\n",
        ] {
            assert!(out.contains(line), "{line:?} in {out}");
        }
    }
}
