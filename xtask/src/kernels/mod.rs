//! `cargo xtask test kernels`: boots Debian's own kernels in qemu/KVM with a minimal root (the
//! release `profiler`, the busy helper, busybox) and checks on each that sampling, the ring
//! buffer, kernel and user stacks and the tracepoint detectors work, or that the daemon refuses
//! with one sentence naming the missing kernel feature (docs/kernels.md).
//!
//! `fetch` gets qemu, the kernels and busybox; `initramfs` builds the guest's root and its init
//! script; `console` reads what the guest printed and decides.

mod console;
mod fetch;
mod initramfs;

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Parser;

use console::{Expect, Verdict};

/// Debian bookworm's 6.1 flavours, each the newest build apt knows.
pub const FLAVOURS: [&str; 3] = ["amd64", "cloud-amd64", "rt-amd64"];

#[derive(Parser, Debug)]
#[command(name = "cargo xtask test kernels")]
pub struct Options {
    /// Debian kernel flavours to boot (`linux-image-FLAVOUR`); all of them by default.
    #[arg(long = "flavour")]
    pub flavours: Vec<String>,
    /// How long the busy helper spins while the daemon samples.
    #[arg(long, default_value_t = 8)]
    pub seconds: u64,
    /// A guest that has not powered off after this many seconds fails.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// `kvm`, `tcg` (qemu's emulator), or `auto`: KVM unless it cannot be opened or is a
    /// nested paravirtual one (PVM) that cannot run an unmodified kernel.
    #[arg(long, default_value = "auto")]
    pub accel: String,
}

impl Options {
    /// What `cargo xtask test` runs: the cloud kernel only (about a minute under TCG here,
    /// BENCHMARKS.md).
    pub fn in_suite() -> Self {
        Self { flavours: vec!["cloud-amd64".into()], seconds: 8, timeout: 300, accel: "auto".into() }
    }

    pub fn parse_args(args: &[String]) -> anyhow::Result<Self> {
        Ok(Self::try_parse_from(std::iter::once("kernels".to_string()).chain(args.iter().cloned()))?)
    }
}

/// How qemu runs the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    fn qemu_args(self) -> &'static [&'static str] {
        match self {
            Accel::Kvm => &["-enable-kvm", "-cpu", "host"],
            // One host thread per guest CPU; `max` has every feature TCG emulates.
            Accel::Tcg => &["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }
}

/// What this machine's KVM is: `Err(why)` when it cannot be used.
fn kvm_state() -> Result<(), String> {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return Err(format!("/dev/kvm cannot be opened ({e})"));
    }
    // PVM (a nested, page-table based hypervisor, as in some cloud sandboxes) answers on
    // /dev/kvm but runs an unmodified kernel's boot code emulated: a Debian kernel did not get
    // past its decompressor in 120 s there.
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        return Err(
            "/dev/kvm is served by kvm_pvm (nested PVM), which cannot boot an unmodified kernel at a usable speed"
                .into(),
        );
    }
    Ok(())
}

/// The accelerator for `requested` given what KVM is here (`kvm`: [`kvm_state`]).
pub fn choose_accel(requested: &str, kvm: Result<(), String>) -> anyhow::Result<(Accel, Option<String>)> {
    match (requested, kvm) {
        ("kvm", Ok(())) | ("auto", Ok(())) => Ok((Accel::Kvm, None)),
        ("kvm", Err(why)) => bail!("--accel kvm: {why}; use --accel tcg (slower) or a machine with KVM"),
        ("auto", Err(why)) => Ok((Accel::Tcg, Some(format!("{why}: booting with qemu's TCG emulator instead")))),
        ("tcg", _) => Ok((Accel::Tcg, None)),
        (other, _) => bail!("--accel {other} is not kvm, tcg or auto"),
    }
}

const FREQUENCY_HZ: u64 = 99;
const CPUS: u64 = 2;
const BUSY_CPU: u32 = 1;

/// One kernel's outcome.
struct Outcome {
    kernel: fetch::Kernel,
    verdict: Verdict,
    /// Samples stored and lost, from `profiler status`, whatever the verdict.
    totals: Option<(u64, u64)>,
    /// From qemu's start to its exit.
    seconds: f64,
}

/// Fetches what is missing, boots every kernel asked for and checks it. Fails if one fails.
pub fn run(root: &Path, profiler: &Path, helper: &Path, opts: &Options) -> anyhow::Result<()> {
    let (accel, note) = choose_accel(&opts.accel, kvm_state())?;
    if let Some(note) = note {
        eprintln!("xtask: {note}");
    }
    let cache = cache_dir(root);
    std::fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
    let mut apt = fetch::Apt::default();
    apt.ensure_qemu()?;
    let busybox = fetch::busybox(&mut apt, &cache)?;
    let flavours: Vec<String> =
        if opts.flavours.is_empty() { FLAVOURS.iter().map(|s| s.to_string()).collect() } else { opts.flavours.clone() };
    let kernels = flavours.iter().map(|f| fetch::kernel(&mut apt, &cache, f)).collect::<anyhow::Result<Vec<_>>>()?;
    // Without debug info (the profiler's is ~90 MB): the guest unpacks less; symbol tables stay.
    let (profiler, helper) = (stripped(profiler, &cache)?, stripped(helper, &cache)?);
    let initrd = cache.join("initramfs.cpio");
    initramfs::build(
        &initramfs::Guest {
            busybox: &busybox,
            profiler: &profiler,
            helper: &helper,
            seconds: opts.seconds,
            busy_cpu: BUSY_CPU,
            frequency_hz: FREQUENCY_HZ,
        },
        &initrd,
    )?;
    let mut outcomes = Vec::new();
    for kernel in kernels {
        eprintln!("xtask: booting {} ({})", kernel.release, kernel.vmlinuz.display());
        let log = cache.join(format!("console-{}.log", kernel.release));
        let started = Instant::now();
        let timed_out = boot(&kernel, accel, &initrd, &log, Duration::from_secs(opts.timeout))?;
        let seconds = started.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
        let expect = Expect {
            release: kernel.release.clone(),
            seconds: opts.seconds,
            frequency_hz: FREQUENCY_HZ,
            cpus: CPUS,
            busy_cpu: BUSY_CPU,
            comm: "busy-helper",
            hot_function: "profiler_test_hot_loop",
        };
        let parsed = console::parse(&text);
        let totals = parsed.sections.get("status").and_then(|s| console::status_totals(&s.lines));
        let mut verdict = console::evaluate(&parsed, &expect);
        if timed_out && !matches!(verdict, Verdict::Fail { .. }) {
            verdict = Verdict::Fail { check: "timeout", detail: format!("still running after {} s", opts.timeout) };
        }
        report(&kernel, &verdict, seconds, &text, &log);
        // The start on this kernel: when the sampler and the walkers came, and the verifier's work.
        let daemon_log = parsed.sections.get("daemon-log").map(|s| s.lines.as_slice()).unwrap_or_default();
        for line in daemon_log.iter().filter(|l| l.contains("sampler attached") || l.contains("stack walkers loaded")) {
            eprintln!("xtask: {}: {}", kernel.release, line.split("INFO ").nth(1).unwrap_or(line));
        }
        outcomes.push(Outcome { kernel, verdict, totals, seconds });
    }
    let table = table(&outcomes);
    println!("{table}");
    let last = cache.join("last-result.md");
    std::fs::write(&last, &table).with_context(|| format!("cannot write {}", last.display()))?;
    let failed: Vec<_> = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, Verdict::Fail { .. }))
        .map(|o| o.kernel.release.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("kernel checks failed on {}", failed.join(", "));
    }
    Ok(())
}

/// A copy of `bin` in `dir` without debug sections.
fn stripped(bin: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let out = dir.join(bin.file_name().context("a binary has a file name")?);
    let st = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&out)
        .arg(bin)
        .status()
        .context("cannot run strip (binutils)")?;
    if !st.success() {
        bail!("strip --strip-debug {} failed ({st})", bin.display());
    }
    Ok(out)
}

/// Boots `kernel` with `initrd`, its serial console written to `log`. True when it had to be
/// killed at `timeout`.
fn boot(kernel: &fetch::Kernel, accel: Accel, initrd: &Path, log: &Path, timeout: Duration) -> anyhow::Result<bool> {
    let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(accel.qemu_args())
        .args(["-smp", &CPUS.to_string(), "-m", "2G", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        // quiet + loglevel=1: kernel messages would interleave with the script's output;
        // panic=-1 with -no-reboot: a panic ends qemu at once instead of hanging until the timeout.
        .args(["-append", "console=ttyS0 quiet loglevel=1 panic=-1 rdinit=/init"])
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    let mut child = qemu.spawn().context("cannot start qemu-system-x86_64")?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait()? {
            if !st.success() {
                eprintln!("xtask: qemu exited with {st}");
            }
            return Ok(false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn report(kernel: &fetch::Kernel, verdict: &Verdict, seconds: f64, text: &str, log: &Path) {
    match verdict {
        Verdict::Pass(f) => {
            eprintln!(
                "xtask: {} passed in {seconds:.0} s: {} samples, {} lost, CPU {BUSY_CPU} busy {:.2}",
                kernel.release, f.samples, f.lost, f.busy_share
            );
            for d in &f.degraded {
                eprintln!("xtask:   runs without {d}");
            }
        }
        Verdict::Refused(sentence) => eprintln!("xtask: {} refused as it should: {sentence}", kernel.release),
        Verdict::Fail { check, detail } => {
            eprintln!("xtask: {} FAILED the {check} check: {detail}", kernel.release);
            eprintln!("xtask: the console's last lines ({}):\n{}", log.display(), console::tail(text, 40));
        }
    }
}

/// The result as a Markdown table (BENCHMARKS.md quotes it).
fn table(outcomes: &[Outcome]) -> String {
    let mut t = String::from("| kernel | result | samples | lost | boot+test s |\n|---|---|---|---|---|\n");
    for o in outcomes {
        let result = match &o.verdict {
            Verdict::Pass(f) if f.degraded.is_empty() => "pass".to_string(),
            Verdict::Pass(f) => format!("pass, without: {}", f.degraded.join("; ")),
            Verdict::Refused(s) => format!("refused: {s}"),
            Verdict::Fail { check, .. } => format!("FAIL ({check})"),
        };
        let (samples, lost) = o.totals.map_or(("-".into(), "-".into()), |(s, l)| (s.to_string(), l.to_string()));
        t.push_str(&format!("| {} | {result} | {samples} | {lost} | {:.0} |\n", o.kernel.release, o.seconds));
    }
    t
}

/// Where the kernels' console logs and the last result go.
pub fn cache_dir(root: &Path) -> PathBuf {
    root.join("target/kernels")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_kvm_when_it_works_and_tcg_with_a_reason_otherwise() {
        assert_eq!(choose_accel("auto", Ok(())).unwrap(), (Accel::Kvm, None));
        let (accel, note) = choose_accel("auto", Err("/dev/kvm cannot be opened".into())).unwrap();
        assert_eq!(accel, Accel::Tcg);
        assert!(note.unwrap().starts_with("/dev/kvm cannot be opened: booting with qemu's TCG"));
        assert!(choose_accel("kvm", Err("no".into())).unwrap_err().to_string().contains("--accel tcg"));
        assert_eq!(choose_accel("tcg", Ok(())).unwrap(), (Accel::Tcg, None));
        assert!(choose_accel("xen", Ok(())).is_err());
    }

    #[test]
    fn options_parse_after_the_word_kernels() {
        let o =
            Options::parse_args(&["--flavour".into(), "cloud-amd64".into(), "--seconds".into(), "5".into()]).unwrap();
        assert_eq!((o.flavours, o.seconds, o.accel.as_str()), (vec!["cloud-amd64".to_string()], 5, "auto"));
        assert!(Options::parse_args(&["--bogus".into()]).is_err());
    }
}
