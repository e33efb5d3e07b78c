"""The egpu-extender command line: arguments and config errors."""

from __future__ import annotations

from pathlib import Path

from scheduler.main import main, parse_args


def test_defaults_and_flags() -> None:
    args = parse_args(["--port", "9999", "--host", "127.0.0.1", "--config", "/x.yaml",
                       "--kubeconfig", "/k"])
    assert (args.port, args.host, args.config, args.kubeconfig) == (9999, "127.0.0.1", "/x.yaml",
                                                                    "/k")


def test_bad_config_exits_2_naming_the_key(tmp_path: Path, capsys: object) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("sharesPerCard: 0\n")
    assert main(["--config", str(config), "--kubeconfig", str(tmp_path / "none")]) == 2
    assert "sharesPerCard" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_missing_kubeconfig_exits_2(tmp_path: Path, capsys: object) -> None:
    assert main(["--kubeconfig", str(tmp_path / "none")]) == 2
    assert "kubeconfig" in capsys.readouterr().err  # type: ignore[attr-defined]
