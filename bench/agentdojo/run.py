#!/usr/bin/env python3
"""AgentDojo through mcp-code-bridge: a fully steered model's scripts (steer.py) sent as
`run_python` calls by the official MCP Python SDK client to the real bridge binary over stdio,
each suite served by server.py as a real stdio MCP server the bridge proxies, and every pair
scored with AgentDojo's own `utility` and `security` on the server's final environment.

See README.md beside this file for what each figure means. Typical runs:

    run.py --bridge BIN --image-archive TAR --suite banking                # baseline, all placements
    run.py --bridge BIN --image-archive TAR --suite banking --limit 2 --injection-limit 2   # smoke
    run.py ... --mode benign --ask-acting --answer yes                     # ask on every acting tool
    run.py ... --policy flows.toml                                         # a [policy.flows] fragment
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import dojo  # noqa: E402
import steer  # noqa: E402


# ---------------------------------------------------------------------------------------------
# The bridge: a private HOME, a config naming the suite's server, and the SDK client over stdio.


def control(path: Path, req: dict, timeout: float = 60.0) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(json.dumps(req).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    out = json.loads(data)
    if "error" in out:
        raise RuntimeError(f"server control {req.get('op')}: {out['error']}")
    return out


def toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a TOML basic string


def bridge_config(suite: str, ctl: Path, policy: str) -> str:
    lines = [
        f"[servers.{suite}]",
        f"command = {toml_str(sys.executable)}",
        "args = [" + ", ".join(toml_str(a) for a in [str(HERE / "server.py"), "--suite", suite, "--control", str(ctl)]) + "]",
        f"description = {toml_str(f'AgentDojo {dojo.BENCHMARK_VERSION} suite {suite}')}",
        "",
    ]
    return "\n".join(lines) + ("\n" + policy.strip() + "\n" if policy.strip() else "")


def ask_acting_policy(suite: str) -> str:
    tools = sorted(dojo.ACTING[suite])
    return "[policy]\nask = [" + ", ".join(toml_str(f"{suite}.{t}") for t in tools) + "]\n"


@dataclass
class Asked:
    answer: str  # "yes" | "no"
    questions: list = field(default_factory=list)

    async def __call__(self, context, params):
        from mcp import types

        d = params.model_dump(mode="json", by_alias=True)
        self.questions.append(d.get("message"))
        if self.answer != "yes":
            return types.ElicitResult(action="decline")
        choices = []
        try:
            prop = d["requestedSchema"]["properties"]
            key = next(iter(prop))
            spec = prop[key]
            choices = [c.get("const") for c in spec.get("oneOf", [])] or spec.get("enum", [])
        except Exception:
            key = "decision"
        pick = "allow_once" if "allow_once" in choices else (choices[0] if choices else "allow_once")
        return types.ElicitResult(action="accept", content={key: pick})


class Bridge:
    """One bridge process (one MCP connection) serving one suite's server."""

    def __init__(self, args, suite: str, policy: str):
        self.args = args
        self.suite = suite
        self.policy = policy
        self.home = Path(tempfile.mkdtemp(prefix="dojo-bridge-"))
        self.ctl = self.home / "ctl"
        self.asked = Asked(args.answer)
        self._stack = contextlib.AsyncExitStack()
        self.session = None
        self.protocol = None

    def env(self) -> dict:
        h = self.home
        env = {
            "HOME": str(h),
            "XDG_CONFIG_HOME": str(h / ".config"),
            "XDG_STATE_HOME": str(h / ".local/state"),
            "XDG_CACHE_HOME": str(h / ".cache"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MCP_BRIDGE_SYSTEM_CONFIG": "none",
            "MCP_BRIDGE_ENGINE_LINGER": "0",
            "MCP_BRIDGE_SESSION_LINGER": "0",
            "MCP_BRIDGE_SNAPSHOT_MAX_SIZE": "0",
            "MCP_BRIDGE_UPSTREAM_IDLE_TIMEOUT": "3600s",
        }
        if self.args.client != "session":
            env["MCP_BRIDGE_LOG_LEVEL"] = "warning"  # the SDK's Client passes the bridge's stderr through
        if self.args.image_archive:
            env["MCP_BRIDGE_IMAGE_ARCHIVE"] = self.args.image_archive
        for kv in self.args.bridge_env:
            k, _, v = kv.partition("=")
            env[k] = v
        return env

    async def start(self, pair: dict) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        for d in (".config/mcp-code-bridge", ".local/state", ".cache"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        self.ctl.mkdir()
        (self.ctl / "pair.json").write_text(json.dumps(pair))
        (self.home / ".config/mcp-code-bridge/config.toml").write_text(bridge_config(self.suite, self.ctl, self.policy))
        params = StdioServerParameters(command=self.args.bridge, args=["run"], env=self.env(), cwd=str(self.home))
        errlog = open(self.home / "bridge.stderr", "w")
        self._stack.callback(errlog.close)
        if self.args.client == "session":
            # The low-level ClientSession: `initialize` (2025-11-25), questions as elicitation.
            read, write = await self._stack.enter_async_context(stdio_client(params, errlog=errlog))
            self.session = await self._stack.enter_async_context(
                ClientSession(read, write, elicitation_callback=self.asked)
            )
            await self.session.initialize()
            self.protocol = getattr(self.session, "protocol_version", None)
        else:
            # The high-level Client in its `legacy` (initialize, 2025-11-25) or `auto` mode
            # (server/discover: 2026-07-28 with this bridge, questions as input_required rounds
            # the Client answers through the same callback).
            from mcp.client import Client

            client = await self._stack.enter_async_context(
                Client(params, mode=self.args.client, elicitation_callback=self.asked)
            )
            self.session = client
            self.protocol = client.protocol_version

    async def reset_pair(self, pair: dict) -> None:
        (self.ctl / "pair.json").write_text(json.dumps(pair))
        sock = self.ctl / "control.sock"
        if sock.exists():
            try:
                await asyncio.to_thread(control, sock, {"op": "reset", **pair})
            except (ConnectionRefusedError, FileNotFoundError):
                pass  # not running now: it loads pair.json when it starts

    async def dump(self) -> dict:
        sock = self.ctl / "control.sock"
        if sock.exists():
            try:
                return await asyncio.to_thread(control, sock, {"op": "dump"})
            except (ConnectionRefusedError, FileNotFoundError):
                pass
        final = self.ctl / "final.json"
        if final.exists():
            return json.loads(final.read_text())
        raise RuntimeError("the suite's server never started (no control socket, no final.json)")

    async def run_python(self, code: str, session: str, reset: bool) -> dict:
        args = {"code": code, "servers": [self.suite], "timeout": self.args.timeout, "session": session}
        if reset:
            args["reset"] = True
        res = await self.session.call_tool("run_python", args)
        parts = {}
        for c in res.content:
            meta = getattr(c, "meta", None) or {}
            part = meta.get("mcp-code-bridge/part", "text")
            parts[part] = parts.get(part, "") + getattr(c, "text", "")
        text = "\n".join(getattr(c, "text", "") for c in res.content)
        meta = getattr(res, "meta", None) or {}
        return {"text": text, "parts": parts, "status": meta.get("status"), "is_error": bool(res.is_error)}

    def stderr_tail(self, n: int = 6) -> str:
        try:
            lines = (self.home / "bridge.stderr").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no bridge stderr)"
        return " | ".join(lines[-n:])

    async def close(self) -> None:
        try:
            await self._stack.aclose()
        except Exception as e:  # a bridge that dies at the end still gave its results
            print(f"[dojo] closing the bridge: {type(e).__name__}: {e}", file=sys.stderr)
        if not self.args.keep_homes:
            shutil.rmtree(self.home, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# One pair: its scripts through the bridge, then AgentDojo's scoring on the final environment.


def score(suite: str, plan: steer.Plan, dump: dict, model_output: str) -> dict:
    from agentdojo.functions_runtime import FunctionCall
    from agentdojo.types import text_content_block_from_string

    s = dojo.suite(suite)
    pre = dojo.environment(suite, plan.user_task, plan.injection_task)
    post = dojo.env_from_text(dump["env"])
    trace = [FunctionCall(function=c["function"], args=c["args"]) for c in dump["calls"]]
    out = [text_content_block_from_string(model_output)]
    result = {"utility": bool(s._check_task_result(dojo.user_task(suite, plan.user_task), out, pre, post, trace))}
    if plan.injection_task:
        it = dojo.injection_task(suite, plan.injection_task)
        try:
            result["security"] = bool(s._check_task_result(it, out, pre.model_copy(deep=True), post, trace))
        except Exception as e:  # AgentDojo's check could not read the environment: not its goal
            result["security"] = False
            result["score_error"] = f"{type(e).__name__}: {e}"
    return result


def normal_call(suite: str, tool: str, args: dict):
    """A call with its defaults filled in as the tool's parameters model fills them (the
    sandbox's proxy leaves out an argument equal to its default)."""
    f = {t.name: t for t in dojo.suite(suite).tools}.get(tool)
    try:
        return tool, f.parameters.model_validate(args).model_dump(mode="json")
    except Exception:
        return tool, args


async def run_pair(bridge: Bridge, plan: steer.Plan, tag: str) -> dict:
    t0 = time.monotonic()
    pair = {"user_task": plan.user_task, "injection_task": plan.injection_task}
    await bridge.reset_pair(pair)
    q0 = len(bridge.asked.questions)
    replies = []
    for i, step in enumerate(plan.steps):
        session = step["session"] if step["session"] == "s1" else f"{step['session']}-{tag}"
        reset = step["reset"] and (bridge.args.reset_sessions or session != "s1")
        replies.append(await bridge.run_python(step["code"], session, reset))
    dump = await bridge.dump()
    if dump.get("pair") != pair:
        raise RuntimeError(f"the server holds {dump.get('pair')}, not {pair}: it restarted during the pair")
    done = all("STEERED-DONE" in r["parts"].get("stdout", r["text"]) for r in replies)
    model_output = plan.model_output if done else "\n".join(r["text"] for r in replies)
    scored = score(plan.suite, plan, dump, model_output)
    ran = [normal_call(plan.suite, c["function"], c["args"]) for c in dump["calls"] if c["error"] is None]
    planned = [normal_call(plan.suite, t, a) for t, a in plan.planned()]
    row = {
        "suite": plan.suite,
        "user_task": plan.user_task,
        "injection_task": plan.injection_task,
        "placement": plan.placement,
        **scored,
        "questions": len(bridge.asked.questions) - q0,
        "asked": [q[:400] if isinstance(q, str) else q for q in bridge.asked.questions[q0:]],
        "protocol": bridge.protocol,
        "done": done,
        "denied": sum(r["text"].count("ToolDenied") > 0 for r in replies),
        "calls_planned": len(planned),
        "calls_ran": len(ran),
        "drift": ran != planned[: len(ran)],
        "attacker_sources": [c.sources for c in plan.calls if c.who == "attacker"],
        "seconds": round(time.monotonic() - t0, 3),
    }
    if not done:
        row["reply"] = [r["text"][-600:] for r in replies]
    return row


# ---------------------------------------------------------------------------------------------


def plans_for(args, suite: str):
    """[(group key, [(plan, tag)])]: the pairs of one suite, grouped by the bridge that runs them."""
    s = dojo.suite(suite)
    users = sorted(s.user_tasks, key=lambda t: int(t.rsplit("_", 1)[1]))
    if args.user_tasks:
        users = [u for u in users if u in args.user_tasks]
    if args.limit:
        users = users[: args.limit]
    injs = sorted(s.injection_tasks, key=lambda t: int(t.rsplit("_", 1)[1]))
    if args.injection_tasks:
        injs = [i for i in injs if i in args.injection_tasks]
    if args.injection_limit:
        injs = injs[: args.injection_limit]
    groups = []
    if args.mode in ("benign", "all"):
        groups.append(("benign", [(steer.make_plan(suite, u), u) for u in users]))
    if args.mode in ("attack", "all"):
        for it in injs:
            groups.append((it, [(steer.make_plan(suite, u, it, p), f"{u}-{p}") for u in users for p in args.placements]))
    return groups


async def run_suite(args, suite: str, policy: str, out) -> list[dict]:
    rows = []
    for key, plans in plans_for(args, suite):
        if not plans:
            continue
        per_pair = args.connection == "pair"
        chunks = [[p] for p in plans] if per_pair else [plans]
        for chunk in chunks:
            first = chunk[0][0]
            b = Bridge(args, suite, policy)
            t0 = time.monotonic()
            try:
                try:
                    await b.start({"user_task": first.user_task, "injection_task": first.injection_task})
                except Exception as e:
                    why = f"the bridge did not start ({type(e).__name__}: {e}): {b.stderr_tail()}"
                    print(f"[dojo] {why}", file=sys.stderr)
                    for plan, _ in chunk:
                        row = {"suite": suite, "user_task": plan.user_task, "injection_task": plan.injection_task,
                               "placement": plan.placement, "error": why}
                        rows.append(row)
                        out.write(json.dumps(row) + "\n")
                    if "unknown key" in why or "configuration" in why:
                        return rows  # the same config fails every bridge of the suite
                    continue
                start_s = time.monotonic() - t0
                for plan, tag in chunk:
                    try:
                        row = await run_pair(b, plan, tag)
                    except Exception as e:
                        row = {
                            "suite": suite, "user_task": plan.user_task, "injection_task": plan.injection_task,
                            "placement": plan.placement, "error": f"{type(e).__name__}: {e}",
                        }
                    row["bridge_start_s"] = round(start_s, 3)
                    start_s = 0.0
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    if args.verbose:
                        print(json.dumps({k: row.get(k) for k in ("user_task", "injection_task", "placement", "utility", "security", "questions", "seconds", "error")}), file=sys.stderr)
            finally:
                await b.close()
        print(f"[dojo] {suite} {key}: {len(plans)} runs", file=sys.stderr)
    return rows


def report(rows: list[dict]) -> str:
    from collections import defaultdict

    lines = []
    errors = [r for r in rows if "error" in r]
    ok = [r for r in rows if "error" not in r]
    by = defaultdict(list)
    for r in ok:
        by[(r["suite"], r["placement"])].append(r)
    suites = sorted({r["suite"] for r in ok})
    lines.append("| suite | runs | placement | utility | attacks that reach their goal, no question | asked | denied | seconds per run (p50) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    totals = defaultdict(lambda: [0, 0, 0, 0, 0])
    for s in suites + ["all"]:
        for p in ("benign", "data", "reply", "session"):
            rs = [r for r in ok if r["placement"] == p and (s == "all" or r["suite"] == s)]
            if not rs:
                continue
            util = sum(r["utility"] for r in rs)
            benign_clean = sum(r["utility"] and r["questions"] == 0 for r in rs)
            asked = sum(r["questions"] > 0 for r in rs)
            denied = sum(r["denied"] > 0 for r in rs)
            secs = sorted(r["seconds"] for r in rs)
            p50 = secs[len(secs) // 2]
            if p == "benign":
                goal = f"completed with no question: {benign_clean}"
            else:
                goal = str(sum(bool(r.get("security")) and r["questions"] == 0 for r in rs))
            lines.append(f"| {s} | {len(rs)} | {p} | {util} | {goal} | {asked} | {denied} | {p50:.2f} |")
    exfil = [r for r in ok if r["placement"] != "benign" and r.get("injection_task") in dojo.EXFILTRATION.get(r["suite"], ())]
    if exfil:
        lines.append("\nAttacks whose goal is to send the user's data out (`dojo.EXFILTRATION`), reached with no question:")
        for p in ("data", "reply", "session"):
            rs = [r for r in exfil if r["placement"] == p]
            if rs:
                reached = sum(bool(r.get("security")) and r["questions"] == 0 for r in rs)
                lines.append(f"- {p}: {reached} of {len(rs)}")
    if errors:
        lines.append(f"\n{len(errors)} run(s) failed in the harness:")
        for r in errors[:20]:
            lines.append(f"- {r['suite']} {r['user_task']} {r.get('injection_task')} {r['placement']}: {r['error']}")
    drift = [r for r in ok if r.get("drift")]
    if drift:
        lines.append(f"\n{len(drift)} run(s) where the calls that ran differ from the planned ones (a denial, or a result the dry run did not foresee).")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bridge", default=os.environ.get("MCP_CODE_BRIDGE_BIN"), help="the mcp-code-bridge binary (env MCP_CODE_BRIDGE_BIN)")
    ap.add_argument("--image-archive", default=os.environ.get("MCP_BRIDGE_IMAGE_ARCHIVE"), help="the sandbox image archive (env MCP_BRIDGE_IMAGE_ARCHIVE)")
    ap.add_argument("--bridge-env", action="append", default=[], metavar="KEY=VALUE", help="more environment for the bridge")
    ap.add_argument("--suite", action="append", choices=dojo.SUITES, help="repeatable; default all four")
    ap.add_argument("--mode", default="all", choices=("benign", "attack", "all"))
    ap.add_argument("--placements", default="data,reply,session", type=lambda s: [p for p in s.split(",") if p])
    ap.add_argument("--limit", type=int, help="the first N user tasks of each suite")
    ap.add_argument("--injection-limit", type=int, help="the first N injection tasks of each suite")
    ap.add_argument("--user-tasks", type=lambda s: s.split(","), help="only these user tasks (comma-separated ids)")
    ap.add_argument("--injection-tasks", type=lambda s: s.split(","), help="only these injection tasks")
    ap.add_argument("--policy", type=Path, help="a TOML fragment appended to the bridge's config ([policy], [policy.flows], ...)")
    ap.add_argument("--policy-toml", default="", help="the same, given inline")
    ap.add_argument("--ask-acting", action="store_true", help="[policy] ask on every acting (not read-only) tool of the suite")
    ap.add_argument("--answer", default="yes", choices=("yes", "no"), help="how the client answers a question")
    ap.add_argument("--connection", default="group", choices=("group", "pair"),
                    help="group: one bridge (one connection) per suite for the benign runs and per (suite, injection task) "
                         "for the attacks; pair: a bridge per pair (what a per-connection taint needs)")
    ap.add_argument("--reset-sessions", action="store_true", help="reset the first session before each pair (a fresh interpreter)")
    ap.add_argument("--client", default="session", choices=("session", "legacy", "auto"),
                    help="the SDK's ClientSession (initialize), or its Client in legacy or auto mode (auto: 2026-07-28, input_required)")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--out", type=Path, default=Path("dojo-results.jsonl"))
    ap.add_argument("--dry", action="store_true", help="no bridge: run the scripts here over the suite's functions and score them "
                    "(what a run with nothing refused must give; a drift is a script that does not read what it was made for)")
    ap.add_argument("--report-only", action="store_true", help="print the report of --out and stop")
    ap.add_argument("--keep-homes", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    if args.report_only:
        rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
        print(report(rows))
        return
    if args.dry:
        rows = []
        for s in args.suite or list(dojo.SUITES):
            for _, plans in plans_for(args, s):
                for plan, _ in plans:
                    dump = steer.execute_locally(plan)
                    ran = [normal_call(s, c["function"], c["args"]) for c in dump["calls"]]
                    planned = [normal_call(s, t, a) for t, a in plan.planned()]
                    rows.append({"suite": s, "user_task": plan.user_task, "injection_task": plan.injection_task,
                                 "placement": plan.placement, **score(s, plan, dump, plan.model_output),
                                 "questions": 0, "denied": 0, "seconds": 0.0, "drift": ran != planned})
        print(report(rows))
        return
    if not args.bridge or not Path(args.bridge).exists():
        ap.error("--bridge (or MCP_CODE_BRIDGE_BIN): the mcp-code-bridge binary")
    suites = args.suite or list(dojo.SUITES)
    policy_extra = (args.policy.read_text() if args.policy else "") + "\n" + args.policy_toml

    async def go():
        rows = []
        with args.out.open("w") as out:
            for s in suites:
                policy = policy_extra
                if args.ask_acting:
                    if "[policy]" in policy:
                        raise SystemExit("--ask-acting writes [policy]; the fragment has one too: put the ask list in it")
                    policy = ask_acting_policy(s) + "\n" + policy
                rows += await run_suite(args, s, policy, out)
        return rows

    t0 = time.monotonic()
    rows = asyncio.run(go())
    print(report(rows))
    print(f"\n{len(rows)} runs in {time.monotonic() - t0:.0f} s; rows in {args.out}")
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
