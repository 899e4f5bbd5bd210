"""The dispatcher's conversion endpoint (/convert) alone, for a test cluster: the AppWrapper
CRD in its converting form (core/crdforms.py) serves v1beta2, its preferred version, so every
`kubectl get aw` converts, whether a test runs the dispatcher's webhook or not.

Side effects: a thread with its own event loop serving HTTPS on 127.0.0.1 (a throwaway CA
made in memory); `crd_calling` reads crds/appwrapper.yaml.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import ssl
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from dispatcher.core.crdforms import converting
from dispatcher.kube import certplan, webhook

DAY = 86400.0
REPO_CRD = Path(__file__).resolve().parents[1] / "crds" / "appwrapper.yaml"


class Converter:
    """`start()`, then `url` and `ca_bundle` say how to call it; `stop()` ends it."""

    def __init__(self) -> None:
        self.url = ""
        self.ca_bundle = b""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    def start(self) -> None:
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(started),), name="converter", daemon=True
        )
        self._thread.start()
        started.result(timeout=30)

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    async def _serve(self, started: concurrent.futures.Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            context = _server_context(self)
            runner, port = await webhook.serve(
                host="127.0.0.1",
                port=0,
                ssl_context=context,
                mutate=_refuse,
                validate=_refuse,
            )
        except BaseException as exc:
            started.set_exception(exc)
            raise
        self.url = f"https://127.0.0.1:{port}{webhook.CONVERT_PATH}"
        started.set_result(None)
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()


def _server_context(converter: Converter) -> ssl.SSLContext:
    context, converter.ca_bundle = loopback_server_context()
    return context


def loopback_server_context() -> tuple[ssl.SSLContext, bytes]:
    """A TLS server context for 127.0.0.1 with a certificate from a throwaway CA (valid a
    day), and that CA's PEM: what a webhook configuration's caBundle names."""
    now = time.time()
    ca = certplan.make_ca(now, DAY)
    serving = certplan.issue_serving(ca, ["127.0.0.1"], now, DAY)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as directory:
        cert, key = Path(directory, "tls.crt"), Path(directory, "tls.key")
        cert.write_bytes(serving.cert_pem)
        key.write_bytes(serving.key_pem)
        context.load_cert_chain(cert, key)
    return context, ca.cert_pem


async def _refuse(request: Any) -> dict[str, Any]:
    return {"uid": request.get("uid", ""), "allowed": False}


def crd_calling(path: Path, url: str, ca_bundle: bytes) -> dict[str, Any]:
    """The CRD in `path` converting through its webhook at `url`, trusting `ca_bundle`."""
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return converting(crd, {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()})


def v1beta1_only(path: Path) -> dict[str, Any]:
    """The CRD in `path` as it was before v1beta2: v1beta1 alone, no conversion."""
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    crd["spec"]["versions"] = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    crd["spec"].pop("conversion", None)
    return crd


_SHARED: list[Converter] = []


def install_appwrapper_crd(cluster: Any, *, server_side: bool = False) -> Converter:
    """crds/appwrapper.yaml into `cluster` (a LocalCluster), its conversion served by a
    converter of this process (one, started at the first call, for the process's life): for
    harnesses that run the dispatcher without its webhook, where `kubectl get aw` (v1beta2,
    the preferred version) must still work."""
    if not _SHARED:
        converter = Converter()
        converter.start()
        _SHARED.append(converter)
    converter = _SHARED[0]
    crd = crd_calling(REPO_CRD, converter.url, converter.ca_bundle)
    args = ["apply", "-f", "-"] + (["--server-side", "--force-conflicts"] if server_side else [])
    cluster.kubectl(*args, input=json.dumps(crd))
    return converter
