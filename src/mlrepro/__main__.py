"""`python -m mlrepro`: the command line (see mlrepro.cli)."""

from mlrepro.cli import main

raise SystemExit(main())
