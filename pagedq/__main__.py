from pagedq.cli import main

raise SystemExit(main())
