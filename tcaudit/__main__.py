from tcaudit.cli.main import main

raise SystemExit(main())
