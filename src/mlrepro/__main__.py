from mlrepro.cli import main

raise SystemExit(main())
