from fgscale.cli import main

raise SystemExit(main())
