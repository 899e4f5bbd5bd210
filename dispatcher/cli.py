"""Command line: `appwrapper-dispatcher run [--config FILE] [--dev] [flags]`. Side effects:
runs the dispatcher until stopped (with --dev, see devmode.py, after registering its webhook
on 127.0.0.1 for the run)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dispatcher import __version__, settingsfile
from dispatcher.config import load_config, validated
from dispatcher.kube.leader import LostLease
from dispatcher.kube.preflight import StartRefused
from dispatcher.logs import configure_logging


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="appwrapper-dispatcher",
        description="Gang dispatch of AppWrappers onto Kubernetes clusters.",
    )
    root.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = root.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the dispatcher until SIGTERM")
    run.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML settings file (see docs/operations.md)"
    )
    run.add_argument(
        "--kubeconfig", metavar="PATH", help="hub kubeconfig (default: $KUBECONFIG or in-cluster)"
    )
    run.add_argument("--context", metavar="NAME", help="kubeconfig context of the hub")
    run.add_argument("--queue-mode", dest="queue_mode", choices=["StrictFIFO", "BestEffortFIFO"])
    run.add_argument(
        "--starvation-after", dest="starvation_after_seconds", type=float, metavar="SECONDS"
    )
    run.add_argument(
        "--no-preemption",
        dest="preemption",
        action="store_const",
        const=False,
        help="no AppWrapper evicts another to fit (preemption: false)",
    )
    run.add_argument("--health-port", dest="health_port", type=int, metavar="PORT")
    run.add_argument("--kueue-quotas", dest="kueue_quotas", choices=["off", "beside", "instead"])
    run.add_argument("--qps", type=float, metavar="N")
    run.add_argument("--burst", type=int, metavar="N")
    run.add_argument("--workers", type=int, metavar="N")
    run.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", dest="log_format", choices=["console", "json"])
    run.add_argument(
        "--webhook-cert-dir",
        dest="webhook_cert_dir",
        metavar="DIR",
        help="serve the webhook with tls.crt/tls.key from this directory (cert-manager)",
    )
    run.add_argument(
        "--visibility",
        action="store_true",
        help="serve the pending list and web view (visibility.enabled; manifests/visibility)",
    )
    run.add_argument(
        "--dev",
        action="store_true",
        help="for trying it out from this machine: serve the webhook on 127.0.0.1 and register "
        "it while running, or, where the API server cannot reach this machine, dispatch "
        "unattributed AppWrappers with this kubeconfig's rights (it says which)",
    )
    check = commands.add_parser(
        "check-config", help="validate a settings file without starting (exit 0, or 2 and why)"
    )
    check.add_argument("file", type=Path, help="YAML settings file")
    return root


def check_config(path: Path) -> int:
    """`check-config FILE`: the settings read and validated as `run --config FILE` would,
    nothing started; FILE may also be the ConfigMap that holds them (manifests/config.yaml)."""
    try:
        data, node, name = settingsfile.unwrapped(path)
        validated(data, name=name, node=node)
    except (ValidationError, ValueError) as exc:
        print(f"appwrapper-dispatcher: bad configuration: {exc}", file=sys.stderr)
        return 2
    print(f"{name}: the settings are valid")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file)
    overrides: dict[str, Any] = {
        k: v
        for k, v in vars(args).items()
        if k not in ("command", "config", "webhook_cert_dir", "dev", "visibility")
    }
    try:
        config = load_config(args.config, overrides)
        if args.webhook_cert_dir:
            webhook = config.webhook.model_copy(update={"cert_dir": args.webhook_cert_dir})
            config = config.model_copy(update={"webhook": webhook})
        if args.visibility:
            visibility = config.visibility.model_copy(update={"enabled": True})
            config = config.model_copy(update={"visibility": visibility})
        missing = [
            f"{what} {path}: no such file"
            for what, path in [
                ("kubeconfig", config.kubeconfig),
                *((f"members[{m.name}].kubeconfig", m.kubeconfig) for m in config.members),
            ]
            if path and not Path(path).expanduser().is_file()
        ]
        if missing:
            raise ValueError("; ".join(missing))
    except (ValidationError, ValueError, OSError) as exc:
        print(f"appwrapper-dispatcher: bad configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(level=config.log_level, fmt=config.log_format)
    # deferred: keeps --help fast
    from dispatcher.app import serve_forever
    from dispatcher.devmode import serve_dev

    try:
        asyncio.run(serve_dev(config) if args.dev else serve_forever(config))
    except KeyboardInterrupt:
        return 130
    except StartRefused as exc:
        print(f"appwrapper-dispatcher: refusing to start: {exc}", file=sys.stderr)
        return 3
    except LostLease as exc:
        print(
            f"appwrapper-dispatcher: {exc}; exiting so a new leader can take over", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
