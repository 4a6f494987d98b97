//! What a booted kernel printed on its serial console, and whether it passes.
//!
//! The init script (see `initramfs::init_script`) frames each command's output with marker
//! lines, `@@KT begin NAME` and `@@KT end NAME rc=N`; everything else on the console (kernel
//! messages, qemu's own) is ignored. Pure functions: unit-tested without root or qemu.

use std::collections::BTreeMap;

/// Prefix of every marker line.
pub const MARK: &str = "@@KT";

/// One framed command's output.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Section {
    pub lines: Vec<String>,
    /// The command's exit status; `None` when its end marker never came.
    pub rc: Option<i32>,
}

/// The console, split into what the init script framed.
#[derive(Debug, Default, PartialEq)]
pub struct Console {
    /// `uname -r` inside the guest (`@@KT kernel RELEASE`).
    pub release: Option<String>,
    pub sections: BTreeMap<String, Section>,
    /// The daemon was gone before it became healthy (`@@KT daemon-exited`).
    pub daemon_exited: bool,
    /// The script reached its end (`@@KT done`).
    pub done: bool,
}

pub fn parse(text: &str) -> Console {
    let mut console = Console::default();
    let mut open: Option<(String, Section)> = None;
    for raw in text.lines() {
        let line = raw.trim_end_matches('\r');
        // A kernel message can land before a marker on the same line: find the marker anywhere.
        let marker = line.find(MARK).map(|i| line[i + MARK.len()..].trim());
        match marker {
            Some(rest) => {
                let (word, arg) = rest.split_once(' ').unwrap_or((rest, ""));
                match word {
                    "kernel" => console.release = Some(arg.trim().to_string()),
                    "begin" => open = Some((arg.trim().to_string(), Section::default())),
                    "end" => {
                        // Sections do not nest: an end closes whatever is open.
                        let rc = arg.split_once(" rc=").map_or("", |(_, rc)| rc);
                        if let Some((name, mut section)) = open.take() {
                            section.rc = rc.trim().parse().ok();
                            console.sections.insert(name, section);
                        }
                    }
                    "daemon-exited" => console.daemon_exited = true,
                    "done" => console.done = true,
                    _ => {}
                }
            }
            None => {
                if let Some((_, section)) = open.as_mut() {
                    section.lines.push(line.to_string());
                }
            }
        }
    }
    // A section cut off (the guest died or timed out) is kept, without an exit status.
    if let Some((name, section)) = open {
        console.sections.insert(name, section);
    }
    console
}

/// What a kernel must show.
#[derive(Debug, Clone)]
pub struct Expect {
    pub release: String,
    pub seconds: u64,
    pub frequency_hz: u64,
    pub cpus: u64,
    /// The CPU the busy helper spins on.
    pub busy_cpu: u32,
    pub comm: &'static str,
    pub hot_function: &'static str,
}

/// Figures of a passing run.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub samples: u64,
    pub lost: u64,
    /// Busy share of the busy CPU's fullest second.
    pub busy_share: f64,
    /// Optional kernel features the daemon said it runs without.
    pub degraded: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Pass(Figures),
    /// The daemon refused to start, with this sentence naming the missing feature.
    Refused(String),
    Fail {
        check: &'static str,
        detail: String,
    },
}

fn fail(check: &'static str, detail: impl Into<String>) -> Verdict {
    Verdict::Fail { check, detail: detail.into() }
}

/// The tracepoint groups the daemon must report attached.
pub const TRACEPOINT_GROUPS: [&str; 5] = ["NET_RX/NAPI", "runq", "reclaim", "cgroup", "exec"];

pub fn evaluate(console: &Console, expect: &Expect) -> Verdict {
    match &console.release {
        None => return fail("boot", "the guest never reached the init script (no kernel release printed)"),
        Some(r) if *r != expect.release => {
            return fail("boot", format!("the guest runs {r}, not {}", expect.release));
        }
        Some(_) => {}
    }
    let log = console.sections.get("daemon-log").map(|s| s.lines.as_slice()).unwrap_or_default();
    if console.daemon_exited {
        // A refusal is a pass of its own kind only when it names the missing kernel feature.
        return match log.iter().find(|l| l.contains("this kernel (Linux") && l.contains(" lacks ")) {
            Some(line) => Verdict::Refused(sentence(line)),
            None => {
                fail("daemon start", "the daemon exited before it was healthy, without naming a missing kernel feature")
            }
        };
    }
    if !console.done {
        return fail("script", "the init script did not finish (timeout or guest crash)");
    }
    if !log.iter().any(|l| l.contains("kernel features probed")) {
        return fail("feature probe", "the daemon's log has no `kernel features probed` line");
    }
    let attached = log
        .iter()
        .find(|l| l.contains("tracepoint detectors"))
        .and_then(|l| l.split("attached=").nth(1))
        .map(|v| v.split_whitespace().next().unwrap_or("").trim_matches('"').to_string());
    let Some(attached) = attached else {
        return fail("tracepoints", "the daemon's log has no `tracepoint detectors` line");
    };
    let missing: Vec<_> = TRACEPOINT_GROUPS.iter().filter(|g| !attached.split(',').any(|a| a == **g)).collect();
    if !missing.is_empty() {
        return fail("tracepoints", format!("not attached: {missing:?} (attached: {attached})"));
    }
    let degraded: Vec<String> =
        log.iter().filter_map(|l| l.split("this kernel lacks ").nth(1)).map(|s| s.trim().to_string()).collect();
    for name in ["health", "status", "folded", "cputime"] {
        match console.sections.get(name) {
            None => return fail("commands", format!("`{name}` printed nothing")),
            Some(s) if s.rc != Some(0) => {
                return fail("commands", format!("`{name}` exited with {:?}: {}", s.rc, s.lines.join(" | ")));
            }
            Some(_) => {}
        }
    }
    let Some((samples, lost)) = status_totals(&console.sections["status"].lines) else {
        return fail("sampling", "`profiler status` has no `total ... samples ..., N lost` line");
    };
    // Half of what the sampler should take while the helper spins: the VM's timers are not exact.
    let floor = expect.frequency_hz * expect.cpus * expect.seconds / 2;
    if samples < floor {
        return fail("sampling", format!("{samples} samples stored, fewer than {floor}"));
    }
    if lost * 100 > samples {
        return fail("ring buffer", format!("{lost} of {samples} samples lost (more than 1 %)"));
    }
    let folded = &console.sections["folded"].lines;
    if !folded.iter().any(|l| l.starts_with(expect.comm) && l.contains(expect.hot_function)) {
        return fail("user stacks", format!("no folded stack of {} through {}", expect.comm, expect.hot_function));
    }
    if !folded.iter().any(|l| l.contains("_[k]")) {
        return fail("kernel stacks", "no folded stack has a kernel frame (`_[k]`)");
    }
    let busy_share = cpu_busy_max(&console.sections["cputime"].lines, expect.busy_cpu);
    if busy_share < 0.9 {
        return fail(
            "cputime",
            format!("CPU {} was at most {busy_share:.2} busy while the helper spun", expect.busy_cpu),
        );
    }
    // Last, so that a kernel failing here has passed every check above: parts the daemon runs
    // without but that this kernel must load (its verifier can reject what the host's accepts).
    for (check, warning) in COMPONENTS {
        if let Some(line) = log.iter().find(|l| l.contains(warning)) {
            return fail(check, why_rejected(line));
        }
    }
    Verdict::Pass(Figures { samples, lost, busy_share, degraded })
}

/// Warnings of the daemon that fail a kernel: (check, the warning's text).
pub const COMPONENTS: [(&str, &str); 2] =
    [("unwind tables", "unwind tables unavailable"), ("python frames", "Python frames unavailable")];

/// A rejected program's warning in one line: the error up to the verifier's output, and the
/// verifier's verdict when it gave one (`BPF program is too large. Processed 1000001 insn`).
fn why_rejected(line: &str) -> String {
    let head = line.split(" Verifier output:").next().unwrap_or(line);
    let head = head.find("error=").map_or(head, |i| &head[i + "error=".len()..]);
    let verdict = ["BPF program is too large", "processed "]
        .iter()
        .find_map(|k| line.find(k).map(|i| line[i..].split("\\n").next().unwrap_or("").to_string()));
    match verdict {
        Some(v) => format!("{} ({v})", head.trim()),
        None => head.trim().to_string(),
    }
}

/// The daemon's error line without the log's prefix (time, level, target).
fn sentence(line: &str) -> String {
    line.find("this kernel (Linux").map_or(line, |i| &line[i..]).trim().to_string()
}

/// `total        1584 samples (800 busy, 784 idle), 0 lost` → (1584, 0).
pub fn status_totals(lines: &[String]) -> Option<(u64, u64)> {
    let line = lines.iter().find_map(|l| l.strip_prefix("total"))?;
    let samples = line.split_whitespace().next()?.parse().ok()?;
    let lost = line.rsplit(", ").next()?.strip_suffix(" lost")?.trim().parse().ok()?;
    Some((samples, lost))
}

/// The highest busy share of `cpu` in `cputime --format csv` (`start_ns,cpu,busy_share,kernel_share`).
pub fn cpu_busy_max(lines: &[String], cpu: u32) -> f64 {
    lines
        .iter()
        .filter_map(|l| {
            let mut f = l.split(',');
            let (_, c, busy) = (f.next()?, f.next()?.parse::<u32>().ok()?, f.next()?.parse::<f64>().ok()?);
            (c == cpu).then_some(busy)
        })
        .fold(0.0, f64::max)
}

/// The last `n` lines of a console, for a failure report, each cut at 300 characters (a
/// verifier's output is one log line of 16 KB).
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| match l.char_indices().nth(300) {
            Some((i, _)) => format!("{} [...]", &l[..i]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect() -> Expect {
        Expect {
            release: "6.1.0-56-cloud-amd64".into(),
            seconds: 8,
            frequency_hz: 99,
            cpus: 2,
            busy_cpu: 1,
            comm: "busy-helper",
            hot_function: "profiler_test_hot_loop",
        }
    }

    /// A console as a healthy 6.1 guest prints it, kernel noise included.
    fn good() -> String {
        [
            "[    0.000000] Linux version 6.1.0-56-cloud-amd64",
            "@@KT kernel 6.1.0-56-cloud-amd64\r",
            "@@KT begin health",
            "healthy: samples written 0.2s ago",
            "@@KT end health rc=0",
            "@@KT begin status",
            "daemon       running",
            "total        1500 samples (900 busy, 600 idle), 3 lost",
            "@@KT end status rc=0",
            "@@KT begin folded",
            "busy-helper;main;profiler_test_hot_loop 780",
            "profiler;syscall;do_syscall_64_[k];ksys_read_[k] 4",
            "@@KT end folded rc=0",
            "@@KT begin cputime",
            "start_ns,cpu,busy_share,kernel_share",
            "1000000000,0,0.120,0.050",
            "1000000000,1,1.000,0.000",
            "@@KT end cputime rc=0",
            "@@KT begin daemon-log",
            "2026-11-23T17:00:00Z  INFO profiler::collect: kernel features probed kernel=6.1.0 missing=0",
            "2026-11-23T17:00:00Z  INFO profiler::collect: tracepoint detectors attached=NET_RX/NAPI,runq,reclaim,cgroup,exec",
            "@@KT end daemon-log rc=0",
            "@@KT done",
        ]
        .join("\n")
    }

    #[test]
    fn a_good_console_passes_with_its_figures() {
        let v = evaluate(&parse(&good()), &expect());
        assert_eq!(v, Verdict::Pass(Figures { samples: 1500, lost: 3, busy_share: 1.0, degraded: vec![] }));
    }

    #[test]
    fn sections_keep_their_lines_and_exit_status() {
        let c = parse(&good());
        assert_eq!(c.release.as_deref(), Some("6.1.0-56-cloud-amd64"));
        assert_eq!(
            c.sections["health"],
            Section { lines: vec!["healthy: samples written 0.2s ago".into()], rc: Some(0) }
        );
        assert!(c.done && !c.daemon_exited);
    }

    #[test]
    fn a_marker_after_kernel_noise_on_the_same_line_still_counts() {
        let c = parse("[ 1.2] random: crng init done@@KT kernel 6.1.0\n");
        assert_eq!(c.release.as_deref(), Some("6.1.0"));
    }

    fn with(replace: &str, by: &str) -> Verdict {
        let text = good().replace(replace, by);
        evaluate(&parse(&text), &expect())
    }

    fn failed_check(v: Verdict) -> &'static str {
        match v {
            Verdict::Fail { check, .. } => check,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn each_missing_piece_fails_its_own_check() {
        assert_eq!(failed_check(with("@@KT kernel 6.1.0-56-cloud-amd64", "")), "boot");
        assert_eq!(failed_check(with("@@KT kernel 6.1.0-56-cloud-amd64", "@@KT kernel 6.1.0-56-amd64")), "boot");
        assert_eq!(failed_check(with("@@KT done", "")), "script");
        assert_eq!(failed_check(with("kernel features probed", "x")), "feature probe");
        assert_eq!(
            failed_check(with("NET_RX/NAPI,runq,reclaim,cgroup,exec", "NET_RX/NAPI,cgroup,exec")),
            "tracepoints"
        );
        assert_eq!(failed_check(with("end health rc=0", "end health rc=1")), "commands");
        assert_eq!(failed_check(with("1500 samples", "700 samples")), "sampling");
        assert_eq!(failed_check(with("3 lost", "30 lost")), "ring buffer");
        assert_eq!(failed_check(with("main;profiler_test_hot_loop", "main;spin")), "user stacks");
        assert_eq!(failed_check(with("do_syscall_64_[k];ksys_read_[k]", "x;y")), "kernel stacks");
        assert_eq!(failed_check(with("1000000000,1,1.000", "1000000000,1,0.400")), "cputime");
    }

    #[test]
    fn a_refusal_naming_the_feature_is_reported_as_such() {
        let text = "@@KT kernel 6.1.0-56-cloud-amd64\n@@KT daemon-exited\n@@KT begin daemon-log\n\
            profiler: this kernel (Linux 5.4.0) lacks the BPF ring buffer (Linux 5.8+, for delivering samples and events): run the profiler on Linux 5.8 or later\n\
            @@KT end daemon-log rc=0\n@@KT done\n";
        match evaluate(&parse(text), &expect()) {
            Verdict::Refused(s) => assert!(s.starts_with("this kernel (Linux 5.4.0) lacks the BPF ring buffer"), "{s}"),
            other => panic!("{other:?}"),
        }
        let silent = text.replace("this kernel (Linux 5.4.0) lacks", "error:");
        assert_eq!(failed_check(evaluate(&parse(&silent), &expect())), "daemon start");
    }

    #[test]
    fn degraded_features_are_listed_without_failing() {
        let text = good().replace(
            "@@KT end daemon-log",
            "WARN profiler::collect: this kernel lacks bpf_task_pt_regs: samples taken in the kernel get no table-walked user stack\n@@KT end daemon-log",
        );
        match evaluate(&parse(&text), &expect()) {
            Verdict::Pass(f) => assert_eq!(f.degraded.len(), 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unwinder_the_verifier_rejects_fails_with_its_verdict() {
        let warn = "2026-11-23T17:55:35Z  WARN user stacks without frame pointers will be cut short: unwind tables unavailable \
            error=the unwinder program was rejected: the BPF_PROG_LOAD syscall returned Argument list too long (os error 7). \
            Verifier output: reg type unsupported\\n0: R1=ctx\\nBPF program is too large. Processed 1000001 insn\\nverification time 1 usec";
        let text = good().replace("@@KT end daemon-log", &format!("{warn}\n@@KT end daemon-log"));
        match evaluate(&parse(&text), &expect()) {
            Verdict::Fail { check, detail } => {
                assert_eq!(check, "unwind tables");
                assert!(detail.starts_with("the unwinder program was rejected"), "{detail}");
                assert!(detail.ends_with("(BPF program is too large. Processed 1000001 insn)"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        // Checked last: a kernel reported as failing it has passed every other check.
        let also_short = text.replace("1500 samples", "700 samples");
        assert_eq!(failed_check(evaluate(&parse(&also_short), &expect())), "sampling");
    }

    #[test]
    fn a_section_cut_off_has_no_exit_status() {
        let c = parse("@@KT begin status\ntotal 3 samples");
        assert_eq!(c.sections["status"].rc, None);
        assert_eq!(status_totals(&c.sections["status"].lines), None);
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\r\nb\nc\n", 2), "b\nc");
        assert_eq!(tail(&"x".repeat(1000), 1), format!("{} [...]", "x".repeat(300)));
    }
}
