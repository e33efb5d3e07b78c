"""Build the dev cluster's binaries from pinned Go modules (``python -m devcluster.build``).

Everything lands in a cache outside the clone, so every clone (and CI's fresh clone, when the
cache folder is kept between runs) reuses it:

    ${EGPU_CACHE:-~/.cache/egpu}/
        go/mod/                    GOMODCACHE (module sources)
        go/build/                  GOCACHE (compiled packages)
        k8s-<version>/src/<group>/ small generated wrapper Go modules (go.mod, tools.go)
        k8s-<version>/bin/         kube-apiserver kube-controller-manager kube-scheduler
                                   kubectl etcd kwok ... and egpu-kube-scheduler

Only missing binaries are built. egpu-kube-scheduler (kube-scheduler with egpu's plugin) is
built from this checkout's kube-scheduler/ module (go.mod and go.sum as committed), named by
the digest of its sources (``plugin_scheduler``). Each binary
is built with ``go build -p 2 -trimpath -ldflags='-s -w'`` and GOFLAGS=-mod=mod,
GOTOOLCHAIN=local.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# --- Pinned versions ----------------------------------------------------------------------
K8S_VERSION = "v1.37.2"  # k8s.io/kubernetes
ETCD_VERSION = "v3.7.0"  # go.etcd.io/etcd/server/v3: the etcd client version k8s v1.37.2 pins
KWOK_VERSION = "v0.8.0"  # sigs.k8s.io/kwok
# The real node's parts (issue 13): containerd 2.x with its runc shim, crictl, and helm.
CONTAINERD_VERSION = "v2.4.2"  # github.com/containerd/containerd/v2
CRI_TOOLS_VERSION = "v1.37.0"  # sigs.k8s.io/cri-tools (crictl), matching the kubelet's minor
HELM_VERSION = "v3.22.0"  # helm.sh/helm/v3
# github.com/prometheus/prometheus publishes Prometheus 3.X.Y as the Go module v0.3XX.Y
PROMETHEUS_MODULE_VERSION = "v0.316.0"
PROMETHEUS_VERSION = "3.16.0"
# containerd's storage drivers that need cgo or kernel headers are left out; overlayfs and
# native snapshotters stay (the real node uses overlayfs).
CONTAINERD_TAGS = "no_btrfs no_devmapper no_zfs"

BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "etcd",
    "kwok",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "crictl",
    "helm",
    "prometheus",
    "promtool",
)


def staging_version(k8s_version: str = K8S_VERSION) -> str:
    """k8s.io/kubernetes v1.X.Y publishes its staging repos (k8s.io/api ...) as v0.X.Y."""
    major_minor_patch = k8s_version.lstrip("v").split(".", 1)[1]
    return f"v0.{major_minor_patch}"


def cache_root() -> Path:
    return Path(os.environ.get("EGPU_CACHE") or Path.home() / ".cache" / "egpu").expanduser()


def version_dir(k8s_version: str = K8S_VERSION) -> Path:
    return cache_root() / f"k8s-{k8s_version.lstrip('v')}"


def bin_dir(k8s_version: str = K8S_VERSION) -> Path:
    return version_dir(k8s_version) / "bin"


def binary_path(name: str, k8s_version: str = K8S_VERSION) -> Path:
    return bin_dir(k8s_version) / name


def find_go() -> str:
    go = os.environ.get("GO") or shutil.which("go")
    if not go and Path("/usr/local/go/bin/go").exists():
        go = "/usr/local/go/bin/go"
    if not go:
        raise SystemExit("devcluster.build: no `go` on PATH (set GO=/path/to/go)")
    return go


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    root = cache_root()
    env["GOMODCACHE"] = str(root / "go" / "mod")
    env["GOCACHE"] = str(root / "go" / "build")
    env["GOFLAGS"] = "-mod=mod"
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    return env


@dataclass(frozen=True)
class Group:
    """One wrapper module and the binaries built from it."""

    name: str
    module: str
    version: str
    packages: dict[str, str]  # binary name -> Go package path
    ldflags: str = "-s -w"
    tags: str = ""  # go build -tags

    def stamp(self) -> str:
        """What a built binary must match to be reused (written next to it as .<name>.stamp)."""
        tags = f" -tags={self.tags}" if self.tags else ""
        return f"{self.module}@{self.version} -trimpath -ldflags={self.ldflags}{tags}\n"


def k8s_version_ldflags(k8s_version: str = K8S_VERSION) -> str:
    """-X flags that k8s' hack/lib/version.sh sets, so the binaries report their real version
    (kubectl version, /version, feature-gate emulation) instead of v0.0.0-master."""
    major, minor = k8s_version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={k8s_version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return "-s -w " + " ".join(flags)


# The Kubernetes version helm v3.22.0 is built against (its go.mod: k8s.io/client-go v0.37.0):
# `helm template` and `helm lint` check charts' kubeVersion against it.
HELM_K8S_MINOR = "37"


def helm_ldflags() -> str:
    """The -X flags of helm's Makefile, so `helm version` says v3.22.0 (not v3.22) and charts'
    kubeVersion constraints are checked against Kubernetes 1.37 (not 1.20)."""
    flags = [f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
             "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"]
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={HELM_K8S_MINOR}"]
    return "-s -w " + " ".join(flags)


def prometheus_ldflags() -> str:
    """The -X flags of Prometheus' promu build, so `prometheus --version` names its version."""
    pkg = "github.com/prometheus/common/version"
    return (f"-s -w -X {pkg}.Version={PROMETHEUS_VERSION} -X {pkg}.Revision=module "
            f"-X {pkg}.Branch=HEAD -X {pkg}.BuildUser=egpu-devcluster")


def groups(k8s_version: str = K8S_VERSION) -> list[Group]:
    return [
        Group(
            "kubernetes",
            "k8s.io/kubernetes",
            k8s_version,
            {
                "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
                "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
                "kubectl": "k8s.io/kubernetes/cmd/kubectl",
                "kubelet": "k8s.io/kubernetes/cmd/kubelet",
                "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
            },
            ldflags=k8s_version_ldflags(k8s_version),
        ),
        Group(
            "etcd", "go.etcd.io/etcd/server/v3", ETCD_VERSION, {"etcd": "go.etcd.io/etcd/server/v3"}
        ),
        Group("kwok", "sigs.k8s.io/kwok", KWOK_VERSION, {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
        Group(
            "containerd",
            "github.com/containerd/containerd/v2",
            CONTAINERD_VERSION,
            {
                "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
                "containerd-shim-runc-v2": (
                    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
                ),
                "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
            },
            ldflags=(
                "-s -w -X github.com/containerd/containerd/v2/version.Version="
                + CONTAINERD_VERSION
            ),
            tags=CONTAINERD_TAGS,
        ),
        Group(
            "cri-tools",
            "sigs.k8s.io/cri-tools",
            CRI_TOOLS_VERSION,
            {"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"},
        ),
        Group("helm", "helm.sh/helm/v3", HELM_VERSION, {"helm": "helm.sh/helm/v3/cmd/helm"},
              ldflags=helm_ldflags()),
        # issue 26: the dev cluster's Prometheus, and promtool for the alert rules' tests
        Group("prometheus", "github.com/prometheus/prometheus", PROMETHEUS_MODULE_VERSION,
              {"prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
               "promtool": "github.com/prometheus/prometheus/cmd/promtool"},
              ldflags=prometheus_ldflags()),
    ]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise SystemExit(f"devcluster.build: {what} failed ({' '.join(cmd)}):\n{tail}")


def _staging_replaces(go: str, env: dict[str, str], k8s_version: str, work: Path) -> list[str]:
    """k8s.io/kubernetes' go.mod points every k8s.io/* staging repo at ./staging/...; as a
    dependency those replaces are ignored and the requires read v0.0.0, so the wrapper must
    replace each one with its published v0.X.Y."""
    _run(
        [go, "mod", "download", f"k8s.io/kubernetes@{k8s_version}"],
        work,
        env,
        "downloading k8s.io/kubernetes",
    )
    gomod = Path(env["GOMODCACHE"]) / "cache" / "download" / "k8s.io" / "kubernetes" / "@v"
    text = (gomod / f"{k8s_version}.mod").read_text()
    names = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", text, re.MULTILINE)
    sv = staging_version(k8s_version)
    return [f"\t{n} => {n} {sv}" for n in sorted(set(names))]


def write_wrapper(group: Group, go: str, env: dict[str, str], k8s_version: str) -> Path:
    work = version_dir(k8s_version) / "src" / group.name
    work.mkdir(parents=True, exist_ok=True)
    gomod = work / "go.mod"
    ready = work / ".ready"
    # The marker names the packages, so adding a binary to a group regenerates its wrapper.
    marker = f"{group.module}@{group.version} {' '.join(sorted(group.packages.values()))}\n"
    if gomod.exists() and (work / "go.sum").exists() and ready.exists() \
            and ready.read_text() == marker:
        return work
    lines = [
        f"module egpu.local/devcluster/{group.name}",
        "",
        "go 1.26.0",
        "",
        f"require {group.module} {group.version}",
    ]
    if group.name == "kubernetes":
        gomod.write_text("\n".join(lines) + "\n")  # so `go mod download` runs inside a module
        lines += ["", "replace (", *_staging_replaces(go, env, k8s_version, work), ")"]
    gomod.write_text("\n".join(lines) + "\n")
    imports = "\n".join(f'\t_ "{pkg}"' for pkg in group.packages.values())
    (work / "tools.go").write_text(
        "//go:build tools\n\n// Generated by devcluster/build.py: pins the commands built here.\n"
        f"package tools\n\nimport (\n{imports}\n)\n"
    )
    print(f"  resolving modules for {group.name} ({group.module}@{group.version}) ...", flush=True)
    t0 = time.monotonic()
    _run([go, "mod", "tidy"], work, env, f"go mod tidy for {group.name}")
    ready.write_text(marker)
    print(f"  resolved in {time.monotonic() - t0:.0f}s", flush=True)
    return work


def _stamp_path(name: str, k8s_version: str = K8S_VERSION) -> Path:
    return bin_dir(k8s_version) / f".{name}.stamp"


def missing(k8s_version: str = K8S_VERSION) -> list[str]:
    """Binaries not built yet, or built from other versions/flags than pinned here."""
    out = []
    for group in groups(k8s_version):
        for name in group.packages:
            stamp = _stamp_path(name, k8s_version)
            if (
                not binary_path(name, k8s_version).exists()
                or not stamp.exists()
                or (stamp.read_text() != group.stamp())
            ):
                out.append(name)
    return [b for b in BINARIES if b in out]


PLUGIN_SCHEDULER = "egpu-kube-scheduler"
PLUGIN_MODULE_DIR = Path(__file__).resolve().parents[1] / "kube-scheduler"
PLUGIN_PACKAGE = "./cmd/egpu-kube-scheduler"
PLUGIN_BUILDS_KEPT = 4  # egpu-kube-scheduler-<digest> binaries kept in the bin folder


def _plugin_digest(go: str, env: dict[str, str], k8s_version: str) -> str:
    """What egpu-kube-scheduler is built from, as a digest: its module's go.mod, go.sum and
    non-test Go files (paths and contents), the Go version and the flags."""
    digest = hashlib.sha256()
    files = [PLUGIN_MODULE_DIR / "go.mod", PLUGIN_MODULE_DIR / "go.sum",
             *(f for f in PLUGIN_MODULE_DIR.rglob("*.go") if not f.name.endswith("_test.go"))]
    for f in sorted(files):
        digest.update(f.relative_to(PLUGIN_MODULE_DIR).as_posix().encode() + b"\0")
        digest.update(f.read_bytes() + b"\0")
    version = subprocess.run([go, "env", "GOVERSION"], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
    digest.update(f"{version} -trimpath -ldflags={k8s_version_ldflags(k8s_version)}".encode())
    return digest.hexdigest()[:16]


def plugin_scheduler_path(k8s_version: str = K8S_VERSION) -> Path:
    """Where egpu-kube-scheduler built from this checkout's sources lies (built or not):
    ``bin/egpu-kube-scheduler-<digest>``."""
    go = find_go()
    env = {**go_env(), "GOFLAGS": "-mod=readonly"}
    return bin_dir(k8s_version) / f"{PLUGIN_SCHEDULER}-{_plugin_digest(go, env, k8s_version)}"


def plugin_scheduler(k8s_version: str = K8S_VERSION, parallel: int = 2) -> Path:
    """egpu-kube-scheduler built from this checkout's kube-scheduler/ module; returns its path,
    ``bin/egpu-kube-scheduler-<digest of its sources>``, built when missing.

    The name carries the digest, so that clones of other sources sharing the cache never take
    one another's binary (each builds its own, into a temporary file renamed into place);
    the PLUGIN_BUILDS_KEPT newest stay. GOFLAGS=-mod=readonly: the module's go.mod and go.sum
    are the record of its dependencies (k8s.io/kubernetes at ``k8s_version``,
    tests/scheduler/test_placement_port.py checks)."""
    go = find_go()
    env = {**go_env(), "GOFLAGS": "-mod=readonly"}
    folder = bin_dir(k8s_version)
    out = plugin_scheduler_path(k8s_version)
    if out.exists():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    print(f"devcluster.build: building {out.name} from {PLUGIN_MODULE_DIR} ...", flush=True)
    t0 = time.monotonic()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _run([go, "build", f"-p={parallel}", "-trimpath",
              f"-ldflags={k8s_version_ldflags(k8s_version)}", "-o", str(tmp), PLUGIN_PACKAGE],
             PLUGIN_MODULE_DIR, env, f"building {PLUGIN_SCHEDULER}")
        tmp.chmod(0o755)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    builds = sorted(folder.glob(f"{PLUGIN_SCHEDULER}-*"), key=lambda f: f.stat().st_mtime)
    for old in builds[:-PLUGIN_BUILDS_KEPT]:  # a running one keeps its file open: no harm
        old.unlink(missing_ok=True)
    print(f"devcluster.build: {out.name} built in {time.monotonic() - t0:.0f}s", flush=True)
    return out


def build(k8s_version: str = K8S_VERSION, force: bool = False, parallel: int = 2) -> Path:
    """Build whatever of BINARIES is missing, and egpu-kube-scheduler where its sources
    changed (``plugin_scheduler``); returns the bin folder."""
    go = find_go()
    env = go_env()
    out = bin_dir(k8s_version)
    out.mkdir(parents=True, exist_ok=True)
    todo = list(BINARIES) if force else missing(k8s_version)
    if not todo:
        print(f"devcluster.build: all binaries present in {out}", flush=True)
        plugin_scheduler(k8s_version, parallel)
        return out
    print(f"devcluster.build: building {', '.join(todo)} into {out}", flush=True)
    total0 = time.monotonic()
    n = 0
    for group in groups(k8s_version):
        wanted = [b for b in group.packages if b in todo]
        if not wanted:
            continue
        work = write_wrapper(group, go, env, k8s_version)
        for name in wanted:
            n += 1
            print(f"[{n}/{len(todo)}] {name} ({group.packages[name]}) ...", flush=True)
            t0 = time.monotonic()
            tmp = out / f".{name}.tmp"
            _run(
                [
                    go,
                    "build",
                    f"-p={parallel}",
                    "-trimpath",
                    f"-ldflags={group.ldflags}",
                    *([f"-tags={group.tags}"] if group.tags else []),
                    "-o",
                    str(tmp),
                    group.packages[name],
                ],
                work,
                env,
                f"building {name}",
            )
            tmp.replace(out / name)
            _stamp_path(name, k8s_version).write_text(group.stamp())
            print(f"[{n}/{len(todo)}] {name} built in {time.monotonic() - t0:.0f}s", flush=True)
    plugin_scheduler(k8s_version, parallel)
    print(f"devcluster.build: done in {time.monotonic() - total0:.0f}s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m devcluster.build",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--k8s-version", default=K8S_VERSION)
    p.add_argument("--force", action="store_true", help="rebuild even binaries already present")
    p.add_argument("-p", "--parallel", type=int, default=2, help="go build -p (default 2)")
    p.add_argument("--print-bin-dir", action="store_true", help="print the bin folder and exit")
    args = p.parse_args(argv)
    if args.print_bin_dir:
        print(bin_dir(args.k8s_version))
        return 0
    build(args.k8s_version, force=args.force, parallel=args.parallel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
