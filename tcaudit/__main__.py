from tcaudit.cli import main

raise SystemExit(main())
