"""Build the dev cluster's container images without Docker (``python -m devcluster.images``).

Three images, each written as an OCI archive that ``ctr -n k8s.io images import <file>`` loads
under its full reference (the index's ``org.opencontainers.image.ref.name`` annotation holds
the whole reference, which ctr keeps as the image name):

    egpu.local/egpu:dev                       what the repository's Dockerfile describes: every
                                              Python part with its dependencies and the
                                              interposer at /opt/egpu/lib/libegpu_interpose.so
    egpu.local/pause:3.10                     the pod sandbox: a static /pause (devcluster/pause.c)
    egpu.local/egpu-kube-scheduler:dev        kube-scheduler with egpu's plugin (kube-scheduler/),
                                              as devcluster.build builds it from this checkout
                                              (kube-scheduler/Dockerfile describes the same)

Everything is cached outside the clone, keyed by a hash of its inputs:

    ${EGPU_CACHE:-~/.cache/egpu}/images/
        base-<key>/rootfs/     Debian bookworm (debootstrap --variant=minbase + python3), cleaned
        base-<key>/oci/        an OCI layout (umoci) with that rootfs as one layer
        deps-<key>/oci/        base + a layer with the Python dependencies (pip, from wheels)
        deps-<key>/pip/        the pip wheel that installs inside the rootfs
        egpu-<key>.oci.tar     deps + a layer with egpu's wheel and the interposer
        pause-<key>.oci.tar
        egpu-kube-scheduler-<key>.oci.tar

The base key covers the suite and the package list (debootstrap is the slow part), the deps key
the base key and pyproject.toml's dependencies, the egpu key the deps key and the sources (the
Python packages, pyproject.toml, README.md, libinterpose); so a source change rebuilds only the
egpu image's last layer. Python runs inside the rootfs (chroot, in a private mount namespace
with the rootfs read-only): the rootfs's own python3 runs pip from its wheel file and installs
into a staging folder that becomes the layer. Needs root, debootstrap, umoci, skopeo, gcc
(static libc), make and unshare (util-linux).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from devcluster import build

# --- References (what the manifests name, or what a kustomize override points at) ---------
IMAGE_EGPU = "egpu.local/egpu:dev"
IMAGE_PAUSE = "egpu.local/pause:3.10"
IMAGE_SCHEDULER = "egpu.local/egpu-kube-scheduler:dev"
IMAGES = (IMAGE_EGPU, IMAGE_PAUSE, IMAGE_SCHEDULER)
KIND = {IMAGE_EGPU: "egpu", IMAGE_PAUSE: "pause", IMAGE_SCHEDULER: build.PLUGIN_SCHEDULER}

# --- The egpu image's recipe -------------------------------------------------------------
SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"  # EGPU_DEBIAN_MIRROR overrides (not in the key)
BASE_PACKAGES = ("python3", "python-is-python3", "ca-certificates")
# Emptied after debootstrap (the folders stay): package lists and archives, docs, logs, device
# nodes (the runtime makes /dev).
BASE_CLEAN = (
    "var/cache/apt",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "var/log",
    "var/cache/debconf",
    "dev",
    "tmp",
    "run",
)
BASE_KEEP = ("usr/share/locale/locale.alias",)
BASE_TRUNCATE = ("etc/resolv.conf", "etc/hostname")  # the host's, copied by debootstrap
PYTHON_VERSION = "3.11"  # bookworm's python3
GLIBC = (2, 36)  # bookworm's glibc: wheels up to manylinux_2_36 run on it
ARCH = "x86_64"
PIP_SPEC = "pip"
EGPU_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
)
INTERPOSER_PATH = "opt/egpu/lib/libegpu_interpose.so"
INTERPOSER_INPUTS = ("Makefile", "src", "include")  # under libinterpose/
SOURCE_EXTRA = ("pyproject.toml", "README.md")
SKIP_PARTS = ("__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist")
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".egg-info")

PAUSE_SOURCE = "devcluster/pause.c"
PAUSE_CFLAGS = ("-static", "-Os", "-s", "-std=gnu11", "-Wall", "-Wextra", "-Werror")
SCHEDULER_PATH = f"usr/local/bin/{build.PLUGIN_SCHEDULER}"
NONROOT_UID = 65532  # distroless' "nonroot"; the scheduler pod runs as it
PAUSE_UID = 65535  # the upstream pause image's user

LAYOUT_TAG = "image"  # the one tag in every cached OCI layout
REPO = Path(__file__).resolve().parent.parent


class ImagesError(Exception):
    """A step failed or an input is missing; the message says what to do."""


# --- Pure core ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageConfig:
    """The image config fields we set (umoci config)."""

    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""
    workingdir: str = "/"


EGPU_CONFIG = ImageConfig(env=EGPU_ENV, cmd=("egpu", "--help"))
PAUSE_CONFIG = ImageConfig(entrypoint=("/pause",), user=f"{PAUSE_UID}:{PAUSE_UID}")
SCHEDULER_CONFIG = ImageConfig(
    env=(EGPU_ENV[0],),
    entrypoint=(f"/{SCHEDULER_PATH}",),
    user=f"{NONROOT_UID}:{NONROOT_UID}",
)


def key_of(*parts: object) -> str:
    """A short stable hash of JSON-able parts (dataclasses allowed)."""

    def plain(o: object) -> object:
        if isinstance(o, ImageConfig):
            return asdict(o)
        if isinstance(o, tuple | list):
            return [plain(x) for x in o]
        if isinstance(o, Mapping):
            return {str(k): plain(v) for k, v in o.items()}
        return o

    text = json.dumps(plain(list(parts)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tree_digest(files: Iterable[tuple[str, str]]) -> str:
    """Digest of (relative path, content sha256) pairs, order-independent."""
    h = hashlib.sha256()
    for rel, digest in sorted(files):
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


def manylinux_platforms(glibc: tuple[int, int] = GLIBC, arch: str = ARCH) -> list[str]:
    """pip --platform values for a glibc: manylinux_2_<n> down to 2_17, and the old aliases
    (pip does not widen manylinux_2_<n> to older tags by itself)."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def dependencies(pyproject_text: str) -> list[str]:
    """[project].dependencies of a pyproject.toml."""
    return list(tomllib.loads(pyproject_text).get("project", {}).get("dependencies", []))


def package_dirs(pyproject_text: str, top_level_dirs: Iterable[str]) -> list[str]:
    """The top-level folders that [tool.setuptools.packages.find].include selects."""
    data = tomllib.loads(pyproject_text)
    find = data.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    patterns = [p for p in find.get("include", []) if "." not in p]
    return sorted(
        d
        for d in top_level_dirs
        if not d.endswith(".egg-info") and any(fnmatch.fnmatchcase(d, p) for p in patterns)
    )


def is_source(rel: str, roots: Sequence[str]) -> bool:
    """Whether a repository path is an input of egpu's wheel or the interposer."""
    parts = rel.split("/")
    if rel in SOURCE_EXTRA:
        return True
    if any(p in SKIP_PARTS or p.endswith(SKIP_SUFFIXES) or p.startswith(".") for p in parts):
        return False
    if parts[0] == "libinterpose":
        return len(parts) > 1 and parts[1] in INTERPOSER_INPUTS
    return len(parts) > 1 and parts[0] in roots


def base_key(suite: str = SUITE, packages: Sequence[str] = BASE_PACKAGES) -> str:
    return key_of("base", suite, "minbase", sorted(packages), BASE_CLEAN, BASE_KEEP, ARCH)


def deps_key(base: str, deps: Sequence[str], pip_spec: str = PIP_SPEC) -> str:
    return key_of("deps", base, sorted(deps), PYTHON_VERSION, manylinux_platforms(), pip_spec)


def egpu_key(deps: str, sources: str, compiler: str) -> str:
    return key_of("egpu", deps, sources, compiler, EGPU_CONFIG, INTERPOSER_PATH)


def pause_key(source: bytes, compiler: str) -> str:
    return key_of("pause", hashlib.sha256(source).hexdigest(), PAUSE_CFLAGS, compiler, PAUSE_CONFIG)


def scheduler_key(binary_sha256: str) -> str:
    return key_of(build.PLUGIN_SCHEDULER, binary_sha256, SCHEDULER_PATH, SCHEDULER_CONFIG,
                  passwd_text())


def archive_name(kind: str, key: str) -> str:
    return f"{kind}-{key}.oci.tar"


def stage_pattern(kind: str) -> re.Pattern[str]:
    """Names of cached entries of one kind (any key): for pruning the old ones."""
    return re.compile(rf"^{re.escape(kind)}-[0-9a-f]{{16}}(\.oci\.tar)?$")


def human_size(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 10**6 else f"{n / 1e3:.0f} kB"


def passwd_text() -> str:
    nonroot = f"{NONROOT_UID}:{NONROOT_UID}"
    return (
        "root:x:0:0:root:/root:/sbin/nologin\n"
        f"nonroot:x:{nonroot}:nonroot:/home/nonroot:/sbin/nologin\n"
    )


def group_text() -> str:
    return f"root:x:0:\nnonroot:x:{NONROOT_UID}:\n"


def config_args(cfg: ImageConfig) -> list[str]:
    """umoci config flags that set exactly cfg (previous values cleared)."""
    args = ["--clear=config.env", "--clear=config.entrypoint", "--clear=config.cmd"]
    args += [f"--config.env={e}" for e in cfg.env]
    args += [f"--config.entrypoint={e}" for e in cfg.entrypoint]
    args += [f"--config.cmd={c}" for c in cfg.cmd]
    if cfg.user:
        args.append(f"--config.user={cfg.user}")
    args.append(f"--config.workingdir={cfg.workingdir}")
    return args


def pip_download_argv(python: str, dest: str, specs: Sequence[str]) -> list[str]:
    """Wheels for the rootfs's CPython (cp311, manylinux x86_64), downloaded on the host."""
    plats: list[str] = []
    for p in manylinux_platforms():
        plats += ["--platform", p]
    abi = "cp" + PYTHON_VERSION.replace(".", "")
    return [
        python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
        "--abi", abi, *plats, "--dest", dest, *specs,
    ]


def pip_install_argv(pip_wheel: str, wheels: str, root: str, specs: Sequence[str],
                     no_deps: bool = False) -> list[str]:
    """pip run by the rootfs's python3 from its wheel file, installing under `root`."""
    return [
        "python3", f"{pip_wheel}/pip", "install", "--quiet", "--no-index", "--find-links", wheels,
        "--no-cache-dir", "--root", root, "--break-system-packages", "--root-user-action=ignore",
        "--disable-pip-version-check", "--no-warn-script-location",
        *(["--no-deps"] if no_deps else []), *specs,
    ]


CHROOT_ENV = ("PATH=" + EGPU_ENV[0].split("=", 1)[1], "HOME=/root", "LANG=C.UTF-8",
              "PYTHONDONTWRITEBYTECODE=1")


def chroot_script(rootfs: str, binds: Mapping[str, str], argv: Sequence[str],
                  user: str = "") -> str:
    """A sh script, run in a private mount namespace (unshare -m), that runs argv chrooted in
    rootfs (as user "uid:gid" if given): the rootfs read-only, /dev and /proc from the host, a
    tmpfs on /tmp, and each bind (name -> host folder) at /tmp/<name>. Every mount goes away
    with the namespace. umask 022: what it installs is readable by the non-root users the pods
    run as."""
    q = shlex.quote
    r = rootfs.rstrip("/")
    lines = [
        "set -e",
        "umask 022",
        f"mount --bind {q(r)} {q(r)}",
        f"mount -o remount,bind,ro {q(r)}",
        f"mount --rbind /dev {q(r + '/dev')}",
        f"mount -t proc proc {q(r + '/proc')}",
        f"mount -t tmpfs -o mode=1777 tmpfs {q(r + '/tmp')}",
    ]
    for name, host in binds.items():
        lines += [f"mkdir {q(f'{r}/tmp/{name}')}", f"mount --bind {q(host)} {q(f'{r}/tmp/{name}')}"]
    env = " ".join(q(e) for e in CHROOT_ENV)
    userspec = f"--userspec={q(user)} " if user else ""
    lines.append(
        f"exec chroot {userspec}{q(r)} /usr/bin/env -i {env} {' '.join(q(a) for a in argv)}"
    )
    return "\n".join(lines) + "\n"


# --- I/O -------------------------------------------------------------------------------------
Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(msg, flush=True)


def images_dir() -> Path:
    return build.cache_root() / "images"


def _run(cmd: Sequence[str], what: str, cwd: Path | None = None,
         env: Mapping[str, str] | None = None) -> str:
    proc = subprocess.run(
        list(cmd), cwd=cwd, env=None if env is None else dict(env),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise ImagesError(f"{what} failed ({shlex.join(cmd)}):\n{tail}")
    return proc.stdout


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def compiler_version() -> str:
    cc = os.environ.get("CC", "gcc")
    if not shutil.which(cc):
        return f"{cc}: missing"
    return f"{cc} " + _run([cc, "-dumpfullversion", "-dumpversion"], f"{cc} --version").strip()


def repo_source_files(repo: Path = REPO) -> list[str]:
    """Repository paths (relative, '/') that egpu's wheel and the interposer are built from:
    git's view (tracked and untracked-not-ignored files) when the clone is a git work tree,
    else a walk."""
    pyproject = (repo / "pyproject.toml").read_text()
    tops = [p.name for p in repo.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    roots = package_dirs(pyproject, tops)
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
             *SOURCE_EXTRA, *roots, "libinterpose"],
            cwd=repo, capture_output=True, check=True,
        ).stdout.decode()
        candidates = [p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        candidates = [
            str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file() or p.is_symlink()
        ]
    return sorted({p for p in candidates if is_source(p, roots) and (repo / p).is_file()})


def source_digest(repo: Path = REPO) -> str:
    return tree_digest((rel, sha256_file(repo / rel)) for rel in repo_source_files(repo))


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            point = line.split()[1].replace("\\040", " ")
            if point.startswith(prefix) or point == prefix.rstrip("/"):
                out.append(point)
    return out


def _safe_rmtree(path: Path) -> None:
    """rmtree that never walks into a mount (a leftover /dev or /proc of a chroot)."""
    if not path.exists() and not path.is_symlink():
        return
    for point in sorted(_mounts_under(path), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    if left := _mounts_under(path):
        raise ImagesError(f"refusing to remove {path}: still mounted: {', '.join(left)}")
    shutil.rmtree(path)


def _prune(kind: str, keep: str) -> None:
    pat = stage_pattern(kind)
    for p in images_dir().iterdir():
        if pat.match(p.name) and p.name not in (keep, archive_name(kind, keep.split("-")[-1])):
            if p.is_dir():
                _safe_rmtree(p)
            else:
                p.unlink(missing_ok=True)


@contextlib.contextmanager
def _workdir(what: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=f"tmp-{what}-", dir=images_dir()))
    try:
        d.chmod(0o755)
        yield d
    finally:
        _safe_rmtree(d)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    images_dir().mkdir(parents=True, exist_ok=True)
    with open(images_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _staging(parent: Path, name: str = "root") -> Path:
    d = parent / name
    d.mkdir(mode=0o755)
    d.chmod(0o755)  # becomes the layer's "/" entry: keep it 0755 whatever the umask
    return d


def _mkdirs(root: Path, rel: str) -> Path:
    d = root
    for part in Path(rel).parts:
        d = d / part
        if not d.exists():
            d.mkdir()
            d.chmod(0o755)
    return d


def _umoci(*args: str) -> None:
    _run(["umoci", *args], f"umoci {args[0]}")


def _image(layout: Path) -> str:
    return f"{layout}:{LAYOUT_TAG}"


def _new_layout(layout: Path) -> None:
    _umoci("init", "--layout", str(layout))
    _umoci("new", "--image", _image(layout))


def _copy_layout(src: Path, dst: Path) -> None:
    """A new OCI layout holding src's image: blobs hard-linked (immutable, content-addressed),
    index.json copied (umoci rewrites it)."""
    (dst / "blobs" / "sha256").mkdir(parents=True)
    for name in ("oci-layout", "index.json"):
        shutil.copy2(src / name, dst / name)
    for blob in (src / "blobs" / "sha256").iterdir():
        try:
            os.link(blob, dst / "blobs" / "sha256" / blob.name)
        except OSError:
            shutil.copy2(blob, dst / "blobs" / "sha256" / blob.name)


def _insert(layout: Path, folder: Path, created_by: str) -> None:
    _umoci("insert", "--image", _image(layout), f"--history.created_by={created_by}",
           str(folder), "/")


def _archive(layout: Path, reference: str, dest: Path, cfg: ImageConfig) -> None:
    _umoci("config", "--image", _image(layout), "--history.created_by=umoci config",
           *config_args(cfg))
    _umoci("gc", "--layout", str(layout))
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.unlink(missing_ok=True)
    _run(["skopeo", "--insecure-policy", "copy", "--quiet", f"oci:{_image(layout)}",
          f"oci-archive:{tmp}:{reference}"], f"skopeo copy to {dest.name}")
    tmp.replace(dest)


def _chroot(rootfs: Path, binds: Mapping[str, Path], argv: Sequence[str], what: str) -> None:
    script = chroot_script(str(rootfs), {k: str(v) for k, v in binds.items()}, argv)
    _run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script], what)


def _step(log: Log, what: str) -> Callable[[], None]:
    log(f"  {what} ...")
    t0 = time.monotonic()
    return lambda: log(f"  {what}: done in {time.monotonic() - t0:.0f}s")


def _require_tools(tools: Iterable[str]) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise ImagesError(
            f"missing tools: {' '.join(missing)}. Install them (Debian: apt-get install "
            "skopeo umoci debootstrap gcc libc6-dev make util-linux); `make image` does, as root"
        )
    if os.geteuid() != 0:
        raise ImagesError("building images needs root (debootstrap, chroot, umoci ownership)")
    if ":" in str(images_dir()):
        raise ImagesError(f"the cache path {images_dir()} must not contain ':' (skopeo)")


# --- Stages of the egpu image ---------------------------------------------------------------
def _ensure_base(log: Log, force: bool = False) -> Path:
    key = base_key()
    out = images_dir() / f"base-{key}"
    if not force and (out / "oci" / "index.json").exists() and (out / "rootfs" / "usr").is_dir():
        return out
    _require_tools(["debootstrap", "umoci"])
    mirror = os.environ.get("EGPU_DEBIAN_MIRROR", DEBIAN_MIRROR)
    with _workdir("base") as work:
        done = _step(log, f"base: debootstrap {SUITE} minbase + {', '.join(BASE_PACKAGES)}")
        rootfs = work / "rootfs"
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
              SUITE, str(rootfs), mirror], "debootstrap")
        for rel in BASE_CLEAN:
            d = rootfs / rel
            if not d.is_dir():
                continue
            for child in d.iterdir():
                if str(child.relative_to(rootfs)) in BASE_KEEP:
                    continue
                if child.is_dir() and not child.is_symlink():
                    _safe_rmtree(child)
                else:
                    child.unlink()
        for rel in BASE_TRUNCATE:
            if (rootfs / rel).exists():
                (rootfs / rel).write_text("")
        done()
        done = _step(log, "base: layer (umoci)")
        _new_layout(work / "oci")
        _insert(work / "oci", rootfs, f"debootstrap --variant=minbase {SUITE} {BASE_PACKAGES}")
        _umoci("gc", "--layout", str(work / "oci"))
        done()
        _prune("base", out.name)
        _safe_rmtree(out)
        work.rename(out)
    return out


def _ensure_deps(log: Log, base: Path, deps: list[str], force: bool = False) -> Path:
    key = deps_key(base.name.split("-", 1)[1], deps)
    out = images_dir() / f"deps-{key}"
    ready = (out / "oci" / "index.json").exists() and any((out / "pip").glob("pip-*.whl"))
    if ready and not force:
        return out
    _require_tools(["umoci", "unshare", "chroot"])
    with _workdir("deps") as work:
        done = _step(log, f"deps: pip download ({len(deps)} requirements, cp311 manylinux)")
        wheels = work / "wheels"
        _run(pip_download_argv(sys.executable, str(wheels), [*deps, PIP_SPEC]), "pip download")
        pip_wheel = sorted(wheels.glob("pip-*.whl"))[-1]
        done()
        done = _step(log, "deps: pip install in the rootfs (chroot)")
        staging = _staging(work)
        argv = pip_install_argv(f"/tmp/wheels/{pip_wheel.name}", "/tmp/wheels",
                                "/tmp/staging", deps)
        _chroot(base / "rootfs", {"wheels": wheels, "staging": staging}, argv, "pip install")
        done()
        done = _step(log, "deps: layer (umoci)")
        _copy_layout(base / "oci", work / "oci")
        _insert(work / "oci", staging, "pip install " + " ".join(deps))
        _umoci("gc", "--layout", str(work / "oci"))
        (work / "pip").mkdir()
        shutil.copy2(pip_wheel, work / "pip" / pip_wheel.name)
        _safe_rmtree(staging)
        _safe_rmtree(wheels)
        done()
        _prune("deps", out.name)
        _safe_rmtree(out)
        work.rename(out)
    return out


def _inputs_egpu() -> tuple[str, list[str], Path]:
    """(egpu key, dependencies, base folder) from the current inputs (no building)."""
    deps = dependencies((REPO / "pyproject.toml").read_text())
    base = images_dir() / f"base-{base_key()}"
    dkey = deps_key(base_key(), deps)
    return egpu_key(dkey, source_digest(), compiler_version()), deps, base


def _build_egpu(log: Log, dest: Path, force: bool = False) -> None:
    """The egpu image; force redoes the base (debootstrap) and deps stages too."""
    _require_tools(["debootstrap", "umoci", "skopeo", "unshare", "chroot", "make", "gcc"])
    deps = dependencies((REPO / "pyproject.toml").read_text())
    base = _ensure_base(log, force)
    dep = _ensure_deps(log, base, deps, force)
    with _workdir("egpu") as work:
        done = _step(log, "egpu: wheel (pip wheel --no-deps) and interposer (make)")
        src = work / "src"
        for rel in repo_source_files():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
        wheels = work / "wheels"
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
              *_build_isolation_flag(), "--wheel-dir", str(wheels), str(src)],
             "pip wheel (egpu)")
        wheel = next(wheels.glob("egpu-*.whl"))
        so_dir = work / "libinterpose-build"
        _run(["make", "-C", str(src / "libinterpose"), f"B={so_dir}",
              f"{so_dir}/libegpu_interpose.so"], "make libegpu_interpose.so")
        for pw in (dep / "pip").glob("pip-*.whl"):
            shutil.copy2(pw, wheels / pw.name)
        pip_wheel = next((dep / "pip").glob("pip-*.whl")).name
        done()
        done = _step(log, "egpu: pip install egpu in the rootfs (chroot), layer (umoci)")
        staging = _staging(work)
        argv = pip_install_argv(f"/tmp/wheels/{pip_wheel}", "/tmp/wheels", "/tmp/staging",
                                [f"/tmp/wheels/{wheel.name}"], no_deps=True)
        _chroot(base / "rootfs", {"wheels": wheels, "staging": staging}, argv, "pip install egpu")
        lib = _mkdirs(staging, str(Path(INTERPOSER_PATH).parent))
        shutil.copy2(so_dir / "libegpu_interpose.so", lib / "libegpu_interpose.so")
        (lib / "libegpu_interpose.so").chmod(0o755)
        _copy_layout(dep / "oci", work / "oci")
        _insert(work / "oci", staging, f"pip install {wheel.name}; interposer")
        done()
        done = _step(log, "egpu: archive (skopeo)")
        _archive(work / "oci", IMAGE_EGPU, dest, EGPU_CONFIG)
        done()


def _build_isolation_flag() -> list[str]:
    """Build egpu's wheel with this interpreter's setuptools when it is new enough (fast, no
    download); else let pip fetch it (build isolation)."""
    try:
        from importlib.metadata import version

        if int(version("setuptools").split(".")[0]) >= 77:
            return ["--no-build-isolation"]
    except Exception:
        pass
    return []


# --- The small images -------------------------------------------------------------------------
def _build_pause(log: Log, dest: Path) -> None:
    _require_tools(["umoci", "skopeo", os.environ.get("CC", "gcc")])
    with _workdir("pause") as work:
        done = _step(log, "pause: gcc -static, layer, archive")
        root = _staging(work)
        cc = os.environ.get("CC", "gcc")
        _run([cc, *PAUSE_CFLAGS, "-o", str(root / "pause"), str(REPO / PAUSE_SOURCE)],
             "compiling pause (gcc -static; needs libc6-dev's libc.a)")
        (root / "pause").chmod(0o755)
        _new_layout(work / "oci")
        _insert(work / "oci", root, "gcc -static pause.c")
        _archive(work / "oci", IMAGE_PAUSE, dest, PAUSE_CONFIG)
        done()


def _build_scheduler(log: Log, dest: Path, binary: Path) -> None:
    """egpu-kube-scheduler's image: the binary, and the non-root user it runs as."""
    _require_tools(["umoci", "skopeo"])
    kind = KIND[IMAGE_SCHEDULER]
    with _workdir(kind) as work:
        done = _step(log, f"{kind}: layer from {binary}, archive")
        root = _staging(work)
        target = root / SCHEDULER_PATH
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(binary, target)
        target.chmod(0o755)
        etc = _mkdirs(root, "etc")
        (etc / "passwd").write_text(passwd_text())
        (etc / "group").write_text(group_text())
        for f in ("passwd", "group"):
            (etc / f).chmod(0o644)
        tmp = root / "tmp"
        tmp.mkdir()
        tmp.chmod(0o1777)
        _new_layout(work / "oci")
        _insert(work / "oci", root, f"{kind} {build.K8S_VERSION} (devcluster.build)")
        _archive(work / "oci", IMAGE_SCHEDULER, dest, SCHEDULER_CONFIG)
        done()


# --- Entry points ---------------------------------------------------------------------------
def _scheduler_binary() -> Path:
    """egpu-kube-scheduler as built from this checkout (built or not)."""
    return build.plugin_scheduler_path()


def archive_paths() -> dict[str, Path | None]:
    """reference -> the archive the current inputs map to (built or not); None for the
    scheduler while its binary is not built. Builds nothing."""
    d = images_dir()
    binary = _scheduler_binary()
    sched = d / archive_name(KIND[IMAGE_SCHEDULER], scheduler_key(sha256_file(binary))) \
        if binary.exists() else None
    pause = pause_key((REPO / PAUSE_SOURCE).read_bytes(), compiler_version())
    return {
        IMAGE_EGPU: d / archive_name("egpu", _inputs_egpu()[0]),
        IMAGE_PAUSE: d / archive_name("pause", pause),
        IMAGE_SCHEDULER: sched,
    }


def _built(path: Path | None) -> bool:
    return path is not None and path.exists()


def ensure_images(force: bool = False, only: Iterable[str] | None = None,
                  log: Log = _log) -> dict[str, Path]:
    """Build whichever image archive is missing (everything with force, the egpu image's cached
    base and dependency stages included); reference -> archive path.
    Raises ImagesError (after building the others) when egpu-kube-scheduler is not built
    yet."""
    only_set = None if only is None else set(only)
    wanted = [r for r in IMAGES if only_set is None or r in only_set]
    unknown = (only_set or set()) - set(IMAGES)
    if unknown:
        raise ImagesError(f"unknown image(s) {sorted(unknown)}; known: {list(IMAGES)}")
    result: dict[str, Path] = {}
    problems: list[str] = []
    t_all = time.monotonic()
    old_umask = os.umask(0o022)  # layers readable by the non-root users the pods run as
    with contextlib.ExitStack() as stack:
        stack.callback(os.umask, old_umask)
        stack.enter_context(_locked())
        for p in images_dir().glob("tmp-*"):  # leftovers of an interrupted run
            _safe_rmtree(p)
        paths = archive_paths()
        todo = [r for r in wanted if force or not _built(paths[r])]
        if not todo:
            log(f"devcluster.images: all images present in {images_dir()}")
        for n, ref in enumerate(todo, 1):
            path = paths[ref]
            kind = KIND[ref]
            if path is None:
                problems.append(
                    f"{ref}: its binary is not built yet ({_scheduler_binary()} is missing). Run "
                    "`make k8s` (python -m devcluster.build), or wait for the build that is "
                    "running, then `make image` again"
                )
                log(f"[{n}/{len(todo)}] {ref}: skipped, its binary is not built yet")
                continue
            log(f"[{n}/{len(todo)}] {ref} -> {path} ...")
            t0 = time.monotonic()
            if kind == "egpu":
                _build_egpu(log, path, force)
            elif kind == "pause":
                _build_pause(log, path)
            else:
                _build_scheduler(log, path, _scheduler_binary())
            key = path.name.removesuffix(".oci.tar").rsplit("-", 1)[1]
            _prune(kind, f"{kind}-{key}")
            size = human_size(path.stat().st_size)
            log(f"[{n}/{len(todo)}] {ref} built in {time.monotonic() - t0:.0f}s ({size})")
        for ref in wanted:
            path = paths[ref]
            if path is not None and _built(path):
                result[ref] = path
    if todo:
        log(f"devcluster.images: done in {time.monotonic() - t_all:.0f}s")
    if problems:
        raise ImagesError("\n".join(problems))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m devcluster.images",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="rebuild everything, the cached Debian base and Python dependencies included",
    )
    p.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print each reference and its archive path (and whether it is built); build nothing",
    )
    p.add_argument("images", nargs="*", metavar="REF", help=f"only these (of {', '.join(IMAGES)})")
    args = p.parse_args(argv)
    try:
        if args.print_only:
            missing = 0
            for ref, path in archive_paths().items():
                if args.images and ref not in args.images:
                    continue
                state = "built" if path is not None and path.exists() else "missing"
                missing += state == "missing"
                where = path if path is not None else f"(needs {_scheduler_binary()})"
                print(f"{ref}\t{where}\t{state}")
            return 1 if missing else 0
        for ref, path in ensure_images(force=args.force, only=args.images or None).items():
            print(f"{ref}\t{path}")
    except ImagesError as e:
        print(f"devcluster.images: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
