"""``python -m tideflow.testing.sim --seed N [--seeds COUNT] [--verbose]``: replay seeds.

Prints each seed's scenario, every fault injected (virtual time, port call, kind), the
violated invariants and a digest of everything that happened (the fault log and every
run's history): two replays of a seed print the same digest. Exit status 1 when any
invariant failed.

String hashes are randomised per process (``PYTHONHASHSEED``) and the engine iterates
over sets of run ids in places, so a replay in another process could take another path:
this command pins ``PYTHONHASHSEED=0`` (re-executing itself when it is not), and so does
the test suite's replay hint.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tideflow.testing.sim.simulate import simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tideflow.testing.sim", description=__doc__)
    parser.add_argument("--seed", type=int, required=True, help="the (first) seed to replay")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument(
        "--verbose", action="store_true", help="the engine's log lines too (on stderr)"
    )
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    failed = 0
    for seed in range(args.seed, args.seed + args.seeds):
        outcome = simulate(seed, verbose=args.verbose)
        print(outcome.report())
        failed += bool(outcome.violations)
    return 1 if failed else 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tideflow.testing.sim", *sys.argv[1:]])
    sys.exit(main())
