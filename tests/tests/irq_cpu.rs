//! Issue 16, part 1, on this kernel: a CPU held at 100 % in the kernel while it takes a NIC
//! queue's interrupts (how the ENA resets began) gets findings that say so, and `profiler
//! status` shows where the NIC's interrupts go. The queue's IRQ is pinned to CPU 1 for the test
//! and put back afterwards (also when the test fails).

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{Daemon, Kill, now_secs, privileged, profiler, skip, wait_for};
use serde_json::Value;

/// Puts an IRQ's affinity back when dropped.
struct Pinned {
    irq: u64,
    was: String,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("/proc/irq/{}/smp_affinity_list", self.irq), &self.was);
    }
}

fn status(dir: &str, json: bool) -> String {
    let mut args = vec!["status", "--data-dir", dir];
    if json {
        args.extend(["--format", "json"]);
    }
    let out = profiler(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_saturated_cpu_that_takes_a_nic_queues_interrupts_is_named_so() {
    if !privileged("a_saturated_cpu_that_takes_a_nic_queues_interrupts_is_named_so") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let dir = data.to_str().unwrap();
    // The NIC's vectors as the daemon sees them; a receive queue's if there is one.
    std::fs::create_dir_all(&data).unwrap();
    let placement: Value = serde_json::from_str(&status(dir, true)).unwrap();
    let irqs = placement["interrupts"]["irqs"].as_array().cloned().unwrap_or_default();
    let nic: Vec<&Value> = irqs.iter().filter(|i| i["kind"] == "nic").collect();
    let Some(queue) = nic
        .iter()
        .find(|i| i["name"].as_str().is_some_and(|n| n.contains("input") || n.to_lowercase().contains("rx")))
        .or(nic.first())
    else {
        skip("a_saturated_cpu_that_takes_a_nic_queues_interrupts_is_named_so: no NIC with MSI interrupts here");
        return;
    };
    let (irq, name, device) = (
        queue["number"].as_u64().unwrap(),
        queue["name"].as_str().unwrap().to_string(),
        queue["device"].as_str().unwrap().to_string(),
    );
    let affinity = format!("/proc/irq/{irq}/smp_affinity_list");
    let _pinned = Pinned { irq, was: std::fs::read_to_string(&affinity).unwrap() };
    std::fs::write(&affinity, "1").unwrap_or_else(|e| panic!("pin IRQ {irq} ({name}) to CPU 1: {e}"));

    let mut daemon = Daemon::start(&data, &["--listen", "off"]);
    daemon.wait_ready();
    let text = status(dir, false);
    let line = text.lines().find(|l| l.starts_with("interrupts") && l.contains(&format!("{device} (nic)")));
    let on_cpu1 = line.and_then(|l| l.split("; ").find(|part| part.contains("CPU 1 ")));
    assert!(on_cpu1.is_some_and(|p| p.contains(&name)), "status shows IRQ {irq} ({name}) on CPU 1:\n{text}");

    // CPU 1 in the kernel (zeroing buffers for read(2) of /dev/zero), as in S1.
    let start = now_secs();
    let _hog = Kill(
        Command::new("taskset")
            .args(["-c", "1", "dd", "if=/dev/zero", "of=/dev/null", "bs=1M"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Saturated core when the rest of the machine is quiet, hot kernel function either way
    // (a shared machine's other CPU may be busy): both are CPU findings and both must say it.
    let finding = wait_for("a CPU finding on CPU 1", Duration::from_secs(30), || {
        let out = profiler(&["findings", "--data-dir", dir, "--from", "-15m", "--format", "json"]);
        let list: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        list.into_iter()
            .find(|f| (f["kind"] == "saturated-core" || f["kind"] == "hot-kernel-function") && f["cpu"] == 1)
    });
    let summary = finding["summary"].as_str().unwrap_or_default();
    eprintln!("after {:.1} s: {summary}", now_secs() - start);
    assert!(
        summary.contains(&format!("CPU 1 serves {device}'s interrupts (")) && summary.contains(&name),
        "the finding names the NIC queue CPU 1 serves ({name}): {summary}"
    );
    assert_eq!(finding["evidence"]["interrupts"][0]["number"], irq, "{finding}");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}
