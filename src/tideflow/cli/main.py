"""The `tideflow` command's entry point (``[project.scripts]``), kept light: ``tideflow
--version`` is answered here without importing typer, rich or any command; everything
else goes to the typer app of cli/app.py (``app``, also importable from here).

Exit codes: 0 success; 1 the run ended in any state but `succeeded`, or
`validate` found errors; 2 a usage error, a definition that does not compile,
run input that is not valid JSON or does not fit the input schema, a store that
cannot be opened, or a run that is not in the store; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import tideflow

if TYPE_CHECKING:
    from tideflow.cli.app import app as app

VERSION = f"tideflow {tideflow.__version__}"
"""What ``--version`` prints: the installed distribution's version
(tests/unit/cli/test_cli_imports.py keeps the two equal; importlib.metadata would cost
more than the rest of ``--version``)."""

_VERSION_FLAGS = ("--version", "-V")


def main() -> None:
    # --version is the root's only option besides --help, and eager: given first it is
    # answered before anything else is looked at, as click would (cli/app.py has it too,
    # for its help and for the app called directly)
    if sys.argv[1:2] and sys.argv[1] in _VERSION_FLAGS:
        sys.stdout.write(VERSION + "\n")
        raise SystemExit(0)
    from tideflow.cli.app import app

    app(prog_name="tideflow")


def __getattr__(name: str) -> Any:
    if name == "app":
        from tideflow.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
