"""The record that an attempt's objects are made (`status.objectsMadeFor`, v1beta2 phase
`Running`) is written at once after the creates return, in the reconcile that made them:
never paced to ride on a later write, so the phase cannot trail pods a user already sees
ready."""

from __future__ import annotations

import pytest

from dispatcher.core.v1beta2status import RESUMING, RUNNING, objects_made, v1beta2_status
from dispatcher.kube.errors import Conflict
from testenv.fakeenv import NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper, job

KEY = f"{NAMESPACE}/a"


async def dispatched(env: FakeEnv) -> None:
    await env.add_node("n1", cpu="8")
    await env.apply(appwrapper("a", job("a", 2, {"cpu": "1"}), completion="Complete"))
    await env.reconcile("a")
    await env.cycle()
    status = (await env.get("a"))["status"]
    assert v1beta2_status(status)["phase"] == RESUMING
    assert env.objects("batch/v1", "Job") == []


async def test_the_record_is_written_in_the_reconcile_that_made_the_objects() -> None:
    async with fake_env() as env:
        await dispatched(env)
        writes = env.manager.status.writes[KEY]
        await env.reconcile("a")
        assert len(env.objects("batch/v1", "Job")) == 1
        assert env.objects("v1", "Pod") == []  # nothing runs yet, and the record is there
        status = (await env.get("a"))["status"]
        assert objects_made(status)
        assert v1beta2_status(status)["phase"] == RUNNING
        assert env.manager.status.writes[KEY] == writes + 1  # the record, alone
        # Once per attempt: the next look writes nothing for it.
        await env.reconcile("a")
        assert env.manager.status.writes[KEY] == writes + 1


async def test_a_record_write_that_fails_is_written_by_the_next_reconcile() -> None:
    async with fake_env() as env:
        await dispatched(env)
        env.fake.fail_next("replace", kind="AppWrapper", error=Conflict("stale", status=409))
        with pytest.raises(Conflict):  # the work queue runs it again at once
            await env.reconcile("a")
        assert len(env.objects("batch/v1", "Job")) == 1
        assert not objects_made((await env.get("a"))["status"])
        await env.reconcile("a")
        assert objects_made((await env.get("a"))["status"])
        assert len(env.objects("batch/v1", "Job")) == 1
