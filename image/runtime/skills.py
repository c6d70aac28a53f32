"""Skills: functions saved on the host (`runtime.save_skill`) and defined in every new session.

The host keeps them (`<state_dir>/skills/`, bounded in size and number); this side sends a
function's source and, at the first exec of an interpreter whose frame says skills exist,
loads the saved ones. A skill is one function, and defining it runs nothing else: no statement
besides the `def`, no decorator (a call), only literal default values (nested at most the host's
SKILL_DEFAULT_DEPTH), and annotations compiled as strings (`from __future__ import
annotations`), so they are never evaluated at definition. The host checks the same before it
stores a skill and before it sends one to be loaded; this side checks again before it runs one.
"""

import __future__
import ast
import inspect
import keyword
import linecache
import re
import sys
import textwrap
import types

from . import channel, constants, discovery, display, rpc, state

_skills = {}  # name -> description, of the skills defined in this interpreter
_loaded = False  # whether this interpreter asked for the saved skills already
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def skill_source(func):
    """(name, source) of a function that can be saved as a skill; TypeError or ValueError
    saying why not."""
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    if not (inspect.isfunction(func) or inspect.iscoroutinefunction(func)):
        raise TypeError("save_skill() takes a function defined with def; got %s" % type(func).__name__)
    name = func.__name__
    if name == "<lambda>":
        raise ValueError("a lambda has no name to save it under: define it with `def NAME(...):` "
                         "in a cell and save that")
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise ValueError("%r cannot be a skill's name: use ASCII letters, digits and _" % name)
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError) as e:
        raise ValueError("the source of %s() is not available (%s): define it with def in a "
                         "run_python cell and save it from there" % (name, e)) from None
    source = textwrap.dedent(source)
    try:
        tree = ast.parse(source, "<skill %s>" % name)
    except SyntaxError as e:
        raise ValueError("the source of %s() does not compile on its own: %s" % (name, e)) from None
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body):
        raise ValueError("the source of %s() does not define it at the top level (is it a lambda "
                         "assigned to a name?): define it with `def %s(...):`" % (name, name))
    try:
        definition(name, source, "<skill %s>" % name)
    except ValueError as e:
        raise ValueError("%s() cannot be a skill: %s. A skill is one function defined with def, with "
                         "no decorator and only literal default values; it imports what it needs "
                         "inside its body" % (name, str(e).replace("; it is not run", ""))) from None
    return name, source


def save_skill(func, description=None):
    """Save `func` (a function defined with def) for every later session: its source and its
    description (default: its docstring) are kept by the bridge, and each new session has it
    defined under its name. Saving a name again replaces it. Size and number are bounded by the
    bridge's configuration (skills.max_size, skills.max_count); a refusal raises McpError.
    Returns {name, replaced, count}. The function should import what it uses inside its body."""
    name, source = skill_source(func)
    if description is None:
        description = inspect.getdoc(func) or ""
    result = rpc.request_sync("save_skill", {"name": name, "source": source, "description": str(description)})
    _skills[name] = str(description)
    return result


save_tool = save_skill  # the name the Python original gives it


def list_skills():
    """The saved skills: [{name, description, saved_at}]; skills that cannot be loaded are
    printed to stderr."""
    result = rpc.request_sync("list_skills", {}) or {}
    for b in result.get("broken") or ():
        print("list_skills: skill %r is broken: %s" % (b.get("name"), b.get("reason")), file=sys.stderr)
    return [dict(s) for s in result.get("skills") or () if isinstance(s, dict)]


def delete_skill(name):
    """Remove the saved skill `name` for later sessions (this session keeps its definition)."""
    result = rpc.request_sync("delete_skill", {"name": str(name)})
    _skills.pop(str(name), None)
    return result


def defined(name, obj):
    """Whether `obj` is the saved skill `name` as `load` defined it in this interpreter (a
    snapshot leaves it out: the next session defines it from the store again)."""
    return (name in _skills and isinstance(obj, types.FunctionType)
            and obj.__code__.co_filename == "<skill %s>" % name)


def _literal(node, depth=0):
    if depth > constants.SKILL_DEFAULT_DEPTH:
        return False
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return (isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant)
                and isinstance(node.operand.value, (int, float, complex)))
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_literal(e, depth + 1) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k, depth + 1) and _literal(v, depth + 1)
                   for k, v in zip(node.keys, node.values))
    return False


def definition(name, source, filename):
    """The code object that defines skill `name` and does nothing else; ValueError saying why
    when `source` is more than that one function definition."""
    tree = ast.parse(source, filename)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    if len(tree.body) != 1 or not isinstance(tree.body[0], defs):
        raise ValueError("its source is not exactly one function definition (%d top-level "
                         "statements); it is not run" % len(tree.body))
    func = tree.body[0]
    if func.name != name:
        raise ValueError("its source defines %s, not %s" % (func.name, name))
    if func.decorator_list:
        raise ValueError("it has a decorator, which would run when it is defined; it is not run")
    defaults = list(func.args.defaults) + [d for d in func.args.kw_defaults if d is not None]
    if not all(_literal(d) for d in defaults):
        raise ValueError("a default value is not a literal and would run when it is defined; "
                         "it is not run")
    module = ast.Module(body=[func], type_ignores=[])
    return compile(module, filename, "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)


def _define(skill):
    """Define one saved skill in the user's namespace; returns why it could not be, or None."""
    name, source = skill.get("name"), skill.get("source")
    if not isinstance(name, str) or not isinstance(source, str):
        return "its record is malformed"
    filename = "<skill %s>" % name
    try:
        code = definition(name, source, filename)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(code, state.ns)
    except Exception as e:
        return "%s: %s" % (type(e).__name__, e)
    if not callable(state.ns.get(name)):
        return "its source does not define %s" % name
    _skills[name] = skill.get("description") or ""
    return None


def load():
    """At the first exec of this interpreter (a new session, pooled or not): ask the host for
    the saved skills and define them. A skill that no longer compiles or runs is named on the
    call's stderr; the call goes on."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    try:
        reply = rpc.request_sync("load_skills", {})
    except rpc.McpError as e:  # a host without skills (a one-shot probe): nothing to define
        channel.log("skills not loaded: %s" % e, "debug")
        return
    if not isinstance(reply, dict):
        return
    notices = []
    for skill in reply.get("skills") or ():
        if isinstance(skill, dict):
            why = _define(skill)
            if why is not None:
                notices.append("%s: %s" % (skill.get("name"), why))
    for b in reply.get("broken") or ():
        if isinstance(b, dict):
            notices.append("%s: %s" % (b.get("name"), b.get("reason")))
    if notices:
        text = "[skills] not defined in this session (the call goes on): " + "; ".join(notices)
        print(display.cap_middle(text, constants.SKILL_NOTICE_CAP), file=sys.stderr)


def _score(query, name, description):
    tokens = [t for t in re.split(r"[^0-9a-z]+", str(query).lower()) if t]
    if not tokens:
        return 0.0
    text = "%s %s" % (name.lower().replace("_", " "), description.lower())
    return sum(1 for t in tokens if t in text) / len(tokens)


def with_skill_hits(hits, query, limit):
    """The servers' hits and the skills' matches, best first, at most `limit`."""
    extra = []
    for name, description in _skills.items():
        score = _score(query, name, description)
        if score > 0:
            first = description.strip().splitlines()[0] if description.strip() else ""
            extra.append({"skill": name, "description": first, "score": round(score, 3)})
    if not extra:
        return hits
    merged = discovery.SearchResults(sorted(list(hits) + extra, key=lambda h: -float(h.get("score") or 0))[:limit])
    merged.skipped = hits.skipped
    return merged
