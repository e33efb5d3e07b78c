"""``egpu run`` (cli/run_cmd.py) refuses what would run a command without its share, and names
the option, the value and what is allowed. Bugs caught (found by review): a library path with
a space ran the command without the interposer (ld.so splits LD_PRELOAD at spaces and colons)
and exit status 0; an inherited EGPU_CONFIG_PATH replaced the share given on the command line;
``--name ../x`` made folders outside the accounting's flat layout; a MiB figure past the
interposer's bound was accepted and refused only once CUDA started."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli import run_cmd
from egpu.contract import ENV_CONFIG_PATH, ENV_CONTAINER_REGION


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="egpu run", exit_on_error=False)
    run_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("where", ["my dir", "a:b"])
def test_a_library_path_ld_so_cannot_carry_is_refused(
        tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    library = tmp_path / where / "libegpu_interpose.so"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF")
    args = parse("--gpu-memory", "1024", "--library", str(library), "--", "true")
    assert run_cmd.run(args) == 2  # never exec'd
    err = capsys.readouterr().err
    assert repr(str(library)) in err and "space or a colon" in err, err


def test_an_inherited_config_path_never_replaces_the_share(tmp_path: Path) -> None:
    args = parse("--gpu-memory", "1024", "--name", "batch", "--", "true")
    env = run_cmd.share_environment(args, {ENV_CONFIG_PATH: "/somewhere/config.json",
                                           "EGPU_RUNTIME_DIR": str(tmp_path)})
    assert ENV_CONFIG_PATH not in env
    assert env["EGPU_MEMORY_LIMIT_MIB"] == "1024"
    assert env[ENV_CONTAINER_REGION] == str(tmp_path / "containers" / "raw_batch" / "region")


@pytest.mark.parametrize(("argv", "words"), [
    (("--name", "../x/y"), "'../x/y' is not allowed; allowed: 1 to 63 letters"),
    (("--name", ".hidden"), "'.hidden' is not allowed"),
    (("--gpu-memory", str((1 << 40) + 1)), "out of range; allowed: 1..1099511627776 (MiB)"),
    (("--gpu-memory", "lots"), "'lots' is not an integer; allowed: 1..1099511627776 (MiB)"),
    (("--gpu-cores", "abc"), "'abc' is not an integer; allowed: 1..100"),
    (("--gpu-cores", "101"), "101 is out of range; allowed: 1..100"),
])
def test_bad_options_name_the_value_and_what_is_allowed(argv: tuple[str, ...],
                                                         words: str) -> None:
    with pytest.raises(argparse.ArgumentError) as refused:
        parse(*argv, "--", "true")
    assert words in str(refused.value), str(refused.value)


def test_a_good_name_and_the_largest_share_are_taken() -> None:
    args = parse("--name", "job-1.a_b", "--gpu-memory", str(1 << 40), "--", "true")
    assert args.name == "job-1.a_b" and args.gpu_memory == 1 << 40
    assert shutil.which("true")


ARGV_PRINTER = "import json, sys; print(json.dumps(sys.argv[1:]))"


def _egpu_run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``egpu run`` in its own process (it may exec), with a stand-in library (ld.so skips a
    file it cannot preload) and the runtime folder in ``tmp_path``."""
    library = tmp_path / "libstand_in.so"
    library.write_bytes(b"")
    env = {**os.environ, "EGPU_RUNTIME_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", "import sys; from cli.main import main; "
                           "sys.exit(main())", "run", "--gpu-memory", "100", "--library",
                           str(library), *argv], capture_output=True, text=True, env=env,
                          cwd=run_cmd.REPO, timeout=60)


def test_the_command_gets_its_own_dashes(tmp_path: Path) -> None:
    """Bug: ``egpu run --gpu-memory 100 -- python3 -c CODE -- a -- b`` passed
    ['-c', 'a', 'b']: every "--" was dropped, not only the one ending egpu's options."""
    done = _egpu_run(tmp_path, "--", sys.executable, "-c", ARGV_PRINTER, "--", "a", "--", "b")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["--", "a", "--", "b"]


def test_a_run_without_a_name_removes_its_folder_and_keeps_the_status(tmp_path: Path) -> None:
    """Bug: each run without --name left <runtime>/containers/raw_run-<pid>/ behind."""
    done = _egpu_run(tmp_path, "--", sys.executable, "-c",
                     "import os, sys; print(os.environ['EGPU_CONTAINER_REGION']); sys.exit(3)")
    assert done.returncode == 3, done.stderr
    region = Path(done.stdout.splitlines()[-1])
    assert region.parent.parent == tmp_path / "containers"
    assert region.parent.name.startswith("raw_run-")
    assert list((tmp_path / "containers").iterdir()) == []
    named = _egpu_run(tmp_path, "--name", "batch", "--", sys.executable, "-c", "pass")
    assert named.returncode == 0, named.stderr
    assert (tmp_path / "containers" / "raw_batch").is_dir()  # a group's: kept for the next run
