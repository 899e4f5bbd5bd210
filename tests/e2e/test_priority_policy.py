"""The priority policy as a tenant meets it (issue 36, point 7), against the real API server:
a namespace rule narrows the default and never widens it, and its class list holds for
Kueue's WorkloadPriorityClass label as for priorityClassName.

The webhook setup (bob may create AppWrappers, Pods and Services in the namespace) is
tests/e2e/test_security.py's `secure` fixture.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.core.gatekeeping import PriorityPolicy, PriorityRule
from tests.e2e.conftest import appwrapper, wait_condition
from tests.e2e.test_kueue_quotas import kueue_crds, kueue_objects
from tests.e2e.test_security import Secure, pod, secure

pytestmark = [pytest.mark.cluster]
__all__ = ["kueue_crds", "kueue_objects", "secure"]  # the fixtures, imported to be used here

KUEUE_LABEL = "kueue.x-k8s.io/priority-class"


async def test_a_rule_of_classes_only_keeps_the_default_cap(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1")
    policy = PriorityPolicy(namespaces={namespace: PriorityRule(classes=["dev"])})
    await run_dispatcher(**secure.settings(), priority_policy=policy)
    message = await secure.refused(appwrapper("top", pod("top"), priority=2147483647), user="bob")
    assert "priority 2147483647, above the highest this namespace may use (1000000000)" in message
    await secure.apply(appwrapper("fine", pod("fine"), priority=1_000_000_000), user="bob")
    await wait_condition(cluster, namespace, "fine", "Running")


async def test_the_class_list_holds_for_the_kueue_label(
    cluster: Any,
    namespace: str,
    fake_nodes: Any,
    run_dispatcher: Any,
    secure: Secure,
    kueue_objects: None,
) -> None:
    fake_nodes.add("n1")
    listed, other = f"{namespace}-dev"[:63], f"{namespace}-high"[:63]
    for name, value in ((listed, 5), (other, 10)):
        await cluster.akubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta1",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                }
            ),
        )
    policy = PriorityPolicy(namespaces={namespace: PriorityRule(classes=[listed])})
    await run_dispatcher(**secure.settings(), priority_policy=policy, kueue_quotas="beside")
    # Its value (10) is well within the range: only the class list refuses it.
    refused = appwrapper("k", pod("k"))
    refused["metadata"]["labels"] = {KUEUE_LABEL: other}
    message = await secure.refused(refused, user="bob")
    assert f"WorkloadPriorityClass {other!r} is not one namespace {namespace} may use" in message
    allowed = appwrapper("ok", pod("ok"))
    allowed["metadata"]["labels"] = {KUEUE_LABEL: listed}
    await secure.apply(allowed, user="bob")
    await wait_condition(cluster, namespace, "ok", "Running")
