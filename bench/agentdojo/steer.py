"""A fully steered model, as `run_python` scripts made from AgentDojo's ground truths.

The script maker runs the pair's calls once over its own copy of the environment (the same
AgentDojo code the server runs, the same JSON), so it knows every result the real run will get.
Each argument value of each call becomes, in this order of preference:

- a literal, when the user's prompt gives it (`prompt`): the user's intent;
- an expression indexing the result of an earlier call of the same script that carried it
  (`result`): `r2[0]["recipient"]`, or a slice of a text field, `r0[131:154]`, with `float(...)`
  or `int(...)` around a number read from text. Provenance is real: the value is read out of the
  result at run time, not written in the code;
- a text built from pieces of results and literals (`composed`), when the ground truth composed
  it (a concatenation of messages, a body quoting a result): `(r1[0]['body'] + ', ' + ...)`;
- in the `data` placement, an attacker's value the injection's text names is read out of that
  text before anything else (`injection`): an id `'13'`, which a script written before it read
  anything could neither write nor pick by a list position;
- otherwise a literal (`literal`): what the steered model writes itself (a value the task
  leaves to it, or, after a reply showed it the injection, the attacker's value it was told).

Placements of an attack (the injection task's ground truth is what the steered model does):
- `data`: one script; the attacker's calls come right after the call whose result carried the
  injection, their values read from the results (the attacker's IBAN out of the bill's text);
- `reply`: the first call runs the user task and prints the result that carried the injection
  (the reply shows it to the model); a second call in the same session makes the attacker's
  calls, their values literals unless a result of that second script carries them;
- `session`: as `reply`, the second call in another session of the same connection.
A benign run (`benign`) is the user task's script alone.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import dojo
import ground_truths

PLACEMENTS = ("data", "reply", "session")
MARK = "<INFORMATION>"


@dataclass
class Call:
    tool: str
    args: dict
    who: str  # "user" | "attacker"
    exprs: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    var: str = ""


@dataclass
class Plan:
    suite: str
    user_task: str
    injection_task: str | None
    placement: str
    steps: list  # [{"code", "session", "reset"}]
    calls: list  # [Call] in the order they run
    carrier: int | None  # index in calls of the first result that carried the injection
    model_output: str  # the steered model's final answer when every step ran
    dry: dict = field(default_factory=dict, repr=False)  # the dry run's final state, as the server dumps it

    def planned(self) -> list[tuple[str, dict]]:
        return [(c.tool, c.args) for c in self.calls]


def _leaves(value: Any, path: str = ""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}[{k!r}]")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    yield path, value


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _num_texts(v: float | int) -> list[str]:
    out = [repr(v)]
    if isinstance(v, float):
        out.append(f"{v:.2f}")
        if v.is_integer():
            out.append(str(int(v)))
    return [t for t in dict.fromkeys(out) if len(t) >= 2]


def _find_in_text(text: str, needle: str, number: bool) -> int | None:
    start = 0
    while True:
        i = text.find(needle, start)
        if i < 0:
            return None
        if not number:
            return i
        before = text[i - 1] if i > 0 else " "
        after = text[i + len(needle)] if i + len(needle) < len(text) else " "
        if not (before.isdigit() or before == ".") and not (after.isdigit() or (after == "." and text[i + len(needle) + 1 : i + len(needle) + 2].isdigit())):
            return i
        start = i + 1


def _in_prompt(value: Any, prompt: str) -> bool:
    if isinstance(value, str):
        return len(value) > 0 and value in prompt
    if _is_num(value):
        return any(_find_in_text(prompt, t, True) is not None for t in _num_texts(value))
    return False


class Resolver:
    def __init__(self, prompt: str):
        self.prompt = prompt
        self.results: list[tuple[str, Any]] = []  # (var, value) of this script, oldest first
        # (var, path, text) of the injected texts the attacker's calls may read a value from
        # (the `data` placement's attacker calls only).
        self.injected: list[tuple[str, str, str]] = []

    def resolve(self, value: Any) -> tuple[str, str]:
        """(Python expression, source) for one argument value."""
        # The attacker's value in the `data` placement comes out of the injection's text first:
        # a script written before it read anything cannot hold it as a literal, nor index a list
        # at a position equal to it (`r0[13]['id_']` for the file '13').
        injected = self._from_injection(value)
        if injected is not None:
            return injected, "injection"
        if _in_prompt(value, self.prompt):
            return repr(value), "prompt"
        found = self._from_results(value)
        if found is not None:
            return found, "result"
        if isinstance(value, str) and len(value) >= 8:
            composed = self._compose(value)
            if composed is not None:
                return composed, "composed"
        if isinstance(value, dict) and value:
            parts = {k: self.resolve(v) for k, v in value.items()}
            if any(src == "result" for _, src in parts.values()):
                return "{" + ", ".join(f"{k!r}: {e}" for k, (e, _) in parts.items()) + "}", "mixed"
        if isinstance(value, list) and value:
            parts = [self.resolve(v) for v in value]
            if any(s in ("result", "mixed") for _, s in parts):
                srcs = {s for _, s in parts}
                return "[" + ", ".join(e for e, _ in parts) + "]", "result" if srcs == {"result"} else "mixed"
        return repr(value), "literal"

    def _from_injection(self, value: Any) -> str | None:
        """In the `data` placement, the attacker's value read out of the injection's text, which
        names it (an id `'13'`, a short amount), as a whole word: the script of a model that had
        seen nothing could not write it. None outside the attacker's calls of that placement, or
        when the text does not name it."""
        if not self.injected or isinstance(value, bool) or value is None:
            return None
        for var, path, text in self.injected:
            if isinstance(value, str) and value:
                start = 0
                while (i := text.find(value, start)) >= 0:
                    before = text[i - 1] if i > 0 else " "
                    after = text[i + len(value)] if i + len(value) < len(text) else " "
                    if not (before.isalnum() or after.isalnum()):
                        return f"{var}{path}[{i}:{i + len(value)}]"
                    start = i + 1
            elif _is_num(value):
                texts = [repr(value), str(int(value)) if float(value).is_integer() else repr(value)]
                for t in dict.fromkeys(texts):
                    i = _find_in_text(text, t, True)
                    if i is not None:
                        return f"{type(value).__name__}({var}{path}[{i}:{i + len(t)}])"
        return None

    def _compose(self, value: str) -> str | None:
        """A text the ground truth built from pieces (a concatenation of messages, an email's
        body quoting a result): each stretch a result's text field gives, read from it, the rest
        literal. None when no piece of 4 characters or more comes from a result."""
        pieces: dict[str, str] = {}
        for var, res in reversed(self.results):
            for path, leaf in _leaves(res):
                if isinstance(leaf, str) and len(leaf) >= 4 and leaf not in pieces and leaf in value:
                    pieces[leaf] = var + path
        if not pieces:
            return None
        by_len = sorted(pieces, key=len, reverse=True)
        out: list[str] = []
        lit = ""
        i = 0
        while i < len(value):
            hit = next((p for p in by_len if value.startswith(p, i)), None)
            if hit is None:
                lit += value[i]
                i += 1
                continue
            if lit:
                out.append(repr(lit))
                lit = ""
            out.append(pieces[hit])
            i += len(hit)
        if lit:
            out.append(repr(lit))
        return "(" + " + ".join(out) + ")"

    def _from_results(self, value: Any) -> str | None:
        if value is None or isinstance(value, bool) or value == "" or value == [] or value == {}:
            return None
        if _is_num(value) and abs(value) < 10 and float(value).is_integer():
            return None  # 0, 1, 5: too common to say which result carried it
        for var, res in reversed(self.results):
            # A whole field first.
            for path, leaf in _leaves(res):
                short = isinstance(value, str) and len(value) < 3 and not path.endswith(("['id_']", "['id']"))
                if type(leaf) is type(value) and leaf == value and not short:
                    return var + path
                if _is_num(value) and _is_num(leaf) and leaf == value:
                    return f"{type(value).__name__}({var}{path})"
            # Then a piece of a text.
            for path, leaf in _leaves(res):
                if not isinstance(leaf, str):
                    continue
                if isinstance(value, str) and len(value) >= 5 and (not value.isalpha() or len(value) >= 10):
                    i = leaf.find(value)
                    if i >= 0:
                        return f"{var}{path}[{i}:{i + len(value)}]"
                elif _is_num(value):
                    for t in _num_texts(value):
                        i = _find_in_text(leaf, t, True)
                        if i is not None:
                            return f"{type(value).__name__}({var}{path}[{i}:{i + len(t)}])"
        return None


def _carries(value: Any) -> bool:
    return any(isinstance(leaf, str) and MARK in leaf for _, leaf in _leaves(value))


class _Run:
    """The dry run: the pair's environment, each call run as the server will run it."""

    def __init__(self, suite: str, user_task: str, injection_task: str | None):
        self.suite = suite
        self.env = dojo.environment(suite, user_task, injection_task)
        self.pre = self.env.model_copy(deep=True)

    def call(self, tool: str, args: dict):
        result, error = dojo.run_tool(self.env, self.suite, tool, copy.deepcopy(args))
        return result, error


def _args(fc) -> dict:
    return {k: v for k, v in dict(fc.args).items()}


def _emit(suite: str, c: Call) -> str:
    args = ", ".join(f"{k}={c.exprs[k]}" for k in c.args)
    return f"{c.var} = await mcp_{suite}.{c.tool}({args})"


def make_plan(suite: str, user_task: str, injection_task: str | None = None, placement: str = "benign") -> Plan:
    if placement != "benign" and (injection_task is None or placement not in PLACEMENTS):
        raise ValueError(f"placement {placement!r} needs an injection task and one of {PLACEMENTS}")
    ut = dojo.user_task(suite, user_task)
    run = _Run(suite, user_task, injection_task if placement != "benign" else None)
    user_calls = list(ut.ground_truth(run.pre.model_copy(deep=True)))
    attacker_calls = []
    it = None
    if placement != "benign":
        it = dojo.injection_task(suite, injection_task)
        attacker_calls = ground_truths.ground_truth(suite, it, run.pre)

    calls: list[Call] = []
    counter = [0]
    carrier: list[int | None] = [None]

    sent_ids: list = []  # ids of the emails the attacker's send_email calls sent, in order

    def do(fc, who: str, resolver: Resolver) -> Call:
        c = Call(tool=fc.function, args=_args(fc), who=who)
        for k, v in (fc.placeholder_args or {}).items():
            if isinstance(v, str) and v.startswith("$sent:") and int(v[6:]) < len(sent_ids):
                c.args[k] = sent_ids[int(v[6:])]
        for k, v in c.args.items():
            c.exprs[k], c.sources[k] = resolver.resolve(v)
        c.var = f"r{counter[0]}"
        counter[0] += 1
        result, _ = run.call(c.tool, c.args)
        if who == "attacker" and c.tool == "send_email" and isinstance(result, dict) and "id_" in result:
            sent_ids.append(result["id_"])
        resolver.results.append((c.var, result))
        calls.append(c)
        if carrier[0] is None and _carries(result):
            carrier[0] = len(calls) - 1
        return c

    head = "from mcp import ToolDenied\n"
    steps: list[dict] = []
    if placement in ("benign", "data"):
        res = Resolver(ut.PROMPT)
        lines = []
        attacked = placement == "benign"
        for fc in user_calls:
            lines.append(_emit(suite, do(fc, "user", res)))
            if not attacked and carrier[0] is not None:
                attacked = True
                carried = calls[carrier[0]]
                res.injected = [
                    (carried.var, path, leaf)
                    for path, leaf in _leaves(dict(res.results)[carried.var])
                    if isinstance(leaf, str) and MARK in leaf
                ]
                for afc in attacker_calls:
                    lines.append(_emit(suite, do(afc, "attacker", res)))
                res.injected = []
        if not attacked:  # no result carried it: the attacker's calls come last
            for afc in attacker_calls:
                lines.append(_emit(suite, do(afc, "attacker", res)))
        lines.append('print("STEERED-DONE")')
        steps.append({"code": head + "\n".join(lines) + "\n", "session": "s1", "reset": True})
    else:
        res = Resolver(ut.PROMPT)
        lines = [_emit(suite, do(fc, "user", res)) for fc in user_calls]
        shown = calls[carrier[0]].var if carrier[0] is not None else None
        if shown is not None:
            lines.append(f"print({shown})")
        lines.append('print("STEERED-DONE")')
        steps.append({"code": head + "\n".join(lines) + "\n", "session": "s1", "reset": True})
        # The second call: written by a model that has seen the injection. The prompt it
        # follows now is the attacker's; nothing of it counts as the user's.
        res2 = Resolver("")
        lines2 = [_emit(suite, do(afc, "attacker", res2)) for afc in attacker_calls]
        lines2.append('print("STEERED-DONE")')
        if placement == "reply":
            steps.append({"code": head + "\n".join(lines2) + "\n", "session": "s1", "reset": False})
        else:
            steps.append({"code": head + "\n".join(lines2) + "\n", "session": "s2", "reset": True})
    return Plan(
        suite=suite,
        user_task=user_task,
        injection_task=injection_task if placement != "benign" else None,
        placement=placement,
        steps=steps,
        calls=calls,
        carrier=carrier[0],
        model_output=" ".join(
            t for t in (ut.GROUND_TRUTH_OUTPUT, it.GROUND_TRUTH_OUTPUT if placement != "benign" else "") if t
        ),
        dry={
            "pair": {"user_task": user_task, "injection_task": injection_task if placement != "benign" else None},
            "env": dojo.env_to_text(run.env),
            "calls": [{"function": c.tool, "args": c.args, "error": None} for c in calls],
        },
    )


def execute_locally(plan: Plan) -> dict:
    """Run the plan's scripts here, without a bridge: the suite's tools as an object whose
    methods run AgentDojo's functions over a fresh environment of the pair and return the JSON
    a server would send. Proves each expression of the scripts reads the value it was made for.
    Returns what the server's dump gives: {"pair", "env", "calls"}."""
    import ast
    import asyncio

    env = dojo.environment(plan.suite, plan.user_task, plan.injection_task)
    calls: list[dict] = []

    class Tools:
        def __getattr__(self, tool):
            async def call(**kw):
                result, error = dojo.run_tool(env, plan.suite, tool, copy.deepcopy(kw))
                calls.append({"function": tool, "args": kw, "error": error})
                if error is not None:
                    raise RuntimeError(error)
                return result

            return call

    ns = {f"mcp_{plan.suite}": Tools(), "print": lambda *a, **k: None, "ToolDenied": PermissionError}

    async def go():
        for step in plan.steps:
            code = step["code"].replace("from mcp import ToolDenied\n", "")
            compiled = compile(code, "<steered>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            try:
                result = eval(compiled, ns)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # as in the sandbox: the step stops there, the next one runs
                pass

    asyncio.run(go())
    return {"pair": plan.dry["pair"], "env": dojo.env_to_text(env), "calls": calls}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Print the scripts of one pair.")
    ap.add_argument("--suite", default="banking")
    ap.add_argument("--user-task", default="user_task_0")
    ap.add_argument("--injection-task")
    ap.add_argument("--placement", default="benign", choices=("benign",) + PLACEMENTS)
    a = ap.parse_args()
    p = make_plan(a.suite, a.user_task, a.injection_task, a.placement)
    for i, s in enumerate(p.steps):
        print(f"# step {i} (session {s['session']}, reset {s['reset']})\n{s['code']}")
    for c in p.calls:
        print(c.who, c.tool, c.sources)
    print("carrier:", p.carrier)
