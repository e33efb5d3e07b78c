"""The real-GPU script (tests/gpu) tested on the CPU: its pure figures, its shell syntax, and
a short run of the whole pipeline against the fake GPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests" / "gpu"
sys.path.insert(0, str(GPU))

import figures  # noqa: E402


def test_loop_summary_windows_and_gaps() -> None:
    stamps = [0.1 * i for i in range(1, 30)]  # one launch every 100 ms for 3 s
    s = figures.loop_summary(stamps, 0.0, 3.0, kernel_us=20000)
    assert s["launches"] == 29
    assert s["win_use_pct"] == [18.0, 20.0, 20.0]  # 9, 10, 10 launches x 20 ms per 1 s
    assert abs(s["max_gap_ms"] - 100) < 1e-6
    assert figures.steady(s) == 20.0


def test_cap_errors_split_ratio_and_overhead() -> None:
    runs = {
        "short": {"10": {"win_use_pct": [5, 10.5, 11]}, "30": {"error": "x"}},
        "long": {"90": {"win_use_pct": [80, 88, 88]}},
    }
    e = figures.cap_errors(runs)
    assert e["per_run"] == {"short@10": 0.75, "long@90": 2.0} and e["worst"] == 2.0
    assert figures.split({"win_use_pct": [0, 30]}, {"win_use_pct": [0, 70]}) == (30, 70)
    assert figures.split(None, {"win_use_pct": [1]}) is None
    assert figures.ratio(300, 100) == 3.0 and figures.ratio(1, 0) is None
    assert figures.overhead_pct(1000, 990) == 1.0 and figures.overhead_pct(None, 1) is None
    assert figures.percentiles([], "x") == {"x_p50": None, "x_p99": None, "x_max": None}
    assert figures.percentiles([float(i) for i in range(100)], "x")["x_p99"] == 99.0


def test_final_line_format() -> None:
    line = figures.final_line(
        {
            "cap_error_pts": 1.2,
            "split_30_70": [31, 69],
            "hiprio_p99_ratio": 1.5,
            "uncapped_overhead_pct": 0.4,
        }
    )
    assert (
        line == "cap_error_pts=1.2 split_30_70=31:69 hiprio_p99_ratio=1.5 uncapped_overhead_pct=0.4"
    )
    assert figures.final_line({}) == (
        "cap_error_pts=NA split_30_70=NA:NA hiprio_p99_ratio=NA uncapped_overhead_pct=NA"
    )


def test_driver_path_judges_skip_what_the_driver_cannot_do_and_name_what_broke() -> None:
    no_vmm = {"skip": "the card has no VMM"}
    assert figures.judge_vmm_import(no_vmm, {})["status"] == "skip"
    refused = {"import_rc": 801}
    assert figures.judge_vmm_import(refused, {})["status"] == "skip"
    plain = {"import_rc": 0, "reserve_rc": 0, "map_part_rc": 0, "map_whole_rc": 0, "map_over_rc": 1}
    shared = {"size_mib": 512, "free_start": 1792, "free_created": 1280, "free_exported": 1280,
              "import_rc": 0, "free_imported": 1278, "release_rc": 0, "free_end": 1792}  # fmt: skip
    v = figures.judge_vmm_import(plain, shared)
    assert v["status"] == "fail" and "charged 2 MiB, not the whole 512 MiB" in v["why"], v
    v = figures.judge_vmm_import({**plain, "map_over_rc": 0}, {**shared, "free_imported": 768})
    assert v["status"] == "fail" and "mapped past the end" in v["why"], v
    assert figures.judge_vmm_import(plain, {"error": "rc=1"})["status"] == "fail"
    lister = {"self": 10, "list_rc": 0, "pids": [10, 11, 12]}
    namespaced = {"self": 20, "list_rc": 0, "pids": [1010, 1011]}
    assert figures.judge_nvml_procs(lister, namespaced, 11, 12)["status"] == "skip"
    v = figures.judge_nvml_procs(
        lister, {"self": 20, "list_rc": 0, "pids": [10, 11, 12, 20]}, 11, 12
    )
    assert v["status"] == "fail" and "outside the share is listed" in v["why"], v
    heap = {"base_mib": 8, "limit_grown_mib": 264, "free_start": 768, "free_grown": 768,
            "grow_rc": 0, "past_rc": 0, "limit_after_past_mib": 2048}  # fmt: skip
    v = figures.judge_heap_limit(heap, 256)
    assert v["status"] == "fail" and "charged 0 MiB" in v["why"], v


def test_run_sh_syntax() -> None:
    subprocess.run(["bash", "-n", str(GPU / "run.sh")], check=True)


def test_whole_script_against_the_fake_gpu(tmp_path: Path) -> None:
    """run.sh end to end (build, suite, summary) with the fake driver standing in."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(
        OUT=str(tmp_path / "out"),
        LD_LIBRARY_PATH=str(ROOT / "fakegpu" / "build"),
        FAKEGPU_STATE_DIR=str(tmp_path / "fake"),
        EGPU_GPU_SUITE_ARGS="--fake --scale 0.25 --only "
        "fc15,fc16,split_ptx,overhead,graphs,driver_paths",
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
    )
    subprocess.run(["make", "-s", "-C", str(ROOT / "fakegpu")], check=True, capture_output=True)
    p = subprocess.run(
        ["bash", str(GPU / "run.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    last = p.stdout.strip().splitlines()[-2:]
    assert any(line.startswith("cap_error_pts=NA split_30_70=") for line in last), p.stdout
    fig = json.loads((tmp_path / "out" / "figures.json").read_text())
    assert fig["fc15"]["ok"] is True, fig["fc15"]
    assert fig["fc16"]["cu_total_mib"] == 12288, fig["fc16"]
    assert fig["split_ptx"]["split"] is not None
    assert fig["overhead"]["overhead_pct"] is not None
    assert fig["overhead"]["watched_overhead_pct"] is not None, fig["overhead"]
    assert fig["graphs"]["ptx"]["capture_rc"] == 0, fig["graphs"]
    assert fig["graphs"]["ptx_cap_error_pts"] <= 3, fig["graphs"]
    dp = fig["driver_paths"]
    assert dp["statuses"] == dict.fromkeys(
        ("vmm_import", "pool_cap", "pool_destroy", "heap_limit", "nvml_procs"), "pass"
    ), {k: v for k, v in dp.items() if isinstance(v, dict) and v.get("status") != "pass"}
    assert re.search(r"driver paths pass/fail/skip +5/0/0", p.stdout), p.stdout
