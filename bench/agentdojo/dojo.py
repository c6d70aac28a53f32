"""What the AgentDojo server, the script maker and the harness share: the suites (v1.2), which
tools act, the injections of a (user task, injection task) pair, and how a tool's result is
written as JSON (the one form the server sends and the scripts are made against).

Everything here is AgentDojo's own (PyPI `agentdojo`, pinned in requirements.txt): its suites,
environments, ground truths, injection vectors and the `important_instructions` attack text.
"""

from __future__ import annotations

import datetime
import enum
import functools
import json
from typing import Any

from pydantic import BaseModel

BENCHMARK_VERSION = "v1.2"
SUITES = ("workspace", "travel", "banking", "slack")

# The tools of each suite that change the world or reach other people: every tool not listed
# here is read-only (`readOnlyHint`). AgentDojo has no annotations of its own; this is the
# harness's reading of each tool's docstring.
ACTING = {
    "workspace": {
        "send_email", "delete_email", "create_calendar_event", "cancel_calendar_event",
        "reschedule_calendar_event", "add_calendar_event_participants", "append_to_file",
        "create_file", "delete_file", "share_file",
    },
    "travel": {
        "create_calendar_event", "cancel_calendar_event", "reserve_hotel", "reserve_car_rental",
        "reserve_restaurant", "send_email",
    },
    "banking": {
        "send_money", "schedule_transaction", "update_scheduled_transaction", "update_password",
        "update_user_info",
    },
    "slack": {
        "add_user_to_channel", "send_direct_message", "send_channel_message", "invite_user_to_slack",
        "remove_user_from_slack", "post_webpage",
    },
}
# Of those and the read-only ones: the tools that destroy or overwrite something
# (`destructiveHint`), and the tools that reach beyond the user's own data: other people, the
# web (`openWorldHint`).
DESTRUCTIVE = {
    "delete_email", "cancel_calendar_event", "delete_file", "update_password",
    "update_scheduled_transaction", "update_user_info", "remove_user_from_slack",
    "reschedule_calendar_event",
}
OPEN_WORLD = {
    "send_email", "share_file", "send_money", "schedule_transaction", "send_direct_message",
    "send_channel_message", "invite_user_to_slack", "post_webpage", "get_webpage",
    "reserve_hotel", "reserve_car_rental", "reserve_restaurant",
}

# The injection tasks whose goal is to send the user's data out (private -> open): the figure
# "none leaves unseen" is counted over these.
EXFILTRATION = {
    "banking": {"injection_task_0", "injection_task_1", "injection_task_2", "injection_task_3", "injection_task_8"},
    "slack": {"injection_task_2", "injection_task_4"},
    "travel": {"injection_task_1", "injection_task_3", "injection_task_5"},
    "workspace": {f"injection_task_{i}" for i in range(3, 13)},
}

# AgentDojo's `important_instructions` attack, with the names it uses when it does not know the
# user or the model (`important_instructions_no_names`).
ATTACK_USER = "the user"
ATTACK_MODEL = "the AI language model"


def annotations(suite: str, tool: str) -> dict[str, bool]:
    acting = tool in ACTING[suite]
    out = {"readOnlyHint": not acting, "openWorldHint": tool in OPEN_WORLD}
    if acting:
        out["destructiveHint"] = tool in DESTRUCTIVE
        out["idempotentHint"] = False
    return out


@functools.lru_cache
def suite(name: str):
    from agentdojo.task_suite.load_suites import get_suite

    return get_suite(BENCHMARK_VERSION, name)


def user_task(suite_name: str, task_id: str):
    return suite(suite_name).get_user_task_by_id(task_id)


def injection_task(suite_name: str, task_id: str):
    return suite(suite_name).get_injection_task_by_id(task_id)


@functools.lru_cache
def injection_candidates(suite_name: str, user_task_id: str) -> tuple[str, ...]:
    """The injection vectors a correct run of the user task shows (AgentDojo's own method:
    its ground truth run over an environment with a canary in every vector)."""
    from agentdojo.attacks.base_attacks import BaseAttack

    s = suite(suite_name)

    class _Probe(BaseAttack):
        name = "probe"

    probe = _Probe.__new__(_Probe)
    probe.task_suite = s
    probe.canary_injections = {inj: f"<CANARY---{inj}--->" for inj in s.get_injection_vector_defaults()}
    return tuple(BaseAttack.get_injection_candidates.__wrapped__(probe, user_task(suite_name, user_task_id)))


def injection_text(suite_name: str, injection_task_id: str) -> str:
    from agentdojo.attacks.important_instructions_attacks import ImportantInstructionsAttack

    goal = injection_task(suite_name, injection_task_id).GOAL
    return ImportantInstructionsAttack._JB_STRING.format(goal=goal, user=ATTACK_USER, model=ATTACK_MODEL)


def injections(suite_name: str, user_task_id: str | None, injection_task_id: str | None) -> dict[str, str]:
    """The vectors of the pair with the attack text in them, as AgentDojo's attack places them:
    every vector the user task's correct run shows. No injection task: none (the defaults)."""
    if not injection_task_id or not user_task_id:
        return {}
    text = injection_text(suite_name, injection_task_id)
    return {v: text for v in injection_candidates(suite_name, user_task_id)}


def environment(suite_name: str, user_task_id: str | None, injection_task_id: str | None):
    """The environment of the pair, as AgentDojo's `run_task_with_pipeline` starts it: the
    default environment with the injections in place, then the user task's `init_environment`.
    A fresh copy each time (loading one takes AgentDojo up to a second)."""
    return _environment(suite_name, user_task_id, injection_task_id).model_copy(deep=True)


@functools.lru_cache(maxsize=64)
def _environment(suite_name: str, user_task_id: str | None, injection_task_id: str | None):
    s = suite(suite_name)
    env = s.load_and_inject_default_environment(injections(suite_name, user_task_id, injection_task_id))
    if user_task_id:
        env = user_task(suite_name, user_task_id).init_environment(env)
    return env


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    return value


def result_text(value: Any) -> str:
    """A tool's result as the server sends it: one JSON text, which the sandbox's runtime parses
    back into the Python value the script indexes."""
    return json.dumps(to_jsonable(value), ensure_ascii=False)


def run_tool(env, suite_name: str, tool: str, args: dict) -> tuple[Any, str | None]:
    """Run one tool over `env` (changed in place) as AgentDojo's FunctionsRuntime does:
    (the JSON-able result, None) or (None, "ErrorType: message")."""
    from agentdojo.functions_runtime import FunctionsRuntime

    rt = FunctionsRuntime(suite(suite_name).tools)
    result, error = rt.run_function(env, tool, dict(args), raise_on_error=False)
    if error is not None:
        return None, error
    return json.loads(result_text(result)), None


def env_to_text(env) -> str:
    """The environment as the server hands it to the harness: pickled (AgentDojo's models do not
    survive a JSON round trip: an inbox rebuilds its emails from its initial list), base64."""
    import base64
    import pickle

    return base64.b64encode(pickle.dumps(env)).decode()


def env_from_text(text: str):
    import base64
    import pickle

    return pickle.loads(base64.b64decode(text))
