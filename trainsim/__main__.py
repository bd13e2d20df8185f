from trainsim.cli import main

raise SystemExit(main())
