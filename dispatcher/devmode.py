"""`appwrapper-dispatcher run --dev`: try the dispatcher from this machine on a cluster, in one
command, without installing anything but the CRDs.

Out of the cluster and with the defaults, nothing records who created an AppWrapper (the
webhook is off) and `unattributed: refuse` fails every one. `--dev` serves the admission
webhook on 127.0.0.1 and registers it, when the cluster's API server can reach this
machine's 127.0.0.1 (it runs here: the local control plane, a kubeadm or k3s node). Whether
it can is tried first, not guessed: a probe webhook configuration, matching only a dry-run
ConfigMap carrying a label of its own, sends the API server to a port listening here, and a
connection arriving there is the answer. When none arrives (kind, minikube and any remote
cluster run their API server elsewhere, where 127.0.0.1 is not this machine), there is no
webhook and `unattributed: allow`: every AppWrapper is dispatched with the rights of this
kubeconfig's user. Either way it says so, loudly, before it starts.

It refuses to start where the manifests' webhook configurations (`appwrapper-dispatcher`)
exist: a dispatcher is installed there, and a second one would count capacity without the
first one's reservations. What it made is removed when it stops: its webhook configurations
(`appwrapper-dispatcher-dev`) and its Secret (`default/appwrapper-dispatcher-dev`: CA,
serving certificate, record-signing key). A record signed in one run so never verifies in
another: a record some local process obtained from the port (it answers any caller on this
machine) cannot be stored on an AppWrapper between runs, while no webhook overwrites it, and
be honoured by the next run. An AppWrapper still queued at the stop ends `Forbidden` in the
next run: apply it again.

The AppWrapper CRD as shipped serves v1beta1 alone and converts nothing (core/crdforms.py
says why). Reached, --dev serves v1beta2 too for the run, converted by its own server
(https://127.0.0.1:PORT/convert); not reached, v1beta2 stays unserved. Either way the CRD is
put back in its readable form when it stops, and a start finds it so even after a killed
run (a --dev run is the only converter where installed webhook configurations are absent),
so `kubectl get aw` works once no dispatcher answers. kubectl caches the API's discovery for
hours and would go on asking for the v1beta2 the run served (the server answers NotFound,
and kubectl does not look again): at the stop --dev removes kubectl's cached discovery of
this server, from where kubectl keeps it by default, so that kubectl asks again.

Side effects: a TCP listener on 127.0.0.1 for the probe; creates and deletes webhook
configurations in the hub, and deletes its Secret at the end; changes and restores the
AppWrapper CRD's conversion and its v1beta2 `served`; removes this server's folder of
kubectl's discovery cache ($KUBECACHEDIR or ~/.kube/cache) after a run that served v1beta2;
dry-run creates of a ConfigMap; prints to stderr; then `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dispatcher.app import connect_hub, serve_forever
from dispatcher.config import Config
from dispatcher.core.crdforms import converting, is_ours, readable
from dispatcher.kube.certs import CRDS, MUTATING, SECRETS, VALIDATING
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import KubeError, NotFound
from dispatcher.kube.preflight import APPWRAPPER_CRD, StartRefused
from dispatcher.kube.registration import webhook_configurations
from dispatcher.kube.webhook import CONVERT_PATH

DEV_NAME = "appwrapper-dispatcher-dev"
"""Its webhook configurations and its Secret."""
INSTALLED_NAME = "appwrapper-dispatcher"
"""The webhook configurations of manifests/webhook.yaml: a dispatcher is installed."""
SECRET_NAMESPACE = "default"
"""Where its Secret goes: a namespace every cluster has, so nothing else is created."""
PROBE_LABEL = "workload.codeflare.dev/dev-probe"
PROBE_SECONDS = 5.0
"""How long the probe waits for the API server's call (it takes up a new webhook
configuration within a second or so; a refused connection costs it nothing)."""
PROBE_INTERVAL = 0.25
CONFIGMAPS = ResourceInfo("v1", "ConfigMap", "configmaps", namespaced=True)

Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Probe:
    """What the probe found: whether the API server reached 127.0.0.1:`port`, and why not."""

    port: int
    reached: bool
    problem: str = ""


def free_loopback_port() -> int:
    """A port on 127.0.0.1 that is free now (the probe and the webhook then use it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe_configuration(port: int, token: str) -> dict[str, Any]:
    """A validating webhook that only a ConfigMap labelled `PROBE_LABEL: token` matches
    (no other request in the cluster is sent to it), calling https://127.0.0.1:`port`;
    `failurePolicy: Ignore`, so the probe's dry run succeeds whatever happens."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"{DEV_NAME}-probe"},
        "webhooks": [
            {
                "name": "probe.dev.workload.codeflare.dev",
                "clientConfig": {"url": f"https://127.0.0.1:{port}/probe"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                        "operations": ["CREATE"],
                    }
                ],
                "objectSelector": {"matchLabels": {PROBE_LABEL: token}},
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }


async def probe_loopback(
    client: KubeClient, port: int, *, seconds: float = PROBE_SECONDS, listen_on: str = "127.0.0.1"
) -> Probe:
    """Whether the API server behind `client` can open a connection to this machine's
    127.0.0.1:`port` (the probe listens there meanwhile: on `listen_on`, which only a test
    changes, to play an API server that cannot reach it)."""
    reached = asyncio.Event()

    async def accepted(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.set()
        writer.close()  # the TLS handshake fails; the probe's policy ignores that

    server = await asyncio.start_server(accepted, listen_on, port)
    token = secrets.token_hex(8)
    configuration = probe_configuration(port, token)
    name = configuration["metadata"]["name"]
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"generateName": "dev-probe-", "labels": {PROBE_LABEL: token}},
    }
    try:
        await client.delete(VALIDATING, None, name)  # a leftover of a killed run
        await client.create(VALIDATING, None, configuration)
        deadline = time.monotonic() + seconds
        while not reached.is_set() and time.monotonic() < deadline:
            # The API server takes up a new configuration a moment after it is created:
            # each dry run is one more chance for it to call.
            await client.request(
                "POST", CONFIGMAPS.path(SECRET_NAMESPACE), query={"dryRun": "All"}, body=body
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PROBE_INTERVAL):  # not wait_for: see kube/certs.py
                    await reached.wait()
    except KubeError as exc:
        return Probe(port, False, f"the probe failed: {exc}")
    finally:
        server.close()
        await server.wait_closed()
        with contextlib.suppress(KubeError, OSError):
            await client.delete(VALIDATING, None, name)
    if reached.is_set():
        return Probe(port, True)
    return Probe(port, False, f"no call reached 127.0.0.1:{port} within {seconds:g}s")


def dev_config(config: Config, probe: Probe) -> Config:
    """`config` as --dev runs it: the webhook on 127.0.0.1:`probe.port` under DEV_NAME when
    the API server reached it, else no webhook and `unattributed: allow`. The health port is
    off unless it was set (the default, 8081 on every interface, is neither needed for a
    trial nor always free)."""
    update: dict[str, Any] = {}
    if "health_port" not in config.model_fields_set:
        update["health_port"] = 0
    if probe.reached:
        update["webhook"] = config.webhook.model_copy(
            update={
                "enabled": True,
                "host": "127.0.0.1",
                "port": probe.port,
                "namespace": SECRET_NAMESPACE,
                "secret_name": DEV_NAME,
                "extra_names": [*config.webhook.extra_names, "127.0.0.1"],
                "cert_dir": None,
                "mutating_configuration": DEV_NAME,
                "validating_configuration": DEV_NAME,
            }
        )
    else:
        update["unattributed"] = "allow"
        update["webhook"] = config.webhook.model_copy(update={"enabled": False})
    return config.model_copy(update=update)


def announcement(config: Config, probe: Probe) -> list[str]:
    """What --dev tells the user before it starts (`config` as `dev_config` made it)."""
    lines = [
        "=" * 78,
        "appwrapper-dispatcher run --dev: FOR TRYING IT OUT, not for a cluster others use.",
    ]
    if probe.reached:
        lines += [
            f"- admission webhook: served on https://127.0.0.1:{probe.port}, registered as the",
            f"  Mutating- and ValidatingWebhookConfiguration {DEV_NAME} (failurePolicy: Fail),",
            "  removed when this stops; after a kill -9, remove them yourself:",
            "  kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration"
            f" {DEV_NAME}; kubectl -n {SECRET_NAMESPACE} delete secret {DEV_NAME}",
            f"- its CA, certificate and record-signing key: Secret {SECRET_NAMESPACE}/{DEV_NAME},",
            "  deleted when this stops (AppWrappers still queued then are refused by the next",
            "  run: they carry a record it cannot verify)",
            f"- unattributed: {config.unattributed}: who created each AppWrapper is recorded and"
            " their rights checked",
        ]
        if not config.webhook.client_ca_file:
            lines.append(
                "- the webhook answers any process of this machine that calls its port"
                " (webhook.client_ca_file unset)"
            )
    else:
        lines += [
            "!" * 78,
            "! WARNING: NO ADMISSION WEBHOOK. The API server cannot reach 127.0.0.1 of this",
            "! machine (kind, minikube and remote clusters run it elsewhere):",
            f"!   {probe.problem}.",
            "! So unattributed: allow. Every AppWrapper in the cluster is dispatched with the",
            "! rights of THIS kubeconfig's user, whoever created it: anyone who may create an",
            "! AppWrapper gets what you may create. Stop it before others use the cluster.",
            "!" * 78,
        ]
    lines += [
        "- health and metrics: "
        + (f"port {config.health_port}" if config.health_port else "off (--health-port)"),
        "To deploy it for real: manifests/README.md.",
        "=" * 78,
    ]
    return lines


async def refuse_installed(client: KubeClient) -> None:
    """StartRefused where the manifests' webhook configuration exists: a dispatcher is
    installed on this cluster already."""
    try:
        await client.get(MUTATING, None, INSTALLED_NAME)
    except NotFound:
        return
    raise StartRefused(
        f"MutatingWebhookConfiguration {INSTALLED_NAME} exists: a dispatcher is installed on"
        " this cluster (manifests/). --dev is for trying it out on a cluster that has none:"
        " two dispatchers would each count capacity without the other's reservations"
    )


async def _register(client: KubeClient, port: int) -> list[str]:
    """The dev webhook configurations created (replacing a leftover of a killed run); the
    lines that say what was replaced."""
    notes = []
    for configuration in webhook_configurations(DEV_NAME, port):
        info = MUTATING if configuration["kind"] == MUTATING.kind else VALIDATING
        with contextlib.suppress(NotFound):
            await client.get(info, None, DEV_NAME)
            notes.append(
                f"- replaced {configuration['kind']} {DEV_NAME} left by another --dev run"
                " (if that one still runs, stop it: one dispatcher per cluster)"
            )
            await client.delete(info, None, DEV_NAME)
        await client.create(info, None, configuration)
    return notes


async def _unregister(client: KubeClient, say: Say) -> None:
    """Remove what --dev made: its webhook configurations, then its Secret."""
    left = []
    for info, namespace in ((MUTATING, None), (VALIDATING, None), (SECRETS, SECRET_NAMESPACE)):
        try:
            await client.delete(info, namespace, DEV_NAME)
        except (KubeError, OSError) as exc:
            left.append(
                f"{info.kind.lower()} {DEV_NAME}" + (f" -n {namespace}" if namespace else "")
            )
            say(f"--dev: could not remove {info.kind} {DEV_NAME}: {exc}")
    if left:
        say(f"--dev: remove them yourself: {'; '.join(f'kubectl delete {x}' for x in left)}")
    else:
        say(
            f"--dev: removed the webhook configurations {DEV_NAME} and the Secret"
            f" {SECRET_NAMESPACE}/{DEV_NAME}"
        )


def crd_for_dev(crd: dict[str, Any], port: int | None) -> dict[str, Any] | None:
    """The AppWrapper CRD as a --dev run needs it (None: as it is): converting through this
    machine's `port`, or (None: not reachable) readable. Only our CRD is touched (not the
    AppWrapper v1beta2 controller's); the input is not changed."""
    if not is_ours(crd):
        return None
    if port is None:
        return readable(crd)
    return converting(crd, {"url": f"https://127.0.0.1:{port}{CONVERT_PATH}"})


async def _adapt_crd(client: KubeClient, port: int | None, say: Say) -> bool:
    """Whether the CRD was changed for the run (and so is to be made readable at the stop)."""
    try:
        crd = await client.get(CRDS, None, APPWRAPPER_CRD)
        changed = crd_for_dev(crd, port)
        if changed is None:
            return False
        await client.replace(CRDS, None, APPWRAPPER_CRD, changed)
    except (KubeError, OSError) as exc:
        say(f"--dev: could not adapt CRD {APPWRAPPER_CRD} ({exc}): kubectl get aw may fail")
        return False
    return True


async def _restore_crd(client: KubeClient, say: Say) -> None:
    try:
        crd = await client.get(CRDS, None, APPWRAPPER_CRD)
        await client.replace(CRDS, None, APPWRAPPER_CRD, readable(crd))
    except (KubeError, OSError) as exc:
        say(
            f"--dev: could not make CRD {APPWRAPPER_CRD} readable again: {exc}; kubectl "
            "patch crd appwrappers.workload.codeflare.dev --type=json "
            "--patch-file manifests/crd-patches/readable.json"
        )


def kubectl_discovery_cache(
    server: str, *, environ: Mapping[str, str] = os.environ, home: Path | None = None
) -> Path:
    """Where kubectl keeps its cached discovery of the API server at `server` by default:
    $KUBECACHEDIR (else ~/.kube/cache), then discovery/, then the server's address without
    its scheme, every character but letters, digits and `_/.()` made `_` (kubectl's own
    naming, so that this is the folder it reads)."""
    root = Path(environ.get("KUBECACHEDIR") or (home or Path.home()) / ".kube" / "cache")
    host = server.replace("https://", "", 1).replace("http://", "", 1)
    return root / "discovery" / re.sub(r"[^(\w/.)]", "_", host)


def _forget_discovery(server: str, say: Say) -> None:
    cache = kubectl_discovery_cache(server)
    if cache.is_dir():
        shutil.rmtree(cache, ignore_errors=True)
        say(
            f"--dev: v1beta2 is no longer served; removed kubectl's cached discovery of "
            f"{server} ({cache}) so that kubectl asks again"
        )


async def serve_dev(config: Config, *, say: Say = _stderr) -> None:
    """The `run --dev` command: probe, register, announce, run until stopped, unregister."""
    log = structlog.get_logger("dev")
    client = await connect_hub(config, name="dev", qps=config.qps, burst=config.burst)
    registered = False
    adapted = False
    try:
        await refuse_installed(client)
        probe = await probe_loopback(client, free_loopback_port())
        log.info("dev_probe", reached=probe.reached, port=probe.port, reason=probe.problem)
        running = dev_config(config, probe)
        notes: list[str] = []
        if probe.reached:
            registered = True
            # A Secret left by a killed run goes too: records verify within one run only.
            await client.delete(SECRETS, SECRET_NAMESPACE, DEV_NAME)
            notes = await _register(client, probe.port)
            # creationTimestamps are whole seconds: an AppWrapper stored in the
            # configurations' own second cannot be shown to have come after them, and its
            # record would not be honoured (core/recordtime.py). Serve from the next second.
            await asyncio.sleep(1.0)
        adapted = await _adapt_crd(client, probe.port if probe.reached else None, say)
        lines = announcement(running, probe)
        for line in [*lines[:-1], *notes, lines[-1]]:
            say(line)
        await serve_forever(running)
    finally:
        if adapted:
            await _restore_crd(client, say)
            _forget_discovery(client.server, say)
        if registered:
            await _unregister(client, say)
        await client.close()
