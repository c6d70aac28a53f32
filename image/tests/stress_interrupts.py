"""Interrupts at random moments, many times, under CPU load: the runtime must end every exec
that an interrupt names with `interrupted` (or `ok`, for code that finished first) and keep the
session. Not part of the default test run (it takes minutes); run it after touching the
interrupt path:

    python3 image/tests/stress_interrupts.py --runs 1000 --load 2 --switch-interval 0.1

`--load N` starts N CPU-burning processes beside the runtime; `--switch-interval` raises the
runtime's GIL switch interval, which widens the windows between the event loop's steps. With
MCP_RUNTIME_TEST_IMAGE set, the runtime runs in that image under podman (see test_runtime.py).
Exit status 0 when every run ended as it should, 1 otherwise.
"""

import argparse
import collections
import multiprocessing
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_runtime import ENDLESS_CODES, FINITE_CODES, Sandbox  # noqa: E402


def burn():
    while True:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--load", type=int, default=2, help="CPU-burning processes beside the runtime")
    ap.add_argument("--switch-interval", type=float, default=0.1)
    ap.add_argument("--max-delay", type=float, default=0.06, help="longest wait before the interrupt (s)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    counts = collections.Counter()
    failures = []
    sb = Sandbox()
    t0 = time.monotonic()
    try:
        sb.ok("import sys\nsys.setswitchinterval(%r)\nsurvivor = 42" % args.switch_interval)
        for i in range(args.runs):
            endless = rng.random() < 0.5
            code = rng.choice(ENDLESS_CODES if endless else FINITE_CODES)
            eid = sb.start(code, servers=None)
            time.sleep(rng.random() * args.max_delay)
            sb.send({"type": "interrupt", "id": eid})
            try:
                r = sb.collect(eid, timeout=20)
                status = r.status
            except AssertionError as e:  # no result: the interrupt was lost
                status = "lost (%s)" % e
            counts[("endless" if endless else "finite", status)] += 1
            if status not in (("interrupted",) if endless else ("ok", "interrupted")):
                failures.append((i, code, status))
                sb.proc.kill()
                sb.close()
                sb = Sandbox()
                sb.ok("import sys\nsys.setswitchinterval(%r)\nsurvivor = 42" % args.switch_interval)
            if (i + 1) % 100 == 0:
                print("  %d runs, %d failed, %.0fs" % (i + 1, len(failures), time.monotonic() - t0), flush=True)
        alive = sb.ok("survivor").value == "42"
    finally:
        sb.close()
        for b in burners:
            b.terminate()
    print("seed %d, %d runs in %.0fs, load %d, switch interval %ss" % (
        seed, args.runs, time.monotonic() - t0, args.load, args.switch_interval))
    for (kind, status), n in sorted(counts.items()):
        print("  %-8s %-12s %d" % (kind, status, n))
    for i, code, status in failures[:10]:
        print("FAILED run %d: %s\n  %s" % (i, status, code.replace("\n", "\\n")))
    print("session kept to the end: %s" % alive)
    print("%d passed, %d failed" % (args.runs - len(failures), len(failures)))
    return 0 if not failures and alive else 1


if __name__ == "__main__":
    sys.exit(main())
