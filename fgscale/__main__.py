from fgscale.cli import run

raise SystemExit(run())
