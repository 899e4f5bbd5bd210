"""The controller's side of least privilege on the in-memory API server: what is refused
before the scheduler sees it, and what a signed record lets through. SubjectAccessReviews
need a real API server: tests/e2e/test_security.py."""

from __future__ import annotations

from typing import Any

from dispatcher.controller.status import APPWRAPPERS
from dispatcher.core.gatekeeping import Creator, PriorityPolicy, PriorityRule, record_patch
from testenv.fakeenv import NAMESPACE, fake_env
from testenv.manifests import appwrapper, job
from tests.unit.test_admission_rules import apply_patch

KEY = b"s" * 32
JOB = ("batch/v1", "Job")


def failed(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Failed")


async def test_an_unattributed_appwrapper_fails_and_is_never_scheduled() -> None:
    async with fake_env(unattributed="refuse", check_at_dispatch=False) as env:
        env.manager.signing_keys[:] = [KEY]
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("plain", job("plain", 1, {"cpu": "1"})))
        await env.reconcile("plain")
        await env.cycle()
        status = (await env.get("plain"))["status"]
        assert failed(status)["reason"] == "Forbidden"
        assert "no record of who created it" in failed(status)["message"]
        assert "Dispatched" not in {
            c["type"] for c in status["conditions"] if c["status"] == "True"
        }
        assert env.objects(*JOB) == []


async def test_a_signed_record_is_dispatched() -> None:
    async with fake_env(unattributed="refuse", check_at_dispatch=False) as env:
        env.manager.signing_keys[:] = [KEY]
        await env.add_node("n1", cpu="8")
        obj = appwrapper("signed", job("signed", 1, {"cpu": "1"}))
        obj["metadata"]["namespace"] = NAMESPACE
        patch = record_patch(operation="CREATE", obj=obj, old=None, user=Creator("bob"), keys=[KEY])
        await env.apply(apply_patch(obj, patch))
        await env.reconcile("signed")
        await env.cycle()
        await env.reconcile("signed")
        assert len(env.objects(*JOB)) == 1


async def test_a_priority_the_namespace_may_not_use_fails_before_scheduling() -> None:
    policy = PriorityPolicy(namespaces={NAMESPACE: PriorityRule(max_priority=10)})
    async with fake_env(priority_policy=policy) as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("high", job("high", 1, {"cpu": "1"}), priority=11))
        await env.reconcile("high")
        await env.cycle()
        status = (await env.get("high"))["status"]
        assert failed(status)["reason"] == "Forbidden"
        assert (
            "priority 11, above the highest this namespace may use (10)"
            in (failed(status)["message"])
        )
        assert env.objects(*JOB) == []


async def test_an_edit_after_dispatch_that_makes_it_invalid_is_answered() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("edited", job("edited", 1, {"cpu": "1"})))
        await env.reconcile("edited")
        await env.cycle()
        await env.reconcile("edited")
        assert len(env.objects(*JOB)) == 1
        obj = await env.get("edited")
        obj["spec"]["resources"]["GenericItems"].append(
            {
                "generictemplate": {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": "r"},
                }
            }
        )
        await env.fake.replace(APPWRAPPERS, NAMESPACE, "edited", obj)
        # Requeued (its objects go), and back at once to be told why it cannot run.
        assert await env.reconcile("edited") == 0.0
        await env.reconcile("edited")
        status = (await env.get("edited"))["status"]
        assert failed(status)["reason"] == "InvalidSpec"
        assert "ClusterRole" in failed(status)["message"]
        assert env.objects(*JOB) == []
