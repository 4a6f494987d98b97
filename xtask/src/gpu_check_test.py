#!/usr/bin/env python3
"""The parsing parts of gpu_check.py on canned outputs (no GPU, no torch, no root): nvidia-smi's
dmon and pmon tables, the daemon's folded launches and their kernel names, and the verdicts
built on them. Run by `cargo test -p xtask gpu_check` (xtask/src/gpu_check.rs), or directly:
`python3 xtask/src/gpu_check_test.py`."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check as g  # noqa: E402

# `nvidia-smi dmon -i 0 -d 1 --gpm-metrics 2,3,5,10,60,61` as a 580 driver prints it: the GPM
# columns after `gpu`, a units line, a header repeated later.
DMON_GPM = """\
# gpu      smAct    smOcc    tensAct  dramAct  nvlRx    nvlTx
# Idx          %        %          %        %   MiB/s    MiB/s
    0       12.0      6.0        0.0      5.0    100.0    200.0
    0       14.0      8.0        0.0      7.0    100.0    200.0
# gpu      smAct    smOcc    tensAct  dramAct  nvlRx    nvlTx
# Idx          %        %          %        %   MiB/s    MiB/s
    0          -      8.0        0.0      6.0    100.0    200.0
"""

DMON_PCIE = """\
# gpu  rxpci  txpci
# Idx   MB/s   MB/s
    0      1      2
    0      3      2
"""

PMON = """\
# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command
# Idx           #    C/G      %      %      %      %      %      %    name
    0       4242     C     90     40      -      -      -      -    python3
    0       4343     C      6      2      -      -      -      -    python3 light.py
    0          -     -      -      -      -      -      -      -    -
    0       4242     C     94     41      -      -      -      -    python3
"""


def stamped(text, t=100.0):
    header = next(l for l in text.splitlines() if l.startswith("#"))
    rows = []
    for i, line in enumerate(l for l in text.splitlines() if not l.startswith("#")):
        rows.extend((t + i, r) for r in g.parse_smi_table([header, line]))
    return rows


class Tables(unittest.TestCase):
    def test_dmon_rows_skip_units_and_repeated_headers(self):
        rows = g.parse_smi_table(DMON_GPM.splitlines())
        self.assertEqual(len(rows), 3)
        self.assertEqual(rows[0]["gpu"], 0.0)
        self.assertEqual(rows[0]["smAct"], 12.0)
        self.assertIsNone(rows[2]["smAct"])

    def test_dmon_means_map_gpm_by_position_and_nvlink_to_megabytes(self):
        m = g.dmon_means(stamped(DMON_GPM), 100, 200)
        self.assertEqual(m["sm_active"], (13.0, 2))  # the `-` row left out
        self.assertEqual(m["sm_occupancy"], (22.0 / 3, 3))
        self.assertAlmostEqual(m["nvlink_rx_mbps"][0], 104.8576)
        self.assertAlmostEqual(m["nvlink_tx_mbps"][0], 209.7152)
        self.assertNotIn("pcie_rx_mbps", m)
        p = g.dmon_means(stamped(DMON_PCIE), 100, 200)
        self.assertEqual(p, {"pcie_rx_mbps": (2.0, 2), "pcie_tx_mbps": (2.0, 2)})
        # Outside the window: nothing.
        self.assertEqual(g.dmon_means(stamped(DMON_PCIE), 0, 100), {})

    def test_pmon_means_per_pid_with_a_command_holding_spaces(self):
        rows = g.parse_smi_table(PMON.splitlines())
        self.assertEqual(rows[1]["command"], "python3 light.py")
        self.assertEqual(g.pmon_means(stamped(PMON), 100, 200), {4242: (92.0, 2), 4343: (6.0, 1)})


class Running(unittest.TestCase):
    def test_smi_table_reads_a_commands_rows_as_they_come(self):
        t = g.SmiTable(["printf", "# gpu  rxpci  txpci\\n# Idx   MB/s   MB/s\\n    0      1      2\\n"])
        end = g.time.time() + 10
        while not t.rows and g.time.time() < end:
            g.time.sleep(0.05)
        t.close()
        self.assertEqual([r for _, r in t.rows], [{"gpu": 0.0, "rxpci": 1.0, "txpci": 2.0}])

    def test_a_missing_command_or_a_failing_part_is_said(self):
        t = g.SmiTable(["/nonexistent/nvidia-smi", "dmon"])
        t.close()
        self.assertIn("gave 0 rows", t.said())
        self.assertIn("No such file", t.said())
        ok, lines = g.guarded("the GPM comparison", lambda: g.json.loads("not json"))
        self.assertFalse(ok)
        self.assertIn("the GPM comparison failed: JSONDecodeError", lines[0])


class Verdicts(unittest.TestCase):
    def test_gpm_tracks_within_5_points_and_10_percent(self):
        smi = g.dmon_means(stamped(DMON_GPM), 100, 200)
        smi.update(g.dmon_means(stamped(DMON_PCIE), 100, 200))
        daemon = {"sm_active": (12.5, 30), "sm_occupancy": (7.0, 30), "tensor_active": (0.0, 30),
                  "dram_bw_util": (6.0, 30), "nvlink_rx_mbps": (104.9, 30), "nvlink_tx_mbps": (209.7, 30),
                  "pcie_rx_mbps": (2.5, 300), "pcie_tx_mbps": (2.0, 300)}
        ok, lines = g.gpm_verdict(daemon, smi)
        self.assertTrue(ok, lines)
        self.assertEqual(len(lines), 8)
        # NVLink read as bytes where NVML gave MiB: off by far more than 10 %.
        ok, _ = g.gpm_verdict({**daemon, "nvlink_rx_mbps": (100.0 / 1e6, 30)}, {**smi, "nvlink_rx_mbps": (104.9e3, 3)})
        self.assertFalse(ok)
        ok, _ = g.gpm_verdict({**daemon, "sm_active": (30.0, 30)}, smi)
        self.assertFalse(ok)
        # A figure one side lacks is said, not judged.
        ok, lines = g.gpm_verdict({"sm_active": (13.0, 3)}, smi)
        self.assertTrue(ok)
        self.assertIn("not compared", lines[1])

    def test_shared_gpu_heavy_first_and_near_pmon(self):
        counters = {"tracks": [
            {"name": "gpu.0.util", "points": [[1, 99.0], [2, 97.0]]},
            {"name": "gpu.0.pid.4242.sm_util", "points": [[1, 91.0], [2, 93.0]]},
            {"name": "gpu.0.pid.4343.sm_util", "points": [[1, 5.0], [2, 7.0]]},
            {"name": "gpu.0.pid.9.sm_util", "points": []},
        ]}
        tracks = g.track_means(counters, "gpu.0.")
        self.assertEqual(tracks["util"], (98.0, 2))
        self.assertNotIn("pid.9.sm_util", tracks)
        pmon = g.pmon_means(stamped(PMON), 100, 200)
        ok, lines = g.shared_verdict(tracks, pmon, 4242, 4343)
        self.assertTrue(ok, lines)
        self.assertIn("heavy pid 4242: daemon gpu.0.pid.4242.sm_util 92.0 %", lines[0])
        # The light one read as the heavy: wrong.
        self.assertFalse(g.shared_verdict(tracks, pmon, 4343, 4242)[0])
        # A process without its track: wrong.
        self.assertFalse(g.shared_verdict(tracks, pmon, 4242, 5555)[0])
        # Far from pmon: wrong.
        far = {**tracks, "pid.4343.sm_util": (40.0, 2)}
        self.assertFalse(g.shared_verdict(far, pmon, 4242, 4343)[0])


class Names(unittest.TestCase):
    FOLDED = """\
python3;train (loop.py:9);launch_step (loop.py:4);libtorch_cuda.so+0x1;[gpu] void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, at::detail::Array<char*, 3>) 900
python3;train (loop.py:9);launch_step (loop.py:5);[gpu] void at::native::elementwise_kernel<128, 2>(int) 60
python3;train (loop.py:9);[gpu] kernel in libcublasLt.so.12 30
python3;train (loop.py:9);[gpu] graph 10
"""

    def test_parse_folded(self):
        counts = g.parse_folded(self.FOLDED)
        self.assertEqual([n for _, n in counts], [900, 60, 30, 10])
        self.assertTrue(counts[0][0].endswith("at::detail::Array<char*, 3>)"))

    def test_share_named_and_agreeing_with_torch_profiler(self):
        torch = ["void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, "
                 "at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, at::detail::Array<char*, 3>)",
                 "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<...> >(int, ...)"]
        r = g.names_share(g.parse_folded(self.FOLDED), torch)
        self.assertEqual(r["total"], 1000)
        self.assertAlmostEqual(r["named_share"], 0.96)
        self.assertEqual(r["agree_share"], 1.0)
        self.assertTrue(r["ok"])
        self.assertEqual(r["top"][0][1], 900)
        # Names torch.profiler never saw: named, but not agreeing.
        r = g.names_share(g.parse_folded(self.FOLDED), ["void other_kernel(int)"])
        self.assertEqual(r["agree_share"], 0.0)
        self.assertFalse(r["ok"])
        # Under 90 % named: not ok.
        many_unnamed = self.FOLDED + "python3;[gpu] kernel 0x7f00 500\n"
        self.assertFalse(g.names_share(g.parse_folded(many_unnamed), torch)["ok"])
        self.assertFalse(g.names_share([], torch)["ok"])

    def test_median_gap_of_a_tracks_points(self):
        # NVML's samples every 1/6 s on a 100 ms grid: gaps of 100 and 200 ms.
        pts = [[t, 50.0] for t in (0, 100, 300, 500, 600, 800, 1000)]
        self.assertEqual(g.median_gap_ms(pts), 200)
        self.assertIsNone(g.median_gap_ms(pts[:2]))

    def test_kernel_base(self):
        self.assertEqual(g.kernel_base("void at::native::foo<4, int>(int, float)"), "at::native::foo")
        self.assertEqual(g.kernel_base("ampere_sgemm_128x64_tn"), "ampere_sgemm_128x64_tn")


if __name__ == "__main__":
    unittest.main()
