"""Names the dead-code check (`make lint`: vulture) must not report: what only a framework
reads or calls, and dead code in modules whose owners remove it.

Each entry is an attribute access or a name vulture then counts as used. The rest of what
frameworks call is in pyproject.toml [tool.vulture]: `model_config`, `pytestmark`, fixtures
requested for their effect, pydantic validators and pytest fixtures by their decorators.
"""

# ruff: noqa: B018, F821
# mypy: ignore-errors

# pydantic reads these fields: MCAD's legacy item fields (accepted and ignored, so old YAML
# keeps working), its status fields (derived at each write, never read back), and fields
# kept so a dump is complete.
_.minavailable
_.allocated
_.priorityslope
_.initialTimeInSeconds
_.numRequeuings
_.overrun
_.nodeSelector
_.dispatchingWindow
_.observedGeneration
_.canrun
_.isdispatched
_.queuejobstate
_.controllerfirsttimestamp
_.numberOfRequeueings
_.systempriority
_.resourceVersion
_.not_served  # core/crdcheck.py: what the CRD says, compared whole

# kubernetes_asyncio reads its Configuration's attributes.
_.connection_pool_maxsize

# mypy reads it: the test that the real and the fake client both satisfy KubeApi.
_both_satisfy_the_protocol

# Dead, in modules other branches are changing (issue 29): left to their owners.
ANNOTATION_ITEM  # api/constants.py
SHORT_NAME  # api/models.py

# Python calls a module's __getattr__ for a missing name: dispatcher/__init__.py reads
# __version__ lazily with it (the kubectl plugin starts faster).
__getattr__

# A dataclass field the tests compare whole (equality reads it): tests/unit/test_error_policy.py.
logged
