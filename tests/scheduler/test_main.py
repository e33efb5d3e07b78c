"""The egpu-extender command line: arguments and config errors."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_metrics_listener_flags_and_sockets() -> None:
    from scheduler.main import listeners

    args = parse_args(["--host", "127.0.0.1", "--port", "0", "--metrics-host", "127.0.0.1",
                       "--metrics-port", "0"])
    assert (args.metrics_host, args.metrics_port) == ("127.0.0.1", 0)
    socks = listeners(args)
    assert len(socks) == 1  # metrics port 0: no second listener
    socks[0].close()
    args.port, args.metrics_port = 18931, 18931
    with pytest.raises(OSError, match="--metrics-port 18931 is --port"):
        listeners(args)
    args.metrics_port = 18932
    socks = listeners(args)
    try:
        assert [s.getsockname()[1] for s in socks] == [18931, 18932]
    finally:
        for s in socks:
            s.close()
