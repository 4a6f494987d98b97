//! `perf script` text, as FlameScope loads it (and speedscope imports it): a header, then per
//! sample a line `comm pid/tid [cpu] seconds: PERIOD cpu-clock:` (the period in ns, as perf
//! prints it for cpu-clock: 10101010 at 99 Hz), its frames leaf first one per line, and a blank
//! line. A user frame reads `ADDR name (FILE)` with the file it is mapped from, as perf prints
//! it (FlameScope colours a frame by that file: `[...]` is kernel, `/tmp/perf-*` JIT, a path
//! user). The store keeps functions, not instructions, so ADDR is the function's address in
//! its file (an ELF virtual address), where perf has the sampled instruction's; a frame nothing
//! named (`libc.so.6+0x3fb9c`) is `[unknown] (FILE)` at its own address, as perf writes it.
//! Kernel frames are `0 name ([kernel.kallsyms])`: their addresses are not stored (they would
//! give away the kernel's randomised base in every shared export).

use std::io::Write;

use super::ExportError;
use crate::{query::SampleRef, symbolize, untrusted};

pub fn write_header(mut out: impl Write) -> Result<(), ExportError> {
    writeln!(out, "# ========")?;
    writeln!(out, "# captured by : profiler export --format perf-script")?;
    writeln!(out, "# event : name = cpu-clock, type = 1 (PERF_TYPE_SOFTWARE)")?;
    writeln!(out, "# ========")?;
    writeln!(out, "#")?;
    Ok(())
}

pub fn write_sample(s: &SampleRef<'_>, mut out: impl Write) -> Result<(), ExportError> {
    // cpu-clock counts nanoseconds: one sample at F Hz stands for 1e9 / F of them. Data from
    // before the store recorded its frequency says 1.
    let period = s.frequency_hz.map_or(1, |hz| 1_000_000_000 / hz.max(1));
    for _ in 0..s.count.max(1) {
        let (secs, micros) = (s.ts_ns / 1_000_000_000, (s.ts_ns % 1_000_000_000) / 1000);
        let comm = untrusted::perf_comm(s.comm);
        writeln!(out, "{comm} {:>7}/{:<7} [{:03}] {secs}.{micros:06}: {period} cpu-clock: ", s.pid, s.tid, s.cpu)?;
        for (i, &(name, kernel)) in s.frames.iter().enumerate().rev() {
            if kernel {
                // Each name by perf script's rule: one line, no parser-reserved pattern, no fake mark.
                writeln!(out, "\t{:>16x} {} ([kernel.kallsyms])", 0, untrusted::perf_frame(name, false))?;
                continue;
            }
            let (file, addr) = s.locations.get(i).copied().unwrap_or(("", 0));
            let unnamed = symbolize::parse_module_offset(name);
            let (name, addr) = match unnamed {
                Some((_, vaddr)) => ("[unknown]".into(), vaddr),
                None => (untrusted::perf_frame(name, true), addr),
            };
            // Without a stored location (older data), the module an unnamed frame carries.
            let file = match (file, unnamed) {
                ("", Some((module, _))) => untrusted::perf_file(module),
                ("", None) => "[unknown]".into(),
                (file, _) => untrusted::perf_file(file),
            };
            writeln!(out, "\t{addr:>16x} {name} ({file})")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// A sample read back from perf-script text.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub comm: String,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub ts_us: u64,
    /// Root first.
    pub frames: Vec<(String, bool)>,
}

/// Parses perf-script text (ours, or `perf script`'s default output).
pub fn parse(text: &str) -> Vec<Parsed> {
    let mut out = Vec::new();
    let mut cur: Option<Parsed> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            if let Some(mut p) = cur.take() {
                p.frames.reverse();
                out.push(p);
            }
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            let Some(p) = cur.as_mut() else { continue };
            let rest = line.trim_start();
            let (addr, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let (name, module) = match rest.rsplit_once(" (") {
                Some((n, m)) => (n.to_string(), m.trim_end_matches(')').to_string()),
                None => (rest.to_string(), String::new()),
            };
            let kernel = module == "[kernel.kallsyms]";
            // An unnamed frame in a known module: `module+0xADDR` (perf's own output has the
            // run-time address there, ours the ELF virtual address).
            let name = match u64::from_str_radix(addr, 16) {
                Ok(addr) if name == "[unknown]" && module != "[unknown]" && !kernel => {
                    symbolize::module_offset(module.rsplit('/').next().unwrap_or(&module), addr)
                }
                _ => name,
            };
            p.frames.push((name, kernel));
            continue;
        }
        // comm pid/tid [cpu] secs.micros: ...
        let Some((head, _)) = line.split_once(": ") else { continue };
        let Some(cpu_start) = head.rfind(" [") else { continue };
        let (left, right) = head.split_at(cpu_start);
        let Some((cpu, time)) = right.trim().trim_start_matches('[').split_once(']') else { continue };
        let Some((comm, ids)) = left.trim_end().rsplit_once(' ').map(|(c, i)| (c.trim_end(), i)) else { continue };
        let (pid, tid) = ids.split_once('/').unwrap_or((ids, ids));
        let time = time.trim();
        let (s, us) = time.split_once('.').unwrap_or((time, "0"));
        cur = Some(Parsed {
            comm: comm.trim().to_string(),
            pid: pid.trim().parse().unwrap_or(0),
            tid: tid.trim().parse().unwrap_or(0),
            cpu: cpu.trim().parse().unwrap_or(0),
            ts_us: s.parse::<u64>().unwrap_or(0) * 1_000_000 + us.parse::<u64>().unwrap_or(0),
            frames: Vec::new(),
        });
    }
    if let Some(mut p) = cur.take() {
        p.frames.reverse();
        out.push(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_stacks_counts_and_times() {
        let frames: Vec<(&str, bool)> = vec![
            ("libc.so.6+0x3fb9c", false),
            ("main", false),
            ("std::vec::Vec<T>::push (inlined)", false),
            ("entry_SYSCALL_64_after_hwframe", true),
            ("read_zero", true),
        ];
        let locations = [
            ("/usr/lib/x86_64-linux-gnu/libc.so.6", 0x3fb9c),
            ("/srv/my (odd) prog (deleted)", 0x1139),
            ("[vdso]", 0x9a0),
        ];
        let samples = [
            SampleRef {
                ts_ns: 1_795_000_000_123_456_789,
                cpu: 1,
                pid: 42,
                tid: 43,
                comm: "dd",
                frames: &frames,
                locations: &locations,
                count: 1,
                frequency_hz: Some(99),
                workload: "",
            },
            SampleRef {
                ts_ns: 1_795_000_001_000_001_000,
                cpu: 12,
                pid: 7,
                tid: 7,
                comm: "my prog",
                frames: &frames[..2],
                locations: &[],
                count: 2,
                frequency_hz: None,
                workload: "",
            },
        ];
        let mut out = Vec::new();
        write_header(&mut out).unwrap();
        for s in &samples {
            write_sample(s, &mut out).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        // As perf prints them: the period in ns, each user frame's file and address.
        assert!(text.contains("[001] 1795000000.123456: 10101010 cpu-clock: \n"), "{text}");
        assert!(text.contains("\n\t           3fb9c [unknown] (/usr/lib/x86_64-linux-gnu/libc.so.6)\n"), "{text}");
        assert!(text.contains("\n\t            1139 main (/srv/my _odd_ prog)\n"), "{text}");
        // The vDSO is user code: not in brackets, which readers take for the kernel.
        assert!(text.contains("\n\t             9a0 std::vec::Vec<T>::push (inlined) (linux-vdso.so.1)\n"), "{text}");
        assert!(text.contains("\n\t               0 read_zero ([kernel.kallsyms])\n"), "{text}");
        // Without locations (data from before they were stored): what the name says.
        assert!(text.contains("\n\t           3fb9c [unknown] (libc.so.6)\n"), "{text}");
        assert!(text.contains("\n\t               0 main ([unknown])\n"), "{text}");
        let parsed = parse(&text);
        assert_eq!(parsed.len(), 3, "counts become repeated samples");
        assert_eq!(parsed[0].comm, "dd");
        assert_eq!((parsed[0].pid, parsed[0].tid, parsed[0].cpu), (42, 43, 1));
        assert_eq!(parsed[0].ts_us, 1_795_000_000_123_456);
        let want: Vec<(String, bool)> = frames.iter().map(|&(n, k)| (n.to_string(), k)).collect();
        assert_eq!(parsed[0].frames, want);
        assert_eq!(parsed[1].comm, "my prog");
        assert_eq!(parsed[1], parsed[2]);
        assert_eq!(parsed[1].frames.len(), 2);
        assert_eq!(parsed[1].ts_us, 1_795_000_001_000_001);
    }

    /// inferno-collapse-perf (the library behind `inferno-collapse-perf`, which follows
    /// stackcollapse-perf.pl) reads hostile names as one record each, with every frame kept
    /// and only the kernel frame marked kernel.
    #[test]
    fn hostile_names_survive_inferno_collapse_perf() {
        use inferno::collapse::{Collapse, perf};
        let user = [
            "evil;name_[k]",
            "spin\nfake 1",
            "x 12",
            "foo+0x1f",
            "(anonymous namespace)::f",
            "a->b",
            "tab\tname\x1b[2J\x07",
            "x_[k]",
        ];
        let comms = ["evil\x1b]0;x\x07", "a\nb 5", "x 123 y", "semi;colon", "tab\there", "x_[k]"];
        let mut frames: Vec<(&str, bool)> = user.iter().map(|&n| (n, false)).collect();
        frames.push(("ksys_read", true));
        let mut text = Vec::new();
        write_header(&mut text).unwrap();
        for (i, comm) in comms.iter().enumerate() {
            let s = SampleRef {
                ts_ns: 1_000_000_000 + i as u64,
                cpu: 0,
                pid: 10 + i as u32,
                tid: 10,
                comm,
                frames: &frames,
                locations: &[],
                count: 3,
                frequency_hz: None,
                workload: "",
            };
            write_sample(&s, &mut text).unwrap();
        }
        let mut opt = perf::Options::default();
        opt.annotate_kernel = true;
        let mut folded = Vec::new();
        perf::Folder::from(opt).collapse(&text[..], &mut folded).unwrap();
        let folded = String::from_utf8(folded).unwrap();
        assert!(!folded.contains(|c: char| c.is_control() && c != '\n'), "{folded:?}");
        let lines: Vec<&str> = folded.lines().collect();
        assert_eq!(lines.len(), comms.len(), "one stack per comm: {folded}");
        for line in lines {
            let (stack, count) = line.rsplit_once(' ').unwrap();
            assert_eq!(count, "3", "{line}");
            let names: Vec<&str> = stack.split(';').collect();
            assert_eq!(names.len(), 1 + frames.len(), "every frame kept, none split: {line}");
            let kernel: Vec<&&str> = names.iter().filter(|n| n.ends_with("_[k]")).collect();
            assert_eq!(kernel, [&"ksys_read_[k]"], "only the kernel frame reads as kernel: {line}");
        }
        // Our own reader gets every sample back, one record each.
        assert_eq!(parse(&String::from_utf8(text).unwrap()).len(), 3 * comms.len());
    }
}
