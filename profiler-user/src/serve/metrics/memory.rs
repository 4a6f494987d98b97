//! `/metrics` for the memory budget (see `crate::memory`).

use super::exposition::write_family;

/// The memory budget: each pool's use, limit, peak and refusals, and the daemon's anonymous
/// memory against the plan (see `memory`).
pub fn render(out: &mut String) {
    let pools = crate::memory::pools();
    let by_pool = |f: &dyn Fn(&crate::memory::Pool) -> u64| -> Vec<(String, f64)> {
        pools.iter().map(|p| (format!("{{pool=\"{}\"}}", p.name), f(p) as f64)).collect()
    };
    write_family(
        out,
        "profiler_memory_pool_bytes",
        "gauge",
        "Bytes each part of the memory budget holds now.",
        by_pool(&|p| p.used()),
    );
    write_family(
        out,
        "profiler_memory_pool_limit_bytes",
        "gauge",
        "Bytes each part of the memory budget may hold.",
        by_pool(&|p| p.limit()),
    );
    write_family(
        out,
        "profiler_memory_pool_peak_bytes",
        "gauge",
        "The most bytes each part of the memory budget held.",
        by_pool(&|p| p.peak()),
    );
    write_family(
        out,
        "profiler_memory_refused_total",
        "counter",
        "Requests a part of the memory budget refused: unwind tables not built (frame pointers), symbol tables not \
         read (module+offset names), caches started over, perf maps not read on.",
        by_pool(&|p| p.refused()),
    );
    let watch = &crate::memory::watch::anon_bytes;
    write_family(
        out,
        "profiler_memory_anon_bytes",
        "gauge",
        "The daemon's anonymous memory (RssAnon), and its peak.",
        vec![
            ("{at=\"now\"}".into(), watch() as f64),
            ("{at=\"peak\"}".into(), crate::memory::watch::peak_anon_bytes() as f64),
        ],
    );
    write_family(
        out,
        "profiler_memory_sheds_total",
        "counter",
        "Times the daemon's memory passed its budget and the symbol and stack caches were dropped.",
        vec![(String::new(), crate::memory::watch::sheds() as f64)],
    );
}
