from tilewise.cli import main

raise SystemExit(main())
