//! Every sample of a window, for exports that keep them one by one.

use super::{Filter, QueryError, Window, check_filter};
use crate::{
    budget,
    store::{
        Meta, Store,
        reader::{BlockView, Need},
    },
};

/// One sample as exporters see it.
pub struct SampleRef<'a> {
    pub ts_ns: u64,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    pub comm: &'a str,
    /// Root first: (name, kernel frame?).
    pub frames: &'a [(&'a str, bool)],
    /// Where each frame lives, as `frames` lists them: (file, address; `model::Location`), with
    /// "" for a kernel frame or one nothing is known of. May be shorter than `frames` (empty).
    pub locations: &'a [(&'a str, u64)],
    /// Samples this row stands for (1 but in rolled-up data).
    pub count: u64,
    /// The frequency the sample was taken at, when its segment records it (format 4).
    pub frequency_hz: Option<u64>,
    /// The process's workload as stored (`model::Sample::workload`): JSON, or empty.
    pub workload: &'a str,
}

/// Calls `f` for every non-idle sample of `window` that matches `filter`, in time order per
/// block.
pub fn for_each_sample(
    store: &mut Store,
    window: Window,
    filter: &Filter,
    mut f: impl FnMut(&SampleRef<'_>),
) -> Result<u64, QueryError> {
    check_filter(filter, Meta::read(store.data_dir()).as_ref())?;
    let mut n = 0;
    let mut ids = Vec::new();
    let mut places = Vec::new();
    let budget = budget::ScanBudget::default();
    budget::scan(store, window.from_ns, window.to_ns, Need::Samples, budget, &mut |b: BlockView<'_>| {
        let s = b.samples.expect("samples decoded");
        let matcher = filter.matcher(b.dict);
        let mut order: Vec<(u64, usize)> = s.timestamps(b.header.start_ns).enumerate().map(|(i, t)| (t, i)).collect();
        order.sort_unstable();
        for (ts, i) in order {
            if !window.contains(ts) || !matcher.keeps(s, i) {
                continue;
            }
            b.dict.frames(s.stack[i], &mut ids);
            let frames: Vec<(&str, bool)> =
                ids.iter().map(|&(f, k)| (b.dict.strings[f as usize].as_str(), k)).collect();
            b.dict.locations(s.stack[i], &mut places);
            let locations: Vec<(&str, u64)> = places.iter().map(|&l| (b.dict.file(l), l.addr)).collect();
            n += s.count(i);
            f(&SampleRef {
                ts_ns: ts,
                cpu: s.cpu[i],
                pid: s.pid[i],
                tid: s.tid[i],
                comm: &b.dict.strings[s.comm[i] as usize],
                frames: &frames,
                locations: &locations,
                count: s.count(i),
                frequency_hz: b.identity.map(|id| id.frequency_hz.max(1)),
                workload: s.workload(i).map_or("", |w| b.dict.strings[w as usize].as_str()),
            });
        }
    })?;
    Ok(n)
}
