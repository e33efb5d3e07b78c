"""The real-GPU checks of issue 8 (run by tests/gpu/run.sh; see its header).

Runs each share as its own process under the interposer (LD_PRELOAD, its own config file),
against the card the machine has (or the fake GPU with --fake, to test this script on a CPU
machine). Writes figures.json into the output folder after every experiment, prints a table,
and ends with the summary line:

    cap_error_pts=N split_30_70=N:N hiprio_p99_ratio=N uncapped_overhead_pct=N
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import figures  # noqa: E402

SIZES_FAKE = {"tiny": 5, "short": 50, "small": 200, "mid": 2000, "long": 20000}


class Suite:
    def __init__(self, out: Path, lib: Path, fake: bool, scale: float, budget_s: float) -> None:
        self.out = out
        self.lib = lib
        self.fake = fake
        self.scale = scale
        self.t_end = time.monotonic() + budget_s
        self.tmp = Path(tempfile.mkdtemp(prefix="egpu-gpu-"))
        self.res: dict = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "fake": fake,
        }
        self.torch = False
        self.calib: dict = {}
        self.log: list[str] = []

    # ---- processes ---------------------------------------------------------------
    def base_env(self) -> dict:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        env["PYTHONUNBUFFERED"] = "1"
        if self.fake:  # one fake card of 24 GiB, its own state
            fake = HERE.parents[1] / "fakegpu" / "build"
            ini = self.tmp / "fakegpu.ini"
            if not ini.exists():
                ini.write_text(
                    "[card]\nuuid = GPU-f0f0f0f0-0000-4000-8000-000000000001\nmemory_mib = 24576\n"
                )
            env["LD_LIBRARY_PATH"] = f"{fake}:{env.get('LD_LIBRARY_PATH', '')}"
            env["FAKEGPU_CONFIG"] = str(ini)
            env["FAKEGPU_STATE_DIR"] = str(self.tmp / "fakegpu")
        return env

    def share_env(
        self,
        share: str,
        *,
        cores: int = 0,
        priority: str = "high",
        policy: str = "strict",
        memory_mib: int | None = None,
        oversub: bool = False,
        preload: bool = True,
        kernel: str | None = None,
        **extra: object,
    ) -> dict:
        env = self.base_env()
        uuid = self.calib.get("uuid", "GPU-unknown")
        rt = self.tmp / "rt"
        cfg = {
            "version": 1,
            "namespace": "gpu-test",
            "pod": share,
            "pod_uid": f"uid-{share}",
            "container": "c",
            "priority": priority,
            "compute_policy": policy,
            "memory_oversubscription": oversub,
            "container_region": str(rt / "containers" / f"uid-{share}_c" / "region"),
            "cards": [
                {
                    "uuid": uuid,
                    "memory_mib": memory_mib or self.calib.get("total_mib", 1024),
                    "cores": cores,
                    "card_region": str(rt / "cards" / uuid),
                }
            ],
        }
        path = self.tmp / f"config-{share}.json"
        path.write_text(json.dumps(cfg))
        env["EGPU_CONFIG_PATH"] = str(path)
        env["EGPU_RUNTIME_DIR"] = str(rt)
        if preload:
            env["LD_PRELOAD"] = str(self.lib)
        if self.fake:
            env["FAKEGPU_KERNEL_US"] = str(SIZES_FAKE.get(kernel or "", 0))
            env["FAKEGPU_MANAGED_HOST"] = "1"
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def spawn(self, script: str, args: list[object], env: dict) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(HERE / script), *map(str, args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def collect(self, p: subprocess.Popen, timeout: float) -> dict:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return {"error": f"timeout after {timeout:.0f}s", "stderr": err[-2000:]}
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            return {"error": f"rc={p.returncode}", "stderr": err[-2000:], "stdout": out[-1000:]}
        return json.loads(lines[-1])

    def run(self, script: str, args: list[object], env: dict, timeout: float = 120) -> dict:
        return self.collect(self.spawn(script, args, env), timeout)

    def secs(self, s: float) -> float:
        return round(s * self.scale, 2)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "figures.json").write_text(json.dumps(self.res, indent=2))

    def step(self, name: str, fn) -> None:
        if time.monotonic() > self.t_end:
            self.res[name] = {"skipped": "time budget spent"}
            self.save()
            return
        t0 = time.monotonic()
        print(f"==> {name}", flush=True)
        try:
            self.res[name] = fn()
        except Exception as e:  # keep going: one broken check must not lose the others
            self.res[name] = {"error": f"{type(e).__name__}: {e}"}
        self.res.setdefault("seconds", {})[name] = round(time.monotonic() - t0, 1)
        self.save()

    # ---- experiments ---------------------------------------------------------------
    def calibrate(self) -> dict:
        env = self.share_env("calib", preload=False)
        if self.fake:
            env["FAKEGPU_KERNEL_US"] = "0"
        c = self.run("workload.py", ["calibrate"], env, timeout=120)
        if "error" in c:
            raise RuntimeError(f"calibration failed: {c}")
        if self.fake:
            for k, us in SIZES_FAKE.items():
                c[k] = {"iters": 1, "us": us}
        self.calib = c
        try:
            import torch  # noqa: F401

            self.torch = True
        except Exception:
            self.torch = False
        c["torch"] = self.torch
        return c

    def k(self, size: str) -> tuple[int, float]:
        return self.calib[size]["iters"], self.calib[size]["us"]

    def loop_args(self, size: str, seconds: float, sync: int) -> list[object]:
        it, us = self.k(size)
        return ["loop", seconds, it, us, sync]

    def caps(self) -> dict:
        out: dict = {}
        for size, secs, sync in (("short", 4, 32), ("long", 5, 2)):
            out[size] = {}
            for cap in (10, 30, 50, 70, 90):
                env = self.share_env(f"cap{cap}{size}", cores=cap, kernel=size)
                out[size][str(cap)] = self.run(
                    "workload.py", self.loop_args(size, self.secs(secs), sync), env
                )
        out["errors"] = figures.cap_errors({s: out[s] for s in ("short", "long")})
        return out

    def split_ptx(self) -> dict:
        secs = self.secs(8)
        a = self.spawn(
            "workload.py",
            self.loop_args("mid", secs, 4),
            self.share_env("s30", cores=30, kernel="mid", EGPU_TEST_START_AT=time.time() + 3),
        )
        b = self.spawn(
            "workload.py",
            self.loop_args("mid", secs, 4),
            self.share_env("s70", cores=70, kernel="mid", EGPU_TEST_START_AT=time.time() + 3),
        )
        ra, rb = self.collect(a, secs + 60), self.collect(b, secs + 60)
        return {"a30": ra, "b70": rb, "split": figures.split(ra, rb)}

    def priority_ptx(self) -> dict:
        it_s, us_s = self.k("small")
        hi_args = ["periodic", self.secs(4), it_s, us_s, 100]
        solo = self.run("workload.py", hi_args, self.share_env("hisolo", kernel="small"))
        lo_alone = self.run(
            "workload.py",
            self.loop_args("mid", self.secs(4), 4),
            self.share_env("loalone", priority="low", kernel="mid"),
        )
        at = time.time() + 3  # both initialised by then; hi starts 1 s into the low loop
        lo = self.spawn(
            "workload.py",
            self.loop_args("mid", self.secs(6), 4),
            self.share_env("lo", priority="low", kernel="mid", EGPU_TEST_START_AT=at),
        )
        hi = self.run(
            "workload.py", hi_args, self.share_env("hi", kernel="small", EGPU_TEST_START_AT=at + 1)
        )
        lo_r = self.collect(lo, self.secs(6) + 60)
        return {
            "hi_solo": solo,
            "hi_beside_low": hi,
            "low_alone": lo_alone,
            "low_beside_hi": lo_r,
            "p99_ratio": figures.ratio(hi.get("lat_us_p99"), solo.get("lat_us_p99")),
            "p50_ratio": figures.ratio(hi.get("lat_us_p50"), solo.get("lat_us_p50")),
            "low_throughput_kept": figures.ratio(lo_r.get("use_pct"), lo_alone.get("use_pct")),
        }

    def graphs(self) -> dict:
        """CUDA graphs under a 30% share: the capture survives the gate (GLOBAL mode, the
        poller running) and replays are capped; PyTorch's torch.cuda.graph likewise."""
        it, us = self.k("mid")
        secs = self.secs(4)
        out: dict = {
            "ptx": self.run(
                "workload.py",
                ["graph", secs, it, us, 5],
                self.share_env("graph30", cores=30, kernel="mid"),
            )
        }
        use = figures.steady(out["ptx"]) if "win_use_pct" in out["ptx"] else None
        out["ptx_cap_error_pts"] = round(abs(use - 30), 2) if use is not None else None
        if self.torch:
            out["torch"] = self.run(
                "torch_work.py", ["graph", secs], self.share_env("tgraph30", cores=30), 180
            )
        return out

    def overhead(self) -> dict:
        it, _ = self.k("tiny")
        secs = self.secs(3)
        rates: dict = {"plain": [], "uncapped": []}
        for _ in range(2):
            for name, pre in (("plain", False), ("uncapped", True)):
                r = self.run(
                    "workload.py",
                    ["launchrate", secs, it],
                    self.share_env("ovh", preload=pre, kernel="tiny"),
                )
                if "launches_per_s" in r:
                    rates[name].append(r["launches_per_s"])
        plain = max(rates["plain"], default=None)
        ours = max(rates["uncapped"], default=None)
        # an uncapped high-priority share beside a (sleeping) low-priority one is watched:
        # every launch records an event so that the low share knows when it may run
        idle = self.spawn(
            "workload.py",
            ["idle", secs * 2 + 5],
            self.share_env("ovhlow", priority="low", kernel="tiny"),
        )
        time.sleep(3)  # its slot is claimed; the high share's poller sees it within 12.5 ms
        watched = self.run(
            "workload.py", ["launchrate", secs, it], self.share_env("ovh", kernel="tiny")
        )
        idle.kill()
        self.collect(idle, 10)
        rates["watched"] = [watched.get("launches_per_s")]
        # a capped share (issue 17): the gated launch path on a loop of the smallest kernels
        # (one iteration: a few us of GPU time a launch, well under the 90% cap, so that the
        # launch path is what is measured, not the cap)
        small: dict = {"plain_small": [], "capped_small": []}
        for _ in range(2):
            for name, cores, pre in (("plain_small", 0, False), ("capped_small", 90, True)):
                r = self.run(
                    "workload.py",
                    ["launchrate", secs, 1],
                    self.share_env("ovhcap", cores=cores, preload=pre, kernel="tiny"),
                )
                if "launches_per_s" in r:
                    small[name].append(r["launches_per_s"])
        rates.update(small)
        return {
            "rates": rates,
            "overhead_pct": figures.overhead_pct(plain, ours),
            "watched_overhead_pct": figures.overhead_pct(plain, watched.get("launches_per_s")),
            "capped_overhead_pct": figures.overhead_pct(
                max(small["plain_small"], default=None), max(small["capped_small"], default=None)
            ),
        }

    def fc15(self) -> dict:
        total = int(self.calib.get("total_mib", 0))
        limit = total + 8192
        env = self.share_env("fc15", memory_mib=limit, oversub=True)
        r = self.run("workload.py", ["fc15", limit], env, timeout=240)
        r["ok"] = (
            r.get("first_failure") is None
            and r.get("one_more_is_oom") is True
            and r.get("allocated_mib", 0) >= limit - 1024
        )
        return r

    def fc16(self) -> dict:
        env = self.share_env("fc16", memory_mib=12288)
        r = self.run("workload.py", ["fc16", 3000], env)
        if self.torch:
            r["torch"] = self.run(
                "torch_work.py", ["fc16", 3000], self.share_env("fc16t", memory_mib=12288)
            )
        return r

    def torch_checks(self) -> dict:
        if not self.torch:
            return {"skipped": "PyTorch is not installed (see tests/gpu/run.sh: .whl/)"}
        out: dict = {}
        secs = self.secs(8)
        at = time.time() + 25  # torch starts slowly: both loops begin together
        a = self.spawn(
            "torch_work.py",
            ["matmul", secs],
            self.share_env("tm30", cores=30, EGPU_TEST_START_AT=at),
        )
        b = self.spawn(
            "torch_work.py",
            ["matmul", secs],
            self.share_env("tm70", cores=70, EGPU_TEST_START_AT=at),
        )
        ra, rb = self.collect(a, secs + 120), self.collect(b, secs + 120)
        out["fc13_matmul_30"], out["fc13_matmul_70"] = ra, rb
        if "per_s" in ra and "per_s" in rb and ra["per_s"] + rb["per_s"] > 0:
            pa = round(100 * ra["per_s"] / (ra["per_s"] + rb["per_s"]))
            out["fc13_split"] = (pa, 100 - pa)
        plain = self.run(
            "torch_work.py", ["matmul", self.secs(4)], self.share_env("tplain", preload=False)
        )
        unc = self.run("torch_work.py", ["matmul", self.secs(4)], self.share_env("tunc"))
        out["matmul_plain"], out["matmul_uncapped"] = plain, unc
        out["matmul_overhead_pct"] = figures.overhead_pct(plain.get("per_s"), unc.get("per_s"))
        solo = self.run("torch_work.py", ["hiloop", self.secs(4), 100], self.share_env("thisolo"))
        at = time.time() + 25
        trainer = self.spawn(
            "torch_work.py",
            ["matmul", self.secs(8)],
            self.share_env("ttrain", priority="low", EGPU_TEST_START_AT=at),
        )
        hi = self.run(
            "torch_work.py",
            ["hiloop", self.secs(4), 100],
            self.share_env("thi", EGPU_TEST_START_AT=at + 2),
        )
        tr = self.collect(trainer, self.secs(8) + 120)
        out["fc14_hi_solo"], out["fc14_hi_beside_trainer"], out["fc14_trainer"] = solo, hi, tr
        out["fc14_p99_ratio"] = figures.ratio(hi.get("lat_us_p99"), solo.get("lat_us_p99"))
        out["fc14_trainer_per_s_vs_alone"] = figures.ratio(tr.get("per_s"), plain.get("per_s"))
        env = self.share_env(
            "tfc02", memory_mib=4096, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"
        )
        out["fc02"] = self.run("torch_work.py", ["fc02", 12, 512], env)
        return out

    # ---- the interposer's driver assumptions -----------------------------------------
    DP_TIMEOUT_S = 30  # each process; the group takes a few seconds on a card

    def driver_paths(self) -> dict:
        """Real-driver checks of what the interposer's pool, VMM import, cuCtxSetLimit and
        NVML process-list paths assume: each small, its own processes and shares, reported
        pass / fail / skip (with why)."""
        out: dict = {}
        for name, fn in (
            ("vmm_import", self._dp_vmm_import),
            ("pool_cap", self._dp_pool_cap),
            ("pool_destroy", self._dp_pool_destroy),
            ("heap_limit", self._dp_heap_limit),
            ("nvml_procs", self._dp_nvml_procs),
        ):
            try:
                out[name] = fn()
            except Exception as e:  # one broken check must not lose the others
                out[name] = {"status": "fail", "why": f"{type(e).__name__}: {e}"}
            print(f"    {name:<13} {out[name]['status'].upper():<5} {out[name]['why']}", flush=True)
        out["statuses"] = {k: v["status"] for k, v in out.items()}
        return out

    def _dp_vmm_import(self) -> dict:
        mib = 512
        plain = self.run(
            "workload.py",
            ["vmm_trial", mib],
            self.share_env("vmmplain", preload=False),
            self.DP_TIMEOUT_S,
        )
        shared = self.run(
            "workload.py",
            ["vmm_import", mib],
            self.share_env("vmm", memory_mib=2048),
            self.DP_TIMEOUT_S,
        )
        return {**figures.judge_vmm_import(plain, shared), "driver": plain, "share": shared}

    def _dp_pool_cap(self) -> dict:
        share, step = 1024, 64
        r = self.run(
            "workload.py",
            ["pool_cap", step, share],
            self.share_env("poolcap", memory_mib=share),
            self.DP_TIMEOUT_S,
        )
        return {**figures.judge_pool_cap(r, share, step), "share_mib": share, "run": r}

    def _dp_pool_destroy(self) -> dict:
        mib = 256
        r = self.run(
            "workload.py",
            ["pool_destroy", mib],
            self.share_env("pooldead", memory_mib=1024),
            self.DP_TIMEOUT_S,
        )
        return {**figures.judge_pool_destroy(r, mib), "run": r}

    def _dp_heap_limit(self) -> dict:
        share, grow = 1024, 256
        r = self.run(
            "workload.py",
            ["heap_limit", grow, 2 * share],
            self.share_env("heap", memory_mib=share),
            self.DP_TIMEOUT_S,
        )
        return {**figures.judge_heap_limit(r, grow), "share_mib": share, "run": r}

    def _holding(self, mib: int, env: dict) -> subprocess.Popen:
        """A process holding mib on the card, once it says so (or has failed)."""
        p = self.spawn("workload.py", ["hold", mib, self.DP_TIMEOUT_S * 2], env)
        assert p.stdout is not None
        end = time.monotonic() + self.DP_TIMEOUT_S
        while time.monotonic() < end and p.poll() is None:
            if select.select([p.stdout], [], [], 0.2)[0]:
                line = p.stdout.readline()
                if line.startswith("holding"):
                    return p
                if line.startswith("failed") or not line:
                    break
        p.kill()
        p.wait()
        raise RuntimeError(f"a holder of {mib} MiB did not start (rc {p.returncode})")

    def _dp_nvml_procs(self) -> dict:
        held: list[subprocess.Popen] = []
        try:
            # outside the share: another share's process (a co-tenant) holding 512 MiB
            held.append(self._holding(512, self.share_env("npother", memory_mib=4096)))
            # the share's other process, holding 128 MiB
            held.append(self._holding(128, self.share_env("np", memory_mib=4096)))
            lister = self.run(
                "workload.py",
                ["procs"],
                self.share_env("np", memory_mib=4096),
                self.DP_TIMEOUT_S,
            )
            plain = self.run(
                "workload.py",
                ["procs"],
                self.share_env("npplain", preload=False),
                self.DP_TIMEOUT_S,
            )
        finally:
            for p in held:
                p.kill()
                p.communicate()
        other, peer = held[0].pid, held[1].pid
        return {
            **figures.judge_nvml_procs(lister, plain, peer, other),
            "other_pid": other,
            "peer_pid": peer,
            "share": lister,
            "driver": plain,
        }

    # ---- summary -----------------------------------------------------------------
    def summary(self) -> dict:
        r = self.res
        g = lambda *ks: _get(r, *ks)  # noqa: E731
        split = g("torch", "fc13_split") or g("split_ptx", "split")
        hp99 = g("torch", "fc14_p99_ratio") or g("priority_ptx", "p99_ratio")
        fig = {
            "cap_error_pts": g("caps", "errors", "worst"),
            "split_30_70": list(split) if split else None,
            "hiprio_p99_ratio": hp99,
            "uncapped_overhead_pct": g("overhead", "overhead_pct"),
        }
        r["summary"] = fig
        self.save()
        rows = [
            (
                "FC-13 worst cap error (pts)",
                fig["cap_error_pts"],
                "caps 10..90, 50 us + 20 ms kernels",
            ),
            (
                "FC-13 split 30:70",
                "{}:{}".format(*tuple(split)) if split else None,
                "torch matmul" if g("torch", "fc13_split") else "PTX 2 ms kernels",
            ),
            (
                "FC-13 split 30:70 (PTX)",
                "{}:{}".format(*tuple(g("split_ptx", "split")))
                if g("split_ptx", "split")
                else None,
                "",
            ),
            ("FC-14 hi p99 ratio", hp99, "beside low / solo"),
            (
                "FC-14 hi p99 us (PTX)",
                g("priority_ptx", "hi_beside_low", "lat_us_p99"),
                f"solo {g('priority_ptx', 'hi_solo', 'lat_us_p99')}",
            ),
            (
                "FC-14 low throughput kept",
                g("priority_ptx", "low_throughput_kept"),
                "beside hi / alone",
            ),
            (
                "FC-14 low max gap ms",
                g("priority_ptx", "low_beside_hi", "max_gap_ms"),
                "resumption",
            ),
            (
                "graph capture under a 30% cap",
                g("graphs", "ptx", "capture_rc"),
                f"0 = ok; replay cap error {g('graphs', 'ptx_cap_error_pts')} pts;"
                f" torch.cuda.graph ok {g('graphs', 'torch', 'capture_ok')}",
            ),
            (
                "FC-15 oversubscription ok",
                g("fc15", "ok"),
                f"{g('fc15', 'allocated_mib')} MiB of {g('fc15', 'limit_mib')}",
            ),
            (
                "FC-16 cu total MiB",
                g("fc16", "cu_total_mib"),
                f"nvml {g('fc16', 'nvml_total_mib')}",
            ),
            ("FC-02 fails at step", g("torch", "fc02", "fail_at_step"), "want 8"),
            ("uncapped overhead %", fig["uncapped_overhead_pct"], "launch rate, tiny kernels"),
            (
                "watched overhead %",
                g("overhead", "watched_overhead_pct"),
                "uncapped high priority beside a low-priority share",
            ),
            (
                "capped overhead %",
                g("overhead", "capped_overhead_pct"),
                "a 90% share, smallest kernels (the gated launch path)",
            ),
            ("uncapped matmul overhead %", g("torch", "matmul_overhead_pct"), "torch"),
            (
                "driver paths pass/fail/skip",
                _tally(g("driver_paths", "statuses")),
                _not_passed(g("driver_paths", "statuses")),
            ),
        ]
        print(figures.table(rows), flush=True)
        return fig

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def _tally(st: object) -> str | None:
    if not isinstance(st, dict) or not st:
        return None
    v = list(st.values())
    return f"{v.count('pass')}/{v.count('fail')}/{v.count('skip')}"


def _not_passed(st: object) -> str:
    if not isinstance(st, dict):
        return "VMM import, pools, heap limit, NVML lists"
    bad = [f"{k} {v}" for k, v in st.items() if v != "pass"]
    return "not passed: " + ", ".join(bad) if bad else "VMM import, pools, heap limit, NVML lists"


def _pair(v: object) -> str | None:
    return f"{v[0]}:{v[1]}" if isinstance(v, (list, tuple)) and len(v) == 2 else None


def _get(d: object, *keys: str) -> object:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT") or "out")
    ap.add_argument(
        "--lib", default=str(HERE.parents[1] / "libinterpose" / "build" / "libegpu_interpose.so")
    )
    ap.add_argument(
        "--fake", action="store_true", help="run against the fake GPU (CPU test of this script)"
    )
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every duration")
    ap.add_argument(
        "--budget", type=float, default=400, help="seconds; later checks are skipped past it"
    )
    ap.add_argument("--only", default="", help="comma list of checks to run (default: all)")
    a = ap.parse_args(argv)
    s = Suite(Path(a.out), Path(a.lib), a.fake, a.scale, a.budget)
    only = set(filter(None, a.only.split(",")))
    try:
        s.step("calibration", s.calibrate)
        if "error" in s.res["calibration"]:
            print(json.dumps(s.res["calibration"]), file=sys.stderr)
        else:
            for name, fn in (
                ("driver_paths", s.driver_paths),
                ("overhead", s.overhead),
                ("caps", s.caps),
                ("split_ptx", s.split_ptx),
                ("priority_ptx", s.priority_ptx),
                ("graphs", s.graphs),
                ("fc15", s.fc15),
                ("fc16", s.fc16),
                ("torch", s.torch_checks),
            ):
                if not only or name in only:
                    s.step(name, fn)
        fig = s.summary()
    finally:
        s.cleanup()
    print(figures.final_line(fig), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
