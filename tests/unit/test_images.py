"""devcluster.images: references, cache keys (what rebuilds what), command lines; and (e2e) the
built egpu archive's content."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from devcluster import images
from devcluster.images import (
    IMAGE_EGPU,
    IMAGE_PAUSE,
    IMAGE_SCHEDULER,
    ImageConfig,
)
from testbed import realnode_install

REPO = Path(__file__).resolve().parents[2]


# --- references ------------------------------------------------------------------------------
def test_references() -> None:
    assert IMAGE_EGPU == "egpu.local/egpu:dev"
    assert IMAGE_PAUSE == "egpu.local/pause:3.10"
    assert IMAGE_SCHEDULER == "egpu.local/egpu-kube-scheduler:dev"
    assert images.IMAGES == (IMAGE_EGPU, IMAGE_PAUSE, IMAGE_SCHEDULER)
    # Each names a registry host (a dot before the first '/'): containerd and the kubelet use
    # it as is instead of normalizing it to docker.io/library/...
    for ref in images.IMAGES:
        assert "." in ref.split("/", 1)[0], ref


def test_kube_scheduler_reference_is_the_manifests() -> None:
    path = REPO / "manifests" / "scheduler" / "kube-scheduler.yaml"
    doc = yaml.safe_load(path.read_text())
    names = {
        c["name"]: c["image"] for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert names["kube-scheduler"] == "ghcr.io/egpu/egpu-kube-scheduler:0.1.0"
    assert realnode_install.LOCAL_IMAGES[names["kube-scheduler"].rpartition(":")[0]] \
        == IMAGE_SCHEDULER


# --- keys --------------------------------------------------------------------------------------
def test_key_of_is_stable_and_input_sensitive() -> None:
    assert images.key_of("a", [1, 2]) == images.key_of("a", (1, 2))
    assert images.key_of("a", [1, 2]) != images.key_of("a", [2, 1])
    assert len(images.key_of("x")) == 16
    assert images.key_of(ImageConfig(cmd=("a",))) != images.key_of(ImageConfig(cmd=("b",)))


def test_base_key_follows_suite_and_packages() -> None:
    base = images.base_key()
    assert base == images.base_key("bookworm", tuple(reversed(images.BASE_PACKAGES)))
    assert base != images.base_key("trixie")
    assert base != images.base_key(packages=(*images.BASE_PACKAGES, "curl"))


def test_deps_key_follows_base_and_dependencies_only() -> None:
    deps = ["aiohttp>=3.9", "PyYAML>=6.0"]
    key = images.deps_key("b1", deps)
    assert key == images.deps_key("b1", list(reversed(deps)))
    assert key != images.deps_key("b2", deps)
    assert key != images.deps_key("b1", [*deps, "grpcio>=1.60"])
    assert key != images.deps_key("b1", deps, pip_spec="pip==24.0")


def test_egpu_key_follows_sources_deps_and_compiler() -> None:
    key = images.egpu_key("d1", "s1", "gcc 12")
    assert key != images.egpu_key("d2", "s1", "gcc 12")
    assert key != images.egpu_key("d1", "s2", "gcc 12")
    assert key != images.egpu_key("d1", "s1", "gcc 13")


def test_small_image_keys() -> None:
    assert images.pause_key(b"int main;", "gcc 12") != images.pause_key(b"int main; ", "gcc 12")
    assert images.pause_key(b"x", "gcc 12") != images.pause_key(b"x", "gcc 13")
    assert images.scheduler_key("aa") != images.scheduler_key("ab")


def test_tree_digest() -> None:
    a = [("x.py", "1"), ("y.py", "2")]
    assert images.tree_digest(a) == images.tree_digest(reversed(a))
    assert images.tree_digest(a) != images.tree_digest([("x.py", "1"), ("y.py", "3")])
    assert images.tree_digest(a) != images.tree_digest([("x.py", "1"), ("z.py", "2")])


def _fake_repo(root: Path) -> Path:
    (root / "pyproject.toml").write_text(
        '[project]\nname = "egpu"\ndependencies = ["aiohttp>=3.9", "PyYAML>=6.0"]\n'
        '[tool.setuptools.packages.find]\ninclude = ["egpu*", "cli*"]\n'
    )
    (root / "README.md").write_text("readme\n")
    for pkg in ("egpu", "cli", "tests", "egpu.egg-info"):
        (root / pkg).mkdir()
        (root / pkg / "__init__.py").write_text("")
    (root / "egpu" / "core.py").write_text("X = 1\n")
    (root / "egpu" / "__pycache__").mkdir()
    (root / "egpu" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (root / "libinterpose" / "src").mkdir(parents=True)
    (root / "libinterpose" / "src" / "a.c").write_text("int a;\n")
    (root / "libinterpose" / "Makefile").write_text("all:\n")
    (root / "libinterpose" / "build").mkdir()
    (root / "libinterpose" / "build" / "x.so").write_bytes(b"\0")
    (root / "libinterpose" / "tests").mkdir()
    (root / "libinterpose" / "tests" / "t.c").write_text("int t;\n")
    return root


def test_sources_and_what_a_change_rebuilds(tmp_path: Path) -> None:
    repo = _fake_repo(tmp_path)
    assert images.repo_source_files(repo) == [
        "README.md",
        "cli/__init__.py",
        "egpu/__init__.py",
        "egpu/core.py",
        "libinterpose/Makefile",
        "libinterpose/src/a.c",
        "pyproject.toml",
    ]
    deps = images.dependencies((repo / "pyproject.toml").read_text())
    assert deps == ["aiohttp>=3.9", "PyYAML>=6.0"]
    base, dkey = images.base_key(), images.deps_key(images.base_key(), deps)
    before = images.egpu_key(dkey, images.source_digest(repo), "gcc 12")

    # caches and build outputs change nothing
    (repo / "egpu" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\1")
    (repo / "libinterpose" / "build" / "x.so").write_bytes(b"\1")
    assert images.egpu_key(dkey, images.source_digest(repo), "gcc 12") == before

    # a source change: only the egpu key moves (base and deps stay cached)
    for rel in ("egpu/core.py", "libinterpose/src/a.c"):
        (repo / rel).write_text((repo / rel).read_text() + "\n")
        after = images.egpu_key(dkey, images.source_digest(repo), "gcc 12")
        assert after != before
        before = after
    new_deps = images.dependencies((repo / "pyproject.toml").read_text())
    assert images.base_key() == base and images.deps_key(base, new_deps) == dkey


def test_package_dirs() -> None:
    text = '[tool.setuptools.packages.find]\ninclude = ["egpu*", "cli*", "egpu.sub"]\n'
    dirs = ["egpu", "egpu.egg-info", "cli", "tests", "egpux"]
    assert images.package_dirs(text, dirs) == ["cli", "egpu", "egpux"]
    assert images.package_dirs((REPO / "pyproject.toml").read_text(), ["egpu", "tests"]) == [
        "egpu"
    ]


def test_is_source() -> None:
    roots = ["egpu", "cli"]
    assert images.is_source("pyproject.toml", roots)
    assert images.is_source("egpu/x/y.py", roots)
    assert images.is_source("libinterpose/include/egpu_cuda.h", roots)
    assert not images.is_source("libinterpose/tests/t.c", roots)
    assert not images.is_source("libinterpose/build/libegpu_interpose.so", roots)
    assert not images.is_source("egpu/__pycache__/x.cpython-311.pyc", roots)
    assert not images.is_source("tests/test_x.py", roots)
    assert not images.is_source("egpu/.hidden", roots)


# --- recipes and command lines ------------------------------------------------------------
def test_manylinux_platforms() -> None:
    plats = images.manylinux_platforms((2, 36), "x86_64")
    assert plats[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in plats
    assert "manylinux_2_37_x86_64" not in plats and "manylinux_2_16_x86_64" not in plats
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(plats)
    assert not any("musllinux" in p for p in plats)


def test_pip_argv() -> None:
    argv = images.pip_download_argv("/py", "/w", ["aiohttp>=3.9", "pip"])
    assert argv[:4] == ["/py", "-m", "pip", "download"]
    assert "--only-binary=:all:" in argv and argv[argv.index("--abi") + 1] == "cp311"
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert argv[-2:] == ["aiohttp>=3.9", "pip"]
    inst = images.pip_install_argv("/tmp/w/pip-26.whl", "/tmp/w", "/tmp/s", ["x"], no_deps=True)
    assert inst[:3] == ["python3", "/tmp/w/pip-26.whl/pip", "install"]
    assert {"--no-index", "--no-cache-dir", "--break-system-packages", "--no-deps"} <= set(inst)
    assert inst[inst.index("--root") + 1] == "/tmp/s" and inst[-1] == "x"


def test_chroot_script_mounts_read_only_and_binds_under_tmp() -> None:
    script = images.chroot_script("/r oot/", {"wheels": "/host/w"}, ["python3", "-c", "x y"])
    lines = script.splitlines()
    assert lines[:2] == ["set -e", "umask 022"]
    assert lines.index("mount -o remount,bind,ro '/r oot'") < lines.index(
        "mount --rbind /dev '/r oot/dev'"
    )
    assert "mount --bind /host/w '/r oot/tmp/wheels'" in lines
    assert lines[-1].startswith("exec chroot '/r oot' /usr/bin/env -i ")
    assert lines[-1].endswith("python3 -c 'x y'")
    as_user = images.chroot_script("/r", {}, ["id"], user="65532:65532")
    assert as_user.splitlines()[-1].startswith("exec chroot --userspec=65532:65532 /r ")


def test_configs() -> None:
    assert images.EGPU_CONFIG.cmd == ("egpu", "--help")
    assert {"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"} <= set(images.EGPU_CONFIG.env)
    assert images.PAUSE_CONFIG.entrypoint == ("/pause",)
    assert images.SCHEDULER_CONFIG.entrypoint == ("/usr/local/bin/egpu-kube-scheduler",)
    assert any(e.startswith("PATH=") and "/usr/local/bin" in e
               for e in images.SCHEDULER_CONFIG.env)  # `command: [egpu-kube-scheduler, ...]`
    args = images.config_args(images.SCHEDULER_CONFIG)
    assert args[:3] == ["--clear=config.env", "--clear=config.entrypoint", "--clear=config.cmd"]
    assert "--config.user=65532:65532" in args
    assert "nonroot:x:65532:65532:" in images.passwd_text()


def test_names() -> None:
    assert images.archive_name("egpu", "0123456789abcdef") == "egpu-0123456789abcdef.oci.tar"
    pat = images.stage_pattern("egpu-kube-scheduler")
    assert pat.match("egpu-kube-scheduler-0123456789abcdef.oci.tar")
    assert pat.match("egpu-kube-scheduler-0123456789abcdef")
    assert not pat.match("egpu-kube-scheduler-0123456789abcdef.oci.tar.tmp")
    assert not images.stage_pattern("kube-scheduler").match(
        "egpu-kube-scheduler-0123456789abcdef.oci.tar")
    assert not images.stage_pattern("egpu").match("egpu-base-0123456789abcdef")


def test_missing_scheduler_binary_is_said_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EGPU_CACHE", str(tmp_path))
    with pytest.raises(images.ImagesError,
                       match="egpu-kube-scheduler:dev: its binary is not built yet"):
        images.ensure_images(only=[IMAGE_SCHEDULER], log=lambda _m: None)
    assert images.main(["--print", IMAGE_SCHEDULER]) == 1
    out = capsys.readouterr().out
    assert out.startswith(IMAGE_SCHEDULER) and "missing" in out
    with pytest.raises(images.ImagesError, match="unknown image"):
        images.ensure_images(only=["docker.io/library/busybox:latest"])


# --- e2e: the built archives -----------------------------------------------------------------
def _ref_name(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        f = tar.extractfile("index.json")
        assert f is not None
        index = json.load(f)
    (manifest,) = index["manifests"]
    return manifest["annotations"]["org.opencontainers.image.ref.name"]


@pytest.mark.e2e
def test_built_archives(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("unpacking an image (umoci, chroot) needs root (README)")
    paths = images.archive_paths()
    missing = [r for r, p in paths.items() if p is None or not p.exists()]
    if missing:
        pytest.fail(f"not built for the current inputs: {', '.join(missing)} (run `make image`)")

    # ctr images import names each image by this annotation (a full reference is kept as is)
    for ref, archive in paths.items():
        assert archive is not None and _ref_name(archive) == ref

    def config(archive: Path) -> dict:
        out = subprocess.run(
            ["skopeo", "inspect", "--config", f"oci-archive:{archive}"],
            capture_output=True, text=True, check=True,
        ).stdout
        return json.loads(out)["config"]

    assert config(paths[IMAGE_PAUSE])["Entrypoint"] == ["/pause"]  # type: ignore[arg-type]
    sched = config(paths[IMAGE_SCHEDULER])  # type: ignore[arg-type]
    assert sched["Entrypoint"] == ["/usr/local/bin/egpu-kube-scheduler"]
    assert sched["User"] == "65532:65532"  # the Deployment's runAsUser
    egpu_cfg = config(paths[IMAGE_EGPU])  # type: ignore[arg-type]
    assert egpu_cfg["Cmd"] == ["egpu", "--help"]
    assert "PYTHONUNBUFFERED=1" in egpu_cfg["Env"]

    layout, bundle = tmp_path / "oci", tmp_path / "bundle"
    subprocess.run(
        ["skopeo", "--insecure-policy", "copy", "--quiet",
         f"oci-archive:{paths[IMAGE_EGPU]}", f"oci:{layout}:egpu"],
        check=True,
    )
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:egpu", str(bundle)], check=True,
                   capture_output=True)
    root = bundle / "rootfs"

    def present(rel: str) -> bool:
        """rel exists in the image, following symlinks inside the rootfs."""
        p = root / rel
        for _ in range(10):
            if not p.is_symlink():
                return p.exists()
            target = os.readlink(p)
            p = root / target.lstrip("/") if target.startswith("/") else p.parent / target
        return False

    for cmd in ("egpu", "egpu-webhook", "egpu-node-agent", "egpu-hook", "kubectl-egpu"):
        assert present(f"usr/local/bin/{cmd}"), cmd
        assert (root / "usr/local/bin" / cmd).read_text().startswith("#!/usr/bin/python3")
    for tool in ("usr/bin/python", "usr/bin/python3", "bin/sh"):
        assert present(tool), tool
    so = root / "opt/egpu/lib/libegpu_interpose.so"
    assert so.read_bytes()[:4] == b"\x7fELF"
    assert not list((root / "var/lib/apt/lists").iterdir())
    assert not (root / "root/.cache/pip").exists()

    # what the node DaemonSet's init container and the Deployments run
    script = (
        "egpu --help >/dev/null && python -m runtime_hook.bundle /tmp/hook && test -s /tmp/hook"
        " && python3 -c 'import webhook.main, node_agent.main, cli.main'"
    )
    assert shutil.which("unshare")
    # as root (the init container), and as the webhook pod's user
    webhook = "egpu-webhook --help >/dev/null && " + script
    for user, what in (("", script), ("65532:65532", webhook)):
        sh = images.chroot_script(str(root), {}, ["sh", "-c", what], user=user)
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh",
                               "-c", sh], capture_output=True, text=True)
        assert proc.returncode == 0, (user, proc.stdout + proc.stderr)
